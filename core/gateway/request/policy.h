// A model's request policy (SDK 1.1, pulse_policy_vt_t; docs/OPERATIONS.md "Policies"): a
// plugin instance consulted once per request, before translation, for the request's reasoning
// budget, reasoning effort and sampling.
//
// The request never waits longer than the model's policy timeout and never fails because of
// its policy: decide() runs on a thread of the policy's bounded worker pool while the request
// waits at most the timeout, and a decision that comes late, an error, or an answer the host
// cannot use leave the request as the client sent it.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/worker_pool.h"
#include "config/config.h"
#include "plugin/plugin_manager.h"

namespace pulse::gateway {

class Policy {
public:
    // Creates the plugin's instance for `cfg`; throws config::ConfigError with the plugin's
    // message (`where` names the config table).
    Policy(plugin::ComponentLease lease, const config::ModelPolicy& cfg, const std::string& where);
    // Waits for decide calls still running (a bounded time; an instance whose call never
    // returns is left alive rather than destroyed under it).
    ~Policy();
    Policy(const Policy&) = delete;
    Policy& operator=(const Policy&) = delete;

    struct Decision {
        std::optional<int64_t> reasoning_budget;
        std::optional<std::string> effort;
        std::vector<std::pair<std::string, double>> sampling;  // key, value (integers too)
        bool empty() const { return !reasoning_budget && !effort && sampling.empty(); }
    };
    enum class Outcome { applied, unchanged, timeout, error, invalid, busy };
    static const char* name(Outcome o);

    // Asks the policy about a request (`summary`: the JSON the SDK documents). Fills `out` for
    // Outcome::applied; `why` says what went wrong otherwise.
    Outcome decide(const std::string& summary, const std::string& request_id, Decision& out, std::string& why) const;

    const std::string& component() const { return component_; }
    const std::string& plugin_id() const { return lease_->plugin_id(); }

    // Decide calls that may be queued or running at once (and so pool threads at most); beyond
    // it a request goes on without asking.
    static constexpr int kMaxInFlight = 64;

private:
    struct Shared;
    plugin::ComponentLease lease_;
    std::string component_;
    int64_t timeout_ms_;
    std::shared_ptr<Shared> shared_;
    mutable WorkerPool pool_;  // threads "pulse-policy", at most kMaxInFlight, gone after 30 s idle
};

// Reads a decision object; false (and `why`) when any member is of the wrong type, out of range
// or unknown: such an answer is not applied at all.
bool parse_decision(std::string_view json, Policy::Decision& out, std::string& why);

}  // namespace pulse::gateway
