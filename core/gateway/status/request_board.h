// What the status page (/status.json) shows of Responses requests: each one in flight with its
// phase and tokens so far, the last ones that ended with their accounting, and per-endpoint rates
// over the last minutes. It holds ids, names and counts only — never the text of a prompt or of
// an answer — so the page can be shown to anyone who may read /health.
#pragma once

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace pulse::gateway {

// Where a request in flight is. A llama-server holds its response head until the prompt is
// processed, so its prefill shows as waiting_head; vLLM sends the head at once and prefills in
// `prefilling`. Either way the client gets keepalives meanwhile.
enum class Phase { waiting_endpoint, waiting_head, prefilling, generating };
const char* phase_name(Phase p);

class RequestBoard {
public:
    static constexpr size_t kRecent = 50;          // ended requests kept
    static constexpr int kBucketS = 5;             // rate bucket width
    static constexpr size_t kBuckets = 120;        // 10 minutes of buckets

    // One request in flight, updated by its own session (one thread at a time), read by the page.
    class Entry {
    public:
        ~Entry();  // a request that ended without end() (refused as invalid) leaves the board
        void attempt(const std::string& endpoint);  // sent to `endpoint`: waiting for its head
        void accepted();                            // its response head arrived
        void output(int64_t total_tokens);          // output so far (every attempt)
        // The backend's prefill progress (prompt tokens: processed counts the cached ones; the
        // backend's own milliseconds since it started on them).
        void prefill(int64_t processed, int64_t total, int64_t cached, int64_t time_ms);
        void waiting();                             // between failover rounds: no endpoint took it
        void keepalive();
        void failover();
        void resumed();

    private:
        friend class RequestBoard;
        Entry(RequestBoard& board, std::string id, std::string model, bool stream);
        Entry(const Entry&) = delete;
        RequestBoard& board_;
        const std::string id_, model_;
        const bool stream_;
        const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
        mutable std::mutex m_;
        std::string endpoint_;
        Phase phase_ = Phase::waiting_endpoint;
        std::chrono::steady_clock::time_point phase_since_ = t0_, first_output_{};
        int64_t out_ = 0, keepalives_ = 0, failovers_ = 0, resumes_ = 0;
        int64_t prefill_done_ = 0, prefill_total_ = 0, prefill_cached_ = 0, prefill_ms_ = 0;  // total 0: none reported
    };

    // How a request ended, as its log line says it.
    struct Ended {
        std::string outcome;
        int64_t ttft_ms = -1, total_ms = 0;
        int64_t input = -1, cached = -1, output = 0;  // input/cached -1: no backend reported usage
        int64_t budget = -1;                          // reasoning budget, -1 = none
        bool budget_enforced = false;
    };

    std::shared_ptr<Entry> begin(std::string id, std::string model, bool stream);
    void end(const std::shared_ptr<Entry>& e, const Ended& how);

    // Writes the members "requests" (in flight, oldest first), "recent" (ended, newest first) and
    // "rates" into the open JSON object.
    void write(rapidjson::Writer<rapidjson::StringBuffer>& w) const;

private:
    struct Series {  // one model's endpoint: a ring of kBuckets buckets of kBucketS seconds
        std::array<int64_t, kBuckets> tokens{}, requests{}, errors{}, resumes{};
        int64_t last = 0;  // bucket number (steady seconds / kBucketS) of the newest bucket
    };
    struct Recent {
        std::string id, model, endpoint;
        Ended how;
        int64_t failovers = 0, resumes = 0;
        int64_t ended_ms = 0;  // wall clock, ms since the epoch
    };
    using Key = std::pair<std::string, std::string>;  // model, endpoint
    Series& series(const Key& k, int64_t now_bucket) const;  // m_ held; moves the ring to now
    static int64_t bucket_now();
    using Json = rapidjson::Writer<rapidjson::StringBuffer>;
    static void write_live(Json& w, const std::vector<std::shared_ptr<Entry>>& live);
    static void write_recent(Json& w, const std::deque<Recent>& recent);
    static void write_rates(Json& w, const std::map<Key, Series>& rates);
    void add_tokens(const std::string& model, const std::string& endpoint, int64_t n);

    mutable std::mutex m_;
    std::map<std::string, std::weak_ptr<Entry>> live_;  // by response id
    std::deque<Recent> recent_;                         // newest first
    mutable std::map<Key, Series> rates_;
};

}  // namespace pulse::gateway
