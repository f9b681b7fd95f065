#include "serving/engine.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string_view>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "qwen_format.h"

namespace pulse::decoder {
using qwen::OutputParser;
using qwen::render_chat;

namespace {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

void write_string(JsonWriter& w, std::string_view s) { w.String(s.data(), static_cast<rapidjson::SizeType>(s.size())); }

// One chat.completion.chunk as an OpenAI-compatible server streams it: the response's id and
// model, then what `rest` writes (its choices, and the usage in the last one).
template <class Rest>
std::string chunk_json(std::string_view id, std::string_view model, Rest&& rest) {
    rapidjson::StringBuffer b;
    JsonWriter w(b);
    w.StartObject();
    w.Key("id");
    write_string(w, id);
    w.Key("object");
    w.String("chat.completion.chunk");
    w.Key("created");
    w.Int(0);
    w.Key("model");
    write_string(w, model);
    rest(w);
    w.EndObject();
    return {b.GetString(), b.GetSize()};
}

double num(const rapidjson::Value& req, const char* k, double d) {
    auto it = req.FindMember(k);
    return it != req.MemberEnd() && it->value.IsNumber() ? it->value.GetDouble() : d;
}

}  // namespace

// A request being served. Its prompt runs in chunks (phase prefill) until one token is left;
// from then on each step feeds it one token (`next`: the last prompt token, then each sampled
// one) and returns its logits.
struct Engine::Active {
    std::shared_ptr<Job> job;
    Sequence seq;
    size_t cached = 0;  // prompt tokens a checkpoint covered
    size_t fed = 0;     // prompt tokens run so far
    int64_t chunk = 0;  // prompt tokens in the current step
    int32_t next = -1;  // the token the next step feeds (decoding)
    std::vector<float> logits;
    std::string id, model;  // the chunks' response id and model name
    Sampler sampler;
    OutputParser parser;
    Utf8Stream utf8;
    std::vector<std::string> stops;
    std::string content_so_far;
    bool stopped_by_string = false;
    int calls = 0;
    int64_t max_new = 0, budget = -1, reasoning_tokens = 0;
    std::vector<int32_t> generated;
    std::vector<int32_t> forced;  // tokens to emit instead of sampling (reversed)
    std::string finish = "length";
    bool eog = false;
    bool ignore_eos = false;  // the request's ignore_eos (vLLM's and llama-server's): generate to max_tokens
    // Speculative decoding (EngineOptions::draft): the request's drafting and verification;
    // its sampler is then the one that decides. The step's bookkeeping: whether the request has
    // a segment in it, how many of its rows stand, whether it ended.
    std::unique_ptr<Speculator> spec;
    bool in_step = false, ended = false, failed = false;
    bool decoded = false;  // decoded a token in the last step and goes on (its next step drafts after `next`)
    int64_t kept = 0;

    Active(std::shared_ptr<Job> j, SamplerParams sp)
        : job(std::move(j)), sampler(sp), parser(job->request.HasMember("tools") ? &job->request["tools"] : nullptr, job->thinking) {}
    bool decoding() const { return next >= 0; }

    void emit(std::string chunk) {
        std::lock_guard lock(job->mu);
        job->chunks.push_back(std::move(chunk));
        job->cv.notify_all();
    }
    // A chunk with one choice: its delta's members (written by `members`) and finish reason.
    template <class Members>
    void delta(Members&& members, const char* finish_reason = nullptr) {
        emit(chunk_json(id, model, [&](JsonWriter& w) {
            w.Key("choices");
            w.StartArray();
            w.StartObject();
            w.Key("index");
            w.Int(0);
            w.Key("delta");
            w.StartObject();
            members(w);
            w.EndObject();
            w.Key("finish_reason");
            if (finish_reason) w.String(finish_reason);
            else w.Null();
            w.EndObject();
            w.EndArray();
        }));
    }
    void text_delta(const char* field, std::string_view text) {
        delta([&](JsonWriter& w) {
            w.Key(field);
            write_string(w, text);
        });
    }
    void call_delta(const OutputParser::Event& e) {
        const std::string call_id = id + "-call-" + std::to_string(calls);
        delta([&](JsonWriter& w) {
            w.Key("tool_calls");
            w.StartArray();
            w.StartObject();
            w.Key("index");
            w.Int64(calls);
            w.Key("id");
            write_string(w, call_id);
            w.Key("type");
            w.String("function");
            w.Key("function");
            w.StartObject();
            w.Key("name");
            write_string(w, e.name);
            w.Key("arguments");
            write_string(w, e.arguments);
            w.EndObject();
            w.EndObject();
            w.EndArray();
        });
    }
    void send(const std::vector<OutputParser::Event>& events) {
        for (const auto& e : events) {
            if (e.kind == OutputParser::Event::reasoning) text_delta("reasoning_content", e.text);
            else if (e.kind == OutputParser::Event::content) {
                std::string text = e.text;
                if (!stops.empty()) {
                    content_so_far += text;
                    for (const auto& s : stops)
                        if (auto at = content_so_far.find(s); at != std::string::npos) {
                            size_t keep = text.size() - std::min(text.size(), content_so_far.size() - at);
                            text = text.substr(0, keep);
                            stopped_by_string = true;
                        }
                }
                if (!text.empty()) text_delta("content", text);
            } else {
                call_delta(e);
                ++calls;
            }
        }
    }
};

Engine::Engine(EngineOptions o) : Engine(std::move(o), nullptr) {}

Engine::Engine(EngineOptions o, std::unique_ptr<Device> device) : opts_(std::move(o)) {
    if (opts_.max_sequences < 1 || opts_.max_sequences > EngineOptions::kMaxSequences)
        throw std::invalid_argument("max_sequences must be 1 to " + std::to_string(EngineOptions::kMaxSequences) + ", not " +
                                    std::to_string(opts_.max_sequences));
    if (opts_.max_checkpoints < 0) throw std::invalid_argument("max_checkpoints must be 0 (automatic) or more");
    if (opts_.max_checkpoints == 0) opts_.max_checkpoints = std::max<int64_t>(3, 2 * opts_.max_sequences);
    if (opts_.draft.kind != DraftSetting::off && (opts_.draft_k < 1 || opts_.draft_k > Speculator::kMaxDraft))
        throw std::invalid_argument("draft_k must be 1 to " + std::to_string(Speculator::kMaxDraft) + ", not " + std::to_string(opts_.draft_k));
    if (!opts_.draft_vocab.empty() && opts_.draft.kind != DraftSetting::mtp)
        throw std::invalid_argument("draft_vocab goes with draft = \"mtp\" (it narrows the MTP block's head)");
    auto file = GgufFile::open(opts_.model);
    // The model is loaded on the engine's own thread, the one that runs every step: the load's
    // parallel loops (repacking weights) would otherwise make libgomp keep a second team of
    // workers for the constructing thread, and with more managed threads than CPUs libgomp cuts
    // its spin before sleeping to ~1000 iterations, so every parallel region of every step paid
    // a futex wake-up (a VM exit on a virtual machine): 40k context switches for 128 tokens.
    std::promise<void> loaded;
    auto load = loaded.get_future();
    thread_ = std::thread([this, file, dev = std::move(device), &loaded]() mutable {
        try {
#ifdef _OPENMP
            if (opts_.threads > 0) omp_set_num_threads(opts_.threads);
#endif
            model_ = dev ? Model::load(file, std::move(dev)) : Model::load(file, opts_.device);
            model_->threads = opts_.threads;
            model_->exact = opts_.exact;
            tok_ = Tokenizer::load(*file);
            name_ = file->opt_string("general.name").value_or(opts_.model.stem().string());
            eog_ = tok_.eog_tokens();
            if (static_cast<int64_t>(tok_.size()) != model_->hparams().n_vocab)
                throw GgufError(file->name() + ": the vocabulary has " + std::to_string(tok_.size()) + " tokens but token_embd has " +
                                std::to_string(model_->hparams().n_vocab) + " rows");
            if (opts_.draft.kind == DraftSetting::mtp && !model_->has_mtp())
                throw GgufError(file->name() + ": draft = \"mtp\" but the file has no MTP block (no nextn_predict_layers)");
            if (!opts_.draft_vocab.empty()) model_->set_draft_vocab(read_draft_vocab(opts_.draft_vocab, model_->hparams().n_vocab));
            if (opts_.draft.kind == DraftSetting::model) {
                draft_model_ = Model::load(GgufFile::open(opts_.draft.path), opts_.device);
                draft_model_->threads = opts_.threads;
                draft_model_->exact = opts_.exact;
                if (draft_model_->hparams().n_vocab != model_->hparams().n_vocab)
                    throw GgufError(opts_.draft.path + ": the draft model's vocabulary has " + std::to_string(draft_model_->hparams().n_vocab) +
                                    " tokens, the model's " + std::to_string(model_->hparams().n_vocab) + ": drafts must use the same vocabulary");
            }
            const int64_t trained = model_->hparams().context_length;
            context_ = opts_.context > 0 ? std::min(opts_.context, trained) : trained;
            // One token through a sequence that is then dropped: its state buffers fault in here,
            // not in the first request's prefill, and wait in the device's spares for it (a page
            // fault each otherwise: on a VM that doubled a new sequence's first step).
            model_->forward(*model_->new_sequence(), {0});
        } catch (...) {
            loaded.set_exception(std::current_exception());
            return;
        }
        loaded.set_value();
        worker();
    });
    try {
        load.get();
    } catch (...) {
        thread_.join();
        throw;
    }
}

Engine::~Engine() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
        for (auto& j : queue_) j->cancelled = true;
    }
    cv_.notify_all();
    thread_.join();
}

size_t Engine::queued() const {
    std::lock_guard lock(mu_);
    return queue_.size();
}

Engine::Stats Engine::stats() const {
    std::lock_guard lock(mu_);
    return stats_;
}

std::shared_ptr<Job> Engine::prepare(rapidjson::Document request) const {
    auto job = std::make_shared<Job>();
    job->prompt = render_chat(request, &job->thinking);
    job->tokens = tok_.encode(job->prompt, true);
    if (static_cast<int64_t>(job->tokens.size()) >= context_)
        throw std::length_error("This model's maximum context length is " + std::to_string(context_) + " tokens. However, your prompt has " +
                                std::to_string(job->tokens.size()) + " tokens.");
    job->request = std::move(request);
    return job;
}

std::shared_ptr<Job> Engine::submit(rapidjson::Document request) {
    std::vector<rapidjson::Document> one;
    one.push_back(std::move(request));
    return submit_all(std::move(one)).front();
}

std::vector<std::shared_ptr<Job>> Engine::submit_all(std::vector<rapidjson::Document> requests) {
    std::vector<std::shared_ptr<Job>> jobs;
    for (auto& r : requests) jobs.push_back(prepare(std::move(r)));
    {
        std::lock_guard lock(mu_);
        queue_.insert(queue_.end(), jobs.begin(), jobs.end());
    }
    cv_.notify_one();
    return jobs;
}

namespace {

void end_job(Job& job, const std::string& error = "") {
    std::lock_guard lock(job.mu);
    if (!error.empty()) {
        job.error = error;
        job.error_status = -1;
    }
    job.done = true;
    job.cv.notify_all();
}

}  // namespace

void Engine::worker() {
    std::vector<std::unique_ptr<Active>> active;  // in arrival order: prefill goes first come, first served
    for (;;) {
        std::vector<std::shared_ptr<Job>> arrived;
        {
            std::unique_lock lock(mu_);
            if (active.empty()) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (stop_) {
                for (auto& j : queue_) end_job(*j, "the decoder is shutting down");
                for (auto& a : active) end_job(*a->job, "the decoder is shutting down");
                active_count_ = 0;
                return;
            }
            while (static_cast<int64_t>(active.size() + arrived.size()) < opts_.max_sequences && !queue_.empty()) {
                arrived.push_back(std::move(queue_.front()));
                queue_.pop_front();
            }
        }
        for (auto& job : arrived) {
            if (job->cancelled) {
                end_job(*job);
                continue;
            }
            try {
                active.push_back(admit(job));
            } catch (const std::exception& e) {
                end_job(*job, std::string("decoder: ") + e.what());
            }
        }
        // A cancelled request leaves at once; its sequence is dropped with it.
        std::erase_if(active, [](const std::unique_ptr<Active>& a) {
            if (!a->job->cancelled) return false;
            end_job(*a->job);
            return true;
        });
        active_count_ = active.size();
        if (active.empty()) continue;

        run_step(active);
        std::erase_if(active, [&](const std::unique_ptr<Active>& ap) {
            Active& a = *ap;
            if (a.failed) return true;
            if (!a.ended) return false;
            try {
                finish(a);
                end_job(*a.job);
            } catch (const std::exception& e) {
                end_job(*a.job, std::string("decoder: ") + e.what());
            }
            return true;
        });
        active_count_ = active.size();
        uint64_t sequence_bytes = 0, checkpoint_bytes = 0;
        for (const auto& a : active) sequence_bytes += a->seq.bytes();
        for (const auto& c : checkpoints_) checkpoint_bytes += c.seq.bytes();
        std::lock_guard lock(mu_);
        stats_.sequence_bytes = sequence_bytes;
        stats_.checkpoint_bytes = checkpoint_bytes;
    }
}

int64_t Engine::drafts_for(const Active& a, int64_t draft_room) const {
    // Never more drafts than tokens the request may still take, nor past its reasoning budget
    // (the forced end of the think block comes in a step of its own).
    if (!a.spec || !a.forced.empty()) return 0;
    int64_t k = std::min<int64_t>(a.spec->next_k(), draft_room);
    k = std::min(k, a.max_new - static_cast<int64_t>(a.generated.size()) - 1);
    if (a.budget >= 0 && a.parser.thinking()) k = std::min(k, a.budget - a.reasoning_tokens - 1);
    return std::max<int64_t>(k, 0);
}

void Engine::plan(Active& a, std::vector<Segment>& segs, int64_t& rows, const std::vector<int32_t>& drafts) {
    a.in_step = false;
    a.chunk = 0;
    if (a.decoding()) {
        if (!a.spec) {
            segs.push_back(Segment{&a.seq, &a.next, 1, a.logits.data(), false});
        } else {
            std::vector<int32_t> r{a.next};
            r.insert(r.end(), drafts.begin(), drafts.end());
            segs.push_back(a.spec->main_rows(r.data(), static_cast<int64_t>(r.size()), static_cast<int64_t>(r.size()) - 1, true));
        }
    } else {
        if (rows >= Model::kMaxStepRows) return;
        const int64_t left = static_cast<int64_t>(a.job->tokens.size() - 1 - a.fed);
        a.chunk = std::min(left, Model::kMaxStepRows - rows);
        const int32_t* chunk = a.job->tokens.data() + a.fed;
        segs.push_back(a.spec ? a.spec->main_rows(chunk, a.chunk, 0, false) : Segment{&a.seq, chunk, a.chunk, nullptr, false});
    }
    rows += segs.back().n;
    a.in_step = true;
}

void Engine::run_step(std::vector<std::unique_ptr<Active>>& active) {
    // Every decoding request's next token (and drafts), then prompt chunks in arrival order with
    // the rows left (max_sequences <= kMaxSequences keeps at least half for them; drafts share
    // that half's other part). The decoding requests' drafts are made together (the MTP block's
    // rows of each draft position in one pass).
    // A step that fails (its drafting included: device memory, a bad token) fails every request
    // in it, none is left half-run; the others wait in the queue.
    auto fail_all = [&](const std::exception& e) {
        for (auto& a : active)
            if (!a->failed) end_job(*a->job, std::string("decoder: ") + e.what()), a->failed = true;
    };
    std::vector<Segment> segs;
    int64_t rows = 0, decoding = 0;
    for (auto& a : active) decoding += a->decoding();
    const int64_t draft_room = decoding ? (Model::kMaxStepRows / 2 - decoding) / decoding : 0;
    std::vector<Speculator*> specs;
    std::vector<int32_t> lasts;
    std::vector<int> ks;
    const auto drafting_started = std::chrono::steady_clock::now();
    for (auto& a : active)
        if (a->decoding() && a->spec) {
            a->spec->set_worth(draft_costs_.worth());
            specs.push_back(a->spec.get());
            lasts.push_back(a->next);
            ks.push_back(static_cast<int>(drafts_for(*a, draft_room)));
        }
    std::vector<std::vector<int32_t>> drafts;
    try {
        drafts = Speculator::draft_together(specs, lasts, ks);
    } catch (const std::exception& e) {
        return fail_all(e);
    }
    const std::vector<int32_t> none;
    size_t next_drafts = 0;  // drafts[] follows the decoding requests with a speculator, in order
    for (auto& a : active)
        if (a->decoding()) plan(*a, segs, rows, a->spec ? drafts[next_drafts++] : none);
    for (auto& a : active)
        if (!a->decoding()) plan(*a, segs, rows, none);
    bool decode_only = true;
    {
        std::lock_guard lock(mu_);
        ++stats_.steps;
        for (const auto& sg : segs) {
            (sg.logits ? stats_.decode_rows : stats_.prompt_rows) += static_cast<uint64_t>(sg.n);
            decode_only = decode_only && sg.logits;
        }
        stats_.peak_batch = std::max(stats_.peak_batch, static_cast<int64_t>(segs.size()));
        stats_.last_batch = static_cast<int64_t>(segs.size());
    }
    const auto started = std::chrono::steady_clock::now();
    try {
        model_->step(segs);
    } catch (const std::exception& e) {
        return fail_all(e);
    }
    // Speculation: rows past what a request keeps are undone (keep), then the MTP block catches
    // up on every request's kept rows in one more step.
    std::vector<Segment> catch_ups;
    for (auto& ap : active) {
        Active& a = *ap;
        if (!a.in_step) continue;
        try {
            const bool was_decoding = a.decoding();
            a.decoded = false;
            if (was_decoding) a.ended = !advance(a), a.decoded = !a.ended;
            else a.fed += static_cast<size_t>(a.chunk);
            if (a.spec) a.spec->keep(was_decoding ? a.kept : a.chunk);
        } catch (const std::exception& e) {
            end_job(*a.job, std::string("decoder: ") + e.what());
            a.failed = true;
        }
    }
    try {
        // A request that goes on decoding has the block run its next token too: the next
        // step's first draft (Speculator::catch_up), while the rows fit one step.
        int64_t catch_rows = 0;
        for (auto& a : active)
            if (a->spec && a->in_step && !a->failed) {
                const int64_t kept = a->decoded ? a->kept : a->chunk;
                const bool next = a->decoded && a->spec->next_k() > 0 && catch_rows + kept + 1 <= Model::kMaxStepRows;
                if (auto s = a->spec->catch_up(next ? std::optional<int32_t>(a->next) : std::nullopt)) {
                    catch_ups.push_back(*s);
                    catch_rows += s->n;
                }
            }
        if (!catch_ups.empty()) model_->mtp_step(catch_ups);
    } catch (const std::exception& e) {
        return fail_all(e);
    }
    uint64_t decided = 0;  // before a finished prompt's last token makes its request decoding
    for (auto& a : active)
        if (a->in_step && a->decoding()) decided += static_cast<uint64_t>(a->kept);
    for (auto& a : active)  // the prompt but its last token: a checkpoint
        if (a->in_step && !a->failed && !a->decoding() && a->fed + 1 == a->job->tokens.size()) {
            remember(std::vector<int32_t>(a->job->tokens.begin(), a->job->tokens.end() - 1), *a);
            a->next = a->job->tokens.back();
        }
    if (decode_only && !specs.empty()) {
        int64_t drafted = 0;
        for (const auto& d : drafts) drafted += static_cast<int64_t>(d.size());
        draft_costs_.observe(drafted, static_cast<int64_t>(decided), std::chrono::duration<double>(std::chrono::steady_clock::now() - drafting_started).count());
    }
    if (decode_only) {
        std::lock_guard lock(mu_);
        stats_.decode_only_rows += static_cast<uint64_t>(rows);
        stats_.decode_only_tokens += decided;
        stats_.decode_only_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    }
}

void Engine::remember(std::vector<int32_t> tokens, const Active& a) {
    checkpoints_.push_back({std::move(tokens), a.seq, a.spec ? a.spec->carry() : Speculator::Carry{}});
    while (static_cast<int64_t>(checkpoints_.size()) > opts_.max_checkpoints) checkpoints_.pop_front();
}

std::unique_ptr<Engine::Active> Engine::admit(std::shared_ptr<Job> job) {
    const auto& req = job->request;
    SamplerParams sp;
    sp.temperature = num(req, "temperature", 0);
    sp.top_p = num(req, "top_p", 1);
    sp.min_p = num(req, "min_p", 0);
    sp.top_k = static_cast<int64_t>(num(req, "top_k", 0));
    sp.seed = static_cast<uint64_t>(num(req, "seed", static_cast<double>(std::random_device{}())));
    auto a = std::make_unique<Active>(std::move(job), sp);
    a->model = req.HasMember("model") && req["model"].IsString() ? req["model"].GetString() : name_;
    static std::atomic<uint64_t> counter{0};
    a->id = "chatcmpl-decoder-" + std::to_string(++counter);
    a->delta([](JsonWriter& w) {
        w.Key("role");
        w.String("assistant");
        w.Key("content");
        w.String("");
    });

    // Prefix reuse: the longest checkpoint whose tokens start the prompt (and leave one to run).
    const auto& tokens = a->job->tokens;
    auto best = checkpoints_.end();
    for (auto it = checkpoints_.begin(); it != checkpoints_.end(); ++it)
        if (it->tokens.size() < tokens.size() && std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin()) &&
            (best == checkpoints_.end() || it->tokens.size() > best->tokens.size()))
            best = it;
    const Speculator::Carry* carry = nullptr;
    if (best != checkpoints_.end()) {
        a->seq = best->seq;
        a->cached = best->tokens.size();
        Checkpoint used = std::move(*best);  // most recently used goes last: evicted last
        checkpoints_.erase(best);
        checkpoints_.push_back(std::move(used));
        carry = &checkpoints_.back().carry;
    } else {
        a->seq = std::move(*model_->new_sequence());
    }
    if (opts_.draft.kind != DraftSetting::off)
        a->spec = std::make_unique<Speculator>(*model_, a->seq, opts_.draft_k, sp, opts_.draft_adaptive, DraftSource{draft_model_.get()}, carry);
    a->fed = a->cached;
    if (a->fed + 1 == tokens.size()) a->next = tokens.back();
    a->logits.resize(static_cast<size_t>(model_->hparams().n_vocab));

    a->max_new = static_cast<int64_t>(num(req, "max_completion_tokens", num(req, "max_tokens", 0)));
    const int64_t room = context_ - static_cast<int64_t>(tokens.size());
    if (a->max_new <= 0 || a->max_new > room) a->max_new = room;
    if (req.HasMember("stop")) {
        if (req["stop"].IsString()) a->stops.push_back(req["stop"].GetString());
        else if (req["stop"].IsArray())
            for (const auto& s : req["stop"].GetArray())
                if (s.IsString() && s.GetStringLength()) a->stops.push_back(s.GetString());
    }
    // A reasoning budget (vLLM's field name, or llama-server's): after that many tokens inside
    // the think block, the block is closed by force and the answer follows.
    a->budget = static_cast<int64_t>(num(req, "thinking_token_budget", num(req, "reasoning_budget_tokens", -1)));
    if (auto it = req.FindMember("ignore_eos"); it != req.MemberEnd() && it->value.IsBool()) a->ignore_eos = it->value.GetBool();
    return a;
}

bool Engine::advance(Active& a) {
    if (a.forced.empty() && a.budget >= 0 && a.parser.thinking() && a.reasoning_tokens >= a.budget) {
        a.forced = tok_.encode("\n</think>\n\n");
        std::reverse(a.forced.begin(), a.forced.end());
    }
    std::vector<int32_t> decided;
    if (!a.forced.empty()) {
        decided.push_back(a.forced.back());
        a.forced.pop_back();
    } else {
        std::vector<float>& logits = a.spec ? a.spec->step_logits() : a.logits;
        if (a.ignore_eos)
            for (size_t row = 0; row < logits.size(); row += static_cast<size_t>(model_->hparams().n_vocab))
                for (int32_t e : eog_) logits[row + static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
        if (a.spec) {
            decided = a.spec->judge();
            note_speculation(*a.spec);
        } else {
            decided.push_back(a.sampler.sample(logits.data(), static_cast<int64_t>(logits.size())));
        }
    }
    // The step ran [next, drafts...]: after the i-th decided token, i + 1 of those rows stand.
    for (size_t i = 0; i < decided.size(); ++i)
        if (!take(a, decided[i])) {
            a.kept = static_cast<int64_t>(i) + 1;
            return false;
        }
    a.kept = static_cast<int64_t>(decided.size());
    return true;
}

void Engine::note_speculation(const Speculator& spec) {
    if (!spec.last_drafted()) return;
    {
        std::lock_guard lock(mu_);
        auto& t = stats_.speculation;
        const int64_t k = spec.last_drafted(), m = spec.last_accepted();
        ++t.steps;
        t.drafted += k;
        t.accepted += m;
        t.tokens += m + 1;
        for (int64_t i = 0; i < k; ++i) ++t.drafted_at[static_cast<size_t>(i)], t.accepted_at[static_cast<size_t>(i)] += i < m;
    }
    if (opts_.on_speculation) opts_.on_speculation(spec.last_drafted(), spec.last_accepted());
}

bool Engine::take(Active& a, int32_t t) {
    if (a.generated.empty() && !a.eog) {
        std::lock_guard lock(a.job->mu);
        if (a.job->first_token == std::chrono::steady_clock::time_point{}) a.job->first_token = std::chrono::steady_clock::now();
    }
    if (a.parser.thinking()) ++a.reasoning_tokens;
    if (tok_.is_eog(t)) {
        a.finish = "stop";
        a.eog = true;
        return false;
    }
    a.generated.push_back(t);
    a.send(a.parser.feed(a.utf8.push(tok_.piece(t))));
    if (a.stopped_by_string) {
        a.finish = "stop";
        return false;
    }
    if (static_cast<int64_t>(a.generated.size()) >= a.max_new) return false;
    a.next = t;
    return true;
}

void Engine::finish(Active& a) {
    a.send(a.parser.feed(a.utf8.flush()));
    a.send(a.parser.finish());
    const auto& tokens = a.job->tokens;
    // The state now covers the prompt and every generated token but the last: the next turn of
    // the conversation usually starts with exactly these.
    {
        const size_t covered = static_cast<size_t>(a.seq.n_past) - tokens.size();  // generated tokens already run
        std::vector<int32_t> all(tokens);
        all.insert(all.end(), a.generated.begin(), a.generated.begin() + static_cast<long>(std::min(covered, a.generated.size())));
        if (static_cast<int64_t>(all.size()) == a.seq.n_past && covered > 0) remember(std::move(all), a);
    }
    if (a.calls > 0 && a.finish == "stop") a.finish = "tool_calls";
    a.delta([](JsonWriter&) {}, a.finish.c_str());
    const uint64_t generated = a.generated.size() + a.eog;
    a.emit(chunk_json(a.id, a.model, [&](JsonWriter& w) {
        w.Key("choices");
        w.StartArray();
        w.EndArray();
        w.Key("usage");
        w.StartObject();
        w.Key("prompt_tokens");
        w.Uint64(tokens.size());
        w.Key("completion_tokens");
        w.Uint64(generated);
        w.Key("total_tokens");
        w.Uint64(tokens.size() + generated);
        w.Key("prompt_tokens_details");
        w.StartObject();
        w.Key("cached_tokens");
        w.Uint64(a.cached);
        w.EndObject();
        w.EndObject();
    }));
}

}  // namespace pulse::decoder
