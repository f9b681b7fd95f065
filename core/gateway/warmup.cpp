#include "gateway/warmup.h"

#include <poll.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>

#include "common/log.h"
#include "common/metrics.h"
#include "gateway/upstream.h"

namespace pulse::gateway {

using namespace std::chrono;

std::string warm_body(const std::string& upstream_body, bool llama_server) {
    rapidjson::Document d;
    d.Parse(upstream_body.c_str(), upstream_body.size());
    if (!d.IsObject()) return {};
    d.RemoveMember("max_tokens");
    d.AddMember("max_tokens", 1, d.GetAllocator());
    if (llama_server) {
        d.RemoveMember("return_progress");
        d.AddMember("return_progress", true, d.GetAllocator());
    }
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    d.Accept(w);
    return {b.GetString(), b.GetSize()};
}

void PrefixStore::evict(Model& m) {
    while (!m.lru.empty() && (m.lru.size() > max_entries_ || m.bytes > max_bytes_)) {
        m.bytes -= m.lru.back().body.size();
        m.lru.pop_back();
    }
}

void PrefixStore::remember(const std::string& model, const std::string& key, std::string_view body) {
    // A body of over an eighth of the budget (a prompt full of images) would evict every
    // conversation for one replay: not kept.
    if (max_entries_ == 0 || body.size() > max_bytes_ / 8) return;
    std::lock_guard lock(m_);
    Model& m = models_[model];
    for (auto it = m.lru.begin(); it != m.lru.end(); ++it)
        if (it->key == key) {
            m.bytes -= it->body.size();
            m.lru.erase(it);
            break;
        }
    m.lru.push_front({key, std::string(body), std::chrono::steady_clock::now()});
    m.bytes += body.size();
    evict(m);
    dirty_ = true;
}

bool PrefixStore::served_since(const std::string& model, const std::string& key, std::chrono::steady_clock::time_point t) const {
    std::lock_guard lock(m_);
    if (auto it = models_.find(model); it != models_.end())
        for (const auto& e : it->second.lru)
            if (e.key == key) return e.at >= t;
    return false;
}

std::vector<std::pair<std::string, std::string>> PrefixStore::bodies(const std::string& model,
                                                                     const std::function<bool(const std::string&)>& wanted,
                                                                     std::chrono::steady_clock::time_point before) const {
    std::vector<std::pair<std::string, std::string>> entries;
    {
        std::lock_guard lock(m_);
        if (auto it = models_.find(model); it != models_.end())
            for (const auto& e : it->second.lru)
                if (e.at < before) entries.emplace_back(e.key, e.body);
    }
    if (wanted)  // unlocked: it may take other locks
        std::erase_if(entries, [&](const auto& e) { return !wanted(e.first); });
    return entries;
}

bool PrefixStore::dirty() const {
    std::lock_guard lock(m_);
    return dirty_;
}

void PrefixStore::save(const std::filesystem::path& file) {
    std::string text;
    {
        std::lock_guard lock(m_);
        rapidjson::StringBuffer b;
        rapidjson::Writer<rapidjson::StringBuffer> w(b);
        w.StartObject();
        w.Key("version");
        w.Int(1);
        w.Key("models");
        w.StartObject();
        for (const auto& [name, m] : models_) {
            w.Key(name.c_str());
            w.StartArray();
            for (auto it = m.lru.rbegin(); it != m.lru.rend(); ++it) {  // oldest first: load replays in order
                w.StartObject();
                w.Key("key");
                w.String(it->key.c_str());
                w.Key("body");
                w.String(it->body.c_str(), static_cast<rapidjson::SizeType>(it->body.size()));
                w.EndObject();
            }
            w.EndArray();
        }
        w.EndObject();
        w.EndObject();
        text.assign(b.GetString(), b.GetSize());
        dirty_ = false;
    }
    // It holds prompts: 0600 from the first byte, then an atomic rename.
    std::string tmp = file.string() + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        log::warn("warmup", "cannot write " + tmp + ": " + std::strerror(errno));
        return;
    }
    ::fchmod(fd, 0600);
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ok = ::fsync(fd) == 0 && ok;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), file.c_str()) != 0) log::warn("warmup", "cannot write " + file.string());
}

void PrefixStore::load(const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return;
    std::string text((std::istreambuf_iterator<char>(in)), {});
    rapidjson::Document d;
    d.Parse(text.c_str(), text.size());
    if (!d.IsObject() || !d.HasMember("models") || !d["models"].IsObject()) {
        log::warn("warmup", "ignoring " + file.string() + ": not a warmup state file");
        return;
    }
    size_t n = 0;
    for (const auto& m : d["models"].GetObject()) {
        if (!m.value.IsArray()) continue;
        for (const auto& e : m.value.GetArray())
            if (e.IsObject() && e.HasMember("key") && e["key"].IsString() && e.HasMember("body") && e["body"].IsString()) {
                remember(m.name.GetString(), e["key"].GetString(), std::string(e["body"].GetString(), e["body"].GetStringLength()));
                ++n;
            }
    }
    std::lock_guard lock(m_);
    dirty_ = false;
    log::info("warmup", "loaded " + std::to_string(n) + " prompt prefixes from " + file.string());
}

Warmer::Warmer(PrefixStore& store, config::Upstream timeouts, double slot_save_interval_s, double quiet_s)
    : store_(store),
      timeouts_(timeouts),
      save_interval_(duration_cast<steady_clock::duration>(duration<double>(slot_save_interval_s))),
      quiet_(duration_cast<steady_clock::duration>(duration<double>(quiet_s))) {
    thread_ = std::thread([this] { run(); });
}

Warmer::~Warmer() { stop(); }

void Warmer::stop() {
    {
        std::lock_guard lock(m_);
        if (stop_) return;
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void Warmer::recovered(const std::string& model, const config::Endpoint& ep, std::shared_ptr<EndpointHealth> health,
                       std::function<bool(const std::string&)> wanted) {
    if (ep.is_plugin()) return;  // in-process backends manage their own caches
    health->awaiting_first_turn = true;
    {
        std::lock_guard lock(m_);
        jobs_.push_back({Job::replay, model, ep, std::move(health), std::move(wanted)});
    }
    cv_.notify_all();
}

void Warmer::served(const config::Endpoint& ep, std::shared_ptr<EndpointHealth> health) {
    if (ep.is_plugin()) return;
    {
        std::lock_guard lock(m_);
        Slots& st = slots_[ep.url];
        if (st.unsupported || st.total < 0 || st.pending) return;
        st.pending = true;
        Job j;
        j.kind = Job::save;
        j.ep = ep;
        j.health = std::move(health);
        jobs_.push_back(std::move(j));
    }
    cv_.notify_all();
}

void Warmer::first_turn(const config::Endpoint& ep, EndpointHealth& health, int64_t input, int64_t cached) {
    if (input <= 0 || !health.awaiting_first_turn.exchange(false)) return;
    auto& reg = metrics::global();
    reg.counter("pulse_recovery_first_requests_total", "first real request on an endpoint after it came back, by whether it found its prompt cached",
                {{"endpoint", ep.name}, {"cache", cached > 0 ? "hit" : "miss"}})
        .add();
    reg.counter("pulse_recovery_cached_tokens_total", "prompt tokens the first request after a recovery found cached", {{"endpoint", ep.name}})
        .add(static_cast<uint64_t>(cached));
    reg.counter("pulse_recovery_input_tokens_total", "prompt tokens of the first request after a recovery", {{"endpoint", ep.name}})
        .add(static_cast<uint64_t>(input));
    log::info("warmup", "endpoint " + ep.name + ": the first request since it came back found " + std::to_string(cached) + " of its " +
                            std::to_string(input) + " prompt tokens cached");
}

std::string Warmer::slot_file(const config::Endpoint& ep, int slot) {
    // The endpoint's name, reduced to what a file name may hold (llama-server refuses paths).
    std::string name;
    for (char c : ep.name) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
    return "pulse-" + name + "-slot" + std::to_string(slot) + ".bin";
}

// Saves every slot of a llama-server started with --slot-save-path, when the last save is older
// than the interval and nothing is in flight there (a save holds the server while it writes).
void Warmer::save(const Job& job) {
    Slots st;
    {
        std::lock_guard lock(m_);
        st = slots_[job.ep.url];
    }
    // Wait (bounded) for the interval and for a moment without real traffic.
    for (int i = 0; i < 600 && (steady_clock::now() - st.last_save < save_interval_ || job.health->in_flight.load() > 0); ++i) {
        std::unique_lock lock(m_);
        if (cv_.wait_for(lock, milliseconds(100), [&] { return stop_; })) return;
    }
    auto done = [&](const Slots& s) {
        std::lock_guard lock(m_);
        slots_[job.ep.url] = s;
        slots_[job.ep.url].pending = false;
    };
    if (job.health->in_flight.load() > 0 || !job.health->healthy()) return done(st);
    if (st.total == 0) st.total = backend_slots(job.ep, timeouts_.connect_timeout_s);
    if (st.total <= 0) return done(st);  // not a llama-server
    const double timeout = std::max(30.0, timeouts_.connect_timeout_s);
    for (int slot = 0; slot < st.total; ++slot) {
        std::string answer;
        int status = post_root_json(job.ep, "/slots/" + std::to_string(slot) + "?action=save",
                                    "{\"filename\":\"" + slot_file(job.ep, slot) + "\"}", timeout, &answer);
        if (status == 501 || status == 404) {
            st.unsupported = true;  // started without --slot-save-path: said once, not asked again
            log::info("warmup", "endpoint " + job.ep.name + " cannot save its slots (start llama-server with --slot-save-path to keep its cache "
                                "across restarts); its recovery replays prompts instead");
            return done(st);
        }
        if (status != 200) {
            log::warn("warmup", "endpoint " + job.ep.name + ": saving slot " + std::to_string(slot) + " failed (HTTP " + std::to_string(status) +
                                    "): " + answer.substr(0, 200));
            return done(st);
        }
    }
    st.saved = true;
    st.last_save = steady_clock::now();
    metrics::global().counter("pulse_slot_saves_total", "llama-server slot saves (--slot-save-path)", {{"endpoint", job.ep.name}}).add();
    log::debug("warmup", "endpoint " + job.ep.name + ": saved " + std::to_string(st.total) + " slots");
    done(st);
}

// After a restart: the saved slots go back in, far cheaper than replaying their prompts.
bool Warmer::restore(const Job& job) {
    Slots st;
    {
        std::lock_guard lock(m_);
        st = slots_[job.ep.url];
    }
    if (!st.saved || st.total <= 0) return false;
    // The server may have come back with fewer slots (-np 2, then -np 1): a slot it does not have
    // cannot take a restore (it answered 501 for slot 1), so only the ones it has are asked for.
    const int now_total = backend_slots(job.ep, timeouts_.connect_timeout_s);
    const int asked = now_total > 0 ? std::min(now_total, st.total) : st.total;
    if (asked < st.total)
        log::info("warmup", "endpoint " + job.ep.name + " came back with " + std::to_string(now_total) + " slots, " + std::to_string(st.total) +
                                " were saved: restoring the first " + std::to_string(asked));
    {
        std::lock_guard lock(m_);
        if (now_total > 0) slots_[job.ep.url].total = now_total;  // what its next save covers
    }
    int restored = 0;
    for (int slot = 0; slot < asked; ++slot) {
        std::string answer;
        int status = post_root_json(job.ep, "/slots/" + std::to_string(slot) + "?action=restore",
                                    "{\"filename\":\"" + slot_file(job.ep, slot) + "\"}", std::max(30.0, timeouts_.connect_timeout_s), &answer);
        if (status == 200) ++restored;
        else log::warn("warmup", "endpoint " + job.ep.name + ": restoring slot " + std::to_string(slot) + " failed (HTTP " + std::to_string(status) + ")");
    }
    metrics::global().counter("pulse_slot_restores_total", "llama-server slots loaded from their files after a restart", {{"endpoint", job.ep.name}}).add(restored);
    if (restored == 0) return false;
    // Loaded is not reused: what a slot holds helps only a prompt that extends it (on a hybrid
    // model exactly), so the replays that follow and the first real request say what it was worth.
    log::info("warmup", "endpoint " + job.ep.name + " is back: loaded " + std::to_string(restored) + " of " + std::to_string(asked) +
                            " saved slots; the replays show how much of them their prompts reuse");
    return true;
}

void Warmer::run() {
    for (;;) {
        Job job;
        {
            std::unique_lock lock(m_);
            cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
            if (stop_) return;
            job = std::move(jobs_.front());
            jobs_.pop_front();
        }
        if (job.kind == Job::save) {
            save(job);
        } else {
            restore(job);
            warm(job);
        }
    }
}

// Waits until the endpoint has had no real request for warmup.quiet_s. A server that just came
// back is about to get the requests that waited for it (held in the retry window, retried by the
// client), and a replay running then is batched with them: its prefill delays their first token.
// The quiet time runs from the recovery or the last real request seen, whichever is later (kept
// in `q` across the replays of one recovery). Bounded (10 min); false when stopping or when the
// endpoint went down again.
bool Warmer::wait_quiet(const Job& job, Quiet& q) {
    auto& [quiet_since, seen] = q;
    for (const auto deadline = steady_clock::now() + minutes(10); steady_clock::now() < deadline;) {
        if (job.health->in_flight.load() > 0 || job.health->real_requests.load() != seen) {
            seen = job.health->real_requests.load();
            quiet_since = steady_clock::now();
        } else if (steady_clock::now() - quiet_since >= quiet_) {
            return job.health->healthy();
        }
        std::unique_lock lock(m_);
        if (cv_.wait_for(lock, milliseconds(20), [&] { return stop_; })) return false;
    }
    return false;
}

// A chunk's prompt usage: (input tokens, of them cached), from usage or llama-server's timings.
static std::pair<int64_t, int64_t> prompt_usage(const std::string& chunk) {
    rapidjson::Document d;
    d.Parse(chunk.c_str(), chunk.size());
    if (!d.IsObject()) return {0, 0};
    auto num = [](const rapidjson::Value& o, const char* k) -> int64_t {
        auto m = o.IsObject() ? o.FindMember(k) : o.MemberEnd();
        return o.IsObject() && m != o.MemberEnd() && m->value.IsInt64() ? m->value.GetInt64() : -1;
    };
    auto u = d.FindMember("usage");
    if (u == d.MemberEnd() || !u->value.IsObject()) return {0, 0};
    int64_t input = num(u->value, "prompt_tokens"), cached = -1;
    if (auto det = u->value.FindMember("prompt_tokens_details"); det != u->value.MemberEnd()) cached = num(det->value, "cached_tokens");
    if (auto t = d.FindMember("timings"); cached < 0 && t != d.MemberEnd()) cached = num(t->value, "cache_n");
    return {std::max<int64_t>(input, 0), std::clamp<int64_t>(cached, 0, std::max<int64_t>(input, 0))};
}

void Warmer::warm(const Job& job) {
    auto bodies = store_.bodies(job.model, job.wanted, job.since);
    if (bodies.empty()) return;
    // Asked again at each recovery (a restarted server may run with other flags); kept for saves.
    // A one-slot llama-server (-np 1) gets its replays too: a real request arriving during one
    // stops it at the server's next prompt batch, as on a server with more slots.
    const int total = backend_slots(job.ep, timeouts_.connect_timeout_s);
    {
        std::lock_guard lock(m_);
        slots_[job.ep.url].total = total;
    }
    log::info("warmup", "endpoint " + job.ep.name + " is back: replaying " + std::to_string(bodies.size()) +
                            " prompt prefixes of model " + job.model + " once it has had no real request for " +
                            std::to_string(duration_cast<milliseconds>(quiet_).count()) + " ms (warmup.quiet_s)");
    size_t sent = 0;
    int64_t prompt_tokens = 0, cached_tokens = 0;  // of the completed replays, as the backend reported
    Quiet quiet{job.since, job.health->real_requests.load()};
    for (const auto& [key, body] : bodies) {
        if (!wait_quiet(job, quiet)) break;
        // A turn of this conversation completed since the endpoint came back (often the very
        // request that proved it back): its prefix is warm where it ran, so no replay.
        if (store_.served_since(job.model, key, job.since)) continue;
        pulse_upstream_req req;
        std::string wb = warm_body(body, total > 0);
        if (wb.empty()) continue;
        req.body.reset();
        req.body.writer.RawValue(wb.data(), wb.size(), rapidjson::kObjectType);
        uint64_t real_before = job.health->real_requests.load();
        UpEvent error;
        // Its own connection: a pooled one may date from before the endpoint went down.
        std::unique_ptr<DetachedBody> up = send_http(job.ep, req, timeouts_, /*fresh=*/true, error);
        std::string outcome = "failed";
        auto deadline = steady_clock::now() + seconds(600);
        std::vector<UpEvent> events;
        // Read on this thread (the warmer's own): destroying `up` closes the connection, which
        // makes the backend drop the replay (llama-server at its next prompt batch, as the
        // replay asks for progress chunks; vLLM at its next step).
        while (up && outcome == "failed" && steady_clock::now() < deadline) {
            if (job.health->real_requests.load() != real_before) {
                outcome = "preempted";  // real traffic wins
                break;
            }
            {
                std::lock_guard lock(m_);
                if (stop_) return;
            }
            pollfd p{up->fd(), POLLIN, 0};
            ::poll(&p, 1, 20);  // a real request is noticed within 20 ms
            events.clear();
            up->read(events);
            bool over = false;
            for (const auto& e : events) {
                if (e.kind == UpEvent::Kind::done) outcome = "ok";
                if (e.kind == UpEvent::Kind::failed || e.kind == UpEvent::Kind::rejected) over = true;
                if (e.kind == UpEvent::Kind::data && e.text.find("\"usage\"") != std::string::npos) {
                    auto [input, cached] = prompt_usage(e.text);
                    if (input > 0) prompt_tokens += input, cached_tokens += cached;
                }
            }
            if (over || (outcome != "ok" && (up->exhausted() || up->silence(steady_clock::now()).has_value()))) break;
        }
        metrics::global()
            .counter("pulse_warmup_requests_total", "prefix warmup requests by outcome",
                     {{"model", job.model}, {"endpoint", job.ep.name}, {"outcome", outcome}})
            .add();
        if (outcome == "preempted") break;
        if (outcome == "ok") ++sent;
    }
    if (prompt_tokens > 0) {
        metrics::global().counter("pulse_warmup_prompt_tokens_total", "prompt tokens of completed warmup replays", {{"endpoint", job.ep.name}})
            .add(static_cast<uint64_t>(prompt_tokens));
        metrics::global()
            .counter("pulse_warmup_cached_tokens_total", "prompt tokens completed warmup replays found cached (restored slots)", {{"endpoint", job.ep.name}})
            .add(static_cast<uint64_t>(cached_tokens));
    }
    log::info("warmup", "endpoint " + job.ep.name + ": " + std::to_string(sent) + " warm requests completed; their " + std::to_string(prompt_tokens) +
                            " prompt tokens found " + std::to_string(cached_tokens) + " cached");
}

}  // namespace pulse::gateway
