#include "gateway/status/request_board.h"

#include <algorithm>
#include <vector>

namespace pulse::gateway {

using std::chrono::duration;
using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

const char* phase_name(Phase p) {
    switch (p) {
        case Phase::waiting_endpoint: return "waiting_endpoint";
        case Phase::waiting_head: return "waiting_head";
        case Phase::prefilling: return "prefilling";
        case Phase::generating: return "generating";
    }
    return "waiting_endpoint";
}

RequestBoard::Entry::Entry(RequestBoard& board, std::string id, std::string model, bool stream)
    : board_(board), id_(std::move(id)), model_(std::move(model)), stream_(stream) {}

RequestBoard::Entry::~Entry() {
    std::lock_guard lock(board_.m_);
    if (auto it = board_.live_.find(id_); it != board_.live_.end() && it->second.expired()) board_.live_.erase(it);
}

void RequestBoard::Entry::attempt(const std::string& endpoint) {
    std::lock_guard lock(m_);
    endpoint_ = endpoint;
    phase_ = Phase::waiting_head;
    phase_since_ = steady_clock::now();
}

void RequestBoard::Entry::accepted() {
    std::lock_guard lock(m_);
    if (phase_ != Phase::waiting_head) return;
    phase_ = Phase::prefilling;
    phase_since_ = steady_clock::now();
}

void RequestBoard::Entry::output(int64_t total_tokens) {
    int64_t added = 0;
    std::string endpoint;
    {
        std::lock_guard lock(m_);
        if (total_tokens <= out_) return;
        added = total_tokens - out_;
        out_ = total_tokens;
        if (phase_ != Phase::generating) {
            phase_ = Phase::generating;
            phase_since_ = steady_clock::now();
            if (first_output_ == steady_clock::time_point{}) first_output_ = phase_since_;
        }
        endpoint = endpoint_;
    }
    board_.add_tokens(model_, endpoint, added);
}

void RequestBoard::Entry::prefill(int64_t processed, int64_t total, int64_t cached, int64_t time_ms) {
    std::lock_guard lock(m_);
    prefill_done_ = processed;
    prefill_total_ = total;
    prefill_cached_ = cached;
    prefill_ms_ = time_ms;
}

void RequestBoard::Entry::waiting() {
    std::lock_guard lock(m_);
    if (phase_ == Phase::waiting_endpoint) return;
    phase_ = Phase::waiting_endpoint;
    phase_since_ = steady_clock::now();
}

void RequestBoard::Entry::keepalive() {
    std::lock_guard lock(m_);
    ++keepalives_;
}

void RequestBoard::Entry::failover() {
    std::lock_guard lock(m_);
    ++failovers_;
}

void RequestBoard::Entry::resumed() {
    std::lock_guard lock(m_);
    ++resumes_;
}

std::shared_ptr<RequestBoard::Entry> RequestBoard::begin(std::string id, std::string model, bool stream) {
    std::shared_ptr<Entry> e(new Entry(*this, id, std::move(model), stream));
    std::lock_guard lock(m_);
    live_[std::move(id)] = e;
    return e;
}

int64_t RequestBoard::bucket_now() {
    return duration_cast<std::chrono::seconds>(steady_clock::now().time_since_epoch()).count() / kBucketS;
}

RequestBoard::Series& RequestBoard::series(const Key& k, int64_t now_bucket) const {
    auto [it, fresh] = rates_.try_emplace(k);
    Series& s = it->second;
    if (fresh) s.last = now_bucket;
    // Buckets between the newest one and now saw nothing: clear them as the ring moves on.
    for (int64_t b = s.last + 1; b <= now_bucket && b <= s.last + static_cast<int64_t>(kBuckets); ++b) {
        const size_t i = static_cast<size_t>(b % static_cast<int64_t>(kBuckets));
        s.tokens[i] = s.requests[i] = s.errors[i] = s.resumes[i] = 0;
    }
    s.last = std::max(s.last, now_bucket);
    return s;
}

void RequestBoard::add_tokens(const std::string& model, const std::string& endpoint, int64_t n) {
    if (endpoint.empty() || n <= 0) return;
    const int64_t now = bucket_now();
    std::lock_guard lock(m_);
    series({model, endpoint}, now).tokens[static_cast<size_t>(now % static_cast<int64_t>(kBuckets))] += n;
}

void RequestBoard::end(const std::shared_ptr<Entry>& e, const Ended& how) {
    if (!e) return;
    Recent r;
    {
        std::lock_guard lock(e->m_);
        r.endpoint = e->endpoint_;
        r.failovers = e->failovers_;
        r.resumes = e->resumes_;
    }
    r.id = e->id_;
    r.model = e->model_;
    r.how = how;
    r.ended_ms = duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    // Client-side endings are not the backend's errors; a refusal or a failure is.
    const bool error = how.outcome != "completed" && how.outcome != "incomplete" && how.outcome != "cancelled" &&
                       how.outcome != "client_lost" && how.outcome != "invalid";
    const int64_t now = bucket_now();
    std::lock_guard lock(m_);
    live_.erase(r.id);
    if (!r.endpoint.empty()) {
        Series& s = series({r.model, r.endpoint}, now);
        const size_t i = static_cast<size_t>(now % static_cast<int64_t>(kBuckets));
        s.requests[i] += 1;
        s.errors[i] += error ? 1 : 0;
        s.resumes[i] += r.resumes;
    }
    recent_.push_front(std::move(r));
    if (recent_.size() > kRecent) recent_.pop_back();
}

void RequestBoard::write(rapidjson::Writer<rapidjson::StringBuffer>& w) const {
    std::vector<std::shared_ptr<Entry>> live;
    std::deque<Recent> recent;
    std::map<Key, Series> rates;
    {
        std::lock_guard lock(m_);
        for (const auto& [id, weak] : live_)
            if (auto e = weak.lock()) live.push_back(std::move(e));
        recent = recent_;
        const int64_t b = bucket_now();
        for (const auto& entry : rates_) series(entry.first, b);  // every ring moved to now
        rates = rates_;
    }
    std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) { return a->t0_ < b->t0_; });

    write_live(w, live);
    write_recent(w, recent);
    write_rates(w, rates);
}

void RequestBoard::write_live(Json& w, const std::vector<std::shared_ptr<Entry>>& live) {
    const auto now = steady_clock::now();
    const auto ms = [](steady_clock::duration d) { return duration_cast<milliseconds>(d).count(); };
    w.Key("requests");
    w.StartArray();
    for (const auto& e : live) {
        std::lock_guard lock(e->m_);
        w.StartObject();
        w.Key("id");
        w.String(e->id_.c_str());
        w.Key("model");
        w.String(e->model_.c_str());
        w.Key("endpoint");
        w.String(e->endpoint_.c_str());
        w.Key("stream");
        w.Bool(e->stream_);
        w.Key("phase");
        w.String(phase_name(e->phase_));
        w.Key("age_ms");
        w.Int64(ms(now - e->t0_));
        w.Key("phase_ms");
        w.Int64(ms(now - e->phase_since_));
        w.Key("output_tokens");
        w.Int64(e->out_);
        if (e->first_output_ != steady_clock::time_point{}) {
            w.Key("ttft_ms");
            w.Int64(ms(e->first_output_ - e->t0_));
            const double s = duration<double>(now - e->first_output_).count();
            w.Key("tokens_per_s");
            w.Double(s > 0.05 ? static_cast<double>(static_cast<int64_t>(static_cast<double>(e->out_) / s * 10)) / 10 : 0.0);
        }
        if (e->prefill_total_ > 0) {
            // Prompt tokens done of the total, the rate the backend computed them at (cached ones
            // cost nothing) and the time left at that rate.
            w.Key("prefill");
            w.StartObject();
            w.Key("processed");
            w.Int64(e->prefill_done_);
            w.Key("total");
            w.Int64(e->prefill_total_);
            w.Key("cached");
            w.Int64(e->prefill_cached_);
            const int64_t computed = e->prefill_done_ - e->prefill_cached_;
            const double rate = e->prefill_ms_ > 0 && computed > 0 ? static_cast<double>(computed) * 1000.0 / static_cast<double>(e->prefill_ms_) : 0;
            w.Key("tokens_per_s");
            w.Double(static_cast<double>(static_cast<int64_t>(rate * 10)) / 10);
            w.Key("eta_s");
            if (rate > 0) w.Double(static_cast<double>(static_cast<int64_t>(static_cast<double>(e->prefill_total_ - e->prefill_done_) / rate * 10)) / 10);
            else w.Null();
            w.EndObject();
        }
        w.Key("keepalives");
        w.Int64(e->keepalives_);
        w.Key("failovers");
        w.Int64(e->failovers_);
        w.Key("resumes");
        w.Int64(e->resumes_);
        w.EndObject();
    }
    w.EndArray();

}

void RequestBoard::write_recent(Json& w, const std::deque<Recent>& recent) {
    w.Key("recent");
    w.StartArray();
    for (const auto& r : recent) {
        w.StartObject();
        w.Key("id");
        w.String(r.id.c_str());
        w.Key("model");
        w.String(r.model.c_str());
        w.Key("endpoint");
        w.String(r.endpoint.c_str());
        w.Key("outcome");
        w.String(r.how.outcome.c_str());
        w.Key("ended_ms");
        w.Int64(r.ended_ms);
        w.Key("total_ms");
        w.Int64(r.how.total_ms);
        const auto maybe = [&](const char* key, int64_t v) {
            w.Key(key);
            if (v < 0) w.Null();
            else w.Int64(v);
        };
        maybe("ttft_ms", r.how.ttft_ms);
        maybe("input_tokens", r.how.input);
        maybe("cached_tokens", r.how.cached);
        w.Key("output_tokens");
        w.Int64(r.how.output);
        w.Key("failovers");
        w.Int64(r.failovers);
        w.Key("resumes");
        w.Int64(r.resumes);
        maybe("reasoning_budget", r.how.budget);
        if (r.how.budget >= 0) {
            w.Key("budget_enforced");
            w.Bool(r.how.budget_enforced);
        }
        w.EndObject();
    }
    w.EndArray();

}

void RequestBoard::write_rates(Json& w, const std::map<Key, Series>& rates) {
    w.Key("rates");
    w.StartObject();
    w.Key("bucket_s");
    w.Int(kBucketS);
    w.Key("series");
    w.StartArray();
    for (const auto& entry : rates) {
        const Key& k = entry.first;
        const Series& s = entry.second;  // a plain reference: lambdas below capture it (clang < 16 cannot capture a binding)
        w.StartObject();
        w.Key("model");
        w.String(k.first.c_str());
        w.Key("endpoint");
        w.String(k.second.c_str());
        // Oldest first; the last bucket is the current (still filling) one.
        const auto ring = [&](const char* key, const std::array<int64_t, kBuckets>& a) {
            w.Key(key);
            w.StartArray();
            for (size_t n = 0; n < kBuckets; ++n) w.Int64(a[static_cast<size_t>((s.last + 1 + static_cast<int64_t>(n)) % static_cast<int64_t>(kBuckets))]);
            w.EndArray();
        };
        ring("tokens", s.tokens);
        ring("requests", s.requests);
        ring("errors", s.errors);
        ring("resumes", s.resumes);
        w.EndObject();
    }
    w.EndArray();
    w.EndObject();
}

}  // namespace pulse::gateway
