// libFuzzer: arbitrary bytes through the HTTP framing code, twice.
// As an upstream response (head, then body): parse_response_head, then BodyDecoder in pieces of
// sizes picked by the first input byte, both as a whole body and with `used` (bytes after the
// body belong to the next message). Invariants: no crash, a complete Content-Length body has
// exactly that many bytes, `used` never exceeds the input.
// As a client request: scan_request_head and the strict parse_request_head the server uses, then
// the body with the strict decoder. Invariants: an accepted head has one framing (never both a
// length and chunked, no Transfer-Encoding in HTTP/1.0), no CR, LF or NUL in any field, at most
// kMaxHeaderFields fields, and a head end the scanner found past its start.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "http/body.h"
#include "http/request_head.h"

namespace {

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
    return true;
}

void fuzz_request(std::string_view in, size_t step) {
    using namespace pulse::http;
    HeadScan scan = scan_request_head(in, 0);
    if (scan.state != HeadScan::State::complete) return;
    if (scan.end <= scan.start || scan.end > in.size()) std::abort();
    RequestHead head;
    if (parse_request_head(in.substr(scan.start, scan.end - scan.start), head)) return;
    if (head.version != "HTTP/1.1" && head.version != "HTTP/1.0") std::abort();
    if (head.fields.size() > kMaxHeaderFields || head.length < 0) std::abort();
    bool has_length = false, has_te = false;
    for (const auto& [name, value] : head.fields) {
        for (char c : name + value)
            if (c == '\r' || c == '\n' || c == '\0') std::abort();
        if (iequals(name, "Content-Length")) has_length = true;
        if (iequals(name, "Transfer-Encoding")) has_te = true;
    }
    if (head.body == RequestHead::Body::chunked && (has_length || head.version == "HTTP/1.0")) std::abort();
    if (has_te && head.body != RequestHead::Body::chunked) std::abort();
    using pulse::http::BodyDecoder;
    if (head.body == RequestHead::Body::none) return;
    BodyDecoder d = head.body == RequestHead::Body::chunked ? BodyDecoder(pulse::http::Framing::chunked, 0, true)
                                                            : BodyDecoder(pulse::http::Framing::length, head.length, true);
    std::string body;
    std::string_view rest = in.substr(scan.end);
    for (size_t off = 0; off < rest.size(); off += step) {
        std::string_view piece = rest.substr(off, step);
        size_t used = 0;
        if (!d.feed(piece, body, &used) || d.complete()) break;
        if (used > piece.size()) std::abort();
    }
    if (d.complete() && head.body == RequestHead::Body::length && static_cast<int64_t>(body.size()) != head.length) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace pulse::http;
    if (size < 2) return 0;
    const size_t step = 1 + data[0] % 64;
    std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
    fuzz_request(in, step);
    size_t end = in.find("\r\n\r\n");
    ResponseHead head;
    std::string_view rest = in;
    if (end != std::string_view::npos) {
        if (!parse_response_head(in.substr(0, end), head)) return 0;
        rest = in.substr(end + 4);
    } else {
        head.framing = static_cast<pulse::http::Framing>(data[0] % 3);
        head.length = data[0];
    }
    for (bool with_used : {false, true}) {
        BodyDecoder d = head.decoder();
        std::string body;
        for (size_t off = 0; off < rest.size(); off += step) {
            std::string_view piece = rest.substr(off, step);
            size_t used = 0;
            bool ok = d.feed(piece, body, with_used ? &used : nullptr);
            if (with_used && used > piece.size()) std::abort();
            if (!ok || d.complete()) break;
        }
        if (d.complete() && head.framing == pulse::http::Framing::length && static_cast<int64_t>(body.size()) != head.length) std::abort();
        d.at_eof();
    }
    return 0;
}
