#include "gateway/upstream/stream_loop.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <stdexcept>

#include "common/deadlines.h"
#include "common/log.h"
#include "common/wakeup.h"

namespace pulse::gateway {

using namespace std::chrono;
using Clock = steady_clock;

namespace {

// A submitted job, living on the submitting thread's stack until `done` is signalled.
struct Slot;
struct Handle {
    enum Kind { wake, upstream, client, linger } kind;
    Slot* slot = nullptr;
    void* linger_body = nullptr;  // Linger* for kind == linger
};

struct Slot {
    RelayJob* job;
    std::unique_ptr<DetachedBody> body;
    server::Exchange* client;
    int cfd;
    bool want_out = false, over = false, lost = false;
    bool paused = false;  // the backend is not read while the client's queue is full
    size_t index = 0;  // position in the thread's active list
    Handle up{Handle::upstream, this}, cl{Handle::client, this};

    std::mutex m;
    std::condition_variable cv;
    bool done = false;
};

// Registration of one fd with an epoll set, `h` handed back with its events.
void watch(int ep, int op, int fd, uint32_t events, Handle* h) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = h;
    ::epoll_ctl(ep, op, fd, &ev);
}

// Bodies whose job ended after their terminal marker came but before their HTTP end did: read
// for a moment more (20 ms) so the connection can go back to the pool instead of being closed.
class Lingering {
public:
    Lingering(int ep, Deadlines<Handle*>& timers) : ep_(ep), timers_(timers) {}
    // Takes the body over, with an alarm at its deadline.
    void add(std::unique_ptr<DetachedBody> body) {
        auto& l = list_.emplace_back();
        l.body = std::move(body);
        l.h.linger_body = &l;
        watch(ep_, EPOLL_CTL_MOD, l.body->fd(), EPOLLIN, &l.h);
        timers_.arm(&l.h, Clock::now() + kLinger);
    }
    // The body of handle `h` has something to read: its end, with luck.
    void ready(Handle& h, std::vector<UpEvent>& scratch) {
        Linger& l = *static_cast<Linger*>(h.linger_body);
        if (l.dead) return;
        scratch.clear();
        l.body->read(scratch);
        if (l.body->reusable()) {
            forget(l);
            l.body->recycle();  // after leaving this epoll set: the pool may hand it out at once
        } else if (l.body->exhausted()) {
            forget(l);
        }
    }
    // Its alarm came: the backend took too long to end the body, which is closed.
    void expired(Handle& h) {
        Linger& l = *static_cast<Linger*>(h.linger_body);
        if (!l.dead) forget(l);
    }
    // Forgets (and so closes or has recycled) the bodies that are done, after a round of events.
    void sweep() { list_.remove_if([](const Linger& l) { return l.dead; }); }

private:
    struct Linger {
        std::unique_ptr<DetachedBody> body;
        Handle h{Handle::linger};
        bool dead = false;
    };
    void forget(Linger& l) {
        ::epoll_ctl(ep_, EPOLL_CTL_DEL, l.body->fd(), nullptr);
        timers_.disarm(&l.h);
        l.dead = true;
    }
    static constexpr auto kLinger = milliseconds(20);
    int ep_;
    Deadlines<Handle*>& timers_;
    std::list<Linger> list_;
};

// The hand-off between the threads that submit jobs and the loop: a list under a lock and a
// wake-up (an eventfd) for the loop; flags for stop and cut. A submitter sleeps on its own slot
// until the loop says it is done with it.
class Inbox {
public:
    int fd() const { return wake_.fd(); }

    // False when the loop is stopping (the job is not taken).
    bool submit(Slot& s) {
        {
            std::lock_guard lock(m_);
            if (stopping_) return false;
            list_.push_back(&s);
        }
        wake_.signal();
        return true;
    }
    static void wait_done(Slot& s) {
        std::unique_lock lock(s.m);
        s.cv.wait(lock, [&] { return s.done; });
    }
    static void done(Slot& s) {
        std::lock_guard lock(s.m);
        s.done = true;
        s.cv.notify_one();  // under the lock: `s` is gone once the submitter returns
    }
    void stop() { set(stopping_); }
    void cut() { set(cutting_); }

    // The loop's side: the new jobs, and whether to stop and to cut.
    struct Taken {
        std::vector<Slot*> jobs;
        bool stopping, cutting;
    };
    Taken take() {
        wake_.clear();
        Taken t;
        std::lock_guard lock(m_);
        t.jobs.swap(list_);
        t.stopping = stopping_;
        t.cutting = cutting_;
        return t;
    }

private:
    void set(bool& flag) {
        {
            std::lock_guard lock(m_);
            flag = true;
        }
        wake_.signal();
    }

    Wakeup wake_;
    std::mutex m_;
    std::vector<Slot*> list_;
    bool stopping_ = false, cutting_ = false;
};

}  // namespace

class StreamLoop::Thread {
public:
    Thread() {
        ep_ = ::epoll_create1(EPOLL_CLOEXEC);
        if (ep_ < 0) throw std::runtime_error(std::string("stream loop: ") + std::strerror(errno));
        watch(ep_, EPOLL_CTL_ADD, inbox_.fd(), EPOLLIN, &wake_);
        lingering_ = std::make_unique<Lingering>(ep_, timers_);
        thread_ = std::thread([this] { main(); });
    }

    ~Thread() {
        inbox_.stop();
        thread_.join();
        ::close(ep_);
    }

    void cut() { inbox_.cut(); }

    void run(RelayJob& job, std::unique_ptr<DetachedBody> body) {
        Slot s;
        s.job = &job;
        s.body = std::move(body);
        s.client = &job.client();
        s.cfd = s.client->fd();
        if (!inbox_.submit(s)) {
            s.client->give_up();
            job.on_client_lost();
            return;
        }
        Inbox::wait_done(s);
    }

private:
    void main() {
        ::pthread_setname_np(::pthread_self(), "pulse-relay");  // what `top -H` shows
        epoll_event evs[128];
        for (;;) {
            int n = ::epoll_wait(ep_, evs, 128, timers_.wait_ms(Clock::now()));
            if (n < 0 && errno != EINTR) {
                log::error("relay", std::string("epoll_wait failed: ") + std::strerror(errno));
                n = 0;
            }
            bool stop = false;
            for (int i = 0; i < n; ++i) {
                auto* h = static_cast<Handle*>(evs[i].data.ptr);
                switch (h->kind) {
                    case Handle::wake: stop = admit() || stop; break;
                    case Handle::upstream:
                        if (!h->slot->over) pump(*h->slot);
                        break;
                    case Handle::client:
                        if (h->slot->over) break;
                        if (evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                            lose(*h->slot);
                        else if (evs[i].events & EPOLLOUT)
                            flush(*h->slot);
                        break;
                    case Handle::linger: lingering_->ready(*h, events_); break;
                }
            }
            on_alarms();
            if (stop) {
                for (Slot* s : active_) lose(*s);
            }
            release();
            if (stop) return;
        }
    }

    // New jobs from the inbox. Returns true when the loop is stopping.
    bool admit() {
        const Inbox::Taken in = inbox_.take();
        for (Slot* s : in.jobs) {
            s->index = active_.size();
            active_.push_back(s);
            epoll_event ce{};
            ce.events = EPOLLRDHUP;  // not EPOLLIN: a pipelined next request must not count as activity
            ce.data.ptr = &s->cl;
            if (::epoll_ctl(ep_, EPOLL_CTL_ADD, s->cfd, &ce) != 0) {
                lose(*s);
                continue;
            }
            epoll_event ue{};
            ue.events = EPOLLIN;
            ue.data.ptr = &s->up;
            if (::epoll_ctl(ep_, EPOLL_CTL_ADD, s->body->fd(), &ue) != 0) {
                UpEvent e;
                e.kind = UpEvent::Kind::failed;
                e.status = PULSE_E_UNAVAILABLE;
                e.text = std::string("the backend connection broke mid-stream: ") + std::strerror(errno);
                if (s->job->on_upstream(std::move(e))) end(*s);
                continue;
            }
            pump(*s);  // a response may already be whole (its body then lingers or is gone)
        }
        if (in.cutting)
            for (Slot* s : active_)
                if (!s->over) {
                    s->job->on_cut();
                    end(*s);
                }
        return in.stopping;
    }

    void pump(Slot& s) {
        events_.clear();
        s.body->read(events_);
        for (auto& e : events_) {
            if (s.job->on_upstream(std::move(e))) {
                end(s);
                return;
            }
        }
        flush(s);
    }

    // Sends what the job produced. A full socket is waited for with EPOLLOUT; the client's
    // Outbox decides when it has waited too long (the send timeout).
    void flush(Slot& s) {
        scratch_.clear();
        s.job->take_output(scratch_);
        server::Outbox& out = s.client->out();
        if (scratch_.empty())
            out.pump();
        else
            out.send(scratch_);
        if (out.lost()) return lose(s);
        const size_t queued = out.unsent();
        if ((queued > 0) != s.want_out) watch_out(s, queued > 0);
        if (!s.paused && queued > StreamLoop::kMaxClientBuffer) pause_upstream(s, true);
        else if (s.paused && queued <= StreamLoop::kMaxClientBuffer / 2) pause_upstream(s, false);
        if (!s.over) timers_.arm(&s.up, next_deadline(s));
    }

    // The earliest of a stream's deadlines: the client's send timeout, the backend's silence
    // limits (not while the loop itself holds the backend back), the job's keepalive.
    static Clock::time_point next_deadline(Slot& s) {
        const Clock::time_point idle = s.paused ? Clock::time_point::max() : s.body->idle_deadline();
        return std::min({s.job->next_timer(), idle, s.client->out().deadline()});
    }

    // Stops (or resumes) reading the backend of a stream whose client is behind.
    void pause_upstream(Slot& s, bool pause) {
        watch(ep_, EPOLL_CTL_MOD, s.body->fd(), pause ? 0u : EPOLLIN, &s.up);
        s.paused = pause;
        if (!pause) pump(s);  // what arrived meanwhile
    }

    void watch_out(Slot& s, bool on) {
        watch(ep_, EPOLL_CTL_MOD, s.cfd, EPOLLRDHUP | (on ? EPOLLOUT : 0u), &s.cl);
        s.want_out = on;
    }

    void lose(Slot& s) {
        if (s.over) return;
        s.lost = true;
        s.client->give_up();
        s.job->on_client_lost();
        end(s);
    }

    // The job is over: last output, deregistration, the connection's fate. The submitter is
    // woken in release(), after this round of events (later events may name this slot).
    void end(Slot& s) {
        if (s.over) return;
        s.over = true;
        timers_.disarm(&s.up);
        ::epoll_ctl(ep_, EPOLL_CTL_DEL, s.cfd, nullptr);
        if (!s.lost) {
            // The job's last output joins the client's queue; what the client has not taken
            // when the response ends is the accept loop's to send.
            scratch_.clear();
            s.job->take_output(scratch_);
            s.client->send(scratch_);
        }
        DetachedBody& b = *s.body;
        if (b.reusable()) {
            ::epoll_ctl(ep_, EPOLL_CTL_DEL, b.fd(), nullptr);
            b.recycle();
        } else if (b.ended() && !b.exhausted()) {
            lingering_->add(std::move(s.body));
        } else {
            ::epoll_ctl(ep_, EPOLL_CTL_DEL, b.fd(), nullptr);
        }
        ended_.push_back(&s);
    }

    // The streams and lingering bodies whose alarm came: send timeouts, silent backends,
    // keepalives, bodies that did not end in time.
    void on_alarms() {
        due_.clear();
        timers_.take_due(Clock::now(), due_);
        for (Handle* h : due_) {
            if (h->kind == Handle::linger) {
                lingering_->expired(*h);
                continue;
            }
            Slot& s = *h->slot;
            if (!s.over) on_deadline(s, Clock::now());
        }
    }

    void on_deadline(Slot& s, Clock::time_point now) {
        if (server::Outbox& out = s.client->out(); now >= out.deadline()) {
            out.pump();  // decides: taken meanwhile, or waited too long
            if (out.lost()) return lose(s);
        }
        if (!s.paused && now >= s.body->idle_deadline()) {  // a paused backend is held back by us, not silent
            if (auto failure = s.body->silence(now); failure && s.job->on_upstream(std::move(*failure))) return end(s);
        }
        if (now >= s.job->next_timer() && s.job->on_timer()) return end(s);
        flush(s);  // sends what the timers produced; arms the next alarm
    }

    // Wakes the submitters of the jobs that ended this round and forgets them.
    void release() {
        for (Slot* s : ended_) {
            Slot* last = active_.back();
            active_[s->index] = last;
            last->index = s->index;
            active_.pop_back();
        }
        for (Slot* s : ended_) Inbox::done(*s);
        ended_.clear();
        lingering_->sweep();
    }

    int ep_ = -1;
    Inbox inbox_;
    Handle wake_{Handle::wake};
    std::thread thread_;

    // Loop-thread state.
    std::vector<Slot*> active_, ended_;
    std::unique_ptr<Lingering> lingering_;
    std::vector<UpEvent> events_;
    std::string scratch_;  // a job's output on its way into the client's queue
    Deadlines<Handle*> timers_;  // each active stream's next deadline (its `up` handle); lingering bodies
    std::vector<Handle*> due_;
};

StreamLoop::StreamLoop(int threads) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.push_back(std::make_unique<Thread>());
}

StreamLoop::~StreamLoop() = default;

void StreamLoop::cut_all() {
    for (auto& t : threads_) t->cut();
}

void StreamLoop::run(RelayJob& job, std::unique_ptr<DetachedBody> body) {
    threads_[next_.fetch_add(1, std::memory_order_relaxed) % threads_.size()]->run(job, std::move(body));
}

}  // namespace pulse::gateway
