// The upstream SSE parser (core/gateway/protocol/sse.h), fed every way a socket can split a stream.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "gateway/protocol/sse.h"

using pulse::gateway::SseParser;

namespace {

struct Event {
    std::string name, data;
    bool operator==(const Event& o) const { return name == o.name && data == o.data; }
};

// Feeds `raw` in pieces of `piece` bytes (0 = all at once).
std::vector<Event> parse(const std::string& raw, size_t piece = 0, bool* overflowed = nullptr) {
    SseParser p;
    std::vector<Event> out;
    if (piece == 0) piece = raw.size() ? raw.size() : 1;
    for (size_t i = 0; i < raw.size(); i += piece)
        p.feed(std::string_view(raw).substr(i, piece), [&](std::string_view n, std::string_view d) { out.push_back({std::string(n), std::string(d)}); });
    if (overflowed) *overflowed = p.overflowed();
    return out;
}

}  // namespace

TEST_CASE("events, whatever the split, with LF, CRLF and CR line ends") {
    const std::vector<Event> want = {{"", "{\"a\":1}"}, {"delta", "x\ny"}, {"", "[DONE]"}};
    for (std::string eol : {"\n", "\r\n", "\r"}) {
        const std::string raw = "data: {\"a\":1}" + eol + eol +                          // plain
                                ": a comment" + eol + "event: delta" + eol + "data:x" + eol + "data: y" + eol + eol +  // two data lines
                                "data: [DONE]" + eol + eol;
        for (size_t piece = 0; piece <= raw.size(); ++piece) {
            CAPTURE(eol.size());
            CAPTURE(piece);
            CHECK(parse(raw, piece) == want);
        }
    }
}

TEST_CASE("an event is dispatched only by its blank line; a field without a colon is ignored") {
    CHECK(parse("data: a\n").empty());
    CHECK(parse("data: a\nretry\n\n") == std::vector<Event>{{"", "a"}});
    CHECK(parse("\n\n:only a comment\n\n").empty());  // blank lines with no data dispatch nothing
    // Only one space after the colon is dropped; the event name resets after each event.
    CHECK(parse("event: e\ndata:  two\n\ndata: next\n\n") == std::vector<Event>{{"e", " two"}, {"", "next"}});
}

TEST_CASE("a CR at the end of one feed and its LF at the start of the next make one line end") {
    SseParser p;
    std::vector<std::string> got;
    auto on = [&](std::string_view, std::string_view d) { got.emplace_back(d); };
    p.feed("data: a\r", on);
    p.feed("\n\r", on);
    p.feed("\ndata: b\r\n\r\n", on);
    CHECK(got == std::vector<std::string>{"a", "b"});
}

TEST_CASE("a line over the limit marks the stream broken") {
    bool over = false;
    std::string big = "data: " + std::string(SseParser::kMaxLine, 'x');
    parse(big.substr(0, 1000), 0, &over);
    CHECK_FALSE(over);
    parse(big, 1 << 20, &over);  // split: the limit holds across feeds
    CHECK(over);
    parse(big + "\n\n", 0, &over);  // whole: the limit holds within one feed too
    CHECK(over);
}
