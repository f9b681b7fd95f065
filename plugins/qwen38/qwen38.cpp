// Translation profile "qwen38": the Responses API <-> vLLM Chat Completions, for vLLM serving
// Qwen3.8-Flash-Next (qwen3_coder tool parser, qwen3 reasoning parser, MTP).
//
// Dialect facts it relies on (shared/ref/backends.md §1, §3):
//   - reasoning arrives as `reasoning` (vLLM >= 0.12) or `reasoning_content` (older): both read;
//   - tool-call arguments arrive as fragments per index and are only JSON once complete;
//   - tool_choice "required"/named is accepted but not always applied, so a forced choice is
//     constrained with a JSON schema (profile option force_tool_choice = "schema", default);
//   - Qwen templates read history reasoning from `reasoning_content` and reject a system
//     message that is not first;
//   - context overflow is a 400 whose message says "maximum context length".
#include <pulse/plugin.hpp>

#include <memory>

#include "chat_translation.h"

namespace {

const pulse_host_api_t* g_host = nullptr;
pulse_host_ctx_t* g_ctx = nullptr;
const pulse_metrics_ext_t* g_metrics = nullptr;  // optional host service

struct Profile {
    pulse::chat::Options options;
    pulse::Log log;
};

struct Stream {
    pulse::chat::ChunkTranslator translator;
};

pulse_status_t create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        auto p = std::make_unique<Profile>();
        p->options = pulse::chat::Options::parse(pulse::Json(g_host->json, config), "qwen38");
        p->options.history_reasoning_field = "reasoning_content";
        if (p->options.cache_prompt || p->options.slots)
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "qwen38: cache_prompt and slots are llama-server options");
        p->log = pulse::Log(g_host, g_ctx);
        *out = p.release();
        return PULSE_OK;
    });
}

void destroy(void* p) { delete static_cast<Profile*>(p); }

pulse_status_t build_request(void* inst, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t* model,
                             pulse_upstream_req_t* out) {
    return pulse::guard(g_host, call, [&] {
        auto& p = *static_cast<Profile*>(inst);
        pulse::Json req(g_host->json, request);
        auto info = pulse::chat::request_info(p.options, req);
        for (const auto& t : info.dropped_tools) {
            p.log(PULSE_LOG_INFO, "dropped tool of type '" + t + "': the backend cannot run hosted tools", call);
            if (g_metrics) g_metrics->counter_add(g_ctx, pulse::str("pulse_tools_dropped_total"), pulse::str("type"), pulse::str(t), 1);
        }
        pulse::Writer w(g_host->json, g_host->request->body(out));
        pulse::chat::write_request(g_host, call, p.options, req, pulse::Json(g_host->json, model), info, w, p.log);
        g_host->request->set_path(out, pulse::str("/chat/completions"));
        return PULSE_OK;
    });
}

pulse_status_t stream_open(void* inst, pulse_call_t* call, const pulse_json_t* request, void** out) {
    return pulse::guard(g_host, call, [&] {
        auto& p = *static_cast<Profile*>(inst);
        auto info = pulse::chat::request_info(p.options, pulse::Json(g_host->json, request));
        *out = new Stream{pulse::chat::ChunkTranslator(g_host, std::move(info))};
        return PULSE_OK;
    });
}

pulse_status_t stream_feed(void* stream, pulse_call_t* call, pulse_str_t data, pulse_delta_sink_t* sink) {
    return pulse::guard(g_host, call,
                        [&] { return static_cast<Stream*>(stream)->translator.feed(call, pulse::view(data), sink); });
}

pulse_status_t stream_finish(void* stream, pulse_call_t* call, pulse_stream_end_t how, pulse_delta_sink_t* sink) {
    return pulse::guard(g_host, call, [&] { return static_cast<Stream*>(stream)->translator.finish(call, how, sink); });
}

void stream_close(void* stream) { delete static_cast<Stream*>(stream); }

pulse_status_t map_error(void*, pulse_call_t* call, int32_t status, pulse_str_t body) {
    return pulse::guard(g_host, call, [&] { return pulse::chat::map_http_error(g_host, call, status, pulse::view(body)); });
}

const pulse_translation_vt_t kProfile = {
    sizeof(pulse_translation_vt_t), "qwen38", create, destroy, build_request, stream_open,
    stream_feed, stream_finish, stream_close, map_error,
};

pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    g_host = host;
    g_ctx = ctx;
    g_metrics = static_cast<const pulse_metrics_ext_t*>(host->get_extension(ctx, PULSE_EXT_METRICS));
    if (g_metrics && !PULSE_HAS_FIELD(g_metrics, pulse_metrics_ext_t, counter_add)) g_metrics = nullptr;
    *state = nullptr;
    return pulse::guard(host, call, [&] { return host->register_translation(ctx, &kProfile, sizeof kProfile, nullptr); });
}

void deinit(void*) {}

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_TRANSLATION, "pulse.translation.qwen38", "0.1.0"),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
