// Strict HTTP/1.x request-head parsing (RFC 9112 §2–3, §5–6).
//
// The gateway may sit behind a reverse proxy. Wherever two HTTP parsers disagree on where a
// request ends, one client's bytes can become another's request (request smuggling). So the
// front end accepts only heads whose framing has one reading, and answers anything else with
// an error and a closed connection: a Content-Length that is not plain digits or appears twice,
// whitespace between a field name and its colon, obsolete line folding, control characters in
// a field, a line ending that is not CRLF, a Transfer-Encoding whose final coding is not
// chunked (or any in HTTP/1.0), both framings at once, and no or several Host fields in
// HTTP/1.1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pulse::http {

struct RequestHead {
    std::string method, target, version;  // version: "HTTP/1.0" or "HTTP/1.1"
    std::vector<std::pair<std::string, std::string>> fields;  // in order; values without surrounding whitespace
    enum class Body { none, length, chunked } body = Body::none;
    int64_t length = 0;  // Body::length
};

struct HeadError {
    int status;           // 400, 431, 501 or 505
    std::string message;  // for the client: which rule the head broke
};

// Where a head ends in received bytes. `from` is how far an earlier call already looked.
struct HeadScan {
    enum class State { incomplete, complete, bad_line_ending } state = State::incomplete;
    size_t start = 0;    // the head's first byte (empty lines before a request are skipped)
    size_t end = 0;      // one past the head's final CRLF CRLF (complete)
    size_t scanned = 0;  // pass as `from` next time (incomplete)
};
HeadScan scan_request_head(std::string_view in, size_t from);

// Limits on a head's contents (its total size is the caller's to bound).
constexpr size_t kMaxHeaderFields = 100;

// Parses a complete head, its final CRLF CRLF included. On success `out` holds it.
std::optional<HeadError> parse_request_head(std::string_view head, RequestHead& out);

}  // namespace pulse::http
