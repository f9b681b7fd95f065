// Prefix warmup: remember the most recent prompt of each conversation (per model, keyed by
// Codex's prompt_cache_key), and when an endpoint comes back after being down, replay them as
// max_tokens:1 requests so vLLM's prefix cache is warm before the next real turn arrives.
// Real traffic always wins: a warm request starts only when no real request is in flight to
// that endpoint, and is cancelled as soon as one starts.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <rapidjson/document.h>

#include "config/config.h"
#include "gateway/endpoint_health.h"

namespace pulse::gateway {

class PrefixStore {
public:
    PrefixStore(size_t max_entries_per_model, size_t max_bytes_per_model)
        : max_entries_(max_entries_per_model), max_bytes_(max_bytes_per_model) {}

    // Records the upstream body of a request (the newest body per key wins; LRU eviction).
    void remember(const std::string& model, const std::string& key, std::string_view upstream_body);
    // (key, body), most recent first; with `wanted`, only the conversations it accepts (by key);
    // only those whose latest turn was remembered before `before`.
    std::vector<std::pair<std::string, std::string>> bodies(
        const std::string& model, const std::function<bool(const std::string& key)>& wanted = nullptr,
        std::chrono::steady_clock::time_point before = std::chrono::steady_clock::time_point::max()) const;
    // Whether conversation `key` of `model` had a turn complete at or after `t`.
    bool served_since(const std::string& model, const std::string& key, std::chrono::steady_clock::time_point t) const;

    // Persistence (the file holds prompts: created 0600, replaced atomically).
    void load(const std::filesystem::path& file);
    void save(const std::filesystem::path& file);
    bool dirty() const;

private:
    struct Entry {
        std::string key, body;
        std::chrono::steady_clock::time_point at;  // when its latest turn completed
    };
    struct Model {
        std::list<Entry> lru;  // front = most recent
        size_t bytes = 0;
    };
    void evict(Model& m);

    size_t max_entries_, max_bytes_;
    mutable std::mutex m_;
    std::map<std::string, Model> models_;
    bool dirty_ = false;
};

// Runs warmups on a background thread.
class Warmer {
public:
    Warmer(PrefixStore& store, config::Upstream timeouts, double slot_save_interval_s, double quiet_s = 2);
    ~Warmer();

    // An endpoint of `model` recovered: restore its saved slots (llama-server with
    // --slot-save-path), then replay the model's recorded prefixes: those `wanted` accepts
    // (sticky routing: the conversations that will be routed to this endpoint), or all. After a
    // restore a replay costs little where the slot holds its prompt, and where it cannot (a
    // hybrid model's recurrent state is saved at the end of the last answer and cannot be
    // rewound to a shorter prompt) it rebuilds the conversation, with the server's checkpoints,
    // so that the next turn reuses it.
    void recovered(const std::string& model, const config::Endpoint& ep, std::shared_ptr<EndpointHealth> health,
                   std::function<bool(const std::string& key)> wanted = nullptr);
    // A request completed on `ep`: its KV cache changed. A llama-server that can save its slots
    // is asked to, at most every warmup.slot_save_interval_s and only while it serves nothing.
    void served(const config::Endpoint& ep, std::shared_ptr<EndpointHealth> health);
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
        std::function<bool(const std::string& key)> wanted;  // replay: which conversations (null = all)
        // replay: when the endpoint came back; a conversation whose latest turn completed since
        // then ran on a healthy gateway already and needs no replay
        std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
    };
    // What is known of an endpoint's slot persistence (keyed by URL).
    struct Slots {
        int total = 0;            // 0 = not asked yet; -1 = the backend has no slots to save
        bool saved = false;       // files of every slot exist on the backend's side
        bool unsupported = false; // the server was started without --slot-save-path
        bool pending = false;     // a save job is queued
        std::chrono::steady_clock::time_point last_save{};
    };
    void run();
    void warm(const Job& job);
    void save(const Job& job);
    bool restore(const Job& job);
    struct Quiet {
        std::chrono::steady_clock::time_point since;  // the last real traffic seen (or the recovery)
        uint64_t seen = 0;                            // EndpointHealth::real_requests then
    };
    bool wait_quiet(const Job& job, Quiet& q);
    static std::string slot_file(const config::Endpoint& ep, int slot);

    PrefixStore& store_;
    config::Upstream timeouts_;
    std::chrono::steady_clock::duration save_interval_, quiet_;
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;
    std::map<std::string, Slots> slots_;  // by endpoint URL; under m_
    bool stop_ = false;
    std::thread thread_;
};

// The warm version of an upstream body: same prompt, max_tokens 1. For llama-server also
// "return_progress": true: it then sends a chunk after every prompt batch, and so sees a closed
// connection (a cancelled replay) at the next batch, not at its once-a-second check.
std::string warm_body(const std::string& upstream_body, bool llama_server = false);

}  // namespace pulse::gateway
