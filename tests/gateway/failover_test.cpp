// The failover rules (core/gateway/request/failover), as a table: each case drives a FailoverPlan with
// a simulated clock and attempt results and checks the exact sequence of steps it gives.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "gateway/request/failover.h"

using pulse::gateway::FailoverPlan;
using namespace std::chrono;
using Step = FailoverPlan::Step;

namespace {

// One step as text: "a0" attempt endpoint 0 (first), "f1" failover to 1, "r0" retry round on
// 0, "L2:all_down" last resort 2, "w250" wait 250 ms, "give_up", "give_up:500x2".
std::string show(const Step& s) {
    switch (s.kind) {
        case Step::Kind::attempt:
            if (s.last_resort) return "L" + std::to_string(s.endpoint) + ":" + s.last_resort;
            return (s.count == Step::Count::first ? "a" : s.count == Step::Count::failover ? "f" : "r") + std::to_string(s.endpoint);
        case Step::Kind::wait: return "w" + std::to_string(duration_cast<milliseconds>(s.wait).count());
        case Step::Kind::give_up: return s.refused_for_good ? "give_up:500x2" : "give_up";
    }
    return "?";
}

struct Case {
    const char* name;
    size_t regular;
    std::vector<size_t> last_resorts;
    int window_ms;
    std::vector<bool> healthy_at_round;  // regular_healthy at each round's start (last value repeats)
    bool retryable;                      // the failures' kind
    std::string served_by;               // the step after which an attempt serves ("" = none does)
    std::string expected;                // the steps, space-separated
};

// Runs a case: every attempt asks for another (a failure) unless it is `served_by`; each wait
// advances the clock by its length; at most 60 steps.
std::string run(const Case& c) {
    auto t = FailoverPlan::Clock::time_point{} + hours(1);
    int round = 0;
    std::vector<size_t> regular;
    for (size_t i = 0; i < c.regular; ++i) regular.push_back(i);
    FailoverPlan plan(c.regular, c.last_resorts, [&] { return regular; }, t + milliseconds(c.window_ms));
    std::ostringstream out;
    for (int n = 0; n < 60; ++n) {
        const bool healthy = c.healthy_at_round.empty() ? true : c.healthy_at_round[std::min<size_t>(round, c.healthy_at_round.size() - 1)];
        Step s = plan.next({t, healthy, c.retryable});
        out << (n ? " " : "") << show(s);
        if (s.kind == Step::Kind::give_up) break;
        if (s.kind == Step::Kind::wait) {
            t += s.wait;
            ++round;
            continue;
        }
        plan.attempted(show(s) != c.served_by);
    }
    return out.str();
}

}  // namespace

TEST_CASE("failover plan: the table") {
    const std::vector<Case> cases = {
        {"the first endpoint serves", 2, {}, 5000, {}, true, "a0", "a0 give_up"},
        {"the second serves after the first failed", 2, {}, 5000, {}, true, "f1", "a0 f1 give_up"},
        {"rounds back off 250, 500, 1000 ms and the last starts at the deadline", 2, {}, 1500, {}, true, "",
         "a0 f1 w250 r0 f1 w500 r0 f1 w750 r0 f1 give_up"},
        {"the wait is clipped to the deadline", 1, {}, 300, {}, true, "", "a0 w250 r0 w50 r0 give_up"},
        {"no window: one round, then the answer", 2, {}, 0, {}, true, "", "a0 f1 give_up"},
        {"the backoff doubles up to 5 s", 1, {}, 20000, {}, true, "",
         "a0 w250 r0 w500 r0 w1000 r0 w2000 r0 w4000 r0 w5000 r0 w5000 r0 w2250 r0 give_up"},
        {"a retry round may serve", 2, {}, 5000, {}, true, "r0", "a0 f1 w250 r0 give_up"},
        {"all regular down at the start: the last resort at once, then the regular round", 2, {2}, 0, {false}, true, "",
         "L2:all_down a0 f1 give_up"},
        {"all down and the last resort serves", 2, {2}, 5000, {false}, true, "L2:all_down", "L2:all_down give_up"},
        {"the last resort is tried once per request", 1, {1}, 600, {false}, true, "", "L1:all_down a0 w250 r0 w350 r0 give_up"},
        {"window spent: the last resort then", 1, {1, 2}, 300, {}, true, "", "a0 w250 r0 w50 r0 L1:window_spent L2:window_spent give_up"},
        {"window spent on an error any server would give: no last resort", 1, {1}, 300, {}, false, "", "a0 w250 r0 w50 r0 give_up"},
        {"down at a later round's start: the last resort then", 1, {1}, 5000, {true, false}, true, "L1:all_down",
         "a0 w250 L1:all_down give_up"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.name);
        CHECK(run(c) == c.expected);
    }
}

TEST_CASE("failover plan: an endpoint that fails this request with the same 500 twice is not asked again") {
    auto t = FailoverPlan::Clock::time_point{} + hours(1);
    FailoverPlan plan(2, {2}, [] { return std::vector<size_t>{0, 1}; }, t + seconds(30));
    auto step = [&] { return show(plan.next({t, true, true})); };
    CHECK(step() == "a0");
    CHECK(!plan.refused_500(0, "boom", "HTTP 500: boom"));  // once: may be a hiccup
    plan.attempted(true);
    CHECK(step() == "f1");
    CHECK(!plan.refused_500(1, "bang", "HTTP 500: bang"));
    plan.attempted(true);
    CHECK(step() == "w250");
    t += milliseconds(250);
    CHECK(step() == "r0");
    CHECK(plan.refused_500(0, "boom", "HTTP 500: boom"));  // the same 500 again: for good
    plan.attempted(true);
    CHECK(step() == "f1");
    CHECK(!plan.refused_500(1, "bang, differently", "HTTP 500: bang, differently"));  // a different body is not the same answer
    plan.attempted(true);
    CHECK(step() == "w500");
    t += milliseconds(500);
    CHECK(step() == "r1");  // endpoint 0 is left out
    CHECK(plan.refused_500(1, "bang, differently", "HTTP 500: bang, differently"));
    plan.attempted(true);
    // Every regular endpoint refused for good: the request's own fault, at once — not the last
    // resort, not the rest of the window.
    CHECK(step() == "give_up:500x2");
    CHECK(plan.deterministic_error() == "the backend fails this request the same way each time (HTTP 500 twice): HTTP 500: bang, differently");
    CHECK(step() == "give_up");
}

TEST_CASE("failover plan: a served or finally failed attempt ends the plan") {
    auto t = FailoverPlan::Clock::time_point{} + hours(1);
    FailoverPlan plan(3, {3}, [] { return std::vector<size_t>{2, 0, 1}; }, t + seconds(30));
    CHECK(show(plan.next({t, true, true})) == "a2");  // routing's order, not the list's
    plan.attempted(false);
    CHECK(show(plan.next({t, true, true})) == "give_up");
    CHECK(show(plan.next({t, false, true})) == "give_up");  // and stays over
}
