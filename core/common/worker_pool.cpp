#include "common/worker_pool.h"

#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

namespace pulse {

struct WorkerPool::State {
    Options opts;
    std::mutex m;
    std::condition_variable work;  // a task was queued, or the pool stops
    std::condition_variable idle;  // a task ended or a thread left (stop waits on it)
    std::deque<std::unique_ptr<TaskBase>> queue;
    int in_flight = 0;  // queued or running
    int threads = 0, waiting = 0;
    bool stopping = false;

    static void work_loop(std::shared_ptr<State> s) {
        ::pthread_setname_np(::pthread_self(), s->opts.thread_name.substr(0, 15).c_str());
        std::unique_lock lock(s->m);
        for (;;) {
            while (s->queue.empty()) {
                if (s->stopping) return s->leave();
                ++s->waiting;
                bool woke = true;
                if (s->opts.idle_exit == std::chrono::steady_clock::duration::max())
                    s->work.wait(lock, [&] { return !s->queue.empty() || s->stopping; });
                else
                    woke = s->work.wait_for(lock, s->opts.idle_exit, [&] { return !s->queue.empty() || s->stopping; });
                --s->waiting;
                if (!woke) return s->leave();  // idle too long
            }
            std::unique_ptr<TaskBase> task = std::move(s->queue.front());
            s->queue.pop_front();
            lock.unlock();
            task->run();
            task.reset();  // what it owns is released before the pool counts it done
            lock.lock();
            --s->in_flight;
            s->idle.notify_all();
        }
    }
    void leave() {  // under m
        --threads;
        idle.notify_all();
    }
};

WorkerPool::WorkerPool(Options opts) : state_(std::make_shared<State>()) { state_->opts = std::move(opts); }

WorkerPool::~WorkerPool() {
    {
        std::lock_guard lock(state_->m);
        if (state_->stopping) return;  // stopped by its owner, who chose how long to wait
    }
    stop();
}

bool WorkerPool::submit_task(std::unique_ptr<TaskBase> task) {
    State& s = *state_;
    std::unique_lock lock(s.m);
    if (s.stopping || s.in_flight >= s.opts.max_tasks) return false;  // `task` is destroyed after the lock
    ++s.in_flight;
    s.queue.push_back(std::move(task));
    if (static_cast<int>(s.queue.size()) > s.waiting && s.threads < s.opts.max_tasks) {
        try {
            std::thread(State::work_loop, state_).detach();
            ++s.threads;
        } catch (const std::system_error&) {
            if (s.threads == 0) {  // no thread to run it: refused after all
                task = std::move(s.queue.back());
                s.queue.pop_back();
                --s.in_flight;
                return false;
            }  // else a running thread takes it after its task
        }
    }
    s.work.notify_one();
    return true;
}

bool WorkerPool::stop(std::chrono::steady_clock::duration wait) {
    State& s = *state_;
    std::unique_lock lock(s.m);
    s.stopping = true;
    s.work.notify_all();
    const auto all_done = [&] { return s.threads == 0; };
    if (wait == std::chrono::steady_clock::duration::max()) {
        s.idle.wait(lock, all_done);
        return true;
    }
    return s.idle.wait_for(lock, wait, all_done);
}

int WorkerPool::in_flight() const {
    std::lock_guard lock(state_->m);
    return state_->in_flight;
}

}  // namespace pulse
