// The strict request-head parser (core/http/request_head.h): every framing a front proxy
// could read another way is refused, and what real clients send is read exactly.
#include <doctest/doctest.h>

#include "http/request_head.h"

using namespace pulse::http;

namespace {

std::optional<HeadError> parse(const std::string& head, RequestHead* out = nullptr) {
    RequestHead h;
    auto e = parse_request_head(head, h);
    if (out) *out = h;
    return e;
}

int status_of(const std::string& head) {
    auto e = parse(head);
    return e ? e->status : 0;
}

const std::string kPost = "POST /v1/responses HTTP/1.1\r\nHost: x\r\n";

}  // namespace

TEST_CASE("what real clients send is read exactly") {
    RequestHead h;
    REQUIRE_FALSE(parse(kPost + "Content-Type: application/json\r\nContent-Length: 44\r\n\r\n", &h));
    CHECK(h.method == "POST");
    CHECK(h.target == "/v1/responses");
    CHECK(h.version == "HTTP/1.1");
    CHECK(h.body == RequestHead::Body::length);
    CHECK(h.length == 44);
    REQUIRE(h.fields.size() == 3);
    CHECK(h.fields[1].first == "Content-Type");
    CHECK(h.fields[1].second == "application/json");

    REQUIRE_FALSE(parse(kPost + "transfer-encoding: Chunked\r\n\r\n", &h));
    CHECK(h.body == RequestHead::Body::chunked);
    REQUIRE_FALSE(parse("GET /health HTTP/1.0\r\n\r\n", &h));  // HTTP/1.0 needs no Host
    CHECK(h.body == RequestHead::Body::none);
    REQUIRE_FALSE(parse(kPost + "Content-Length: 0\r\n\r\n", &h));
    CHECK(h.body == RequestHead::Body::none);
    // Optional whitespace around a value is not part of it; obs-text in a value is allowed.
    REQUIRE_FALSE(parse(kPost + "Content-Length: \t7 \r\nX-Name:  caf\xc3\xa9 \r\n\r\n", &h));
    CHECK(h.length == 7);
    CHECK(h.fields.back().second == "caf\xc3\xa9");
}

TEST_CASE("Content-Length: digits only, once") {
    CHECK(status_of(kPost + "Content-Length: 0\r\nContent-Length: 44\r\n\r\n") == 400);  // the first used to win
    CHECK(status_of(kPost + "Content-Length: 44\r\nContent-Length: 44\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Content-Length: 44, 44\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Content-Length: +59\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Content-Length: -1\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Content-Length: 0x2c\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Content-Length: 4 4\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Content-Length:\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Content-Length: 99999999999999999999\r\n\r\n") == 400);
    CHECK(parse(kPost + "Content-Length: +59\r\n\r\n")->message.find("digits only") != std::string::npos);
}

TEST_CASE("field names: a token right before the colon") {
    CHECK(status_of(kPost + "Transfer-Encoding : chunked\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Content-Length : 52\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Content-Length\t: 52\r\n\r\n") == 400);
    CHECK(status_of(kPost + ": value\r\n\r\n") == 400);
    CHECK(status_of(kPost + "No colon here\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Bad[name]: x\r\n\r\n") == 400);
    CHECK(parse(kPost + "Content-Length : 52\r\n\r\n")->message.find("whitespace between a header name and its colon") != std::string::npos);
}

TEST_CASE("Transfer-Encoding: chunked, final, once; never with Content-Length or in HTTP/1.0") {
    CHECK(status_of(kPost + "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n") == 400);  // only the first used to be read
    CHECK(status_of(kPost + "Transfer-Encoding: chunked, identity\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Transfer-Encoding: identity\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Transfer-Encoding: chunked, chunked\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Transfer-Encoding: ,\r\n\r\n") == 400);
    CHECK(status_of(kPost + "Transfer-Encoding:\r\n\r\n") == 400);
    RequestHead h;  // empty list elements are ignored (RFC 9110 §5.6.1)
    REQUIRE_FALSE(parse(kPost + "Transfer-Encoding: , chunked\r\n\r\n", &h));
    CHECK(h.body == RequestHead::Body::chunked);
    CHECK(status_of(kPost + "Transfer-Encoding: gzip, chunked\r\n\r\n") == 501);
    CHECK(status_of(kPost + "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n") == 501);
    CHECK(status_of(kPost + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n") == 400);
    CHECK(status_of("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n") == 400);
}

TEST_CASE("no folding, no control characters, no bare line ends inside a head") {
    CHECK(status_of(kPost + "X-A: one\r\n two\r\n\r\n") == 400);  // obs-fold
    CHECK(status_of(kPost + "X-A: one\r\n\ttwo\r\n\r\n") == 400);
    CHECK(status_of(kPost + std::string("X-A: o\0ne\r\n\r\n", 13)) == 400);
    CHECK(status_of(kPost + "X-A: one\x7f\r\n\r\n") == 400);
    CHECK(status_of(kPost + "X-A: one\ntwo\r\n\r\n") == 400);
    CHECK(status_of(kPost + "X-A: one\rtwo\r\n\r\n") == 400);
    CHECK(parse(kPost + "X-A: one\r\n two\r\n\r\n")->message.find("obsolete line folding") != std::string::npos);
}

TEST_CASE("the request line: single spaces, a token, a visible target, HTTP/1.x") {
    CHECK(status_of("POST  /v1/responses HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("POST /v1/responses  HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("POST /v1/responses HTTP/1.1 \r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("POST\t/v1/responses HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("PO(ST / HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("GET /a\x01 HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/2.0\r\nHost: x\r\n\r\n") == 505);
    CHECK(status_of("GET / HTTP/1.1x\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("GET / http/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("GET /\r\n\r\n") == 400);
}

TEST_CASE("HTTP/1.1 needs exactly one Host") {
    CHECK(status_of("GET / HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") == 400);
}

TEST_CASE("too many fields is a 431") {
    std::string h = kPost;
    for (size_t i = 0; i < kMaxHeaderFields; ++i) h += "X-" + std::to_string(i) + ": v\r\n";
    CHECK(status_of(h + "\r\n") == 431);
}

TEST_CASE("finding the end of a head: CRLF only, a bare LF or CR is an error at once") {
    auto state = [](std::string_view in) { return scan_request_head(in, 0).state; };
    using S = HeadScan::State;
    CHECK(state("GET / HTTP/1.1\nHost: x\n\n") == S::bad_line_ending);  // used to wait for header_timeout_s
    CHECK(state("GET / HTTP/1.1\n") == S::bad_line_ending);
    CHECK(state("GET / HTTP/1.1\rHost") == S::bad_line_ending);
    CHECK(state("GET / HTTP/1.1\r") == S::incomplete);
    CHECK(state("GET / HTTP/1.1\r\nHost: x\r\n") == S::incomplete);
    auto s = scan_request_head("\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\nBODY", 0);  // empty lines before a request are skipped
    REQUIRE(s.state == S::complete);
    CHECK(s.start == 4);
    CHECK(s.end == 4 + std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n").size());
    // Resumed from where the last call stopped, including across a CR at the end.
    std::string in = "GET / HTTP/1.1\r\nHost: x\r";
    auto first = scan_request_head(in, 0);
    CHECK(first.state == S::incomplete);
    in += "\n\r\n";
    auto second = scan_request_head(in, first.scanned);
    CHECK(second.state == S::complete);
    CHECK(second.end == in.size());
    in = "GET / HTTP/1.1\r\nHost: x\r";
    first = scan_request_head(in, 0);
    in += "X";
    CHECK(scan_request_head(in, first.scanned).state == S::bad_line_ending);
}
