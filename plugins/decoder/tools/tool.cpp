// pulse-decoder: the decoder's own command line, `pulse decode` and `pulse gguf` (the host
// binary runs this program for them, as it runs pulse-bench for `pulse bench`, so that `pulse`
// links none of the decoder: no ICU, no OpenMP).
//   pulse-decoder decode MODEL.gguf --prompt TEXT ...
//   pulse-decoder gguf make-demo [--mtp] [FILE] | info FILE
//   pulse-decoder distill collect|export-head|import-head|vocab ...
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "args/args.h"
#include "device/cpu/kernels.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "qwen_format.h"
#include "serving/engine.h"
#include "speculation/speculate.h"
#include "tools/distill.h"
#include "tools/synthetic.h"

namespace pulse::decoder_tool {

namespace {

const char* kDecodeFooter =
    "Runs the in-process decoder on a qwen35 GGUF file: prefill the prompt, generate N tokens.\n"
    "exit codes: 0 ok, 2 usage, 3 the file cannot be used\n";

const char* kGgufFooter =
    "The demo model's weights are random: it answers with random text. It exists so a fresh\n"
    "install can serve Codex end to end with no other server.\n";

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// `pulse decode --streams N`: N chat requests submitted together to one Engine, each waited on
// by its own thread; what the batching gives in aggregate and what each stream waits first.
// --draft and --draft-k as given.
struct DraftArgs {
    decoder::DraftSetting setting;
    int k = 4;
    bool adaptive = false;
    double synthetic_length = 0;  // --synthetic-acceptance (0: drafts judged by the model)
    std::string vocab;            // --draft-vocab FILE (draft mtp: its tokens only)
};

void write_speculation(rapidjson::Writer<rapidjson::StringBuffer>& w, const decoder::SpeculationStats& st, const DraftArgs& d,
                       const decoder::DraftCosts* costs = nullptr);

int decode_streams(const std::string& path, const std::string& prompt, int64_t streams, int64_t max_sequences, int64_t n, int threads,
                   const std::string& device, bool exact, const decoder::SamplerParams& sp, const DraftArgs& draft) {
    decoder::EngineOptions o;
    o.draft = draft.setting;
    o.draft_k = draft.k;
    o.draft_adaptive = draft.adaptive;
    o.draft_vocab = draft.vocab;
    o.model = path;
    o.threads = threads;
    o.device = device;
    o.exact = exact;
    o.max_sequences = max_sequences > 0 ? max_sequences : std::min<int64_t>(streams, decoder::EngineOptions::kMaxSequences);
    std::unique_ptr<decoder::Engine> engine;
    try {
        engine = std::make_unique<decoder::Engine>(o);
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "pulse decode: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pulse decode: %s\n", e.what());
        return 3;
    }
    struct Stream {
        std::shared_ptr<decoder::Job> job;
        double ttft = 0, done = 0;
        int64_t prompt_tokens = 0, completion_tokens = 0;
    };
    std::vector<Stream> ss(static_cast<size_t>(streams));
    std::vector<rapidjson::Document> reqs(ss.size());
    for (size_t k = 0; k < ss.size(); ++k) {
        auto& d = reqs[k];
        d.SetObject();
        auto& al = d.GetAllocator();
        rapidjson::Value msgs(rapidjson::kArrayType), m(rapidjson::kObjectType), kwargs(rapidjson::kObjectType);
        std::string content = prompt + " #" + std::to_string(k + 1);
        m.AddMember("role", "user", al);
        m.AddMember("content", rapidjson::Value(content.c_str(), al), al);
        msgs.PushBack(m, al);
        d.AddMember("messages", msgs, al);
        d.AddMember("max_tokens", n, al);
        d.AddMember("ignore_eos", true, al);
        d.AddMember("temperature", sp.temperature, al);
        d.AddMember("seed", static_cast<uint64_t>(sp.seed + k), al);
        kwargs.AddMember("enable_thinking", false, al);
        d.AddMember("chat_template_kwargs", kwargs, al);
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto since = [&](std::chrono::steady_clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
    try {
        auto jobs = engine->submit_all(std::move(reqs));
        for (size_t k = 0; k < ss.size(); ++k) ss[k].job = jobs[k];
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pulse decode: %s\n", e.what());
        return 2;
    }
    std::vector<std::thread> waiters;
    for (auto& s : ss)
        waiters.emplace_back([&s, &since] {
            auto& j = *s.job;
            std::unique_lock lock(j.mu);
            for (;;) {
                j.cv.wait(lock, [&] { return j.done || !j.chunks.empty(); });
                while (!j.chunks.empty()) {
                    rapidjson::Document c;
                    c.Parse(j.chunks.front().c_str());
                    j.chunks.pop_front();
                    if (c.IsObject() && c.HasMember("usage")) {
                        s.prompt_tokens = c["usage"]["prompt_tokens"].GetInt64();
                        s.completion_tokens = c["usage"]["completion_tokens"].GetInt64();
                    }
                }
                if (j.done) break;
            }
            s.done = since(std::chrono::steady_clock::now());
            s.ttft = since(j.first_token);
        });
    for (auto& w : waiters) w.join();
    for (const auto& s : ss)
        if (!s.job->error.empty()) {
            std::fprintf(stderr, "pulse decode: %s\n", s.job->error.c_str());
            return 1;
        }
    double wall = 0, last_ttft = 0;
    int64_t total = 0;
    for (const auto& s : ss) wall = std::max(wall, s.done), last_ttft = std::max(last_ttft, s.ttft), total += s.completion_tokens;
    const auto st = engine->stats();
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.StartObject();
    w.Key("model");
    w.String(path.c_str());
    w.Key("streams");
    w.Int64(streams);
    w.Key("max_sequences");
    w.Int64(engine->max_sequences());
    auto list = [&](const char* key, auto get) {
        w.Key(key);
        w.StartArray();
        for (const auto& s : ss) get(s);
        w.EndArray();
    };
    list("prompt_tokens", [&](const Stream& s) { w.Int64(s.prompt_tokens); });
    list("completion_tokens", [&](const Stream& s) { w.Int64(s.completion_tokens); });
    list("ttft_s", [&](const Stream& s) { w.Double(s.ttft); });
    list("done_s", [&](const Stream& s) { w.Double(s.done); });
    w.Key("wall_s");
    w.Double(wall);
    // Every stream's tokens over the whole run, prefills included; and the steady decode: rows
    // per second over the steps that only decoded (every stream past its prompt).
    w.Key("aggregate_tokens_per_s");
    w.Double(static_cast<double>(total) / std::max(wall, 1e-9));
    w.Key("decode_tokens_per_s");
    w.Double(st.decode_only_s > 0 ? static_cast<double>(st.decode_only_tokens) / st.decode_only_s : 0);
    w.Key("steps");
    w.Uint64(st.steps);
    if (draft.setting.kind != decoder::DraftSetting::off) {
        write_speculation(w, st.speculation, draft);
    }
    w.Key("peak_batch");
    w.Int64(st.peak_batch);
    w.Key("device");
    w.String(engine->model().device().name());
    w.Key("device_note");
    w.String(engine->model().device_note().c_str());
    w.Key("kernels");
    w.String(decoder::kernel_name());
    w.EndObject();
    std::printf("%s\n", b.GetString());
    return 0;
}

// --json's "speculation": what drafting did (acceptance by draft position; the tokens per
// verification step are what speculation can gain at best, before the cost of a step).
void write_speculation(rapidjson::Writer<rapidjson::StringBuffer>& w, const decoder::SpeculationStats& st, const DraftArgs& d,
                       const decoder::DraftCosts* costs) {
    const int k = d.k;
    w.Key("speculation");
    w.StartObject();
    w.Key("draft");
    w.String(d.setting.kind == decoder::DraftSetting::mtp ? "mtp" : ("model:" + d.setting.path).c_str());
    w.Key("k");
    w.Int(k);
    w.Key("adaptive");
    w.Bool(d.adaptive);
    if (!d.vocab.empty()) {
        w.Key("draft_vocab");
        w.String(d.vocab.c_str());
    }
    if (d.synthetic_length != 0) {
        w.Key("synthetic_acceptance");
        w.Double(d.synthetic_length);
    }
    w.Key("plain_steps");
    w.Int64(st.plain_steps);
    w.Key("steps");
    w.Int64(st.steps);
    w.Key("drafted");
    w.Int64(st.drafted);
    w.Key("accepted");
    w.Int64(st.accepted);
    w.Key("acceptance");
    w.Double(st.drafted ? static_cast<double>(st.accepted) / static_cast<double>(st.drafted) : 0.0);
    w.Key("acceptance_by_position");
    w.StartArray();
    for (int i = 0; i < k; ++i)
        w.Double(st.drafted_at[static_cast<size_t>(i)] ? static_cast<double>(st.accepted_at[static_cast<size_t>(i)]) / static_cast<double>(st.drafted_at[static_cast<size_t>(i)]) : 0.0);
    w.EndArray();
    w.Key("tokens_per_step");
    w.Double(st.steps ? static_cast<double>(st.tokens) / static_cast<double>(st.steps) : 0.0);
    w.Key("recomputed_rows");
    w.Int64(st.recomputed_rows);
    if (st.draft_s + st.verify_s + st.settle_s > 0) {  // one stream: where the steps' time went (the engine's are not timed so)
        w.Key("seconds");
        w.StartObject();
        w.Key("draft");
        w.Double(st.draft_s);
        w.Key("verify");
        w.Double(st.verify_s);
        w.Key("settle");
        w.Double(st.settle_s);
        w.EndObject();
    }
    if (costs && d.adaptive) {  // adaptive k's threshold at the end, and what it came from
        w.Key("draft_cost");
        w.StartObject();
        w.Key("worth");
        w.Double(costs->worth());
        w.Key("seconds_per_draft");
        w.Double(costs->seconds_per_draft());
        w.Key("seconds_per_token");
        w.Double(costs->seconds_per_token());
        w.EndObject();
    }
    w.EndObject();
}

}  // namespace

// `pulse decode`'s command line.
struct DecodeArgs {
    std::string path, tokens_csv, device, draft_k = "4", draft_vocab;
    std::optional<std::string> prompt, draft;
    bool json = false, no_special = false, exact = false, int8_prefill = false;
    int64_t n = 32, topk_print = 0, streams = 0, max_sequences = 0;
    int threads = 0;
    double synthetic_length = 0;
    decoder::SamplerParams sp;
};

CLI::App* add_decode_command(CLI::App& pulse, DecodeArgs& a) {
    CLI::App* cmd = pulse.add_subcommand("decode", "run the in-process decoder directly");
    cmd->footer(kDecodeFooter);
    cmd->add_option("MODEL", a.path, "a qwen35 GGUF file")->type_name("")->required();
    cmd->add_option("--prompt", a.prompt, "the prompt text (<|...|> read as special tokens)")->option_text("TEXT");
    cmd->add_option("--tokens", a.tokens_csv, "the prompt as token ids")->option_text("ID,ID,...");
    cmd->add_option("-n", a.n, "tokens to generate (default 32)")->option_text("N")->check(CLI::NonNegativeNumber);
    cmd->add_option("--threads", a.threads, "CPU threads (default: all)")->option_text("N");
    cmd->add_option("--device", a.device,
                    "the compute device: cpu, or cuda where the build has it (default: cuda when a GPU answers the probe, else cpu; "
                    "the JSON's device_note says which and why)")
        ->option_text("NAME");
    cmd->add_option("--logits", a.topk_print, "print the top-K logits at each generated position")->option_text("K")->check(CLI::NonNegativeNumber);
    cmd->add_option("--temperature", a.sp.temperature, "sampling temperature (default 0: greedy)")->option_text("T");
    cmd->add_option("--top-k", a.sp.top_k, "sampling: the K most likely tokens only")->option_text("K");
    cmd->add_option("--top-p", a.sp.top_p, "sampling: nucleus")->option_text("P");
    cmd->add_option("--min-p", a.sp.min_p, "sampling: drop tokens under P times the most likely")->option_text("P");
    cmd->add_option("--seed", a.sp.seed, "sampling seed")->option_text("S");
    cmd->add_flag("--json", a.json, "machine-readable output: token ids, pieces, logits, prefill/decode tok/s");
    cmd->add_flag("--no-special", a.no_special, "read <|...|> in --prompt as plain text");
    cmd->add_flag("--exact", a.exact, "f32 activations in every matmul (default: int8 for Q8_0, TQ2_0, Q2_0 layouts)");
    cmd->add_option("--draft", a.draft,
                    "speculative decoding with the file's MTP block, or with a smaller draft model of the same vocabulary (greedy or "
                    "sampled); --json reports steps, drafts, acceptance by position and tokens per step (default: off)")
        ->option_text("mtp|model:PATH|off");
    cmd->add_option("--draft-k", a.draft_k,
                    "drafts per step, 1-16 (default 4); auto[:MAX]: each step as many as the running acceptance and the drafts' "
                    "measured cost make worth verifying (up to MAX, default 8; none while none is)")
        ->option_text("K");
    cmd->add_option("--draft-vocab", a.draft_vocab,
                    "with --draft mtp: draft among FILE's tokens only (`pulse distill vocab` writes it): a draft reads that many rows "
                    "of the output head, not all; first:N: among ids 0..N-1 (BPE's merge order, roughly by frequency)")
        ->option_text("FILE");
    cmd->add_option("--synthetic-acceptance", a.synthetic_length,
                    "benchmarking only: drafts kept at random so that a step yields L tokens on average (1 to k+1; llama.cpp's "
                    "--spec-synth-len): the cost of speculation at that acceptance; the text is NOT the model's")
        ->option_text("L");
    cmd->add_option("--streams", a.streams,
                    "serve N requests at once through the serving engine (continuous batching): each a chat turn of --prompt TEXT "
                    "(+ its number), N tokens each; reports aggregate tok/s and per-stream time to first token")
        ->option_text("N");
    cmd->add_option("--max-sequences", a.max_sequences, "with --streams: the engine's batch limit (default N)")->option_text("M");
    cmd->add_flag("--int8-prefill", a.int8_prefill)->group("");  // removed; named so its user learns what replaced it
    return cmd;
}

int cmd_decode(const CLI::App& cmd, const DecodeArgs& a) {
    const std::string& path = a.path;
    const std::string prompt = a.prompt.value_or("");
    const std::string& tokens_csv = a.tokens_csv;
    const std::string& device = a.device;
    const bool json = a.json, special = !a.no_special, have_prompt = a.prompt.has_value(), exact = a.exact;
    const int64_t n = a.n, topk_print = a.topk_print, streams = a.streams, max_sequences = a.max_sequences;
    const int threads = a.threads;
    const decoder::SamplerParams& sp = a.sp;
    if (a.int8_prefill) return args::usage_error(cmd, "--int8-prefill is gone: int8 activations are the default; --exact turns them off");
    DraftArgs draft;
    draft.synthetic_length = a.synthetic_length;
    draft.vocab = a.draft_vocab;
    try {
        if (a.draft) draft.setting = decoder::DraftSetting::parse(*a.draft);
        draft.adaptive = a.draft_k.rfind("auto", 0) == 0;  // auto or auto:MAX
        draft.k = draft.adaptive ? (a.draft_k.size() > 5 && a.draft_k[4] == ':' ? std::stoi(a.draft_k.substr(5)) : 8) : std::stoi(a.draft_k);
    } catch (const std::invalid_argument& e) {
        return args::usage_error(cmd, e.what());
    } catch (const std::out_of_range&) {
        return args::usage_error(cmd, "--draft-k: value out of range");
    }
    if (have_prompt == !tokens_csv.empty()) return args::usage_error(cmd, "give exactly one of --prompt or --tokens");
    if (draft.k < 1 || draft.k > decoder::Speculator::kMaxDraft)
        return args::usage_error(cmd, "--draft-k takes 1 to " + std::to_string(decoder::Speculator::kMaxDraft) + " or auto[:MAX]");
    const bool speculate = draft.setting.kind != decoder::DraftSetting::off;
    if (!draft.vocab.empty() && draft.setting.kind != decoder::DraftSetting::mtp) return args::usage_error(cmd, "--draft-vocab goes with --draft mtp");
    if (draft.synthetic_length != 0 && (!speculate || streams != 0 || !(draft.synthetic_length >= 1 && draft.synthetic_length <= draft.k + 1)))
        return args::usage_error(cmd, "--synthetic-acceptance L needs --draft, one stream and 1 <= L <= k + 1");
    if (streams != 0 || max_sequences != 0) {
        if (streams < 1 || !have_prompt || topk_print || n < 1 || max_sequences < 0)
            return args::usage_error(cmd, "--streams N (N >= 1) takes --prompt, -n >= 1 and no --logits");
        return decode_streams(path, prompt, streams, max_sequences, n, threads, device, exact, sp, draft);
    }
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
#endif
    std::shared_ptr<decoder::GgufFile> file;
    std::shared_ptr<decoder::Model> model, draft_model;
    decoder::Tokenizer tok;
    try {
        file = decoder::GgufFile::open(path);
        model = decoder::Model::load(file, device);
        tok = decoder::Tokenizer::load(*file);
        if (draft.setting.kind == decoder::DraftSetting::model) draft_model = decoder::Model::load(decoder::GgufFile::open(draft.setting.path), device);
    } catch (const std::invalid_argument& e) {  // a device this build does not have
        std::fprintf(stderr, "pulse decode: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pulse decode: %s\n", e.what());
        return 3;
    }
    model->exact = exact;
    if (draft_model) draft_model->exact = exact;
    if (draft.setting.kind == decoder::DraftSetting::mtp && !model->has_mtp()) {
        std::fprintf(stderr, "pulse decode: --draft mtp: %s has no MTP block (no %s.nextn_predict_layers)\n", path.c_str(),
                     file->get_string("general.architecture").c_str());
        return 3;
    }
    if (!draft.vocab.empty()) {
        try {
            model->set_draft_vocab(decoder::read_draft_vocab(draft.vocab, model->hparams().n_vocab));
        } catch (const std::exception& e) {
            std::fprintf(stderr, "pulse decode: --draft-vocab: %s\n", e.what());
            return 2;
        }
    }
    const int64_t V = model->hparams().n_vocab;
    std::vector<int32_t> ids;
    if (have_prompt) ids = tok.encode(prompt, special);
    else {
        std::stringstream ss(tokens_csv);
        for (std::string t; std::getline(ss, t, ',');) {
            char* end = nullptr;
            long v = std::strtol(t.c_str(), &end, 10);
            if (t.empty() || *end || v < 0 || v >= V) {
                std::fprintf(stderr, "pulse decode: --tokens: '%s' is not a token id (0-%lld)\n", t.c_str(), static_cast<long long>(V - 1));
                return 2;
            }
            ids.push_back(static_cast<int32_t>(v));
        }
    }
    if (ids.empty()) {
        std::fprintf(stderr, "pulse decode: the prompt is empty\n");
        return 2;
    }
    auto seq = model->new_sequence();
    std::unique_ptr<decoder::Speculator> spec;
    try {
        if (speculate) spec = std::make_unique<decoder::Speculator>(*model, *seq, draft.k, sp, draft.adaptive, decoder::DraftSource{draft_model.get()});
        if (spec && draft.synthetic_length != 0) {
            auto synthetic = decoder::SyntheticAcceptance::for_length(draft.synthetic_length, draft.k);
            synthetic.never = tok.eog_tokens();
            synthetic.seed = sp.seed;
            spec->set_synthetic(std::move(synthetic));
            std::fprintf(stderr, "pulse decode: synthetic acceptance (%.2f tokens per step): the text is not the model's\n", draft.synthetic_length);
        }
    } catch (const std::invalid_argument& e) {  // a draft model of another vocabulary
        std::fprintf(stderr, "pulse decode: %s\n", e.what());
        return 3;
    }
    double t0 = now_s();
    std::vector<float> logits = spec ? spec->prefill(ids) : model->forward(*seq, ids);
    double t1 = now_s();
    // Speculation decides several tokens per step: they wait here, each with its logits.
    std::vector<int32_t> queued;
    size_t queued_at = 0;
    decoder::Sampler sampler(sp);
    struct Step {
        int32_t id;
        std::string piece;
        std::vector<std::pair<int32_t, float>> top;
    };
    std::vector<Step> steps;
    decoder::Utf8Stream utf8;
    for (int64_t i = 0; i < n; ++i) {
        Step s;
        const float* row = logits.data();
        if (spec && i > 0) {
            if (queued_at == queued.size()) queued = spec->step(steps.back().id), queued_at = 0;
            row = spec->logits().data() + queued_at * static_cast<size_t>(V);
        }
        if (topk_print > 0) {
            std::vector<int32_t> idx(static_cast<size_t>(V));
            std::iota(idx.begin(), idx.end(), 0);
            size_t k = static_cast<size_t>(std::min<int64_t>(topk_print, V));
            std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
            for (size_t j = 0; j < k; ++j) s.top.emplace_back(idx[j], row[idx[j]]);
        }
        s.id = !spec ? sampler.sample(row, V) : i > 0 ? queued[queued_at++] : spec->sample(logits);
        s.piece = tok.piece(s.id);
        bool eog = tok.is_eog(s.id);
        if (!json) {
            std::string out = utf8.push(s.piece);
            std::fwrite(out.data(), 1, out.size(), stdout);
            if (topk_print > 0) {
                std::fprintf(stdout, "\n  [%lld] top:", static_cast<long long>(i));
                for (auto [id, l] : s.top) std::fprintf(stdout, " %d=%.4f", id, l);
                std::fprintf(stdout, "\n");
            }
            std::fflush(stdout);
        }
        steps.push_back(std::move(s));
        if (eog) break;
        if (!spec && i + 1 < n) logits = model->forward(*seq, {steps.back().id});
    }
    double t2 = now_s();
    double prefill_tps = static_cast<double>(ids.size()) / std::max(t1 - t0, 1e-9);
    double decode_tps = steps.size() > 1 ? static_cast<double>(steps.size() - 1) / std::max(t2 - t1, 1e-9) : 0;
    if (!json) {
        std::string rest = utf8.flush();
        std::fwrite(rest.data(), 1, rest.size(), stdout);
        std::fprintf(stderr, "\n[%s; prompt %zu tokens, %.1f tok/s prefill; %zu generated, %.1f tok/s decode]\n", model->device_note().c_str(), ids.size(),
                     prefill_tps, steps.size(), decode_tps);
        return 0;
    }
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.StartObject();
    w.Key("model");
    w.String(path.c_str());
    w.Key("prompt_tokens");
    w.StartArray();
    for (int32_t id : ids) w.Int(id);
    w.EndArray();
    w.Key("tokens");
    w.StartArray();
    for (const auto& s : steps) {
        w.StartObject();
        w.Key("id");
        w.Int(s.id);
        std::string shown = decoder::valid_utf8(s.piece);  // a piece can be part of a character
        w.Key("piece");
        w.String(shown.c_str(), static_cast<rapidjson::SizeType>(shown.size()));
        std::string hex;
        for (unsigned char c : s.piece) {
            static const char* digits = "0123456789abcdef";
            hex += digits[c >> 4];
            hex += digits[c & 15];
        }
        w.Key("bytes");
        w.String(hex.c_str());
        if (!s.top.empty()) {
            w.Key("top_logits");
            w.StartArray();
            for (auto [id, l] : s.top) {
                w.StartArray();
                w.Int(id);
                w.Double(static_cast<double>(l));
                w.EndArray();
            }
            w.EndArray();
        }
        w.EndObject();
    }
    w.EndArray();
    std::string text;
    for (const auto& s : steps) text += s.piece;
    text = decoder::valid_utf8(text);
    w.Key("text");
    w.String(text.c_str(), static_cast<rapidjson::SizeType>(text.size()));
    w.Key("prefill_tokens_per_s");
    w.Double(prefill_tps);
    w.Key("decode_tokens_per_s");
    w.Double(decode_tps);
    // What memory beyond the weights holds: the sequence's KV cache and recurrent state, and
    // the step buffers (sized to the largest step: 64 rows in a long prefill).
    w.Key("state_bytes");
    w.Uint64(seq->bytes());
    w.Key("work_bytes");
    w.Uint64(model->work_bytes());
    w.Key("device");
    w.String(model->device().name());
    w.Key("device_note");
    w.String(model->device_note().c_str());
    w.Key("kernels");
    w.String(decoder::kernel_name());
    if (spec) write_speculation(w, spec->stats(), draft, &spec->costs());
    w.EndObject();
    std::printf("%s\n", b.GetString());
    return 0;
}

// One line on the file's multi-token-prediction block: where it is and which nextn tensors it
// has (what the decoder drafts with), or that there is none.
void print_mtp_summary(const decoder::GgufFile& f) {
    const decoder::Value* arch = f.find("general.architecture");
    if (!arch || arch->type != decoder::ValueType::string) return;
    const auto nextn = f.opt_uint(arch->s + ".nextn_predict_layers").value_or(0);
    const auto blocks = f.opt_uint(arch->s + ".block_count").value_or(0);
    if (!nextn || nextn > blocks) {
        std::printf("  MTP block: none (no %s.nextn_predict_layers): no self-speculation with this file\n", arch->s.c_str());
        return;
    }
    const std::string p = "blk." + std::to_string(blocks - nextn) + ".nextn.";
    std::string have, shared;
    for (const char* n : {"eh_proj", "enorm", "hnorm", "shared_head_norm", "embed_tokens", "shared_head_head"})
        if (f.tensor(p + n + ".weight")) have += std::string(have.empty() ? "" : " ") + n;
    if (!f.tensor(p + "embed_tokens.weight")) shared += "embedding";
    if (!f.tensor(p + "shared_head_head.weight")) shared += std::string(shared.empty() ? "" : " and ") + "output head";
    std::printf("  MTP block: %llu at blk.%llu (nextn: %s)%s\n", static_cast<unsigned long long>(nextn),
                static_cast<unsigned long long>(blocks - nextn), have.empty() ? "no tensors" : have.c_str(),
                shared.empty() ? "" : ("; " + shared + " shared with the main model").c_str());
}

struct GgufArgs {
    CLI::App *make_demo = nullptr, *info = nullptr;
    bool mtp = false;
    std::string file = "pulse-demo.gguf";
};

CLI::App* add_gguf_command(CLI::App& pulse, GgufArgs& a) {
    CLI::App* cmd = pulse.add_subcommand("gguf", "make-demo [--mtp] [FILE] | info FILE: the random-weight demo model; inspect a GGUF file");
    cmd->footer(kGgufFooter);
    cmd->require_subcommand(1);
    a.make_demo = cmd->add_subcommand("make-demo", "write the demo model (random weights, qwen35, ~1 MB)");
    a.make_demo->add_flag("--mtp", a.mtp, "with an MTP (nextn) block, random too");
    a.make_demo->add_option("FILE", a.file, "where (default pulse-demo.gguf)")->type_name("");
    a.info = cmd->add_subcommand("info", "metadata summary and tensor table");
    a.info->add_option("FILE", a.file, "a GGUF file")->type_name("")->required();
    return cmd;
}

int cmd_gguf(const GgufArgs& a) {
    if (*a.make_demo) {
        try {
            decoder::write_demo_model(a.file, a.mtp);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "pulse gguf: %s\n", e.what());
            return 1;
        }
        std::printf("wrote %s: a qwen35 demo model with RANDOM weights (its answers are random text)\n", a.file.c_str());
        return 0;
    }
    try {
        auto f = decoder::GgufFile::open(a.file);
        std::printf("%s: GGUF v%u, %zu metadata keys, %zu tensors, alignment %llu\n", a.file.c_str(), f->version(), f->metadata().size(),
                    f->tensors().size(), static_cast<unsigned long long>(f->alignment()));
        print_mtp_summary(*f);
        for (const auto& [k, v] : f->metadata()) {
            if (v.type == decoder::ValueType::array) std::printf("  %-48s array[%zu]\n", k.c_str(), v.items.size());
            else if (v.type == decoder::ValueType::string) std::printf("  %-48s %s\n", k.c_str(), v.s.substr(0, 80).c_str());
            else if (v.is_float()) std::printf("  %-48s %g\n", k.c_str(), v.f);
            else if (v.type == decoder::ValueType::boolean) std::printf("  %-48s %s\n", k.c_str(), v.b ? "true" : "false");
            else std::printf("  %-48s %lld\n", k.c_str(), static_cast<long long>(v.i + static_cast<int64_t>(v.u)));
        }
        for (const auto& t : f->tensors()) {
            std::string shape;
            for (auto x : t.ne) shape += (shape.empty() ? "" : " x ") + std::to_string(x);
            std::printf("  %-40s %-8s %s\n", t.name.c_str(), decoder::type_name(t.type).c_str(), shape.c_str());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pulse gguf: %s\n", e.what());
        return 3;
    }
    return 0;
}

const char* kCollectFooter =
    "Generates the model's own continuations of each prompt and writes them with the model's hidden\n"
    "state at every position (NumPy files in DIR: tokens, hidden, starts, generated_from, meta.json):\n"
    "the data an MTP draft head is trained on (docs/DECODER.md, \"Self-distillation\").\n"
    "FILE.jsonl: one JSON object per line, {\"prompt\": TEXT} (special tokens read) or a chat request\n"
    "{\"messages\": [...], \"tools\": [...]} (rendered with the Qwen3.5 chat format).\n";

const char* kVocabFooter =
    "A draft vocabulary (the decoder's draft_vocab, `pulse decode --draft-vocab`): the N tokens\n"
    "seen most often in the SOURCEs, most frequent first, one id and its count a line. A SOURCE is\n"
    "a `collect` output directory (the tokens the model generated there) or a text file (its tokens\n"
    "under MODEL's tokenizer: code and prose like what the model will write).\n"
    "--held-out: sources not ranked, only counted against the list: the share of their tokens it\n"
    "misses bounds the draft acceptance it can cost (a draft is right only where the next token is\n"
    "listed), printed for N and for smaller and larger lists, beside what `first:N` (ids 0..N-1)\n"
    "misses.\n";

// The prompts of a JSONL file as token ids; a bad line is an error naming it.
std::vector<std::vector<int32_t>> read_prompts(const std::string& path, const decoder::Tokenizer& tok) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    std::vector<std::vector<int32_t>> out;
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        rapidjson::Document d;
        d.Parse(line.c_str());
        const std::string where = path + ":" + std::to_string(line_no);
        if (d.HasParseError() || !d.IsObject()) throw std::invalid_argument(where + ": not a JSON object");
        if (d.HasMember("prompt") && d["prompt"].IsString()) out.push_back(tok.encode(d["prompt"].GetString(), true));
        else if (d.HasMember("messages") && d["messages"].IsArray()) out.push_back(tok.encode(qwen::render_chat(d), true));
        else throw std::invalid_argument(where + ": needs \"prompt\" (a string) or \"messages\" (an array)");
        if (out.back().empty()) throw std::invalid_argument(where + ": the prompt is empty");
    }
    if (out.empty()) throw std::invalid_argument(path + ": no prompts");
    return out;
}

// `pulse distill`'s subcommands and their arguments.
struct DistillArgs {
    CLI::App *collect = nullptr, *export_head = nullptr, *import_head = nullptr, *vocab = nullptr;
    std::string path, prompts, out, head, device;
    std::vector<std::string> sources, held_out;
    int64_t top = 32768;
    int threads = 0;
    decoder::CollectOptions opt;
};

CLI::App* add_distill_command(CLI::App& pulse, DistillArgs& a) {
    CLI::App* cmd = pulse.add_subcommand("distill", "collect|export-head|import-head|vocab: data for, and the round trip of, a trained MTP draft head");
    cmd->require_subcommand(1);
    auto model = [&](CLI::App* c) { c->add_option("MODEL", a.path, "a qwen35 GGUF file")->type_name("")->required(); };
    a.collect = cmd->add_subcommand("collect", "the model's own continuations and hidden states");
    a.collect->footer(kCollectFooter);
    model(a.collect);
    a.collect->add_option("--prompts", a.prompts, "the prompts, one JSON object a line")->option_text("FILE.jsonl")->required();
    a.collect->add_option("--out", a.out, "the output directory")->option_text("DIR")->required();
    a.collect->add_option("-n", a.opt.max_new, "tokens to generate per continuation (default 128)")->option_text("N")->check(CLI::PositiveNumber);
    a.collect->add_option("--threads", a.threads, "CPU threads (default: all)")->option_text("N");
    a.collect->add_option("--temperature", a.opt.sampling.temperature, "sampling temperature (default 0: greedy)")->option_text("T");
    a.collect->add_option("--seed", a.opt.sampling.seed, "sampling seed")->option_text("S");
    a.collect->add_option("--samples", a.opt.samples, "sampled continuations per prompt (needs --temperature > 0)")->option_text("N");
    a.collect->add_option("--batch", a.opt.batch,
                          "sequences run together: their prompts packed into steps of up to 64 rows, then one row each per step "
                          "(the weights read once for all; default 8)")
        ->option_text("N");
    a.collect->add_option("--device", a.device, "the compute device (as `pulse decode --device`)")->option_text("NAME");
    a.export_head = cmd->add_subcommand(
        "export-head", "the file's MTP block as f32 NumPy files with head.json and a check of the decoder's own logits (what tools/distill/train.py trains)");
    model(a.export_head);
    a.export_head->add_option("--out", a.out, "the output directory")->option_text("DIR")->required();
    a.import_head = cmd->add_subcommand(
        "import-head", "a copy of MODEL with the block's tensors replaced by DIR's trained ones (quantized to each tensor's type)");
    model(a.import_head);
    a.import_head->add_option("--head", a.head, "the trained tensors (NAME.npy)")->option_text("DIR")->required();
    a.import_head->add_option("--out", a.out, "the new file")->option_text("NEW.gguf")->required();
    a.vocab = cmd->add_subcommand("vocab", "a draft vocabulary: the tokens the model writes most often");
    a.vocab->footer(kVocabFooter);
    model(a.vocab);
    a.vocab->add_option("SOURCE", a.sources, "collect directories or text files")->type_name("")->required();
    a.vocab->add_option("--out", a.out, "the vocabulary file")->option_text("FILE")->required();
    a.vocab->add_option("--top", a.top, "tokens listed (default 32768)")->option_text("N")->check(CLI::PositiveNumber);
    a.vocab->add_option("--held-out", a.held_out, "a source counted against the list, not ranked (repeatable)")->option_text("SOURCE");
    return cmd;
}

// pulse distill vocab: the tokens drafts are made among, by how often the model writes them.
int cmd_distill_vocab(const DistillArgs& a) {
    const std::string& path = a.path;
    const std::string& out = a.out;
    const std::vector<std::string>& sources = a.sources;
    const std::vector<std::string>& held_out = a.held_out;
    const int64_t top = a.top;
    try {
        auto file = decoder::GgufFile::open(path);
        const auto tok = decoder::Tokenizer::load(*file);
        auto count = [&](const std::vector<std::string>& srcs) {
            std::vector<int64_t> counts(tok.size());
            for (const auto& src : srcs) {
                if (std::filesystem::is_directory(src)) {
                    decoder::count_generated(src, counts);
                    continue;
                }
                std::ifstream in(src, std::ios::binary);
                if (!in) throw std::runtime_error("cannot read " + src);
                std::stringstream text;
                text << in.rdbuf();
                for (const int32_t t : tok.encode(text.str(), false)) ++counts[static_cast<size_t>(t)];
            }
            return counts;
        };
        const std::vector<int64_t> counts = count(sources);
        const auto ranked = decoder::rank_tokens(counts, 0);
        if (ranked.empty()) throw std::runtime_error("the sources hold no token");
        const std::vector<int32_t> ids(ranked.begin(), ranked.begin() + std::min<int64_t>(top, static_cast<int64_t>(ranked.size())));
        // The share of `c`'s tokens among the first n ranked.
        auto coverage = [&](const std::vector<int64_t>& c, size_t n) {
            int64_t total = 0, covered = 0;
            for (const int64_t x : c) total += x;
            for (size_t k = 0; k < n; ++k) covered += c[static_cast<size_t>(ranked[k])];
            return std::pair{static_cast<double>(covered) / static_cast<double>(std::max<int64_t>(total, 1)), total};
        };
        const std::vector<int64_t> held = held_out.empty() ? std::vector<int64_t>{} : count(held_out);
        if (!held_out.empty() && std::accumulate(held.begin(), held.end(), int64_t{0}) == 0) throw std::runtime_error("the held-out sources hold no token");
        std::ofstream o(out);
        o << "# draft vocabulary of " << path << " (pulse distill vocab): token id, count; most frequent first\n";
        for (const int32_t t : ids) o << t << ' ' << counts[static_cast<size_t>(t)] << '\n';
        o.close();
        if (!o) throw std::runtime_error("cannot write " + out);
        const auto [share, total] = coverage(counts, ids.size());
        std::printf("wrote %s: %zu of %zu tokens, covering %.4f of the %lld counted\n", out.c_str(), ids.size(), counts.size(), share,
                    static_cast<long long>(total));
        if (!held_out.empty()) {
            const auto held_cover = coverage(held, ids.size());
            const double held_share = held_cover.first;
            const int64_t held_total = held_cover.second;  // a plain variable: clang 14 lambdas cannot capture structured bindings
            std::printf("held out: %.4f of their %lld tokens are listed; %.4f are not, and no draft can be right there\n", held_share,
                        static_cast<long long>(held_total), 1.0 - held_share);
            // The same count of ids 0..n-1 (`first:N`, no ranking) beside the ranked list.
            auto first_missed = [&](size_t n) {
                int64_t in = 0;
                for (size_t t = 0; t < std::min(n, held.size()); ++t) in += held[t];
                return 1.0 - static_cast<double>(in) / static_cast<double>(held_total);
            };
            std::printf("| tokens listed | of the sources | held out missed | held out missed by first:N |\n|---:|---:|---:|---:|\n");
            std::vector<size_t> sizes;
            for (const int64_t n : {top / 8, top / 4, top / 2, top, top * 2, top * 4})
                if (n >= 1 && static_cast<size_t>(n) < ranked.size()) sizes.push_back(static_cast<size_t>(n));
            sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
            for (const size_t n : sizes)
                std::printf("| %zu | %.4f | %.4f | %.4f |\n", n, coverage(counts, n).first, 1.0 - coverage(held, n).first, first_missed(n));
            std::printf("| all %zu seen | 1.0000 | %.4f | %.4f |\n", ranked.size(), 1.0 - coverage(held, ranked.size()).first, first_missed(ranked.size()));
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pulse distill vocab: %s\n", e.what());
        return 3;
    }
    return 0;
}

// pulse distill export-head / import-head: the block out to the trainer and back.
int cmd_distill_head(const DistillArgs& a) {
    const bool exporting = a.export_head->parsed();
    const std::string& path = a.path;
    const std::string& head = a.head;
    const std::string& out = a.out;
    const char* name = exporting ? "export-head" : "import-head";
    try {
        auto file = decoder::GgufFile::open(path);
        if (exporting) {
            auto model = decoder::Model::load(file, "cpu");
            decoder::export_head(*model, out);
            std::printf("wrote %s: the MTP block of %s (head.json, tensors, check)\n", out.c_str(), path.c_str());
        } else {
            const int n = decoder::import_head(*file, head, out);
            if (n == 0) throw decoder::GgufError(head + ": no trained tensor of " + path + "'s block (NAME.npy)");
            std::printf("wrote %s: %d tensors of the block from %s, the rest from %s\n", out.c_str(), n, head.c_str(), path.c_str());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pulse distill %s: %s\n", name, e.what());
        return 3;
    }
    return 0;
}

int cmd_distill(const DistillArgs& a) {
    if (*a.export_head || *a.import_head) return cmd_distill_head(a);
    if (*a.vocab) return cmd_distill_vocab(a);
    const std::string& path = a.path;
    const std::string& prompts = a.prompts;
    const std::string& out = a.out;
    const std::string& device = a.device;
    const decoder::CollectOptions& opt = a.opt;
    const int threads = a.threads;
    if (opt.samples < 1 || opt.batch < 1 || opt.batch > decoder::Model::kMaxStepRows)
        return args::usage_error(*a.collect, "--samples must be >= 1 and --batch 1.." + std::to_string(decoder::Model::kMaxStepRows));
    if (opt.samples > 1 && opt.sampling.temperature <= 0)
        return args::usage_error(*a.collect, "--samples " + std::to_string(opt.samples) +
                                                 " with greedy decoding would repeat each continuation: give --temperature > 0");
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
#else
    (void)threads;  // a build without OpenMP runs on one thread
#endif
    try {
        auto file = decoder::GgufFile::open(path);
        auto model = decoder::Model::load(file, device);
        const auto tok = decoder::Tokenizer::load(*file);
        const auto ids = read_prompts(prompts, tok);
        const double t0 = now_s();
        const auto sum = decoder::collect_hidden(*model, path, ids, tok.eog_tokens(), opt, out);
        std::printf("wrote %s: %lld sequences, %lld tokens (%lld generated), hidden states of %lld values, in %.1f s "
                    "(%lld model steps for the prompts, %lld for the continuations)\n",
                    out.c_str(), static_cast<long long>(sum.sequences), static_cast<long long>(sum.tokens), static_cast<long long>(sum.generated),
                    static_cast<long long>(model->hparams().n_embd), now_s() - t0, static_cast<long long>(sum.prompt_steps),
                    static_cast<long long>(sum.generation_steps));
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "pulse distill: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pulse distill: %s\n", e.what());
        return 3;
    }
    return 0;
}

}  // namespace pulse::decoder_tool

// Run as `pulse decode|gguf|distill ...` (the host passes the arguments on as given), so the
// usage reads "pulse decode".
int main(int argc, char** argv) {
    using namespace pulse::decoder_tool;
    CLI::App pulse{"The decoder's own commands.", "pulse"};
    pulse::args::style(pulse);
    DecodeArgs decode;
    GgufArgs gguf;
    DistillArgs distill;
    CLI::App* decode_cmd = add_decode_command(pulse, decode);
    CLI::App* gguf_cmd = add_gguf_command(pulse, gguf);
    CLI::App* distill_cmd = add_distill_command(pulse, distill);
    if (auto exit = pulse::args::parse(pulse, argc, argv)) return *exit;
    if (*decode_cmd) return cmd_decode(*decode_cmd, decode);
    if (*gguf_cmd) return cmd_gguf(gguf);
    if (*distill_cmd) return cmd_distill(distill);
    return pulse::args::usage_error(pulse, "give a command: decode, gguf or distill");
}
