#include "engine.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "chat_format.h"

namespace pulse::decoder {

int32_t Sampler::sample(const float* logits, int64_t n) {
    if (p_.temperature <= 0) return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    size_t keep = p_.top_k > 0 ? std::min<size_t>(idx.size(), static_cast<size_t>(p_.top_k)) : idx.size();
    std::vector<double> prob(keep);
    double mx = logits[idx[0]], sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) / p_.temperature);
    for (auto& p : prob) p /= sum;
    if (p_.min_p > 0) {
        size_t k = 1;
        while (k < keep && prob[k] >= p_.min_p * prob[0]) ++k;
        keep = k;
    }
    if (p_.top_p < 1) {
        double acc = 0;
        size_t k = 0;
        while (k < keep) {
            acc += prob[k++];
            if (acc >= p_.top_p) break;
        }
        keep = k;
    }
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += prob[i];
    double r = std::uniform_real_distribution<double>(0, total)(rng_);
    for (size_t i = 0; i < keep; ++i) {
        r -= prob[i];
        if (r <= 0) return idx[i];
    }
    return idx[keep - 1];
}

namespace {

std::string quote(const std::string& s) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.String(s.c_str(), static_cast<rapidjson::SizeType>(s.size()));
    return {b.GetString(), b.GetSize()};
}

double num(const rapidjson::Value& req, const char* k, double d) {
    auto it = req.FindMember(k);
    return it != req.MemberEnd() && it->value.IsNumber() ? it->value.GetDouble() : d;
}

}  // namespace

Engine::Engine(EngineOptions o) : opts_(std::move(o)) {
    auto file = GgufFile::open(opts_.model);
    model_ = Model::load(file, opts_.device);
    model_->threads = opts_.threads;
    model_->exact = opts_.exact;
    tok_ = Tokenizer::load(*file);
    if (static_cast<int64_t>(tok_.size()) != model_->hparams().n_vocab)
        throw GgufError(file->name() + ": the vocabulary has " + std::to_string(tok_.size()) + " tokens but token_embd has " +
                        std::to_string(model_->hparams().n_vocab) + " rows");
    name_ = file->opt_string("general.name").value_or(opts_.model.stem().string());
    context_ = opts_.context > 0 ? std::min(opts_.context, model_->hparams().context_length) : model_->hparams().context_length;
    thread_ = std::thread([this] { worker(); });
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

std::shared_ptr<Job> Engine::submit(rapidjson::Document request) {
    auto job = std::make_shared<Job>();
    job->prompt = render_chat(request, &job->thinking);
    job->tokens = tok_.encode(job->prompt, true);
    if (static_cast<int64_t>(job->tokens.size()) >= context_)
        throw std::length_error("This model's maximum context length is " + std::to_string(context_) + " tokens. However, your prompt has " +
                                std::to_string(job->tokens.size()) + " tokens.");
    job->request = std::move(request);
    {
        std::lock_guard lock(mu_);
        queue_.push_back(job);
    }
    cv_.notify_one();
    return job;
}

void Engine::worker() {
#ifdef _OPENMP
    if (opts_.threads > 0) omp_set_num_threads(opts_.threads);
#endif
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (stop_) {
                for (auto& j : queue_) {
                    std::lock_guard jl(j->mu);
                    j->done = true;
                    j->error = "the decoder is shutting down";
                    j->error_status = -1;
                    j->cv.notify_all();
                }
                return;
            }
            job = queue_.front();
            queue_.pop_front();
        }
        try {
            run(*job);
        } catch (const std::exception& e) {
            std::lock_guard jl(job->mu);
            job->error = std::string("decoder: ") + e.what();
            job->error_status = -1;
        }
        std::lock_guard jl(job->mu);
        job->done = true;
        job->cv.notify_all();
    }
}

void Engine::run(Job& job) {
    const auto& req = job.request;
    auto emit = [&](std::string chunk) {
        std::lock_guard lock(job.mu);
        job.chunks.push_back(std::move(chunk));
        job.cv.notify_all();
    };
    const std::string model_name = req.HasMember("model") && req["model"].IsString() ? req["model"].GetString() : name_;
    static std::atomic<uint64_t> counter{0};
    const std::string id = "chatcmpl-decoder-" + std::to_string(++counter);
    const std::string head = "{\"id\":\"" + id + "\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":" + quote(model_name) + ",\"choices\":";
    auto delta = [&](const std::string& d, const char* finish = nullptr) {
        emit(head + "[{\"index\":0,\"delta\":" + d + ",\"finish_reason\":" + (finish ? quote(finish) : std::string("null")) + "}]}");
    };
    delta(R"({"role":"assistant","content":""})");

    // Prefix reuse: the longest checkpoint whose tokens start the prompt (and leave one to run).
    const auto& tokens = job.tokens;
    auto best = checkpoints_.end();
    for (auto it = checkpoints_.begin(); it != checkpoints_.end(); ++it)
        if (it->tokens.size() < tokens.size() && std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin()) &&
            (best == checkpoints_.end() || it->tokens.size() > best->tokens.size()))
            best = it;
    Sequence seq = best != checkpoints_.end() ? best->seq : *model_->new_sequence();
    const size_t cached = best != checkpoints_.end() ? best->tokens.size() : 0;
    if (best != checkpoints_.end()) {  // most recently used goes last: evicted last
        Checkpoint used = std::move(*best);
        checkpoints_.erase(best);
        checkpoints_.push_back(std::move(used));
    }
    auto remember = [&](std::vector<int32_t> toks, const Sequence& s) {
        checkpoints_.push_back({std::move(toks), s});
        while (static_cast<int64_t>(checkpoints_.size()) > std::max<int64_t>(opts_.max_checkpoints, 1)) checkpoints_.pop_front();
    };
    // Prefill all but the last prompt token, checkpoint there, then the last token for logits.
    if (tokens.size() - 1 > cached) {
        model_->forward(seq, std::vector<int32_t>(tokens.begin() + static_cast<long>(cached), tokens.end() - 1));
        remember(std::vector<int32_t>(tokens.begin(), tokens.end() - 1), seq);
    }
    if (job.cancelled) return;
    std::vector<float> logits = model_->forward(seq, {tokens.back()});

    SamplerParams sp;
    sp.temperature = num(req, "temperature", 0);
    sp.top_p = num(req, "top_p", 1);
    sp.min_p = num(req, "min_p", 0);
    sp.top_k = static_cast<int64_t>(num(req, "top_k", 0));
    sp.seed = static_cast<uint64_t>(num(req, "seed", static_cast<double>(std::random_device{}())));
    Sampler sampler(sp);
    int64_t max_new = static_cast<int64_t>(num(req, "max_completion_tokens", num(req, "max_tokens", 0)));
    int64_t room = context_ - static_cast<int64_t>(tokens.size());
    if (max_new <= 0 || max_new > room) max_new = room;
    std::vector<std::string> stops;
    if (req.HasMember("stop")) {
        if (req["stop"].IsString()) stops.push_back(req["stop"].GetString());
        else if (req["stop"].IsArray())
            for (const auto& s : req["stop"].GetArray())
                if (s.IsString() && s.GetStringLength()) stops.push_back(s.GetString());
    }
    OutputParser parser(req.HasMember("tools") ? &req["tools"] : nullptr, job.thinking);
    Utf8Stream utf8;
    int calls = 0;
    std::string content_so_far;
    bool stopped_by_string = false;
    auto send = [&](const std::vector<OutputParser::Event>& events) {
        for (const auto& e : events) {
            if (e.kind == OutputParser::Event::reasoning) delta("{\"reasoning_content\":" + quote(e.text) + "}");
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
                if (!text.empty()) delta("{\"content\":" + quote(text) + "}");
            } else {
                std::string call_id = id + "-call-" + std::to_string(calls);
                delta("{\"tool_calls\":[{\"index\":" + std::to_string(calls) + ",\"id\":" + quote(call_id) +
                      ",\"type\":\"function\",\"function\":{\"name\":" + quote(e.name) + ",\"arguments\":" + quote(e.arguments) + "}}]}");
                ++calls;
            }
        }
    };
    std::vector<int32_t> generated;
    std::string finish = "length";
    bool eog = false;
    const int64_t V = model_->hparams().n_vocab;
    // A reasoning budget (vLLM's field name, or llama-server's): after that many tokens inside
    // the think block, the block is closed by force and the answer follows.
    const int64_t budget = static_cast<int64_t>(num(req, "thinking_token_budget", num(req, "reasoning_budget_tokens", -1)));
    int64_t reasoning_tokens = 0;
    std::vector<int32_t> forced;  // tokens to emit instead of sampling
    while (static_cast<int64_t>(generated.size()) < max_new) {
        if (job.cancelled) return;
        if (forced.empty() && budget >= 0 && parser.thinking() && reasoning_tokens >= budget) {
            forced = tok_.encode("\n</think>\n\n");
            std::reverse(forced.begin(), forced.end());
        }
        int32_t t;
        if (!forced.empty()) {
            t = forced.back();
            forced.pop_back();
        } else {
            t = sampler.sample(logits.data(), V);
        }
        if (parser.thinking()) ++reasoning_tokens;
        if (tok_.is_eog(t)) {
            finish = "stop";
            eog = true;
            break;
        }
        generated.push_back(t);
        send(parser.feed(utf8.push(tok_.piece(t))));
        if (stopped_by_string) {
            finish = "stop";
            break;
        }
        if (static_cast<int64_t>(generated.size()) >= max_new) break;
        logits = model_->forward(seq, {t});
    }
    send(parser.feed(utf8.flush()));
    send(parser.finish());
    // The state now covers the prompt and every generated token but the last: the next turn of
    // the conversation usually starts with exactly these.
    {
        const size_t covered = static_cast<size_t>(seq.n_past) - tokens.size();  // generated tokens already run
        std::vector<int32_t> all(tokens);
        all.insert(all.end(), generated.begin(), generated.begin() + static_cast<long>(std::min(covered, generated.size())));
        if (static_cast<int64_t>(all.size()) == seq.n_past && covered > 0) remember(std::move(all), seq);
    }
    if (calls > 0 && finish == "stop") finish = "tool_calls";
    delta("{}", finish.c_str());
    emit(head + "[],\"usage\":{\"prompt_tokens\":" + std::to_string(tokens.size()) + ",\"completion_tokens\":" +
         std::to_string(generated.size() + eog) + ",\"total_tokens\":" + std::to_string(tokens.size() + generated.size() + eog) +
         ",\"prompt_tokens_details\":{\"cached_tokens\":" + std::to_string(cached) + "}}}");
}

}  // namespace pulse::decoder
