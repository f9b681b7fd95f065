// core/common/worker_pool: the one pool the HTTP workers and the policies' decide calls run on.
// What they rely on: a task is refused, never queued, past max_tasks; a refused task is released
// unrun; threads start on demand and leave when idle; stop() lets queued tasks run, and gives up
// on a stuck one after the wait it was given without freeing what that task still uses.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>

#include "common/worker_pool.h"
#include "support/eventually.h"

using pulse::WorkerPool;
using pulse::test::eventually;
using namespace std::chrono;

namespace {

int threads_of_this_process() {
    int n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
    return n;
}

// The thread count once threads left by earlier cases have gone (unchanged for 100 ms; an
// emulator may run threads of its own, so no absolute number is assumed).
int settled_threads() {
    int last = threads_of_this_process();
    for (int stable = 0, i = 0; stable < 20 && i < 1000; ++i) {
        std::this_thread::sleep_for(milliseconds(5));
        const int now = threads_of_this_process();
        stable = now == last ? stable + 1 : 0;
        last = now;
    }
    return last;
}

// A task that holds its thread until released (bounded: 10 s).
struct Gate {
    std::atomic<bool> open{false};
    std::atomic<int> entered{0}, left{0};
    auto task() {
        return [this] {
            ++entered;
            eventually([&] { return open.load(); });
            ++left;
        };
    }
};

}  // namespace

TEST_CASE("past max_tasks a task is refused and released unrun; room again once one ends") {
    WorkerPool pool({"test-pool", 2});
    Gate gate;
    REQUIRE(pool.submit(gate.task()));
    REQUIRE(pool.submit(gate.task()));
    CHECK(eventually([&] { return gate.entered.load() == 2; }, 5000));
    CHECK(pool.in_flight() == 2);
    auto owned = std::make_shared<int>(7);
    std::weak_ptr<int> watch = owned;
    bool ran = false;
    CHECK_FALSE(pool.submit([p = std::move(owned), &ran] { ran = *p == 7; }));
    CHECK(watch.expired());  // what the refused task owned is released
    gate.open = true;
    CHECK(eventually([&] { return pool.in_flight() == 0; }, 5000));
    CHECK(pool.submit([&ran] { ran = true; }));
    CHECK(eventually([&] { return ran; }, 5000));
}

TEST_CASE("a task may own what it works on (move-only captures)") {
    WorkerPool pool({"test-pool", 4});
    std::atomic<int> got{0};
    auto box = std::make_unique<int>(41);
    REQUIRE(pool.submit([b = std::move(box), &got]() mutable { got = ++*b; }));
    CHECK(eventually([&] { return got.load() == 42; }, 5000));
}

TEST_CASE("stop lets queued tasks run, then refuses new ones") {
    WorkerPool pool({"test-pool", 8});
    std::atomic<int> done{0};
    for (int i = 0; i < 8; ++i) REQUIRE(pool.submit([&done] {
        std::this_thread::sleep_for(milliseconds(20));
        ++done;
    }));
    CHECK(pool.stop(seconds(30)));
    CHECK(done.load() == 8);
    CHECK(pool.in_flight() == 0);
    CHECK_FALSE(pool.submit([] {}));
}

TEST_CASE("stop gives up on a stuck task after its wait; the task finishes later with what it uses alive") {
    auto gate = std::make_shared<Gate>();
    {
        WorkerPool pool({"test-pool", 2});
        REQUIRE(pool.submit([gate] { gate->task()(); }));
        REQUIRE(eventually([&] { return gate->entered.load() == 1; }, 5000));
        const auto t0 = steady_clock::now();
        CHECK_FALSE(pool.stop(milliseconds(100)));
        CHECK(steady_clock::now() - t0 < seconds(5));
        CHECK(pool.in_flight() == 1);
    }  // the pool is gone; its thread is not
    gate->open = true;
    CHECK(eventually([&] { return gate->left.load() == 1; }, 5000));
}

TEST_CASE("threads start on demand and leave after idle_exit") {
    const int before = settled_threads();
    WorkerPool pool({"test-pool", 4, milliseconds(50)});
    Gate gate;
    for (int i = 0; i < 3; ++i) REQUIRE(pool.submit(gate.task()));
    CHECK(eventually([&] { return gate.entered.load() == 3; }, 5000));
    CHECK(threads_of_this_process() == before + 3);  // one per task waiting with no idle thread
    gate.open = true;
    CHECK(eventually([&] { return threads_of_this_process() == before; }, 5000));  // idle: gone
    std::atomic<bool> ran{false};
    REQUIRE(pool.submit([&ran] { ran = true; }));  // a new one when needed again
    CHECK(eventually([&] { return ran.load(); }, 5000));
}

TEST_CASE("a steady load reuses an idle thread instead of starting another") {
    const int before = settled_threads();
    WorkerPool pool({"test-pool", 16});
    for (int i = 0; i < 20; ++i) {
        std::atomic<bool> ran{false};
        REQUIRE(pool.submit([&ran] { ran = true; }));
        REQUIRE(eventually([&] { return ran.load() && pool.in_flight() == 0; }, 5000));
    }
    CHECK(threads_of_this_process() <= before + 1);
}
