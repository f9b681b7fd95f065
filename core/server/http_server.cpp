#include "server/http_server.h"

#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/NetException.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "common/deadlines.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/wakeup.h"
#include "common/worker_pool.h"
#include "http/body.h"
#include "http/error_body.h"
#include "http/request_head.h"

namespace pulse::server {

using namespace std::chrono;
using Clock = steady_clock;
using http::HeadScan;
using http::RequestHead;
using http::parse_request_head;
using http::scan_request_head;

namespace {

// Workers beyond server.max_streams, so that status requests (/health, /metrics) and a clear
// 503 from the gateway still find a thread while max_streams responses are in flight.
constexpr int kSpareWorkers = 16;
constexpr size_t kMaxHead = 64 * 1024;
constexpr auto kLinger = seconds(2);  // how long a closing connection's late bytes are read and dropped
constexpr auto kAcceptRetry = milliseconds(100);  // out of descriptors: when accepting is tried again
constexpr double kBodyGrace = 5;  // seconds a body may take before server.body_min_rate applies

Clock::duration secs(double s) { return duration_cast<Clock::duration>(duration<double>(s)); }

// A whole error response in the OpenAI error shape, for answers the loop gives by itself.
std::string error_response(int status, std::string_view code, std::string_view message, int retry_after_s) {
    std::string body = http::error_body(status >= 500 ? "server_error" : "invalid_request_error", message, {}, code);
    std::string r = "HTTP/1.1 " + std::to_string(status) + " " +
                    Poco::Net::HTTPResponse::getReasonForStatus(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(status)) +
                    "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    if (retry_after_s > 0) r += "Retry-After: " + std::to_string(retry_after_s) + "\r\n";
    r += "Connection: close\r\n\r\n";
    return r + body;
}

metrics::Counter& refused(const char* reason) {
    return metrics::global().counter("pulse_http_refusals_total", "requests answered by the HTTP front end itself (load shedding, bad or slow requests)",
                                     {{"reason", reason}});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Exchange

Exchange::Exchange(int fd, Poco::Net::SocketAddress peer, Poco::Net::HTTPRequest head, std::string body, double send_timeout_s, bool draining)
    : fd_(fd), peer_(std::move(peer)), head_(std::move(head)), body_(std::move(body)), out_(fd, secs(send_timeout_s)) {
    http10_ = head_.getVersion() == Poco::Net::HTTPMessage::HTTP_1_0;
    keep_alive_ = !http10_ && !draining && Poco::icompare(head_.get("Connection", ""), "close") != 0;
}

void Exchange::head(std::string& wire, int status, const Headers& extra) {
    responded_ = true;
    wire += "HTTP/1.1 ";
    wire += std::to_string(status);
    wire += ' ';
    wire += Poco::Net::HTTPResponse::getReasonForStatus(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(status));
    wire += "\r\n";
    for (const auto& [k, v] : extra) wire += k + ": " + v + "\r\n";
    if (!keep_alive_) wire += "Connection: close\r\n";
}

void Exchange::respond(int status, std::string_view content_type, std::string_view body, const Headers& extra) {
    std::string wire;
    head(wire, status, extra);
    wire += "Content-Type: ";
    wire += content_type;
    wire += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
    if (head_.getMethod() != "HEAD") wire += body;
    out_.send(wire);
}

void Exchange::stream_head(std::string& wire, std::string_view content_type, const Headers& extra) {
    // HTTP/1.0 has no chunked coding: the body is delimited by closing the connection.
    if (http10_) keep_alive_ = false;
    head(wire, 200, extra);
    wire += "Content-Type: ";
    wire += content_type;
    wire += http10_ ? "\r\n\r\n" : "\r\nTransfer-Encoding: chunked\r\n\r\n";
}

void Exchange::frame(std::string& wire, std::string_view payload) const {
    if (payload.empty()) return;  // an empty chunk would end the body
    if (!http10_) {
        char size[24];  // the chunk size in hex, then CRLF (a formatter here: snprintf showed in profiles)
        char* p = size + sizeof size;
        *--p = '\n';
        *--p = '\r';
        size_t v = payload.size();
        do {
            *--p = "0123456789abcdef"[v & 15];
            v >>= 4;
        } while (v);
        wire.append(p, static_cast<size_t>(size + sizeof size - p));
    }
    wire += payload;
    if (!http10_) wire += "\r\n";
}

void Exchange::stream_end(std::string& wire) const {
    if (!http10_) wire += "0\r\n\r\n";
}

size_t Outbox::write_some(const char* p, size_t n) {
    size_t off = 0;
    while (off < n) {
        ssize_t w = ::send(fd_, p + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            off += static_cast<size_t>(w);
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        } else if (!(w < 0 && errno == EINTR)) {
            lost_ = true;
            break;
        }
    }
    return off;
}

void Outbox::send(std::string_view bytes) {
    if (lost_ || bytes.empty()) {
        pump();
        return;
    }
    if (unsent() > 0) {
        buf_.append(bytes);
        pump();
        return;
    }
    // Nothing waits: straight from the caller's bytes; only what the socket leaves is copied
    // (a stream that keeps up never holds a buffer of its own).
    const size_t n = write_some(bytes.data(), bytes.size());
    if (lost_ || n == bytes.size()) return;
    buf_.assign(bytes.substr(n));
    off_ = 0;
    stalled_ = Clock::now();  // the send timeout starts when bytes begin to wait
}

size_t Outbox::pump() {
    if (lost_ || unsent() == 0) return unsent();
    const size_t n = write_some(buf_.data() + off_, unsent());
    if (lost_) return unsent();
    off_ += n;
    const auto now = Clock::now();
    if (n > 0) stalled_ = now;  // the timeout counts from the last byte the client took
    if (off_ == buf_.size()) {
        if (buf_.capacity() > (1u << 16)) std::string().swap(buf_);  // a burst's buffer is not kept
        buf_.clear();
        off_ = 0;
    } else if (now - stalled_ >= timeout_) {
        lost_ = true;
    } else if (off_ > (1u << 16) && off_ * 2 > buf_.size()) {  // keep the queue from growing at its front
        buf_.erase(0, off_);
        off_ = 0;
    }
    return unsent();
}

bool Exchange::wait_client_gone(Clock::time_point until, int wake_fd) const {
    // Not POLLIN: a pipelined next request is not a hang-up.
    pollfd p[2] = {{fd_, POLLRDHUP, 0}, {wake_fd, POLLIN, 0}};
    const int timeout = until == Clock::time_point::min() ? 0 : timeout_ms(until, Clock::now());
    return ::poll(p, wake_fd < 0 ? 1 : 2, timeout) > 0 && (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR));
}

// ---------------------------------------------------------------------------------------------
// The accept loop and the workers

namespace {

// One client connection while the loop owns it (between requests, or closing), or a worker
// (serving a request). Closed when destroyed.
struct Conn {
    Conn() = default;
    Conn(const Conn&) = delete;
    Conn& operator=(const Conn&) = delete;
    ~Conn() {
        if (fd >= 0) ::close(fd);
    }
    int fd = -1;
    Poco::Net::SocketAddress peer;
    // sending: the accept loop sends what the client had not taken of the last answer, then
    // reads the next request (keep_after) or lingers.
    enum class State { idle, head, body, sending, linger } state = State::idle;
    Clock::time_point deadline;
    std::string in;       // received, not yet consumed (a head being read, or pipelined bytes)
    size_t scanned = 0;   // how far `in` was searched for the head's end
    std::optional<Poco::Net::HTTPRequest> req;
    http::BodyDecoder framing{http::Framing::length, 0};
    std::string body;
    int64_t reserved = 0;  // body bytes counted against server.max_body_memory_bytes
    bool chunked = false;
    Clock::time_point body_start;  // when the head before the body was complete
    int64_t body_received = 0;     // body bytes off the wire so far (framing included)
    Outbox out{-1, {}};    // the answer's bytes the client has not taken yet
    bool keep_after = false;
    bool doomed = false;   // closed at the end of this round
};
struct Returned {
    std::unique_ptr<Conn> conn;
    bool keep_alive;
    Outbox out;  // what the client had not taken when the handler returned
};

}  // namespace

class HttpServer::Loop {
public:
    Loop(const config::Server& cfg, const Handler& handler)
        : cfg_(cfg), handler_(handler), max_workers_(static_cast<int>(cfg.max_streams) + kSpareWorkers),
          // Twice the requests: a worker that handed its connection back still counts in the
          // pool until its task returns, and the loop may already have given that connection's
          // next request to another worker.
          workers_({"pulse-worker", 2 * max_workers_}) {}

    ~Loop() { stop(); }

    void start() {
        raise_fd_limit();
        listen_fd_ = bind_and_listen();
        ep_ = ::epoll_create1(EPOLL_CLOEXEC);
        if (ep_ < 0) throw std::runtime_error(std::string("http server: ") + std::strerror(errno));
        watch(listen_fd_, EPOLLIN, EPOLL_CTL_ADD);
        watch(wake_.fd(), EPOLLIN, EPOLL_CTL_ADD);
        thread_ = std::thread([this] { main(); });
    }

    void drain() {
        draining_ = true;
        wake_.signal();
    }

    void stop() {
        if (!thread_.joinable()) return;
        stopping_ = true;
        wake_.signal();
        thread_.join();
        workers_.stop();  // the requests they have still end (their connections are closed)
        std::lock_guard lock(rm_);
        returned_.clear();  // closed
        ::close(ep_);
    }

    uint16_t port() const { return port_; }

private:
    static void raise_fd_limit() {
        // Every connection costs a descriptor, and load is shed with an answer only while one can
        // be had: take the hard limit, as servers do.
        rlimit r{};
        if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
            r.rlim_cur = r.rlim_max;
            ::setrlimit(RLIMIT_NOFILE, &r);
        }
    }

    int bind_and_listen() {
        const std::string where = cfg_.listen.host + ":" + std::to_string(cfg_.listen.port);
        Poco::Net::SocketAddress addr;
        try {
            addr = Poco::Net::SocketAddress(cfg_.listen.host, static_cast<Poco::UInt16>(cfg_.listen.port));
        } catch (const Poco::Exception& e) {
            throw std::runtime_error("cannot listen on " + where + ": " + e.displayText());
        }
        int fd = ::socket(addr.af(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) throw std::runtime_error("cannot listen on " + where + ": " + std::strerror(errno));
        // SO_REUSEADDR for fast restarts, but never SO_REUSEPORT: a second gateway on the same
        // port must fail loudly, not silently share the traffic.
        int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, addr.addr(), addr.length()) != 0 || ::listen(fd, static_cast<int>(std::max<int64_t>(cfg_.queue, 64))) != 0) {
            std::string why = std::strerror(errno);
            ::close(fd);
            throw std::runtime_error("cannot listen on " + where + ": " + why);
        }
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
        port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
        return fd;
    }

    void watch(int fd, uint32_t events, int op) {
        epoll_event ev{};
        ev.events = events;
        ev.data.fd = fd;
        ::epoll_ctl(ep_, op, fd, &ev);
    }

    void main() {
        ::pthread_setname_np(::pthread_self(), "pulse-accept");
        epoll_event evs[256];
        std::vector<int> due;
        while (!stopping_) {
            int n = ::epoll_wait(ep_, evs, 256, timers_.wait_ms(Clock::now()));
            for (int i = 0; i < n; ++i) {
                int fd = evs[i].data.fd;
                if (fd == listen_fd_) {
                    accept_all();
                } else if (fd == wake_.fd()) {
                    wake_.clear();
                    take_returned();
                } else if (Conn* c = owned(fd)) {
                    if (c->state == Conn::State::sending)
                        on_writable(*c, evs[i].events);
                    else
                        on_readable(*c);
                }
            }
            due.clear();
            timers_.take_due(Clock::now(), due);
            for (int fd : due) on_alarm(fd);
            for (int fd : doomed_) close_now(fd);
            doomed_.clear();
        }
        ::close(listen_fd_);
        conns_.clear();  // closed
    }

    void accept_all() {
        for (int i = 0; i < 256; ++i) {
            sockaddr_storage ss{};
            socklen_t len = sizeof ss;
            int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                    // Out of descriptors: the connection waits in the kernel's queue (not reset) until
                    // some close; look again in a moment.
                    if (Clock::now() - last_fd_warning_ > seconds(10)) {
                        last_fd_warning_ = Clock::now();
                        log::warn("http", std::string("cannot accept connections: ") + std::strerror(errno) + " (raise LimitNOFILE)");
                    }
                    watch(listen_fd_, 0, EPOLL_CTL_MOD);
                    timers_.arm(listen_fd_, Clock::now() + kAcceptRetry);
                }
                return;  // EAGAIN: all taken
            }
            int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // SSE events are small and latency-bound
            auto c = std::make_unique<Conn>();
            c->fd = fd;
            c->out = Outbox(fd, secs(cfg_.send_timeout_s));
            c->peer = Poco::Net::SocketAddress(reinterpret_cast<sockaddr*>(&ss), len);
            set_deadline(*c, Clock::now() + secs(cfg_.header_timeout_s));  // the first request must come soon
            watch(fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
            conns_[fd] = std::move(c);
            connections_.add(1);
        }
    }

    // The loop still owns connection `fd` (a dispatch hands it to a worker).
    Conn* owned(int fd) {
        auto it = conns_.find(fd);
        return it == conns_.end() || it->second->doomed ? nullptr : it->second.get();
    }

    void doom(Conn& c) {
        if (c.doomed) return;
        c.doomed = true;
        doomed_.push_back(c.fd);
    }

    void on_readable(Conn& conn) {
        const int fd = conn.fd;
        char buf[65536];
        for (int i = 0; i < 16; ++i) {
            Conn* c = owned(fd);
            if (!c) return;
            ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n > 0) {
                if (c->state != Conn::State::linger) consume(*c, std::string_view(buf, static_cast<size_t>(n)));
                if (static_cast<size_t>(n) < sizeof buf) return;
            } else if (n == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
                doom(*c);  // the client closed (or the socket failed): nothing to answer
                return;
            } else if (errno != EINTR) {
                return;
            }
        }
    }

    // New bytes for a connection that is between requests or reading one. May hand `c` to a
    // worker: the caller looks it up again (owned()) before touching it.
    void consume(Conn& c, std::string_view bytes) {
        if (c.state == Conn::State::body) return read_body(c, bytes);
        c.in.append(bytes);
        parse_pending(c);
    }

    // Looks for a complete head in `in` and moves on to the body or dispatch.
    void parse_pending(Conn& c) {
        if (c.in.empty()) return;
        if (c.state == Conn::State::idle) {
            c.state = Conn::State::head;
            set_deadline(c, Clock::now() + secs(cfg_.header_timeout_s));
        }
        const HeadScan scan = scan_request_head(c.in, c.scanned);
        if (scan.state == HeadScan::State::bad_line_ending)
            return refuse(c, 400, "bad_request", "malformed HTTP request head: lines must end with CRLF (a bare LF or CR was sent)", 0,
                          "bad_request");
        if (scan.state == HeadScan::State::incomplete) {
            c.scanned = scan.scanned;
            if (c.in.size() > kMaxHead) refuse(c, 431, "request_header_too_large", "the request head is over 64 KiB", 0, "head_too_large");
            return;
        }
        RequestHead head;
        if (auto e = parse_request_head(std::string_view(c.in).substr(scan.start, scan.end - scan.start), head)) {
            const char* code = e->status == 505 ? "http_version_not_supported" : e->status == 501 ? "not_implemented"
                               : e->status == 431                              ? "request_header_too_large"
                                                                               : "bad_request";
            return refuse(c, e->status, code, "malformed HTTP request head: " + e->message, 0, e->status == 431 ? "head_too_large" : "bad_request");
        }
        c.in.erase(0, scan.end);
        c.scanned = 0;
        Poco::Net::HTTPRequest req(head.method, head.target, head.version);
        for (auto& [name, value] : head.fields) req.add(name, value);
        const bool chunked = head.body == RequestHead::Body::chunked;
        const int64_t length = head.body == RequestHead::Body::length ? head.length : 0;
        if (length > cfg_.max_body_bytes)
            return refuse(c, 413, "request_too_large",
                          "request body of " + std::to_string(length) + " bytes is over the limit of " + std::to_string(cfg_.max_body_bytes) +
                              " bytes (server.max_body_bytes)",
                          0, "too_large");
        c.req = std::move(req);
        c.body.clear();
        c.reserved = 0;
        c.chunked = chunked;
        if (!chunked && length == 0) return dispatch(c);
        if (chunked) {
            c.framing = http::BodyDecoder(http::Framing::chunked, 0, /*strict=*/true);
        } else {
            c.framing = http::BodyDecoder(http::Framing::length, length);
            // One allocation of exactly the body's size, not yet touched: pages become resident,
            // and count against the budget, as bytes arrive. Address space is not unlimited
            // (thousands of senders each declaring 32 MiB): when it runs out, a 503 as for memory.
            try {
                c.body.reserve(static_cast<size_t>(length));
            } catch (const std::bad_alloc&) {
                return refuse(c, 503, "server_busy", "the gateway cannot hold another request body now; retry shortly", 1, "body_memory");
            }
        }
        if (Poco::icompare(c.req->get("Expect", ""), "100-continue") == 0 && c.in.empty()) {
            c.out.send("HTTP/1.1 100 Continue\r\n\r\n");  // 25 bytes into an idle socket: taken now
        }
        c.state = Conn::State::body;
        c.body_start = Clock::now();
        c.body_received = 0;
        set_deadline(c, body_deadline(c));
        std::string rest;
        rest.swap(c.in);
        if (!rest.empty()) read_body(c, rest);
    }

    // Counts `n` more body bytes against the memory budget; refuses the request when it is spent.
    bool reserve(Conn& c, int64_t n) {
        if (body_bytes_.load() + n > cfg_.max_body_memory_bytes && n > 0) {
            refuse(c, 503, "server_busy",
                   "the gateway is holding its limit of request-body memory (server.max_body_memory_bytes); retry shortly", 1, "body_memory");
            return false;
        }
        body_bytes_ += n;
        c.reserved += n;
        return true;
    }

    void release(Conn& c) {
        body_bytes_ -= c.reserved;
        c.reserved = 0;
    }

    // When a body being read is given up: body_timeout_s after its head, or sooner while it
    // arrives slower than body_min_rate (after a grace period). A deadline that moved with every
    // byte let one byte per timeout hold a connection, and its memory, forever.
    Clock::time_point body_deadline(const Conn& c) const {
        double allowed = cfg_.body_timeout_s;
        if (cfg_.body_min_rate > 0)
            allowed = std::min(allowed, kBodyGrace + static_cast<double>(c.body_received) / static_cast<double>(cfg_.body_min_rate));
        return c.body_start + secs(allowed);
    }

    void read_body(Conn& c, std::string_view bytes) {
        size_t used = 0;
        if (!c.framing.feed(bytes, c.body, &used))
            return refuse(c, 400, "bad_request", "malformed request body: " + c.framing.error(), 0, "bad_request");
        c.body_received += static_cast<int64_t>(used);
        if (c.chunked && static_cast<int64_t>(c.body.size()) > cfg_.max_body_bytes)
            return refuse(c, 413, "request_too_large",
                          "request body is over the limit of " + std::to_string(cfg_.max_body_bytes) + " bytes (server.max_body_bytes)", 0,
                          "too_large");
        // The budget counts what arrived, not what was declared: a sender that declared 32 MiB
        // and sent a byte holds a byte.
        if (int64_t grown = static_cast<int64_t>(c.body.size()) - c.reserved; grown > 0 && !reserve(c, grown)) return;
        set_deadline(c, body_deadline(c));
        if (!c.framing.complete()) return;
        c.in.assign(bytes.substr(used));  // the next (pipelined) request's first bytes
        dispatch(c);
    }

    // A complete request: to a worker, or answered here when none may take it. (Only this
    // thread submits, so a worker free now is free at submit().)
    void dispatch(Conn& c) {
        if (draining_) return refuse(c, 503, "draining", "the gateway is shutting down; retry shortly", 1, "draining");
        if (serving_.load() >= max_workers_)
            return refuse(c, 503, "at_capacity",
                          "the gateway is at capacity (" + std::to_string(max_workers_) + " requests in flight); retry shortly", 1, "at_capacity");
        const int fd = c.fd;
        watch(fd, 0, EPOLL_CTL_DEL);
        timers_.disarm(fd);
        auto it = conns_.find(fd);
        ++serving_;
        if (!workers_.submit([this, conn = std::move(it->second)]() mutable { serve(std::move(conn)); })) {
            // Not while the loop runs (the pool has room for every request and stops after the
            // loop): the connection was closed with the refused task.
            --serving_;
            connections_.add(-1);
            log::error("http", "the worker pool refused a request: connection closed");
        }
        conns_.erase(it);
    }

    // Answers from the loop, then closes gracefully.
    void refuse(Conn& c, int status, std::string_view code, const std::string& message, int retry_after_s, const char* reason) {
        refused(reason).add();
        release(c);
        c.body.clear();
        c.body.shrink_to_fit();
        c.req.reset();
        c.out.send(error_response(status, code, message, retry_after_s));
        send_rest(c, false);
    }

    // Sends the rest of an answer, then reads the next request (`keep`) or lingers. While
    // bytes wait, the connection is watched for writability; a closing one is also read (and
    // what it sends dropped), so a client still sending its body cannot stall on a full window.
    void send_rest(Conn& c, bool keep) {
        if (c.out.pump() == 0 && !c.out.lost()) return after_send(c, keep);
        if (c.out.lost()) return unfinished(c);
        c.state = Conn::State::sending;
        c.keep_after = keep;
        set_deadline(c, c.out.deadline());
        watch(c.fd, keep ? EPOLLOUT : EPOLLOUT | EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
    }

    void after_send(Conn& c, bool keep) {
        c.out = Outbox(c.fd, secs(cfg_.send_timeout_s));  // an idle connection holds no answer's buffer
        if (!keep || draining_) return linger(c);
        if (c.state == Conn::State::sending) watch(c.fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
        c.state = Conn::State::idle;
        set_deadline(c, Clock::now() + secs(cfg_.idle_timeout_s));
        parse_pending(c);  // a pipelined request already read
    }

    void on_writable(Conn& c, uint32_t events) {
        if (events & (EPOLLIN | EPOLLRDHUP)) {
            char buf[4096];
            ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n == 0) watch(c.fd, EPOLLOUT, EPOLL_CTL_MOD);  // half-closed: it may still read the answer
        }
        if (c.out.pump() == 0 && !c.out.lost()) return after_send(c, c.keep_after);
        if (c.out.lost()) return unfinished(c);
        set_deadline(c, c.out.deadline());
    }

    // The client stopped taking its answer (or its socket failed) after the handler was done.
    void unfinished(Conn& c) {
        unfinished_.add();
        log::info("http", "client " + c.peer.toString() + " did not take the last " + std::to_string(c.out.unsent()) +
                               " bytes of its answer within server.send_timeout_s: connection closed");
        doom(c);
    }

    // Half-closes and drops whatever the client still sends for a moment, so the answer is read
    // instead of being destroyed by an RST (which closing with unread bytes would send).
    void linger(Conn& c) {
        release(c);
        if (c.state == Conn::State::sending) watch(c.fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
        ::shutdown(c.fd, SHUT_WR);
        c.state = Conn::State::linger;
        set_deadline(c, Clock::now() + kLinger);
        c.in.clear();
        c.body.clear();
        c.body.shrink_to_fit();
        c.req.reset();
    }

    void close_now(int fd) {
        auto it = conns_.find(fd);
        if (it == conns_.end()) return;
        release(*it->second);
        watch(fd, 0, EPOLL_CTL_DEL);
        timers_.disarm(fd);
        conns_.erase(it);  // closed
        connections_.add(-1);
    }

    // When a connection's time is up (idle, lingering, a stalled send, a slow request), or
    // accepting may be tried again.
    void set_deadline(Conn& c, Clock::time_point at) {
        c.deadline = at;
        timers_.arm(c.fd, at);
    }

    void on_alarm(int fd) {
        if (fd == listen_fd_) return watch(listen_fd_, EPOLLIN, EPOLL_CTL_MOD);
        Conn* c = owned(fd);
        if (!c) return;
        const auto now = Clock::now();
        if (now < c->deadline) return timers_.arm(fd, c->deadline);  // it moved later meanwhile
        expired(*c, now);
    }

    void expired(Conn& c, Clock::time_point now) {
        switch (c.state) {
            case Conn::State::idle:
            case Conn::State::linger: doom(c); break;
            case Conn::State::sending: on_writable(c, 0); break;
            case Conn::State::head:
                refuse(c, 408, "request_timeout",
                       "the request head did not arrive within " + std::to_string(static_cast<int>(cfg_.header_timeout_s)) +
                           " s (server.header_timeout_s)",
                       0, "header_timeout");
                break;
            case Conn::State::body:
                if (now - c.body_start >= secs(cfg_.body_timeout_s))
                    refuse(c, 408, "request_timeout",
                           "the request body did not arrive within " + std::to_string(static_cast<int>(cfg_.body_timeout_s)) +
                               " s (server.body_timeout_s)",
                           0, "body_timeout");
                else
                    refuse(c, 408, "request_timeout",
                           "the request body arrived slower than " + std::to_string(cfg_.body_min_rate) +
                               " bytes/s (server.body_min_rate): " + std::to_string(c.body_received) + " bytes in " +
                               std::to_string(duration_cast<milliseconds>(now - c.body_start).count()) + " ms",
                           0, "body_too_slow");
                break;
        }
    }

    // Connections back from workers: read the next request, or close.
    void take_returned() {
        std::vector<Returned> back;
        {
            std::lock_guard lock(rm_);
            back.swap(returned_);
        }
        for (auto& r : back) {
            std::unique_ptr<Conn> c = std::move(r.conn);
            const int fd = c->fd;
            c->req.reset();
            c->body.clear();
            c->body.shrink_to_fit();
            c->out = std::move(r.out);
            watch(fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
            Conn& slot = *(conns_[fd] = std::move(c));
            if (slot.out.lost()) {
                doom(slot);  // closed, not lingered: the client is gone or stuck
                continue;
            }
            send_rest(slot, r.keep_alive);
        }
    }

    // On a worker: the request's handler, then the connection back to the loop.
    void serve(std::unique_ptr<Conn> conn) {
        Conn& c = *conn;
        bool keep = false;
        std::optional<Outbox> out;
        {
            Exchange ex(c.fd, c.peer, std::move(*c.req), std::move(c.body), cfg_.send_timeout_s, draining_.load());
            try {
                handler_(ex);
            } catch (const std::exception& e) {
                log::error("http", std::string("unhandled exception in request handler: ") + e.what());
            }
            if (!ex.responded() && !ex.lost()) {
                ex.close_after();
                ex.respond(500, "application/json",
                           R"json({"error":{"message":"the gateway failed to answer this request (a bug: see its log)","type":"server_error","param":null,"code":"internal_error"}})json");
            }
            keep = ex.keep_alive();
            out.emplace(std::move(ex).release_out());
            // The body is released here, with the exchange, before the connection goes back.
        }
        release(c);
        // Done before the connection goes back: its next request may be dispatched at once.
        --serving_;
        std::lock_guard lock(rm_);
        if (stopping_) {
            connections_.add(-1);
            return;  // closed
        }
        returned_.push_back({std::move(conn), keep, std::move(*out)});
        wake_.signal();
    }

    const config::Server cfg_;
    const Handler& handler_;
    const int max_workers_;
    int listen_fd_ = -1, ep_ = -1;
    Wakeup wake_;  // workers hand connections back; drain and stop
    uint16_t port_ = 0;
    std::thread thread_;
    std::atomic<bool> stopping_{false}, draining_{false};
    std::atomic<int64_t> body_bytes_{0};
    std::atomic<int> serving_{0};  // requests on workers: dispatched, connection not yet handed back
    metrics::Gauge& connections_ = metrics::global().gauge("pulse_http_connections", "client connections open");
    metrics::Counter& unfinished_ = metrics::global().counter(
        "pulse_http_unfinished_answers_total", "answers whose last bytes the client did not take within server.send_timeout_s after the request was done (connection closed)");

    // Loop-thread state.
    std::unordered_map<int, std::unique_ptr<Conn>> conns_;
    std::vector<int> doomed_;  // closed at the end of this round (events may still name them)
    Deadlines<int> timers_;  // by fd: each connection's deadline; the listening socket's retry
    Clock::time_point last_fd_warning_{};


    // Connections handed back by workers.
    std::mutex rm_;
    std::vector<Returned> returned_;

    WorkerPool workers_;  // last: destroyed first, while what its requests touch still exists
};

HttpServer::HttpServer(const config::Server& cfg, Handler handler) : cfg_(cfg), handler_(std::move(handler)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
    loop_ = std::make_unique<Loop>(cfg_, handler_);
    loop_->start();
}

void HttpServer::drain() {
    if (loop_) loop_->drain();
}

void HttpServer::stop() {
    if (loop_) loop_->stop();
    loop_.reset();
}

uint16_t HttpServer::port() const { return loop_ ? loop_->port() : 0; }

}  // namespace pulse::server
