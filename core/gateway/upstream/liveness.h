// Tells a frozen backend from a busy one while a request waits on it.
//
// A backend can hold a request's connection and send nothing for a long time for two reasons:
// it is working (llama-server sends no response head until the whole prompt is processed, a
// minute or more for a long one), or it is frozen (SIGSTOP, a hung driver, a deadlocked
// engine) and will never answer. Waiting out upstream.head_timeout_s (300 s) costs the user
// five minutes in the second case; cutting earlier loses a long prefill in the first.
//
// The difference shows on a second connection: a working llama-server or vLLM answers GET
// {base}/models at once from its HTTP threads while the engine computes (measured: llama-server
// answered in under 10 ms in the middle of a 53 s prefill), a frozen process answers nothing.
// So once a request has waited upstream.liveness_after_s without a byte, its endpoint is asked
// that question; no answer within upstream.liveness_timeout_s means frozen, and the request
// fails over (or, mid-stream, resumes) at once. The question is asked again every
// liveness_after_s while the wait goes on, and one probe answers for every request waiting on
// the same endpoint.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "config/config.h"

namespace pulse::gateway {

class Liveness {
public:
    Liveness();
    ~Liveness();
    Liveness(const Liveness&) = delete;
    Liveness& operator=(const Liveness&) = delete;

    // A request has heard nothing from `ep` since `silent_since`. Returns the reason when a
    // probe that started during that silence got no answer (the endpoint is frozen), else ""
    // — and starts a probe when one is due (once the request has been silent `after_s` and
    // no probe started in the last `after_s`). One probe's verdict serves every request that
    // was already silent when it started, whoever asked for it. Never blocks.
    std::string frozen(const config::Endpoint& ep, std::chrono::steady_clock::time_point silent_since, double after_s, double timeout_s);

    // Whether `ep` answered a probe that started at or after `since`: the process was serving
    // while the request waited (a busy backend, not a frozen one).
    bool answered_since(const config::Endpoint& ep, std::chrono::steady_clock::time_point since);

private:
    struct Probe {
        bool running = false, answered = true;
        std::chrono::steady_clock::time_point started{};
        std::chrono::steady_clock::time_point answered_at_start{};  // when the newest answered probe started
        std::string why;  // what the unanswered probe saw
        double timeout_s = 0;
    };
    void run();

    std::mutex m_;
    std::condition_variable cv_;
    std::map<std::string, Probe> probes_;  // by endpoint URL
    std::deque<std::pair<config::Endpoint, double>> queue_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace pulse::gateway
