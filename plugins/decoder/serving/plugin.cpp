// Backend plugin "decoder": serves a GGUF qwen35 model in-process, speaking Chat Completions
// chunks like an HTTP upstream, so the translation profiles work unchanged and it takes part in
// failover like any endpoint. Endpoint options: model (path, required), threads, context,
// make_demo, exact, device, max_sequences, checkpoints, draft, draft_k, draft_adaptive, draft_vocab
// (docs/DECODER.md). Speculative decoding is counted in the host's /metrics.
// In the gateway config: url = "decoder:///path/model.gguf" (sugar for plugin://decoder with
// options.model), or url = "plugin://decoder" with [..endpoints.options] model = "...".
#include <cmath>
#include <pulse/plugin.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <rapidjson/document.h>

#include "device/device.h"
#include "serving/engine.h"
#include "tools/synthetic.h"

namespace {

const pulse_host_api_t* g_host = nullptr;
pulse_host_ctx_t* g_ctx = nullptr;
const pulse_metrics_ext_t* g_metrics = nullptr;  // optional host service

// Speculative decoding in /metrics, vLLM's counters under the decoder's prefix (what `pulse
// bench accept` reads): verification steps that drafted, drafts, drafts kept, and kept by
// position (a draft at position i is kept only with every one before it).
void count_speculation(int64_t drafted, int64_t accepted) {
    if (!g_metrics) return;
    const pulse_str_t none = pulse::str("");
    g_metrics->counter_add(g_ctx, pulse::str("pulse_decoder_spec_decode_num_drafts_total"), none, none, 1);
    g_metrics->counter_add(g_ctx, pulse::str("pulse_decoder_spec_decode_num_draft_tokens_total"), none, none, static_cast<uint64_t>(drafted));
    g_metrics->counter_add(g_ctx, pulse::str("pulse_decoder_spec_decode_num_accepted_tokens_total"), none, none, static_cast<uint64_t>(accepted));
    for (int64_t i = 0; i < drafted; ++i) {
        const std::string pos = std::to_string(i);
        g_metrics->counter_add(g_ctx, pulse::str("pulse_decoder_spec_decode_num_accepted_tokens_per_pos_total"), pulse::str("position"),
                               pulse::str(pos), i < accepted ? 1 : 0);
    }
}

struct Backend {
    std::unique_ptr<pulse::decoder::Engine> engine;
};

struct Stream {
    std::shared_ptr<pulse::decoder::Job> job;
};

// The endpoint's options (its `options` table in the config) as the engine's, checked: an
// unknown or mistyped option, a value out of range, a device this build lacks is a config error.
pulse::decoder::EngineOptions parse_options(const pulse::Json& cfg, bool& make_demo) {
    pulse::decoder::EngineOptions o;
    make_demo = false;
    for (size_t i = 0; i < cfg.size(); ++i) {
        auto [key, value] = cfg.member_at(i);
        if (key == "model" && value.string()) o.model = std::string(*value.string());
        else if (key == "threads" && value.i64() && *value.i64() >= 0) o.threads = static_cast<int>(*value.i64());
        else if (key == "context" && value.i64() && *value.i64() > 0) o.context = *value.i64();
        else if (key == "make_demo" && value.boolean()) make_demo = *value.boolean();
        else if (key == "exact" && value.boolean()) o.exact = *value.boolean();
        else if (key == "device" && value.string()) o.device = std::string(*value.string());
        else if (key == "max_sequences" && value.i64()) {
            if (*value.i64() < 1 || *value.i64() > pulse::decoder::EngineOptions::kMaxSequences)
                throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "decoder: option 'max_sequences' must be 1 to " +
                                                                 std::to_string(pulse::decoder::EngineOptions::kMaxSequences) + ", not " +
                                                                 std::to_string(*value.i64()));
            o.max_sequences = *value.i64();
        } else if (key == "checkpoints" && value.i64()) {
            if (*value.i64() < 0)
                throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "decoder: option 'checkpoints' must be 0 (two per max_sequences) or more");
            o.max_checkpoints = *value.i64();
        } else if (key == "draft" && value.string()) {
            try {
                o.draft = pulse::decoder::DraftSetting::parse(std::string(*value.string()));
            } catch (const std::invalid_argument& e) {
                throw pulse::Error(PULSE_E_INVALID_ARGUMENT, std::string("decoder: option ") + e.what());
            }
        } else if (key == "draft_k" && value.i64()) {
            if (*value.i64() < 1 || *value.i64() > pulse::decoder::Speculator::kMaxDraft)
                throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "decoder: option 'draft_k' must be 1 to " +
                                                                 std::to_string(pulse::decoder::Speculator::kMaxDraft) + ", not " +
                                                                 std::to_string(*value.i64()));
            o.draft_k = static_cast<int>(*value.i64());
        } else if (key == "draft_adaptive" && value.boolean()) {
            o.draft_adaptive = *value.boolean();
        } else if (key == "draft_vocab" && value.string()) {
            o.draft_vocab = std::string(*value.string());
        }
        else if (key == "int8_prefill")
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT,
                               "decoder: option 'int8_prefill' is gone: int8 activations are the default now; 'exact = true' turns them off");
        else
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "decoder: unknown or mistyped option '" + std::string(key) +
                                                             "' (allowed: model = \"/path/model.gguf\", threads = N, context = N, make_demo = true|false, exact = true|false, device = \"NAME\", max_sequences = N, checkpoints = N, draft = \"off\"|\"mtp\"|\"model:PATH\", draft_k = N, draft_adaptive = true|false, draft_vocab = \"/path/vocab.txt\"|\"first:N\")");
    }
    {  // fail fast: before reading (or writing) a model file
        auto names = pulse::decoder::device_names();
        if (!o.device.empty() && std::find(names.begin(), names.end(), o.device) == names.end()) {
            std::string have;
            for (const auto& n : names) have += (have.empty() ? "" : ", ") + n;
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "decoder: device '" + o.device + "' is not in this build (it has: " + have + ")");
        }
    }
    return o;
}

// The out-of-the-box model: random weights, said loudly, written where the config says when it
// is not there. Where that place is not writable (a developer running as themselves), the
// user's cache holds it and `o.model` points there.
void ensure_demo_model(pulse::decoder::EngineOptions& o) {
    std::error_code ec;
    if (std::filesystem::exists(o.model, ec)) return;
    auto write = [](const std::filesystem::path& p) {
        std::error_code e;
        std::filesystem::create_directories(p.parent_path(), e);
        try {
            pulse::decoder::write_demo_model(p);
            return std::string();
        } catch (const std::exception& x) {
            return std::string(x.what());
        }
    };
    std::string err = write(o.model);
    if (!err.empty()) {
        const char* home = std::getenv("HOME");
        std::filesystem::path alt = std::filesystem::path(home && *home ? home : "/tmp") / ".cache" / "pulse-gateway" / o.model.filename();
        if (std::filesystem::exists(alt, ec) || write(alt).empty()) {
            pulse::Log(g_host, g_ctx)(PULSE_LOG_WARN, "decoder: cannot write the demo model to " + o.model.string() + " (" + err +
                                                          "); using " + alt.string());
            o.model = alt;
        } else {
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "decoder: cannot write the demo model to " + o.model.string() + ": " + err);
        }
    }
    pulse::Log(g_host, g_ctx)(PULSE_LOG_WARN, "decoder: serving the demo model " + o.model.string() + " (RANDOM weights: its answers are random text)");
}

// What the engine runs on, and its speculation, said once at start.
void log_engine(const pulse::decoder::EngineOptions& o, const pulse::decoder::Engine& engine) {
    pulse::Log(g_host, g_ctx)(PULSE_LOG_INFO, "decoder: " + engine.model().device_note());
    if (o.draft.kind != pulse::decoder::DraftSetting::off)
        pulse::Log(g_host, g_ctx)(PULSE_LOG_INFO, "decoder: speculative decoding with " +
                                                      (o.draft.kind == pulse::decoder::DraftSetting::mtp ? std::string("the MTP block") : "the draft model " + o.draft.path) +
                                                      ", " + (o.draft_adaptive ? "up to " : "") + std::to_string(o.draft_k) + " drafts per step" +
                                                      (o.draft_vocab.empty() ? std::string()
                                                                             : ", drafting among the " + std::to_string(engine.model().mtp_vocab()) +
                                                                                   " tokens of " + o.draft_vocab));
    else if (engine.model().has_mtp())
        pulse::Log(g_host, g_ctx)(PULSE_LOG_INFO, "decoder: the file has an MTP block; draft = \"mtp\" turns on speculative decoding with it");
}

pulse_status_t create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        pulse::Json cfg(g_host->json, config);
        bool make_demo = false;
        pulse::decoder::EngineOptions o = parse_options(cfg, make_demo);
        if (o.model.empty()) throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "decoder: option 'model' (the GGUF file) is required");
        auto b = std::make_unique<Backend>();
        if (make_demo) ensure_demo_model(o);
        o.on_speculation = count_speculation;
        // A model file that is not there (or not readable) yet: the endpoint cannot start now,
        // which is no config error (the gateway serves the rest and shows why; a reload once the
        // file is in place starts it). Anything the file then says against the options is one.
        if (std::ifstream probe(o.model, std::ios::binary); !probe)
            throw pulse::Error(PULSE_E_UNAVAILABLE, "decoder: cannot open the model " + o.model.string() + " (" + std::strerror(errno) + ")");
        try {
            b->engine = std::make_unique<pulse::decoder::Engine>(o);
        } catch (const std::exception& e) {
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, std::string("decoder: ") + e.what());
        }
        log_engine(o, *b->engine);
        *out = b.release();
        return PULSE_OK;
    });
}

void destroy(void* b) { delete static_cast<Backend*>(b); }

pulse_status_t stream_start(void* backend, pulse_call_t* call, const pulse_json_t* request, void** out) {
    return pulse::guard(g_host, call, [&] {
        auto& b = *static_cast<Backend*>(backend);
        rapidjson::Document req;
        std::string text = pulse::Json(g_host->json, request).dump();
        req.Parse(text.c_str());
        if (req.HasParseError() || !req.IsObject()) throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "decoder: the request is not a JSON object");
        auto s = std::make_unique<Stream>();
        try {
            s->job = b.engine->submit(std::move(req));
        } catch (const std::length_error& e) {
            throw pulse::Error(PULSE_E_CONTEXT_LENGTH, e.what());
        } catch (const std::invalid_argument& e) {
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, std::string("decoder: ") + e.what());
        }
        *out = s.release();
        return PULSE_OK;
    });
}

pulse_status_t stream_next(void* stream, pulse_call_t* call, uint32_t timeout_ms, pulse_chunk_sink_t* sink) {
    auto& job = *static_cast<Stream*>(stream)->job;
    std::unique_lock lock(job.mu);
    job.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !job.chunks.empty() || job.done || job.cancelled; });
    if (job.cancelled) return g_host->set_error(call, PULSE_E_CANCELLED, pulse::str("cancelled"));
    if (!job.chunks.empty()) {
        std::string chunk = std::move(job.chunks.front());
        job.chunks.pop_front();
        lock.unlock();
        return g_host->chunk->data(sink, pulse::str(chunk));
    }
    if (!job.done) return PULSE_TIMEOUT;
    if (job.error_status) return g_host->set_error(call, PULSE_E_INTERNAL, pulse::str(job.error));
    return PULSE_END;
}

void stream_cancel(void* stream) {
    auto& job = *static_cast<Stream*>(stream)->job;
    job.cancelled = true;
    std::lock_guard lock(job.mu);
    job.cv.notify_all();
}

void stream_close(void* stream) {
    auto* s = static_cast<Stream*>(stream);
    s->job->cancelled = true;  // a job still queued or running stops at its next token
    delete s;
}

pulse_status_t health(void* backend, pulse_call_t*, pulse_json_writer_t* out) {
    auto& e = *static_cast<Backend*>(backend)->engine;
    const auto st = e.stats();
    pulse::Writer w(g_host->json, out);
    w.begin_object()
        .kv("status", "ok")
        .kv("model", e.name())
        .kv("device", e.model().device().name())
        .kv("context", e.context())
        .kv("queued", static_cast<int64_t>(e.queued()))
        .kv("active", static_cast<int64_t>(e.active()))
        .kv("concurrency", e.max_sequences())
        .kv("checkpoints", e.max_checkpoints())
        .kv("steps", static_cast<int64_t>(st.steps))
        .kv("batch", st.last_batch)
        .kv("peak_batch", st.peak_batch)
        .kv("state_bytes", static_cast<int64_t>(st.sequence_bytes))
        .kv("checkpoint_bytes", static_cast<int64_t>(st.checkpoint_bytes))
        .kv("draft_steps", st.speculation.steps)
        .kv("drafted", st.speculation.drafted)
        .kv("draft_accepted", st.speculation.accepted)
        .end_object();
    return w.ok() ? PULSE_OK : PULSE_E_INTERNAL;
}

// The engine caps thinking at a request's budget in either field (engine.cpp).
const char* const kBudgetFields[] = {"thinking_token_budget", "reasoning_budget_tokens", nullptr};

const pulse_backend_vt_t kBackend = {
    sizeof(pulse_backend_vt_t), "decoder", create, destroy, stream_start, stream_next, stream_cancel, stream_close, health, kBudgetFields,
};

pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    g_host = host;
    g_ctx = ctx;
    *state = nullptr;
    g_metrics = static_cast<const pulse_metrics_ext_t*>(host->get_extension(ctx, PULSE_EXT_METRICS));
    if (g_metrics && !PULSE_HAS_FIELD(g_metrics, pulse_metrics_ext_t, counter_add)) g_metrics = nullptr;
    return pulse::guard(host, call, [&] { return host->register_backend(ctx, &kBackend, sizeof kBackend, nullptr); });
}
void deinit(void*) {}

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_BACKEND, "pulse.backend.decoder", "0.1.0"), PULSE_BUILD_INFO, nullptr, init, deinit,
};

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
