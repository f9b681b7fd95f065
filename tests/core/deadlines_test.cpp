// core/common/deadlines.h: the event loops' timer facility. What an owner relies on: an item
// comes back no later than the earliest time it was armed for, once per arming; a forgotten item
// never comes back; the heap stays bounded however often deadlines move.
#include <doctest/doctest.h>

#include <chrono>
#include <vector>

#include "common/deadlines.h"

using namespace std::chrono;
using pulse::Deadlines;
using Clock = steady_clock;

namespace {

std::vector<int> due(Deadlines<int>& d, Clock::time_point now) {
    std::vector<int> out;
    d.take_due(now, out);
    return out;
}

}  // namespace

TEST_CASE("items come back in deadline order, each once, only when due") {
    Deadlines<int> d;
    const auto t0 = Clock::now();
    d.arm(3, t0 + milliseconds(30));
    d.arm(1, t0 + milliseconds(10));
    d.arm(2, t0 + milliseconds(20));
    CHECK(d.next() == t0 + milliseconds(10));
    CHECK(due(d, t0).empty());
    CHECK(due(d, t0 + milliseconds(20)) == std::vector<int>{1, 2});
    CHECK(due(d, t0 + milliseconds(25)).empty());  // handed back once per arming
    CHECK(due(d, t0 + seconds(1)) == std::vector<int>{3});
    CHECK(d.next() == Clock::time_point::max());
    CHECK(d.armed() == 0);
}

TEST_CASE("a later deadline does not move an earlier alarm; an earlier one replaces a later") {
    Deadlines<int> d;
    const auto t0 = Clock::now();
    d.arm(7, t0 + milliseconds(10));
    d.arm(7, t0 + milliseconds(50));  // the owner's deadline moved later: the alarm stays early
    CHECK(d.next() == t0 + milliseconds(10));
    CHECK(due(d, t0 + milliseconds(10)) == std::vector<int>{7});
    d.arm(7, t0 + milliseconds(50));  // the owner re-arms at what is really due
    d.arm(7, t0 + milliseconds(30));  // and it moved earlier: the later entry is stale
    CHECK(d.next() == t0 + milliseconds(30));
    CHECK(due(d, t0 + milliseconds(40)) == std::vector<int>{7});
    CHECK(due(d, t0 + milliseconds(60)).empty());  // the stale 50 ms entry is not handed back
}

TEST_CASE("a disarmed item never comes back; armed again, it comes back at its new time only") {
    Deadlines<int> d;
    const auto t0 = Clock::now();
    d.arm(4, t0 + milliseconds(10));
    d.arm(5, t0 + milliseconds(20));
    d.disarm(4);
    CHECK(d.next() == t0 + milliseconds(20));
    CHECK(due(d, t0 + milliseconds(15)).empty());
    d.arm(4, t0 + milliseconds(40));  // the same key, reused (a descriptor number, say)
    CHECK(due(d, t0 + milliseconds(30)) == std::vector<int>{5});
    CHECK(due(d, t0 + milliseconds(40)) == std::vector<int>{4});
    d.arm(9, Clock::time_point::max());  // no deadline: nothing armed
    CHECK(d.armed() == 0);
    CHECK(d.next() == Clock::time_point::max());
}

TEST_CASE("epoll's timeout: -1 with nothing armed, 0 when due, rounded up to the millisecond, capped") {
    Deadlines<int> d;
    const auto t0 = Clock::now();
    CHECK(d.wait_ms(t0) == -1);
    d.arm(1, t0 + microseconds(1200));
    CHECK(d.wait_ms(t0) == 2);  // never a wake-up that finds nothing due
    CHECK(d.wait_ms(t0 + microseconds(1200)) == 0);
    CHECK(d.wait_ms(t0 + seconds(5)) == 0);
    Deadlines<int> far;
    far.arm(1, t0 + hours(2));
    CHECK(far.wait_ms(t0) == 60'000);
    CHECK(far.wait_ms(t0, 500) == 500);
}

TEST_CASE("deadlines that move earlier again and again leave a bounded heap") {
    Deadlines<int> d;
    const auto t0 = Clock::now();
    for (int key = 0; key < 10; ++key)
        for (int i = 0; i < 10'000; ++i) d.arm(key, t0 + hours(1) - milliseconds(i));  // each push makes the last stale
    CHECK(d.armed() == 10);
    CHECK(d.entries() <= 2 * d.armed() + 64);
    std::vector<int> out;
    d.take_due(t0 + hours(1), out);
    CHECK(out.size() == 10);
    CHECK(d.entries() == 0);
}
