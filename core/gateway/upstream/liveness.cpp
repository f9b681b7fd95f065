#include "gateway/upstream/liveness.h"

#include <pthread.h>

#include <cstdio>

#include "gateway/upstream/upstream.h"

namespace pulse::gateway {

using namespace std::chrono;

Liveness::Liveness() : thread_([this] { run(); }) {}

Liveness::~Liveness() {
    {
        std::lock_guard lock(m_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

std::string Liveness::frozen(const config::Endpoint& ep, steady_clock::time_point silent_since, double after_s, double timeout_s) {
    const auto after = duration_cast<steady_clock::duration>(duration<double>(after_s));
    const auto now = steady_clock::now();
    std::lock_guard lock(m_);
    Probe& p = probes_[ep.url];
    // A probe that began while this request was already silent, and got no answer: the process
    // did not answer anything for timeout_s while the request waited. (It was started for
    // whichever request reached after_s first; a request that fell silent a moment later is
    // answered by the same verdict, not made to wait for a probe of its own.)
    if (!p.running && !p.answered && p.started >= silent_since) {
        char when[96];
        std::snprintf(when, sizeof when, "no answer to GET /models within %g s after %g s without a byte", p.timeout_s, after_s);
        return std::string("the backend stopped answering (frozen?): ") + when + " (upstream.liveness_after_s): " + p.why;
    }
    if (!p.running && now >= silent_since + after && now - p.started >= after) {
        p.running = true;
        p.started = now;
        p.timeout_s = timeout_s;
        queue_.emplace_back(ep, timeout_s);
        cv_.notify_one();
    }
    return {};
}

bool Liveness::answered_since(const config::Endpoint& ep, steady_clock::time_point since) {
    std::lock_guard lock(m_);
    auto it = probes_.find(ep.url);
    return it != probes_.end() && it->second.answered_at_start != steady_clock::time_point{} && it->second.answered_at_start >= since;
}

void Liveness::run() {
    ::pthread_setname_np(::pthread_self(), "pulse-liveness");
    std::unique_lock lock(m_);
    for (;;) {
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        auto [ep, timeout_s] = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        // Any HTTP answer, whatever its status, says the process is serving: only silence counts.
        ProbeAnswer a = get_models(ep, timeout_s);
        lock.lock();
        Probe& p = probes_[ep.url];
        p.running = false;
        p.answered = a.answered;
        if (a.answered) p.answered_at_start = p.started;
        p.why = a.error;
    }
}

}  // namespace pulse::gateway
