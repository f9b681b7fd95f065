// libFuzzer: arbitrary bytes as an upstream HTTP response (head, then body) through the
// framing code the stream loop and the server share: parse_response_head, then BodyDecoder in
// pieces of sizes picked by the first input byte, both as a whole body and with `used` (the
// request side, where bytes after the body belong to the next request). Invariants: no crash,
// a complete Content-Length body has exactly that many bytes, `used` never exceeds the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/http_body.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace pulse::gateway;
    if (size < 2) return 0;
    const size_t step = 1 + data[0] % 64;
    std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
    size_t end = in.find("\r\n\r\n");
    ResponseHead head;
    std::string_view rest = in;
    if (end != std::string_view::npos) {
        if (!parse_response_head(in.substr(0, end), head)) return 0;
        rest = in.substr(end + 4);
    } else {
        head.framing = static_cast<ResponseHead::Framing>(data[0] % 3);
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
        if (d.complete() && head.framing == ResponseHead::Framing::length && static_cast<int64_t>(body.size()) != head.length) std::abort();
        d.at_eof();
    }
    return 0;
}
