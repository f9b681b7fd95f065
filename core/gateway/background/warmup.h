// Prefix warmup: remember the most recent upstream request of each conversation (per model,
// keyed by Codex's prompt_cache_key), and when an endpoint comes back after being down, replay
// them in the cheap form the model's profile writes (SDK 1.4 warm_request: the same prompt,
// one output token) so the server's prefix cache is warm before the next real turn arrives;
// where the profile can persist the server's cache (cache_request), save it while the
// endpoint is idle and restore it after a restart. Real traffic always wins: a warm request
// starts only when no real request is in flight to that endpoint, and is cancelled as soon as
// one starts. What any of this means for a particular server is the profile's business
// (backend_dialect.h); this file holds only when and how often.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "config/config.h"
#include "gateway/background/endpoint_health.h"
#include "gateway/background/prefix_store.h"
#include "gateway/background/slot_keeper.h"
#include "gateway/upstream/backend_dialect.h"

namespace pulse::gateway {

// Runs warmups on a background thread.
class Warmer {
public:
    Warmer(PrefixStore& store, config::Upstream timeouts, double slot_save_interval_s, double quiet_s = 2);
    ~Warmer();

    // An endpoint of `model` recovered: restore its saved cache slots (where the profile can,
    // e.g. llama-server with --slot-save-path), then replay the model's recorded prefixes in
    // the form `dialect` (the model's profile) writes them: those `wanted` accepts
    // (sticky routing: the conversations that will be routed to this endpoint), or all. After a
    // restore a replay costs little where the slot holds its prompt, and where it cannot (a
    // hybrid model's recurrent state is saved at the end of the last answer and cannot be
    // rewound to a shorter prompt) it rebuilds the conversation, with the server's checkpoints,
    // so that the next turn reuses it.
    void recovered(const std::string& model, const config::Endpoint& ep, std::shared_ptr<EndpointHealth> health, BackendDialect dialect,
                   std::function<bool(const std::string& key)> wanted = nullptr);
    // A request completed on `ep`: its KV cache changed. A server whose profile can save its
    // cache slots is asked to, at most every warmup.slot_save_interval_s and only while it
    // serves nothing.
    void served(const config::Endpoint& ep, std::shared_ptr<EndpointHealth> health, BackendDialect dialect);
    // A real request completed on `ep` with this prompt usage (input tokens, of them cached).
    // The first one after a recovery is logged and counted: the cache it found is what the
    // restored slots and replays really left there (pulse_recovery_*).
    void first_turn(const config::Endpoint& ep, EndpointHealth& health, int64_t input, int64_t cached);
    void stop();

private:
    struct Job {
        enum Kind { replay, save } kind = replay;
        std::string model;
        config::Endpoint ep;
        std::shared_ptr<EndpointHealth> health;
        BackendDialect dialect;
        std::function<bool(const std::string& key)> wanted;  // replay: which conversations (null = all)
        // replay: when the endpoint came back; a conversation whose latest turn completed since
        // then ran on a healthy gateway already and needs no replay
        std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
    };
    void run();
    void warm(const Job& job);
    struct Quiet {
        std::chrono::steady_clock::time_point since;  // the last real traffic seen (or the recovery)
        uint64_t seen = 0;                            // EndpointHealth::real_requests then
        bool busy = false;                            // a real request was in flight then
    };
    // Sleeps until `until`, or until stop or traffic on the watched endpoint wakes it; false
    // when stopping.
    bool pause_until(std::chrono::steady_clock::time_point until);
    bool wait_quiet(const Job& job, Quiet& q);

    PrefixStore& store_;
    config::Upstream timeouts_;
    SlotKeeper slots_;
    std::chrono::steady_clock::duration quiet_;
    std::mutex m_;
    std::condition_variable cv_;
    Wakeup wake_;  // stop, and real traffic on the endpoint of the job under way (TrafficWatch)
    std::deque<Job> jobs_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace pulse::gateway
