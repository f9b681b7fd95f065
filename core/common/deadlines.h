// The timer facility of an event loop: which of its items (connections, streams) has a deadline
// due, and how long epoll_wait may sleep until the next one. A min-heap, so a loop with
// thousands of items neither wakes on a fixed tick nor scans every item when one is due.
//
// Deadlines may fire early, never late. Arming an item that already waits for an earlier time
// changes nothing (no heap push per moved deadline: a body's deadline moves with every read);
// when that earlier time comes the item is handed back, and the owner looks at what is really
// due and arms it again. So an owner keeps the truth (its own deadline fields) and uses this
// only as an alarm clock; one loop thread owns an instance (no locking).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <queue>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pulse {

// A poll or epoll_wait timeout for a deadline: milliseconds rounded up (a wake-up a little late,
// never one early enough to find nothing due), 0 once due, -1 for max (no deadline), at most
// `cap_ms` (the caller looks again).
inline int timeout_ms(std::chrono::steady_clock::time_point until, std::chrono::steady_clock::time_point now, int cap_ms = 60'000) {
    if (until == std::chrono::steady_clock::time_point::max()) return -1;
    if (until <= now) return 0;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    return static_cast<int>(std::min<int64_t>(left, cap_ms));
}

template <class Key>
class Deadlines {
public:
    using Clock = std::chrono::steady_clock;

    // Hands `key` back from due() at or before `at` (max: no wake-up wanted).
    void arm(Key key, Clock::time_point at) {
        if (at == Clock::time_point::max()) return;
        auto [it, fresh] = armed_.try_emplace(key, at);
        if (!fresh) {
            if (it->second <= at) return;  // an earlier alarm stands
            it->second = at;               // its older, later entry is now stale
        }
        heap_.push({at, key});
        if (heap_.size() > 2 * armed_.size() + 64) compact();
    }

    // Forgets `key` (an item that is gone): due() will not hand it back unless armed again.
    void disarm(Key key) { armed_.erase(key); }

    // The items whose alarm has come by `now`, appended to `out`; each is disarmed.
    void take_due(Clock::time_point now, std::vector<Key>& out) {
        while (!heap_.empty() && heap_.top().first <= now) {
            auto [at, key] = heap_.top();
            heap_.pop();
            auto it = armed_.find(key);
            if (it == armed_.end() || it->second != at) continue;  // stale
            armed_.erase(it);
            out.push_back(key);
        }
    }

    // When the next alarm is due (max: none armed).
    Clock::time_point next() {
        drop_stale();
        return heap_.empty() ? Clock::time_point::max() : heap_.top().first;
    }

    // epoll_wait's timeout for the next alarm (timeout_ms below).
    int wait_ms(Clock::time_point now, int cap_ms = 60'000) { return timeout_ms(next(), now, cap_ms); }

    size_t armed() const { return armed_.size(); }
    // Heap entries, stale ones included: at most twice the armed items plus 64.
    size_t entries() const { return heap_.size(); }

private:
    using Entry = std::pair<Clock::time_point, Key>;
    struct Later {
        bool operator()(const Entry& a, const Entry& b) const { return a.first > b.first; }
    };

    void drop_stale() {
        while (!heap_.empty()) {
            auto it = armed_.find(heap_.top().second);
            if (it != armed_.end() && it->second == heap_.top().first) return;
            heap_.pop();
        }
    }
    // Rebuilt from the live alarms when stale entries outnumber them (bounds the heap's size).
    void compact() {
        std::vector<Entry> live;
        live.reserve(armed_.size());
        for (const auto& [key, at] : armed_) live.emplace_back(at, key);
        heap_ = std::priority_queue<Entry, std::vector<Entry>, Later>(Later{}, std::move(live));
    }

    std::priority_queue<Entry, std::vector<Entry>, Later> heap_;
    std::unordered_map<Key, Clock::time_point> armed_;
};

}  // namespace pulse
