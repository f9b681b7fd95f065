// A wake-up another thread can send: an eventfd, so a waiter can sleep on it together with
// sockets (epoll, poll) until the next event or deadline, never polling on a timer to notice.
// Used two ways: cleared by its one waiter after each wake-up (an event loop's inbox, the warmer
// told of traffic or stop), or signalled once and never cleared, a latch every waiter sees (the
// gateway's drain cut).
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/deadlines.h"

namespace pulse {

class Wakeup {
public:
    Wakeup() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
        if (fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
    }
    ~Wakeup() { ::close(fd_); }
    Wakeup(const Wakeup&) = delete;
    Wakeup& operator=(const Wakeup&) = delete;

    // Readable (POLLIN) from now until cleared.
    void signal() {
        const uint64_t one = 1;
        ssize_t n = ::write(fd_, &one, sizeof one);
        (void)n;  // only a counter at its maximum refuses, and that one is readable already
    }
    void clear() {
        uint64_t v;
        ssize_t n = ::read(fd_, &v, sizeof v);
        (void)n;
    }
    bool signalled() const {
        pollfd p{fd_, POLLIN, 0};
        return ::poll(&p, 1, 0) > 0;
    }
    // Sleeps until signalled or `until`, then clears; true when it was signalled.
    bool wait_until(std::chrono::steady_clock::time_point until) {
        pollfd p{fd_, POLLIN, 0};
        ::poll(&p, 1, timeout_ms(until, std::chrono::steady_clock::now()));
        const bool woke = (p.revents & POLLIN) != 0;
        if (woke) clear();
        return woke;
    }
    int fd() const { return fd_; }

private:
    int fd_;
};

}  // namespace pulse
