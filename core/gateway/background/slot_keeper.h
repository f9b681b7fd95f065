// A backend's prompt cache kept across its restarts, where the model's profile knows how
// (SDK 1.4 cache_request: llama-server's slots with --slot-save-path): what is known of each
// endpoint's slots, saving them while the endpoint is idle, loading them back after a restart.
// When and how often is decided here; every request and every answer is the profile's.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "config/config.h"
#include "gateway/background/endpoint_health.h"
#include "gateway/upstream/backend_dialect.h"

namespace pulse::gateway {

class SlotKeeper {
public:
    SlotKeeper(config::Upstream timeouts, std::chrono::steady_clock::duration save_interval)
        : timeouts_(timeouts), save_interval_(save_interval) {}

    // A request completed on `ep`: whether a save should be queued (the profile can persist the
    // cache, the server has not said it cannot, and none is queued yet). True marks it queued.
    bool want_save(const config::Endpoint& ep, const BackendDialect& dialect);
    // Saves every slot once the last save is older than the interval and nothing is in flight
    // there (a save holds the server while it writes), waiting at most a minute for both.
    // `pause(t)` sleeps until t or until a real request starts or ends on the endpoint, and
    // returns false when the caller is stopping.
    void save(const config::Endpoint& ep, const EndpointHealth& health, const BackendDialect& dialect,
              const std::function<bool(std::chrono::steady_clock::time_point)>& pause);
    // The endpoint came back: its slots are counted again, once (a restarted server may run
    // with other flags; the count is what the next save covers), and the saved ones go back in,
    // far cheaper than replaying their prompts. True when at least one was loaded.
    bool recover(const config::Endpoint& ep, const BackendDialect& dialect);

    // The file a slot is saved to on the server's side: a plain file name, as the SDK promises.
    static std::string slot_file(const config::Endpoint& ep, int slot);

private:
    struct Slots {
        int total = 0;             // 0 = not asked yet; -1 = the backend has no slots to save
        bool saved = false;        // files of every slot exist on the backend's side
        bool unsupported = false;  // the server cannot save them (llama-server without --slot-save-path)
        bool pending = false;      // a save is queued
        std::chrono::steady_clock::time_point last_save{};
    };
    // One cache request (count, save or restore of `slot`) and the profile's reading of its
    // answer; COUNT's count in *count.
    pulse_status_t ask(const config::Endpoint& ep, const BackendDialect& dialect, pulse_cache_op_t op, int slot, int* count, std::string* why);
    int count(const config::Endpoint& ep, const BackendDialect& dialect);  // -1: none the profile can persist
    Slots get(const std::string& url);
    void put(const std::string& url, const Slots& s);

    config::Upstream timeouts_;
    std::chrono::steady_clock::duration save_interval_;
    std::mutex m_;
    std::map<std::string, Slots> slots_;  // by endpoint URL
};

}  // namespace pulse::gateway
