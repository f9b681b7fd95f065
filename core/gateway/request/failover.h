// The failover rules of one request, with no I/O: which endpoint it tries next, when it waits
// before another round, when it goes to a last-resort endpoint, and when it gives up. The
// request's driver asks next(), runs the step (an attempt, a wait) and reports how it went;
// everything it decides from is passed in, so the rules are tested as a table of cases
// (tests/gateway/failover_test.cpp).
//
// The rules (docs/OPERATIONS.md, "Failover"):
//  - a round tries the model's regular endpoints in the order routing gives (healthy first);
//  - a round in which every endpoint asked for another waits (250 ms, doubling, at most 5 s)
//    and starts again, while the retry window lasts; the last round starts at its deadline;
//  - when every regular endpoint is known to be down at a round's start, the last-resort
//    endpoints serve at once (once per request); when the window is spent and the last
//    error was one another server might not give, they serve then;
//  - an endpoint that failed this very request with the same HTTP 500 twice is not asked
//    again; when none is left for that reason the request's own fault is the answer (no last
//    resort either).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace pulse::gateway {

class FailoverPlan {
public:
    using Clock = std::chrono::steady_clock;

    struct Step {
        enum class Kind { attempt, wait, give_up } kind = Kind::give_up;
        size_t endpoint = 0;    // attempt: the endpoint's index in the model's list
        Clock::duration wait{};  // wait: how long before the next round
        // attempt: what it is, for the metrics: the first try, another endpoint in the same
        // round (failover), or a new round's first (retry).
        enum class Count { first, failover, retry } count = Count::first;
        const char* last_resort = nullptr;  // attempt on a last-resort endpoint: why ("all_down", "window_spent")
        bool refused_for_good = false;      // give_up: every endpoint left failed this request the same way twice
    };

    // What the driver knows when it asks for the next step.
    struct Now {
        Clock::time_point time;
        bool regular_healthy = true;   // some regular endpoint is up
        bool error_retryable = true;   // the last failure is one another server might not give
    };

    // `regular`: how many regular endpoints the model has; `last_resorts`: the indices of its
    // last-resort endpoints; `order` gives a round's regular endpoints (called once per round).
    FailoverPlan(size_t regular, std::vector<size_t> last_resorts, std::function<std::vector<size_t>()> order, Clock::time_point deadline);

    Step next(const Now& now);
    // How the last attempt ended: `another` when a further endpoint or round may serve the
    // request; otherwise the plan is over (served, or failed for good).
    void attempted(bool another);
    // Endpoint `endpoint` answered this request HTTP 500 with `body` (`error` says so for the
    // client). True when it did so twice the same way: it is not asked again.
    bool refused_500(size_t endpoint, const std::string& body, const std::string& error);
    // The answer when the plan gave up because of repeated 500s.
    const std::string& deterministic_error() const { return deterministic_error_; }
    int round() const { return round_; }

private:
    enum class Phase { round_start, round_order, in_round, rounds_over, last_resort, done };
    Step last_resort_step();
    void to_last_resort(const char* reason, Phase then);

    const size_t regular_;
    const std::vector<size_t> last_resorts_;
    const std::function<std::vector<size_t>()> order_of_round_;
    const Clock::time_point deadline_;

    Phase phase_ = Phase::round_start;
    int round_ = 0;
    std::vector<size_t> order_;
    size_t pos_ = 0;
    Clock::duration backoff_ = std::chrono::milliseconds(250);
    bool tried_last_resort_ = false;
    const char* last_resort_reason_ = nullptr;
    size_t last_resort_pos_ = 0;
    Phase after_last_resort_ = Phase::done;
    std::map<size_t, std::string> refusals_;  // the last HTTP 500 body per endpoint
    std::set<size_t> refused_for_good_;
    std::string deterministic_error_;
};

}  // namespace pulse::gateway
