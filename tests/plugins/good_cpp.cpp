// Conformance plugin through plugin.hpp: a translation profile "test-profile" that builds a
// request from the Responses `input` string and turns each upstream payload into a text delta.
#include <pulse/plugin.hpp>

#include <string>

namespace {
const pulse_host_api_t* g_host;

pulse_status_t create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        pulse::Json cfg(g_host->json, config);
        if (cfg.present() && !cfg.is_null() && !cfg.is_object())
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "profile options must be a table");
        *out = new std::string(cfg["prefix"].string_or(""));
        return PULSE_OK;
    });
}
void destroy(void* inst) { delete static_cast<std::string*>(inst); }
pulse_status_t build_request(void*, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t*,
                             pulse_upstream_req_t* out) {
    return pulse::guard(g_host, call, [&] {
        pulse::Json req(g_host->json, request);
        pulse::Writer w(g_host->json, g_host->request->body(out));
        w.begin_object().kv("prompt", req["input"].string_or("")).end_object();
        return w.ok() ? PULSE_OK : PULSE_E_INTERNAL;
    });
}
pulse_status_t stream_open(void* inst, pulse_call_t*, const pulse_json_t*, void** out) {
    *out = inst;
    return PULSE_OK;
}
pulse_status_t stream_feed(void* stream, pulse_call_t*, pulse_str_t data, pulse_delta_sink_t* sink) {
    std::string text = *static_cast<std::string*>(stream) + std::string(pulse::view(data));
    return g_host->delta->text(sink, pulse::str(text));
}
pulse_status_t stream_finish(void*, pulse_call_t*, pulse_stream_end_t how, pulse_delta_sink_t* sink) {
    return how == PULSE_STREAM_CLEAN ? g_host->delta->finish(sink, PULSE_FINISH_STOP) : PULSE_OK;
}
void stream_close(void*) {}

const pulse_translation_vt_t kProfile = {
    sizeof(pulse_translation_vt_t), "test-profile", create, destroy, build_request, stream_open,
    stream_feed, stream_finish, stream_close, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
};

pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    g_host = host;
    *state = nullptr;
    return pulse::guard(host, call, [&] { return host->register_translation(ctx, &kProfile, sizeof kProfile, nullptr); });
}
void deinit(void*) {}

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_TRANSLATION, "test.good-cpp", "0.4.0"),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};
}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
