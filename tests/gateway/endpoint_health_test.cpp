// core/gateway/background/endpoint_health: the state failover and warmup read. What they rely
// on: each change of state is reported once (the caller logs it, or starts a warmup on the
// recovery); a server that answers its probe but fails every real request stays down until a
// real request succeeds; real traffic wakes whoever watches it (the warmer), and no one else.
#include <doctest/doctest.h>

#include "common/wakeup.h"
#include "gateway/background/endpoint_health.h"

using pulse::Wakeup;
using namespace pulse::gateway;

TEST_CASE("a change of state is reported once, with the reason kept") {
    EndpointHealth h("http://127.0.0.1:1/v1");
    CHECK(h.healthy());
    CHECK(h.mark_unhealthy("connection refused", false));
    CHECK_FALSE(h.mark_unhealthy("connection refused again", false));  // already down: no second report
    CHECK_FALSE(h.healthy());
    CHECK(h.last_error() == "connection refused again");
    CHECK(h.mark_healthy(false));  // a probe brings it back: the recovery a warmup starts on
    CHECK_FALSE(h.mark_healthy(false));
    CHECK(h.healthy());
}

TEST_CASE("after kFailureRun real failures in a row a probe's success does not count; a real success does") {
    EndpointHealth h("k");
    for (int i = 0; i < EndpointHealth::kFailureRun - 1; ++i) h.mark_unhealthy("500", true);
    CHECK(h.mark_healthy(false));  // fewer failures than the run: the probe still counts
    for (int i = 0; i < EndpointHealth::kFailureRun; ++i) h.mark_unhealthy("500", true);
    CHECK(h.request_failures() >= EndpointHealth::kFailureRun);
    CHECK_FALSE(h.mark_healthy(false));  // answering GET /models is not enough
    CHECK_FALSE(h.healthy());
    CHECK(h.mark_healthy(true));
    CHECK(h.request_failures() == 0);
    CHECK(h.healthy());
}

TEST_CASE("misconfigured: down until a real request succeeds, whatever the probe says") {
    EndpointHealth h("k");
    h.set_misconfigured(true);
    CHECK(h.mark_unhealthy("404: model not served", true));
    CHECK_FALSE(h.mark_healthy(false));
    CHECK(h.misconfigured());
    CHECK(h.mark_healthy(true));
    CHECK_FALSE(h.misconfigured());
}

TEST_CASE("a real request's start and end wake the traffic watcher; nothing is signalled without one") {
    EndpointHealth h("k");
    Wakeup w;
    {
        InFlight unwatched(h);  // no watcher yet
    }
    CHECK_FALSE(w.signalled());
    {
        const TrafficWatch watching(h, w);
        {
            InFlight r(h);
            CHECK(h.in_flight.load() == 1);
            CHECK(w.signalled());  // the start
            w.clear();
            CHECK_FALSE(w.signalled());
        }
        CHECK(w.signalled());  // the end
        CHECK(h.in_flight.load() == 0);
        w.clear();
    }
    {
        InFlight after(h);  // the watch is gone: its wake-up is not touched
    }
    CHECK_FALSE(w.signalled());
    CHECK(h.real_requests.load() == 3);
}

TEST_CASE("a wake-up: wait_until returns at the deadline unsignalled, at once when signalled, and consumes the signal") {
    Wakeup w;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_FALSE(w.wait_until(t0 + std::chrono::milliseconds(30)));
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(30));
    w.signal();
    w.signal();  // two signals before a wait: one wake-up
    CHECK(w.wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(30)));
    CHECK_FALSE(w.signalled());
}
