// Health of one upstream endpoint, from active probes and from what real requests see.
// Shared by every model and config generation that names the same endpoint (keyed by URL),
// so a reload does not forget what is known about a backend.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "common/wakeup.h"

namespace pulse::gateway {

class EndpointHealth {
public:
    explicit EndpointHealth(std::string key) : key_(std::move(key)) {}

    const std::string& key() const { return key_; }
    bool healthy() const { return healthy_.load(std::memory_order_relaxed); }

    // A probe or a real request saw the endpoint work / fail. Returns true when this call
    // changed the state (so the caller can log it, or start a warmup on recovery).
    // After kFailureRun real requests in a row failed, a probe's success does not count: a
    // backend can answer GET /models and still refuse every request (a broken engine behind a
    // live HTTP server). Then only a real request that succeeds makes it healthy again.
    static constexpr int kFailureRun = 3;
    bool mark_healthy(bool real_request);
    bool mark_unhealthy(const std::string& why, bool real_request);
    int request_failures() const { return request_failures_.load(); }

    // The endpoint answered a request in a way that says it is set up wrong, not slow or down
    // (HTTP 404: it does not serve the configured model, or not at that path): down until a
    // probe shows the model listed or a real request succeeds. A
    // probe's plain answer does not bring it back: the server was answering all along.
    // Set before mark_unhealthy with the reason.
    void set_misconfigured(bool yes) { misconfigured_ = yes; }
    bool misconfigured() const { return misconfigured_.load(); }

    std::string last_error() const;
    // What an in-process backend's health hook last said (a JSON object; "" for HTTP).
    void set_detail(std::string json);
    std::string detail() const;
    // Seconds since the last state change.
    double seconds_in_state() const;

    // Real requests currently talking to this endpoint; warmup stays out of their way.
    std::atomic<int> in_flight{0};
    // Bumped by every real request, so a warmup can tell that real traffic arrived.
    std::atomic<uint64_t> real_requests{0};
    // Set when the endpoint came back after being down, cleared by the first real request that
    // completes there: what that request found in the cache says what warmup achieved.
    std::atomic<bool> awaiting_first_turn{false};

    // While set, a real request starting or ending here signals `w`: the warmer, which stays out
    // of real traffic's way, sleeps on it instead of polling. One watcher at a time (TrafficWatch).
    void watch_traffic(Wakeup* w) {
        std::lock_guard lock(m_);
        traffic_watch_ = w;
    }
    void traffic_changed() {
        std::lock_guard lock(m_);
        if (traffic_watch_) traffic_watch_->signal();
    }

private:
    std::string key_;
    std::atomic<bool> healthy_{true};
    std::atomic<bool> misconfigured_{false};
    std::atomic<int> request_failures_{0};  // real requests failed in a row
    mutable std::mutex m_;
    std::string last_error_;
    std::string detail_;
    Wakeup* traffic_watch_ = nullptr;  // under m_
    std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
};

// Counts a real request in flight on an endpoint for its lifetime.
struct InFlight {
    EndpointHealth& h;
    explicit InFlight(EndpointHealth& e) : h(e) {
        h.real_requests.fetch_add(1);
        h.in_flight.fetch_add(1);
        h.traffic_changed();
    }
    ~InFlight() {
        h.in_flight.fetch_sub(1);
        h.traffic_changed();
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
};

// Watches an endpoint's real traffic for as long as it lives (EndpointHealth::watch_traffic).
class TrafficWatch {
public:
    TrafficWatch(EndpointHealth& h, Wakeup& w) : h_(h) { h_.watch_traffic(&w); }
    ~TrafficWatch() { h_.watch_traffic(nullptr); }
    TrafficWatch(const TrafficWatch&) = delete;
    TrafficWatch& operator=(const TrafficWatch&) = delete;

private:
    EndpointHealth& h_;
};

}  // namespace pulse::gateway
