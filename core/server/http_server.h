// The HTTP/1.x front end.
//
// One epoll thread (`pulse-accept`) accepts connections and reads each request's head and body
// without blocking, so a slow, idle or hostile connection costs a socket and a few bytes of
// state, never a thread. Only complete requests reach the worker threads. Load is shed with an
// HTTP answer, never a reset: when every worker is busy, while draining, when the request-body
// memory budget is spent, or when a head is too slow, the loop itself writes a small error
// response and closes the connection gracefully (half-close, then it reads and drops what the
// client still sends, so the kernel never turns unread bytes into an RST).
//
// It knows nothing about routes: every complete request goes to one Handler with an Exchange,
// the one way anything writes to a client.
#pragma once

#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/SocketAddress.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"

namespace pulse::server {

using Headers = std::vector<std::pair<std::string, std::string>>;

// The bytes on their way to one client, in order. It is the one place that writes to a client
// socket, and it never blocks: what the socket does not take now stays queued until whoever
// holds the connection (a worker, the stream loop, the accept loop) pumps it again when the
// socket is writable. The client is lost when its socket fails, or when queued bytes have
// waited server.send_timeout_s without the client taking a byte: one timeout, counted from the
// last byte taken, and one "lost" state, wherever the bytes are.
class Outbox {
public:
    using Clock = std::chrono::steady_clock;
    Outbox(int fd, Clock::duration send_timeout) : fd_(fd), timeout_(send_timeout) {}

    // Queues `bytes` behind what waits and sends what the socket takes now (nothing once lost).
    void send(std::string_view bytes);
    // Sends what the socket takes now; returns the bytes still queued. Decides "lost".
    size_t pump();
    size_t unsent() const { return buf_.size() - off_; }
    // When the queued bytes count as not taken (lost at the next pump): max when none wait.
    Clock::time_point deadline() const { return unsent() ? stalled_ + timeout_ : Clock::time_point::max(); }
    Clock::duration send_timeout() const { return timeout_; }
    void lose() { lost_ = true; }
    bool lost() const { return lost_; }

private:
    size_t write_some(const char* p, size_t n);  // what the socket takes now; a failure makes it lost

    int fd_;
    Clock::duration timeout_;
    std::string buf_;
    size_t off_ = 0;             // bytes of buf_ already sent
    Clock::time_point stalled_;  // the last byte taken, or when bytes began to wait
    bool lost_ = false;
};

// One request and the response to it. A handler answers with respond() (a whole response), or
// with stream_head() / frame() / stream_end() and send() (a streamed one). Every byte goes out
// through the exchange's Outbox, so it alone knows whether the client is lost, and no handler
// ever waits for a slow client: bytes the client has not taken when the handler returns are
// sent by the accept loop (up to the send timeout) before the connection reads its next
// request. A lost exchange's connection is closed, never kept alive with a response half sent.
class Exchange {
public:
    Exchange(int fd, Poco::Net::SocketAddress peer, Poco::Net::HTTPRequest head, std::string body, double send_timeout_s, bool draining);

    const Poco::Net::HTTPRequest& request() const { return head_; }
    std::string& body() { return body_; }  // the whole (de-chunked) body; the handler may parse it in place
    const Poco::Net::SocketAddress& peer() const { return peer_; }
    int fd() const { return fd_; }

    // A whole response with Content-Length.
    void respond(int status, std::string_view content_type, std::string_view body, const Headers& extra = {});
    // A streamed response: the head (HTTP/1.1: chunked; HTTP/1.0: no framing, the body ends
    // when the connection closes), each piece framed, the end. They append to `wire`.
    void stream_head(std::string& wire, std::string_view content_type, const Headers& extra = {});
    void frame(std::string& wire, std::string_view payload) const;
    void stream_end(std::string& wire) const;

    // Queues bytes for the client and sends what its socket takes now (never waits).
    void send(std::string_view bytes) { out_.send(bytes); }
    // The client's queue, for a loop that waits for the socket itself (the stream loop).
    Outbox& out() { return out_; }
    // The client hung up or stopped reading: the connection is closed, not kept alive.
    void give_up() { out_.lose(); }
    // Whether the client closed its end or the socket failed, waiting for it until `until` or
    // until `wake_fd` (an eventfd; -1: none) is readable, whichever comes first: a request
    // thread's sleep that a hang-up ends at once.
    bool wait_client_gone(std::chrono::steady_clock::time_point until, int wake_fd) const;
    bool lost() const { return out_.lost(); }
    bool responded() const { return responded_; }
    // No further request on this connection (set by errors that leave the stream unsure).
    void close_after() { keep_alive_ = false; }
    bool keep_alive() const { return keep_alive_ && !out_.lost(); }
    // What the client has not taken yet, for the accept loop once the handler returned.
    Outbox release_out() && { return std::move(out_); }

private:
    void head(std::string& wire, int status, const Headers& extra);

    int fd_;
    Poco::Net::SocketAddress peer_;
    Poco::Net::HTTPRequest head_;
    std::string body_;
    Outbox out_;
    bool http10_, keep_alive_, responded_ = false;
};

using Handler = std::function<void(Exchange&)>;

class HttpServer {
public:
    HttpServer(const config::Server& cfg, Handler handler);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Binds and starts accepting. Throws std::runtime_error with the OS reason on failure.
    void start();
    // From now on every new request is answered 503 (Retry-After) and its connection closed;
    // idle keep-alive connections are closed. Requests in flight go on.
    void drain();
    // Closes every connection and joins the threads (after the handlers have returned).
    void stop();
    uint16_t port() const;  // the bound port (useful with port 0 in tests)

private:
    class Loop;
    config::Server cfg_;
    Handler handler_;
    std::unique_ptr<Loop> loop_;
};

}  // namespace pulse::server
