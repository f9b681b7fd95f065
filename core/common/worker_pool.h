// The one worker pool: threads started on demand, each running queued tasks one at a time. The
// HTTP server's request workers and each model policy's decide calls run on one.
//
// A thread is started only when a task waits and no thread is idle, up to max_tasks, so a steady
// load reuses a few threads; one idle for idle_exit leaves, so a burst's threads go away. At most
// max_tasks tasks are queued or running: past that submit() refuses, and the caller answers
// "busy" at once instead of queueing work it cannot start.
//
// The threads are detached and share the pool's state, so a task that never returns (a plugin
// call stuck past its deadline) cannot hold up the pool's owner: stop() waits for running tasks
// only as long as it is told, and what the task still uses stays alive with it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

namespace pulse {

class WorkerPool {
public:
    struct Options {
        std::string thread_name;  // what `top -H` shows (15 characters at most)
        int max_tasks = 1;        // queued or running at once, and the most threads
        std::chrono::steady_clock::duration idle_exit = std::chrono::steady_clock::duration::max();
    };
    explicit WorkerPool(Options opts);
    // stop(forever), unless stopped already.
    ~WorkerPool();
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    // Queues `task` (a callable, moved; it may own what it works on). False, and `task` is
    // destroyed unrun, when max_tasks are queued or running or the pool is stopping.
    template <class F>
    bool submit(F&& task) {
        return submit_task(std::make_unique<Task<std::decay_t<F>>>(std::forward<F>(task)));
    }

    // Takes no more tasks; those queued still run, then the threads leave. Waits for that at
    // most `wait`; true when every thread has left.
    bool stop(std::chrono::steady_clock::duration wait = std::chrono::steady_clock::duration::max());

    int in_flight() const;  // tasks queued or running

    struct TaskBase {
        virtual ~TaskBase() = default;
        virtual void run() = 0;
    };

private:
    template <class F>
    struct Task final : TaskBase {
        explicit Task(F&& fn) : f(std::move(fn)) {}
        explicit Task(const F& fn) : f(fn) {}
        void run() override { f(); }
        F f;
    };
    bool submit_task(std::unique_ptr<TaskBase> task);

    struct State;
    std::shared_ptr<State> state_;
};

}  // namespace pulse
