// The latest served upstream request of each conversation, per model (keyed by Codex's
// prompt_cache_key): what warmup replays when an endpoint comes back. Bounded in entries and
// bytes per model (least recently served first out), and kept across restarts in
// warmup.state_file (it holds prompts: written 0600, replaced atomically).
#pragma once

#include <pulse/plugin.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pulse::gateway {

class PrefixStore {
public:
    PrefixStore(size_t max_entries_per_model, size_t max_bytes_per_model)
        : max_entries_(max_entries_per_model), max_bytes_(max_bytes_per_model) {}

    // Records a served upstream request (the newest one per key wins; LRU eviction), kept as
    // warm_request reads it: {"path", "root_path", "body"} as JSON text.
    void remember(const std::string& model, const std::string& key, const pulse_upstream_req& sent);
    // (key, sent request), most recent first; with `wanted`, only the conversations it accepts (by key);
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
        std::string key, body;  // body: the sent request
        std::chrono::steady_clock::time_point at;  // when its latest turn completed
    };
    struct Model {
        std::list<Entry> lru;  // front = most recent
        size_t bytes = 0;
    };
    void evict(Model& m);
    void keep(const std::string& model, const std::string& key, std::string sent);

    size_t max_entries_, max_bytes_;
    mutable std::mutex m_;
    std::map<std::string, Model> models_;
    bool dirty_ = false;
};

}  // namespace pulse::gateway
