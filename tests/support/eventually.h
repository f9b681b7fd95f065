// The tests' one way to wait for something another thread or process does: poll the condition
// every 20 ms, bounded in time.
#pragma once

#include <chrono>
#include <thread>

namespace pulse::test {

// Polls `cond` every 20 ms for up to `ms`; its last answer.
template <class F>
bool eventually(F cond, int ms = 10000) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
        if (cond()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return cond();
}

}  // namespace pulse::test
