// Serving: one model, a request queue worked by one thread (one sequence at a time), prefix
// reuse through checkpoints of the whole sequence state, sampling, and Chat Completions chunks
// (text, reasoning_content from <think>, tool_calls from Qwen XML, usage) streamed to the caller.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rapidjson/document.h>

#include "model.h"
#include "tokenizer.h"

namespace pulse::decoder {

struct SamplerParams {
    double temperature = 0;  // <= 0: greedy
    int64_t top_k = 0;       // 0: off
    double top_p = 1, min_p = 0;
    uint64_t seed = 0;
};

// top-k, then temperature, min-p and top-p over the softmax, then a draw from a seeded RNG.
class Sampler {
public:
    explicit Sampler(SamplerParams p) : p_(p), rng_(p.seed) {}
    int32_t sample(const float* logits, int64_t n);

private:
    SamplerParams p_;
    std::mt19937_64 rng_;
};

// What one request receives: chunk payloads (Chat Completions JSON) as they are produced.
struct Job {
    rapidjson::Document request;
    std::string prompt;
    std::vector<int32_t> tokens;
    bool thinking = true;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> chunks;
    bool done = false;
    int error_status = 0;  // a pulse_status_t when the job failed
    std::string error;
    std::atomic<bool> cancelled{false};
};

struct EngineOptions {
    std::filesystem::path model;
    int threads = 0;          // 0 = all cores
    int64_t context = 0;      // 0 = the model's context_length
    int64_t max_checkpoints = 3;  // whole-sequence states kept for prefix reuse (LRU)
    bool exact = false;           // f32 activations everywhere (Model::exact)
    std::string device;           // the compute device (device.h; "" = the default, cpu)
};

class Engine {
public:
    explicit Engine(EngineOptions o);  // loads the model; throws GgufError
    ~Engine();

    // Renders and tokenizes the request now (bad input fails here, before any output); the
    // generation runs on the engine's thread. Throws std::invalid_argument (bad request) or
    // std::length_error (prompt over the context).
    std::shared_ptr<Job> submit(rapidjson::Document request);

    const Model& model() const { return *model_; }
    const Tokenizer& tokenizer() const { return tok_; }
    size_t queued() const;
    std::string name() const { return name_; }
    int64_t context() const { return context_; }

private:
    void worker();
    void run(Job& job);

    EngineOptions opts_;
    std::shared_ptr<Model> model_;
    Tokenizer tok_;
    std::string name_;
    int64_t context_ = 0;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    bool stop_ = false;
    // Prefix reuse: states after known token sequences (the worker thread only).
    struct Checkpoint {
        std::vector<int32_t> tokens;
        Sequence seq;
    };
    std::deque<Checkpoint> checkpoints_;
    std::thread thread_;
};

}  // namespace pulse::decoder
