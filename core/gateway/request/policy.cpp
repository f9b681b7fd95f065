#include "gateway/request/policy.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

#include <rapidjson/document.h>

#include "common/log.h"
#include "plugin/host_api.h"

namespace pulse::gateway {

using namespace std::chrono;

namespace {

struct Job {
    rapidjson::Document summary;
    pulse_call call;
    pulse_json_writer out;
    std::atomic<bool> cancelled{false};
    pulse_status_t rc = PULSE_OK;
    bool done = false;
    std::mutex m;
    std::condition_variable cv;
};

const char* const kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};

// How long a pool thread with nothing to do stays for the next decision.
constexpr auto kIdleWorker = seconds(30);

}  // namespace

// The policy's instance, kept alive by the calls running on it: a request that stopped waiting,
// or a policy being destroyed, does not take it from under a call.
struct Policy::Shared {
    pulse_policy_vt_t vt{};
    void* instance = nullptr;
};

const char* Policy::name(Outcome o) {
    switch (o) {
        case Outcome::applied: return "applied";
        case Outcome::unchanged: return "unchanged";
        case Outcome::timeout: return "timeout";
        case Outcome::error: return "error";
        case Outcome::invalid: return "invalid";
        case Outcome::busy: return "busy";
    }
    return "?";
}

Policy::Policy(plugin::ComponentLease lease, const config::ModelPolicy& cfg, const std::string& where)
    : lease_(std::move(lease)),
      component_(cfg.name),
      timeout_ms_(cfg.timeout_ms),
      shared_(std::make_shared<Shared>()),
      pool_({"pulse-policy", kMaxInFlight, kIdleWorker}) {
    shared_->vt = lease_->registration.policy;
    if (!shared_->vt.create || !shared_->vt.decide)
        throw config::ConfigError(where + ": policy '" + component_ + "' (plugin " + lease_->plugin_id() + ") has no create or decide function");
    rapidjson::Document opts;
    opts.Parse(cfg.options_json.c_str());
    pulse_call call;
    pulse_status_t rc = shared_->vt.create(lease_->registration.user, &call, opts.IsNull() ? nullptr : host::view(&opts), &shared_->instance);
    if (rc != PULSE_OK) throw config::ConfigError(where + ".options: " + host::call_error(call, rc, lease_->plugin_id()));
}

Policy::~Policy() {
    // A decide still running past its request's deadline: give it a moment to notice the
    // cancellation, else leave the instance to it (a leak beats a use after free).
    if (!pool_.stop(seconds(2))) {
        log::error("policy", "policy '" + component_ + "' (plugin " + lease_->plugin_id() + "): " + std::to_string(pool_.in_flight()) +
                                 " decide call(s) still running at shutdown; its instance is not destroyed");
        return;
    }
    if (shared_->vt.destroy) shared_->vt.destroy(shared_->instance);
}

Policy::Outcome Policy::decide(const std::string& summary, const std::string& request_id, Decision& out, std::string& why) const {
    auto job = std::make_shared<Job>();
    job->summary.Parse(summary.c_str());
    job->call.cancelled = &job->cancelled;
    job->call.request_id = request_id;
    const auto deadline = steady_clock::now() + milliseconds(timeout_ms_);
    job->call.deadline_ms = static_cast<uint64_t>(duration_cast<milliseconds>(deadline.time_since_epoch()).count());
    job->out.call = &job->call;
    const bool queued = pool_.submit([s = shared_, job] {
        // A request that stopped waiting before its turn came is not asked about.
        pulse_status_t rc = job->cancelled ? PULSE_E_DEADLINE : s->vt.decide(s->instance, &job->call, host::view(&job->summary), &job->out);
        std::lock_guard lock(job->m);
        job->rc = rc;
        job->done = true;
        job->cv.notify_one();  // under the lock: the waiter may return and drop `job` at once (it is shared)
    });
    if (!queued) {
        why = std::to_string(kMaxInFlight) + " decide calls already running (the policy is stuck or overloaded)";
        return Outcome::busy;
    }

    std::unique_lock lock(job->m);
    if (!job->cv.wait_until(lock, deadline, [&] { return job->done; })) {
        job->cancelled = true;  // the call goes on without us; the plugin can see it is no longer wanted
        why = "no decision within " + std::to_string(timeout_ms_) + " ms (policy timeout_ms)";
        return Outcome::timeout;
    }
    if (job->rc != PULSE_OK) {
        why = host::call_error(job->call, job->rc, lease_->plugin_id());
        // A plugin that gave up because its time ran out (its own timeout or this call's
        // deadline) timed out, whatever clock fired first.
        return job->rc == PULSE_E_DEADLINE ? Outcome::timeout : Outcome::error;
    }
    if (!job->out.complete()) {
        why = "the decision is not a complete JSON value: " + job->out.incomplete_reason();
        return Outcome::invalid;
    }
    if (!parse_decision(job->out.text(), out, why)) return Outcome::invalid;
    return out.empty() ? Outcome::unchanged : Outcome::applied;
}

bool parse_decision(std::string_view json, Policy::Decision& out, std::string& why) {
    rapidjson::Document d;
    d.Parse(json.data(), json.size());
    if (d.HasParseError() || !d.IsObject()) {
        why = "the decision is not a JSON object";
        return false;
    }
    Policy::Decision dec;
    for (const auto& m : d.GetObject()) {
        std::string k(m.name.GetString(), m.name.GetStringLength());
        const auto& v = m.value;
        if (k == "reasoning_budget") {
            if (!v.IsInt64() || v.GetInt64() < 0 || v.GetInt64() > (int64_t(1) << 32)) {
                why = "reasoning_budget must be an integer from 0 to 2^32";
                return false;
            }
            dec.reasoning_budget = v.GetInt64();
        } else if (k == "effort") {
            bool known = false;
            if (v.IsString())
                for (const char* e : kEfforts) known = known || std::string_view(v.GetString()) == e;
            if (!known) {
                why = "effort must be one of none, minimal, low, medium, high, xhigh";
                return false;
            }
            dec.effort = v.GetString();
        } else if (k == "sampling") {
            if (!v.IsObject()) {
                why = "sampling must be an object";
                return false;
            }
            struct Range {
                const char* key;
                double lo, hi;
                bool integer;
            };
            static const Range ranges[] = {{"temperature", 0, 10, false},      {"top_p", 0, 1, false},
                                           {"top_k", -1, 1000000, true},       {"min_p", 0, 1, false},
                                           {"presence_penalty", -2, 2, false}, {"repetition_penalty", 0, 10, false},
                                           {"max_output_tokens", 1, 4294967296.0, true}};
            for (const auto& s : v.GetObject()) {
                std::string sk(s.name.GetString(), s.name.GetStringLength());
                const Range* r = nullptr;
                for (const auto& x : ranges)
                    if (sk == x.key) r = &x;
                if (!r) {
                    why = "unknown sampling key '" + sk + "'";
                    return false;
                }
                if (!s.value.IsNumber() || (r->integer && !s.value.IsInt64()) || s.value.GetDouble() < r->lo || s.value.GetDouble() > r->hi) {
                    why = "sampling." + sk + " must be " + (r->integer ? "an integer" : "a number") + " from " + std::to_string(r->lo) +
                          " to " + std::to_string(r->hi);
                    return false;
                }
                dec.sampling.emplace_back(sk, s.value.GetDouble());
            }
        } else {
            why = "unknown decision key '" + k + "' (known: reasoning_budget, effort, sampling)";
            return false;
        }
    }
    out = std::move(dec);
    return true;
}

}  // namespace pulse::gateway
