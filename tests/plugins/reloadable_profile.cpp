// Test translation profile "reloadable", built twice (PROFILE_TAG "v1" / "v2"). It translates
// like the shipped profiles (it links the shared Chat Completions translation) and starts every
// answer with "[TAG] ", so a test can tell which generation served a stream.
#include <pulse/plugin.hpp>

#include <memory>

#include "chat_translation.h"

#ifndef PROFILE_TAG
#error "build with -DPROFILE_TAG=\"v1\""
#endif

namespace {

const pulse_host_api_t* g_host = nullptr;
pulse_host_ctx_t* g_ctx = nullptr;

struct Stream {
    pulse::chat::ChunkTranslator translator;
    bool tagged = false;
};

pulse_status_t create(void*, pulse_call_t* call, const pulse_json_t*, void** out) {
    *out = new pulse::chat::Options();
    (void)call;
    return PULSE_OK;
}
void destroy(void* p) { delete static_cast<pulse::chat::Options*>(p); }

pulse_status_t build_request(void* inst, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t* model,
                             pulse_upstream_req_t* out) {
    return pulse::guard(g_host, call, [&] {
        const auto& opt = *static_cast<pulse::chat::Options*>(inst);
        pulse::Json req(g_host->json, request);
        auto info = pulse::chat::request_info(opt, req);
        pulse::Writer w(g_host->json, g_host->request->body(out));
        pulse::chat::write_request(g_host, call, opt, req, pulse::Json(g_host->json, model), info, w, pulse::Log(g_host, g_ctx));
        return PULSE_OK;
    });
}

pulse_status_t stream_open(void* inst, pulse_call_t* call, const pulse_json_t* request, void** out) {
    return pulse::guard(g_host, call, [&] {
        auto info = pulse::chat::request_info(*static_cast<pulse::chat::Options*>(inst), pulse::Json(g_host->json, request));
        *out = new Stream{pulse::chat::ChunkTranslator(g_host, std::move(info))};
        return PULSE_OK;
    });
}

pulse_status_t stream_feed(void* stream, pulse_call_t* call, pulse_str_t data, pulse_delta_sink_t* sink) {
    auto& s = *static_cast<Stream*>(stream);
    if (!s.tagged) {
        s.tagged = true;
        if (pulse_status_t rc = g_host->delta->text(sink, pulse::str("[" PROFILE_TAG "] ")); rc != PULSE_OK) return rc;
    }
    return pulse::guard(g_host, call, [&] { return s.translator.feed(call, pulse::view(data), sink); });
}

pulse_status_t stream_finish(void* stream, pulse_call_t* call, pulse_stream_end_t how, pulse_delta_sink_t* sink) {
    return pulse::guard(g_host, call, [&] { return static_cast<Stream*>(stream)->translator.finish(call, how, sink); });
}

void stream_close(void* stream) { delete static_cast<Stream*>(stream); }

const pulse_translation_vt_t kProfile = {
    sizeof(pulse_translation_vt_t), "reloadable", create, destroy, build_request, stream_open,
    stream_feed, stream_finish, stream_close, nullptr,
};

int g_inits = 0;
pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
#ifdef RELOAD_BROKEN
    // A bad new version: the reload must keep the old one serving.
    (void)ctx;
    *state = nullptr;
    return host->set_error(call, PULSE_E_INTERNAL, pulse::str("this build is broken on purpose"));
#endif
    g_host = host;
    g_ctx = ctx;
    *state = &g_inits;
    ++g_inits;
    return pulse::guard(host, call, [&] { return host->register_translation(ctx, &kProfile, sizeof kProfile, nullptr); });
}

void deinit(void*) {
    pulse::Log(g_host, g_ctx)(PULSE_LOG_INFO, "reloadable " PROFILE_TAG ": deinit");
}

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_TRANSLATION, "test.reloadable", PROFILE_TAG),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
