#include "gateway/background/warmup.h"

#include <poll.h>

#include <chrono>

#include "common/deadlines.h"
#include "common/log.h"
#include "common/metrics.h"
#include "gateway/upstream/upstream.h"

namespace pulse::gateway {

using namespace std::chrono;

Warmer::Warmer(PrefixStore& store, config::Upstream timeouts, double slot_save_interval_s, double quiet_s)
    : store_(store),
      timeouts_(timeouts),
      slots_(timeouts, duration_cast<steady_clock::duration>(duration<double>(slot_save_interval_s))),
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
    wake_.signal();
    thread_.join();
}

void Warmer::recovered(const std::string& model, const config::Endpoint& ep, std::shared_ptr<EndpointHealth> health, BackendDialect dialect,
                       std::function<bool(const std::string&)> wanted) {
    if (ep.is_plugin()) return;  // in-process backends manage their own caches
    health->awaiting_first_turn = true;
    {
        std::lock_guard lock(m_);
        jobs_.push_back({Job::replay, model, ep, std::move(health), std::move(dialect), std::move(wanted)});
    }
    cv_.notify_all();
}

void Warmer::served(const config::Endpoint& ep, std::shared_ptr<EndpointHealth> health, BackendDialect dialect) {
    if (!slots_.want_save(ep, dialect)) return;
    {
        std::lock_guard lock(m_);
        Job j;
        j.kind = Job::save;
        j.ep = ep;
        j.health = std::move(health);
        j.dialect = std::move(dialect);
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
        const TrafficWatch watching(*job.health, wake_);
        if (job.kind == Job::save) {
            slots_.save(job.ep, *job.health, job.dialect, [this](steady_clock::time_point until) { return pause_until(until); });
        } else {
            slots_.recover(job.ep, job.dialect);  // counted once, saved slots loaded
            warm(job);
        }
    }
}

// Waits until the endpoint has had no real request for warmup.quiet_s. A server that just came
// back is about to get the requests that waited for it (held in the retry window, retried by the
// client), and a replay running then is batched with them: its prefill delays their first token.
// The quiet time runs from the recovery or the last real request seen, whichever is later (kept
// in `q` across the replays of one recovery). Bounded (10 min); false when stopping or when the
// endpoint went down again. Asleep in between: a real request starting or ending wakes it
// (TrafficWatch), so the quiet time counts from the moment the last one ended.
bool Warmer::wait_quiet(const Job& job, Quiet& q) {
    auto& [quiet_since, seen, busy] = q;
    for (const auto bound = steady_clock::now() + minutes(10);;) {
        const auto now = steady_clock::now();
        const bool busy_now = job.health->in_flight.load() > 0;
        if (busy_now || busy || job.health->real_requests.load() != seen) {
            seen = job.health->real_requests.load();
            quiet_since = now;  // traffic now, or it ended since the last look
        }
        busy = busy_now;
        if (!busy && now - quiet_since >= quiet_) return job.health->healthy();
        if (now >= bound || !pause_until(busy ? bound : std::min(bound, quiet_since + quiet_))) return false;
    }
}

bool Warmer::pause_until(steady_clock::time_point until) {
    wake_.wait_until(until);
    std::lock_guard lock(m_);
    return !stop_;
}

void Warmer::warm(const Job& job) {
    if (!job.dialect.warms()) {
        log::info("warmup", "endpoint " + job.ep.name + " is back; profile '" + job.dialect.profile() +
                                "' has no warm_request (SDK < 1.4): no prompts are replayed");
        return;
    }
    auto bodies = store_.bodies(job.model, job.wanted, job.since);
    if (bodies.empty()) return;
    // (A one-slot server gets its replays too: a real request arriving during one cancels it.)
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
        auto req = job.dialect.warm_request(body);
        if (!req) continue;
        auto usage = job.dialect.read_usage();
        uint64_t real_before = job.health->real_requests.load();
        UpEvent error;
        // Its own connection: a pooled one may date from before the endpoint went down.
        std::unique_ptr<DetachedBody> up = send_http(job.ep, *req, timeouts_, /*fresh=*/true, error);
        std::string outcome = "failed";
        auto deadline = steady_clock::now() + seconds(600);
        std::vector<UpEvent> events;
        // Read on this thread (the warmer's own): destroying `up` closes the connection, which
        // makes the backend drop the replay (at its next step, or for llama-server at its next
        // prompt batch, as its profile's replay asks for progress chunks).
        while (up && outcome == "failed" && steady_clock::now() < deadline) {
            if (job.health->real_requests.load() != real_before) {
                outcome = "preempted";  // real traffic wins
                break;
            }
            {
                std::lock_guard lock(m_);
                if (stop_) return;
            }
            // Asleep until the backend sends, a real request starts (or stop), or a deadline.
            pollfd p[2] = {{up->fd(), POLLIN, 0}, {wake_.fd(), POLLIN, 0}};
            ::poll(p, 2, timeout_ms(std::min(deadline, up->idle_deadline()), steady_clock::now()));
            if (p[1].revents & POLLIN) wake_.clear();
            events.clear();
            up->read(events);
            bool over = false;
            for (const auto& e : events) {
                if (e.kind == UpEvent::Kind::done) outcome = "ok";
                if (e.kind == UpEvent::Kind::failed || e.kind == UpEvent::Kind::rejected) over = true;
                if (e.kind == UpEvent::Kind::data) usage->feed(e.text);
            }
            if (over || (outcome != "ok" && (up->exhausted() || up->silence(steady_clock::now()).has_value()))) break;
        }
        if (outcome == "ok") {
            usage->finish(true);
            prompt_tokens += usage->input();
            cached_tokens += usage->cached();
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
