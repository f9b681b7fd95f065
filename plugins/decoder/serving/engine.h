// Serving: one model, a request queue worked by one thread with continuous batching (up to
// max_sequences requests in flight, each step one batched pass over all of them: their next
// tokens and a prefill chunk together), prefix reuse through checkpoints of the whole sequence
// state, sampling, speculative decoding (each request's drafts verified in the same batched
// step), and Chat Completions chunks (text, reasoning_content from <think>, tool_calls from Qwen
// XML, usage) streamed to the caller.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rapidjson/document.h>

#include "model/model.h"
#include "model/tokenizer.h"
#include "speculation/speculate.h"

namespace pulse::decoder {

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
    // When the first token was sampled (under mu; unset until then): time to first token for
    // whoever measures it.
    std::chrono::steady_clock::time_point first_token{};
};

struct EngineOptions {
    std::filesystem::path model;
    int threads = 0;          // 0 = all cores
    int64_t context = 0;      // 0 = the model's context_length
    // Whole-sequence states kept for prefix reuse (LRU); 0 = two per sequence slot (a request
    // leaves one at its prompt and one at its end), at least 3.
    int64_t max_checkpoints = 0;
    bool exact = false;           // f32 activations everywhere (Model::exact)
    std::string device;           // the compute device (device.h; "" = the default, cpu)
    // Requests served at once (continuous batching); more wait in the queue. 1 = one at a time.
    int64_t max_sequences = 4;
    static constexpr int64_t kMaxSequences = 32;  // leaves half of a step's rows to prefill
    // Speculative decoding: drafts from the file's MTP block or a draft model, `draft_k` per
    // step (1..Speculator::kMaxDraft), or with `draft_adaptive` as many as the running
    // acceptance makes worth it, up to draft_k. Greedy output is unchanged; sampled output is
    // distributed as without drafts (speculate.h).
    DraftSetting draft;
    int draft_k = 4;
    bool draft_adaptive = false;
    // draft = "mtp": a draft vocabulary file (read_draft_vocab): the block drafts among those
    // tokens only (Model::set_draft_vocab). Empty: the whole vocabulary.
    std::string draft_vocab;
    // Called on the engine's thread after each speculative step that drafted: drafts proposed,
    // and how many of them were kept (always the first ones).
    std::function<void(int64_t drafted, int64_t accepted)> on_speculation;
};

class Engine {
public:
    explicit Engine(EngineOptions o);  // loads the model; throws GgufError
    // The same on a device the caller made (options.device is then not read), as Model::load.
    Engine(EngineOptions o, std::unique_ptr<Device> device);
    ~Engine();

    // Renders and tokenizes the request now (bad input fails here, before any output); the
    // generation runs on the engine's thread. Throws std::invalid_argument (bad request) or
    // std::length_error (prompt over the context).
    std::shared_ptr<Job> submit(rapidjson::Document request);
    // Several at once: all are checked first (one bad request submits none), then queued
    // together, so the engine admits them in one go (what a benchmark of N streams needs).
    std::vector<std::shared_ptr<Job>> submit_all(std::vector<rapidjson::Document> requests);

    const Model& model() const { return *model_; }
    const Tokenizer& tokenizer() const { return tok_; }
    size_t queued() const;
    size_t active() const { return active_count_; }  // requests being served now
    // What the batching did since start: steps run, rows in them (decode tokens and prompt
    // tokens), and the most requests one step served; and the steps that only decoded (no
    // prompt chunk): their rows and wall time, sampling and streaming included — the steady
    // decode throughput.
    struct Stats {
        uint64_t steps = 0, decode_rows = 0, prompt_rows = 0;
        int64_t peak_batch = 0;
        uint64_t decode_only_rows = 0;
        double decode_only_s = 0;
        // After the latest step: the requests it served, and the device memory the per-request
        // states (KV caches, DeltaNet states) and the prefix checkpoints hold.
        int64_t last_batch = 0;
        uint64_t sequence_bytes = 0, checkpoint_bytes = 0;
        // Decode-only steps: the tokens they decoded (rows count drafts too).
        uint64_t decode_only_tokens = 0;
        // Speculative decoding, every request's steps summed (steps: those that drafted).
        SpeculationStats speculation = SpeculationStats::zero();
    };
    Stats stats() const;
    int64_t max_sequences() const { return opts_.max_sequences; }
    int64_t max_checkpoints() const { return opts_.max_checkpoints; }
    std::string name() const { return name_; }
    int64_t context() const { return context_; }

private:
    struct Active;  // a request being served: its sequence, sampler, parser and progress
    void worker();
    std::unique_ptr<Active> admit(std::shared_ptr<Job> job);
    // One batched step over the requests being served (their segments, then the MTP catch-ups
    // speculation needs); a request that failed or ended is marked so (Active::failed, ended).
    void run_step(std::vector<std::unique_ptr<Active>>& active);
    // How many drafts a decoding request proposes this step (0 without a speculator).
    int64_t drafts_for(const Active& a, int64_t draft_room) const;
    // Adds `a`'s segment to the step: its next token and `drafts`, or its next prompt chunk.
    void plan(Active& a, std::vector<Segment>& segs, int64_t& rows, const std::vector<int32_t>& drafts);
    bool advance(Active& a);  // after a's logits came: choose, emit; false when it ended
    bool take(Active& a, int32_t t);  // emit one decoded token; false when it ended
    void note_speculation(const Speculator& spec);
    void finish(Active& a);
    void remember(std::vector<int32_t> tokens, const Active& a);
    std::shared_ptr<Job> prepare(rapidjson::Document request) const;  // render, tokenize, check

    EngineOptions opts_;
    std::shared_ptr<Model> model_;
    std::shared_ptr<Model> draft_model_;  // draft = model:PATH
    Tokenizer tok_;
    std::string name_;
    int64_t context_ = 0;
    std::vector<int32_t> eog_;  // end-of-generation tokens (masked for ignore_eos)
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    bool stop_ = false;
    std::atomic<size_t> active_count_{0};
    Stats stats_;  // under mu_
    // Prefix reuse: states after known token sequences (the worker thread only).
    struct Checkpoint {
        std::vector<int32_t> tokens;
        Sequence seq;
        Speculator::Carry carry;  // with speculation: what drafting from there needs
    };
    std::deque<Checkpoint> checkpoints_;
    // What a draft costs in this engine's decode-only steps (all sequences' drafts together):
    // every adaptive speculator's threshold (the worker thread only).
    DraftCosts draft_costs_;
    std::thread thread_;
};

}  // namespace pulse::decoder
