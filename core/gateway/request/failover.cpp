#include "gateway/request/failover.h"

#include <algorithm>

namespace pulse::gateway {

using namespace std::chrono;

FailoverPlan::FailoverPlan(size_t regular, std::vector<size_t> last_resorts, std::function<std::vector<size_t>()> order, Clock::time_point deadline)
    : regular_(regular), last_resorts_(std::move(last_resorts)), order_of_round_(std::move(order)), deadline_(deadline) {}

FailoverPlan::Step FailoverPlan::next(const Now& now) {
    for (;;) {
        switch (phase_) {
            case Phase::round_start:
                phase_ = Phase::round_order;
                if (!now.regular_healthy) to_last_resort("all_down", Phase::round_order);
                break;
            case Phase::round_order:
                order_ = order_of_round_();
                std::erase_if(order_, [&](size_t i) { return refused_for_good_.count(i) > 0; });
                pos_ = 0;
                if (order_.empty() && !deterministic_error_.empty()) {
                    phase_ = Phase::done;
                    Step s;
                    s.refused_for_good = true;
                    return s;  // the request's own fault: no last resort either
                }
                phase_ = Phase::in_round;
                break;
            case Phase::in_round: {
                if (pos_ < order_.size()) {
                    Step s;
                    s.kind = Step::Kind::attempt;
                    s.endpoint = order_[pos_];
                    s.count = round_ == 0 && pos_ == 0 ? Step::Count::first : pos_ == 0 ? Step::Count::retry : Step::Count::failover;
                    ++pos_;
                    return s;
                }
                ++round_;
                if (refused_for_good_.size() == regular_) {  // settled at the next round's start
                    phase_ = Phase::round_start;
                    break;
                }
                if (now.time >= deadline_) {  // the window is used to its end: the last round started at the deadline
                    phase_ = Phase::rounds_over;
                    break;
                }
                Step s;
                s.kind = Step::Kind::wait;
                s.wait = std::min<Clock::duration>(backoff_, deadline_ - now.time);
                backoff_ = std::min<Clock::duration>(backoff_ * 2, seconds(5));
                phase_ = Phase::round_start;
                return s;
            }
            case Phase::rounds_over:
                phase_ = Phase::done;
                if (now.error_retryable) to_last_resort("window_spent", Phase::done);
                break;
            case Phase::last_resort:
                if (last_resort_pos_ < last_resorts_.size()) return last_resort_step();
                phase_ = after_last_resort_;
                break;
            case Phase::done: return Step{};
        }
    }
}

// The last-resort endpoints are tried next (once per request), then the plan goes on at `then`.
void FailoverPlan::to_last_resort(const char* reason, Phase then) {
    if (tried_last_resort_ || last_resorts_.empty()) return;
    tried_last_resort_ = true;
    last_resort_reason_ = reason;
    last_resort_pos_ = 0;
    after_last_resort_ = then;
    phase_ = Phase::last_resort;
}

FailoverPlan::Step FailoverPlan::last_resort_step() {
    Step s;
    s.kind = Step::Kind::attempt;
    s.endpoint = last_resorts_[last_resort_pos_++];
    s.last_resort = last_resort_reason_;
    return s;
}

void FailoverPlan::attempted(bool another) {
    if (!another) phase_ = Phase::done;
}

bool FailoverPlan::refused_500(size_t endpoint, const std::string& body, const std::string& error) {
    auto [it, first] = refusals_.try_emplace(endpoint, body);
    const bool again = !first && it->second == body;
    it->second = body;
    if (again) {
        refused_for_good_.insert(endpoint);
        deterministic_error_ = "the backend fails this request the same way each time (HTTP 500 twice): " + error;
    }
    return again;
}

}  // namespace pulse::gateway
