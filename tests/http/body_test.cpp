// HTTP/1.1 body framing read in arbitrary pieces (core/http/body): upstream responses and client requests.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "http/body.h"

using pulse::http::BodyDecoder;

namespace {

struct Outcome {
    bool ok = true;
    bool complete = false;
    std::string body, error;
};

// Feeds `raw` split into pieces of `piece` bytes (0 = all at once).
Outcome decode(BodyDecoder d, const std::string& raw, size_t piece = 0) {
    Outcome o;
    if (piece == 0) piece = raw.size() ? raw.size() : 1;
    for (size_t i = 0; i < raw.size() && o.ok; i += piece) o.ok = d.feed(std::string_view(raw).substr(i, piece), o.body);
    o.complete = d.complete();
    o.error = d.error();
    return o;
}

BodyDecoder chunked() { return BodyDecoder(pulse::http::Framing::chunked); }

}  // namespace

TEST_CASE("chunked: the body and its end, whatever the split") {
    // Two chunks (one with an extension), the last chunk and a trailer field.
    const std::string raw = "5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n";
    for (size_t piece = 1; piece <= raw.size(); ++piece) {
        CAPTURE(piece);
        Outcome o = decode(chunked(), raw, piece);
        CHECK(o.ok);
        CHECK(o.complete);
        CHECK(o.body == "hello, world");
    }
}

TEST_CASE("chunked: hex sizes in either case, and a body that has not ended yet") {
    Outcome o = decode(chunked(), "1a\r\n" + std::string(26, 'x') + "\r\nA\r\n" + std::string(10, 'y') + "\r\n");
    CHECK(o.ok);
    CHECK_FALSE(o.complete);
    CHECK(o.body == std::string(26, 'x') + std::string(10, 'y'));
}

TEST_CASE("chunked: malformed framing is an error that names the problem") {
    CHECK(decode(chunked(), "zz\r\n").error == "malformed chunk size line");
    CHECK(decode(chunked(), "3\r\nabcX\r\n").error == "chunk data not followed by CRLF");
    CHECK(decode(chunked(), "3\rabc").error == "chunk size line not ended by CRLF");
    CHECK(decode(chunked(), "ffffffffffffffff\r\n").error == "chunk size too large");
    Outcome after = decode(chunked(), "0\r\n\r\nextra");
    CHECK_FALSE(after.ok);
    CHECK(after.error == "bytes after the end of the body");
    // Once failed, it stays failed.
    BodyDecoder d = chunked();
    std::string out;
    CHECK_FALSE(d.feed("q\r\n", out));
    CHECK_FALSE(d.feed("0\r\n\r\n", out));
    CHECK_FALSE(d.complete());
}

TEST_CASE("chunked, strict (client requests): CRLF only, nothing after a size but an extension") {
    auto strict = [] { return BodyDecoder(pulse::http::Framing::chunked, 0, /*strict=*/true); };
    for (size_t piece : {size_t(0), size_t(1), size_t(3)}) {
        CAPTURE(piece);
        auto ok = decode(strict(), "5;name=value\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n", piece);
        CHECK(ok.ok);
        CHECK(ok.complete);
        CHECK(ok.body == "hello0123456789");
        for (const char* bad : {"5\nhello\r\n0\r\n\r\n", "5\r\nhello\n0\r\n\r\n", "5\r\nhello\r\n0\n\n", "5\r\nhello\r\n0\r\n\n",
                                "5 \r\nhello\r\n0\r\n\r\n", "5\t\r\nhello\r\n0\r\n\r\n", "5;a\nhello\r\n0\r\n\r\n",
                                "5\r\nhello\r\n0\r\nX-T: 1\n\r\n", "5\r\nhello\r\n0\r\nX-T: a\x01\r\n\r\n"}) {
            CAPTURE(bad);
            CHECK_FALSE(decode(strict(), bad, piece).ok);
        }
        // Upstream responses are read as leniently as before: bare LF, whitespace after a size.
        auto lenient = decode(chunked(), "5 \nhello\n0\n\n", piece);
        CHECK(lenient.ok);
        CHECK(lenient.complete);
        CHECK(lenient.body == "hello");
    }
}

TEST_CASE("chunked: EOF is a clean end only after the last chunk") {
    BodyDecoder d = chunked();
    std::string out;
    CHECK(d.feed("3\r\nabc\r\n", out));
    CHECK_FALSE(d.at_eof());
    BodyDecoder e = chunked();
    CHECK(e.feed("0\r\n\r\n", out));
    CHECK(e.at_eof());
}

TEST_CASE("Content-Length: exactly that many bytes; more is an error") {
    Outcome o = decode(BodyDecoder(pulse::http::Framing::length, 5), "hello", 2);
    CHECK(o.ok);
    CHECK(o.complete);
    CHECK(o.body == "hello");
    CHECK(decode(BodyDecoder(pulse::http::Framing::length, 0), "").complete);
    Outcome over = decode(BodyDecoder(pulse::http::Framing::length, 3), "hello");
    CHECK_FALSE(over.ok);
    CHECK(over.error == "more bytes than the Content-Length");
    BodyDecoder short_body(pulse::http::Framing::length, 10);
    std::string out;
    CHECK(short_body.feed("abc", out));
    CHECK_FALSE(short_body.at_eof());  // closed before Content-Length bytes: not a clean end
}

TEST_CASE("no framing header: the body runs to the connection's close") {
    BodyDecoder d(pulse::http::Framing::until_close);
    std::string out;
    CHECK(d.feed("data: x\n\n", out));
    CHECK_FALSE(d.complete());
    CHECK(d.at_eof());
    CHECK(d.complete());
    CHECK(out == "data: x\n\n");
}
