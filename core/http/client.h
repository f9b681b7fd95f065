// The one blocking HTTP/1.1 client for what Pulse asks of another server outside the streaming
// relay: endpoint probes, preparatory requests, warmup, the http policy's decision service,
// `pulse codex`'s checks and pulse-bench. Each exchange opens a fresh connection: none of
// these callers is hot, and a fresh connection cannot be one the server already closed.
// (The relay's own pooled, non-blocking connections start from session() below.)
//
// Built as a small position-independent library, linked into the host and into the plugins
// that need a client, so there is one set-up of timeouts, one way to read an answer and one
// way to report a transport failure.
#pragma once

#include <cstddef>
#include <istream>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace Poco::Net {
class HTTPClientSession;
}
namespace Poco {
class URI;
}

namespace pulse::http {

using Fields = std::vector<std::pair<std::string, std::string>>;

// Seconds. `receive_s` bounds each wait for bytes, not the whole answer.
struct Timeouts {
    double connect_s = 3, send_s = 30, receive_s = 30;
    static Timeouts all(double s) { return {s, s, s}; }
};

struct Request {
    std::string method = "GET";
    std::string target;             // "/v1/models?x=1"
    std::string_view body;          // sent with Content-Length when the method is not GET/HEAD
    std::string content_type = "application/json";
    Fields fields;                  // extra header fields (Authorization, Accept, ...)
};

struct Answer {
    int status = 0;     // 0: no HTTP answer; `error` says why
    bool timed_out = false;  // that failure was a timeout (connect, send or receive)
    std::string body;   // at most the caller's max_body bytes
    std::string error;
    Fields fields;      // the answer's header fields
    // A header field's value, "" when absent (names compare case-insensitively).
    std::string field(std::string_view name) const;
};

// One whole exchange. `origin` is a URL whose scheme, host and port are used ("http://h:p/v1"
// names the same origin as "http://h:p"); `req.target` is sent as it is.
Answer fetch(const std::string& origin, const Request& req, const Timeouts& t, size_t max_body = size_t(1) << 20);

// An exchange whose body the caller reads at its own pace (an SSE stream).
class Stream {
public:
    ~Stream();
    int status() const { return status_; }
    std::string field(std::string_view name) const;
    std::istream& body() { return *body_; }

private:
    friend std::unique_ptr<Stream> open(const std::string&, const Request&, const Timeouts&, std::string*);
    Stream() = default;
    std::unique_ptr<Poco::Net::HTTPClientSession> session_;
    Fields fields_;
    int status_ = 0;
    std::istream* body_ = nullptr;
};
// nullptr when no HTTP answer came; `error` then says why.
std::unique_ptr<Stream> open(const std::string& origin, const Request& req, const Timeouts& t, std::string* error);

// A session to `origin` with the timeouts set: the one place a POCO client session is made.
std::unique_ptr<Poco::Net::HTTPClientSession> session(const Poco::URI& origin, const Timeouts& t);

// The request target for `path` under the origin URL's own path ("http://h/v1" + "/models").
std::string under(const std::string& origin, std::string_view path);

}  // namespace pulse::http
