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

// One request and the response to it. A handler answers with respond() (a whole response), or
// with stream_head() / frame() / stream_end() and write() (a streamed one). Every byte to the
// client goes through it (write(), or send_now() from the stream loop), so it alone knows
// whether the client is lost: writes block at most server.send_timeout_s while the client takes
// nothing; after a failed write, lost() is true and the connection is closed, never kept alive
// with a response half sent.
class Exchange {
public:
    Exchange(int fd, Poco::Net::SocketAddress peer, Poco::Net::HTTPRequest head, std::string body, double send_timeout_s, bool draining);

    const Poco::Net::HTTPRequest& request() const { return head_; }
    std::string& body() { return body_; }  // the whole (de-chunked) body; the handler may parse it in place
    const Poco::Net::SocketAddress& peer() const { return peer_; }
    int fd() const { return fd_; }
    std::chrono::steady_clock::duration send_timeout() const { return send_timeout_; }

    // A whole response with Content-Length.
    void respond(int status, std::string_view content_type, std::string_view body, const Headers& extra = {});
    // A streamed response: the head (HTTP/1.1: chunked; HTTP/1.0: no framing, the body ends
    // when the connection closes), each piece framed, the end. They append to `wire`.
    void stream_head(std::string& wire, std::string_view content_type, const Headers& extra = {});
    void frame(std::string& wire, std::string_view payload) const;
    void stream_end(std::string& wire) const;

    // Sends all of `bytes`; false when the client is gone or took nothing for the send timeout.
    bool write(std::string_view bytes);
    // Sends what the socket takes now without waiting: the bytes taken (a failed socket makes
    // the exchange lost). For a caller that waits for the socket itself (the stream loop).
    size_t send_now(std::string_view bytes);
    // The caller's own wait ran out (the client took nothing for the send timeout, or hung up):
    // the exchange is lost, so its connection is closed instead of kept alive.
    void give_up() { lost_ = true; }
    // The client closed its end or the socket failed (checked without blocking).
    bool client_gone() const;
    bool lost() const { return lost_; }
    bool responded() const { return responded_; }
    // No further request on this connection (set by errors that leave the stream unsure).
    void close_after() { keep_alive_ = false; }
    bool keep_alive() const { return keep_alive_ && !lost_; }

private:
    void head(std::string& wire, int status, const Headers& extra);

    int fd_;
    Poco::Net::SocketAddress peer_;
    Poco::Net::HTTPRequest head_;
    std::string body_;
    std::chrono::steady_clock::duration send_timeout_;
    bool http10_, keep_alive_, lost_ = false, responded_ = false;
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
