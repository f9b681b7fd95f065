// The answer ledger (core/gateway/protocol/answer_ledger) on its own: what an answer spent and
// generated across attempts, and the token record a token-exact resume continues from. The
// black-box resume tests (resume_test.cpp) see its results only through whole responses.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gateway/protocol/answer_ledger.h"

using pulse::gateway::AnswerLedger;

namespace {

pulse_usage_t usage(int64_t in, int64_t cached, int64_t out, int64_t reasoning) {
    return pulse_usage_t{sizeof(pulse_usage_t), in, cached, out, reasoning};
}

void deltas(AnswerLedger& l, int text, int reasoning) {
    for (int i = 0; i < reasoning; ++i) l.delta(true);
    for (int i = 0; i < text; ++i) l.delta(false);
}

}  // namespace

TEST_CASE("one attempt: the backend's usage, with cached and reasoning bounded and unknowns as zero") {
    AnswerLedger l;
    deltas(l, 4, 2);
    l.usage(usage(100, 150, 10, 30));  // cached > input, reasoning > output: a backend's slip
    const auto t = l.totals();
    CHECK(t.reported);
    CHECK(t.input == 100);
    CHECK(t.cached == 100);
    CHECK(t.output == 10);
    CHECK(t.reasoning == 10);

    AnswerLedger llama;  // llama-server counts no reasoning tokens (-1): its reasoning deltas are the count
    deltas(llama, 5, 3);
    llama.usage(usage(-1, -1, 8, -1));
    CHECK(llama.totals().input == 0);
    CHECK(llama.totals().cached == 0);
    CHECK(llama.totals().reasoning == 3);
}

TEST_CASE("an attempt with no usage is counted from its deltas, or exactly from its token record") {
    AnswerLedger l;
    CHECK_FALSE(l.attempt_has_output());
    deltas(l, 6, 2);
    CHECK(l.attempt_has_output());
    CHECK(l.spent().output == 8);
    CHECK(l.spent().reasoning == 2);
    CHECK_FALSE(l.totals().reported);

    AnswerLedger t;  // tokens that make no delta (a held-back partial character) still count
    deltas(t, 2, 0);
    const std::vector<int32_t> ids = {11, 12, 13};
    t.trail(ids.data(), ids.size(), "abc");
    CHECK(t.spent().output == 3);
}

TEST_CASE("a resumed answer: earlier attempts' spending is carried, the new attempt starts from zero") {
    AnswerLedger l;
    deltas(l, 5, 0);  // attempt 1 dies after 5 deltas, no usage
    l.next_attempt();
    CHECK_FALSE(l.attempt_has_output());
    CHECK(l.spent().output == 5);  // the budget the resume may still use is counted against these
    deltas(l, 3, 0);
    CHECK(l.spent().output == 8);
    l.usage(usage(900, 800, 3, 0));  // attempt 2 reports its own
    const auto t = l.totals();
    CHECK(t.output == 8);
    CHECK(t.input == 900);  // attempt 1's input was never reported: unknown, not guessed
    CHECK(t.cached == 800);
    CHECK(t.reported);
}

TEST_CASE("the token record: continued across attempts, lost at a hole, restarted by a fresh stream") {
    std::string why;
    AnswerLedger l;
    CHECK_FALSE(l.record(&why));
    CHECK(why.empty());  // no backend reported one

    const std::vector<int32_t> a = {1, 2}, b = {3};
    deltas(l, 2, 0);
    l.trail(a.data(), a.size(), "xy");
    l.next_attempt();
    deltas(l, 1, 0);
    l.trail(b.data(), b.size(), "z");
    auto r = l.record(&why);
    REQUIRE(r);
    CHECK(r->first == std::vector<int32_t>{1, 2, 3});
    CHECK(r->second == "xyz");

    // An attempt that showed output and reported no record leaves a hole no later report fills.
    l.next_attempt();
    deltas(l, 1, 0);
    CHECK_FALSE(l.record(&why));
    CHECK(why == "an attempt reported no token record");
    l.next_attempt();
    l.trail(b.data(), b.size(), "z");
    why.clear();
    CHECK_FALSE(l.record(&why));
    CHECK(why == "an attempt reported no token record");

    // The first reason a backend gave is the one kept; a fresh stream clears it.
    AnswerLedger m;
    m.trail_lost("the backend skipped tokens");
    m.trail_lost("another reason");
    m.trail(a.data(), a.size(), "xy");
    CHECK_FALSE(m.record(&why));
    CHECK(why == "the backend skipped tokens");
    m.restart_trail();
    m.trail(b.data(), b.size(), "z");
    r = m.record(&why);
    REQUIRE(r);
    CHECK(r->first == std::vector<int32_t>{3});
}
