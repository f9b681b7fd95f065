// Test translation profile "reloadable", built twice (PROFILE_TAG "v1" / "v2"). It translates
// like the shipped profiles (it links the shared Chat Completions translation) and starts every
// answer with "[TAG] ", so a test can tell which generation served a stream. With -DSDK_1_0 it
// registers as a plugin built against SDK 1.0 does (minor 0, the 1.0 vtable size: no resume);
// with -DRESUME_FAILS its resume hook refuses every call.
#include <pulse/plugin.hpp>

#include <memory>

#include "chat_profile.h"

#ifndef PROFILE_TAG
#error "build with -DPROFILE_TAG=\"v1\""
#endif

namespace {

const pulse_host_api_t* g_host = nullptr;
pulse_host_ctx_t* g_ctx = nullptr;
const pulse::chat::Dialect kDialect = {"reloadable", nullptr};

// Tags the first delta of every stream; everything else is the shared profile.
pulse_status_t stream_open(void* inst, pulse_call_t* call, const pulse_json_t* request, void** out) {
    pulse_status_t rc = pulse::chat::profile_stream_open(inst, call, request, out);
    if (rc == PULSE_OK) *out = new std::pair<void*, bool>(*out, false);
    return rc;
}
pulse_status_t stream_feed(void* stream, pulse_call_t* call, pulse_str_t data, pulse_delta_sink_t* sink) {
    auto& s = *static_cast<std::pair<void*, bool>*>(stream);
    if (!s.second) {
        s.second = true;
        if (pulse_status_t rc = g_host->delta->text(sink, pulse::str("[" PROFILE_TAG "] ")); rc != PULSE_OK) return rc;
    }
    return pulse::chat::profile_stream_feed(s.first, call, data, sink);
}
pulse_status_t stream_finish(void* stream, pulse_call_t* call, pulse_stream_end_t how, pulse_delta_sink_t* sink) {
    return pulse::chat::profile_stream_finish(static_cast<std::pair<void*, bool>*>(stream)->first, call, how, sink);
}
void stream_close(void* stream) {
    auto* s = static_cast<std::pair<void*, bool>*>(stream);
    pulse::chat::profile_stream_close(s->first);
    delete s;
}

#ifdef RESUME_FAILS
// A profile whose resume hook refuses: the host must end such a response as if it had none.
pulse_status_t resume(void*, pulse_call_t* call, const pulse_json_t*, const pulse_json_t*, const pulse_json_t*, pulse_upstream_req_t*,
                      void**) {
    return g_host->set_error(call, PULSE_E_UNAVAILABLE, pulse::str("reloadable: resume refused on purpose"));
}
#else
constexpr auto resume = nullptr;
#endif

const pulse_translation_vt_t kProfile = {
    sizeof(pulse_translation_vt_t), "reloadable", pulse::chat::profile_create, pulse::chat::profile_destroy,
    pulse::chat::profile_build_request, stream_open, stream_feed, stream_finish, stream_close, nullptr, resume, nullptr,
    nullptr, nullptr, nullptr, nullptr,  // no 1.4 hooks: warmup and probes as for a profile built before them
};
#ifdef SDK_1_0
// What a plugin built against the 1.0 header hands the host: the vtable without the 1.1 tail.
constexpr uint32_t kProfileSize = offsetof(pulse_translation_vt_t, resume);
const pulse_translation_vt_t kProfile10 = [] {
    pulse_translation_vt_t v = kProfile;
    v.struct_size = kProfileSize;
    return v;
}();
#define PROFILE_VT kProfile10
#else
constexpr uint32_t kProfileSize = sizeof kProfile;
#define PROFILE_VT kProfile
#endif

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
    pulse::chat::bind_host(host, ctx);
    *state = &g_inits;
    ++g_inits;
    return pulse::guard(host, call, [&] {
        return host->register_translation(ctx, &PROFILE_VT, kProfileSize, const_cast<pulse::chat::Dialect*>(&kDialect));
    });
}

void deinit(void*) {
    pulse::Log(g_host, g_ctx)(PULSE_LOG_INFO, "reloadable " PROFILE_TAG ": deinit");
}

#ifdef SDK_1_0
const pulse_plugin_info_t kInfo = {
    sizeof(pulse_plugin_info_t), PULSE_ABI_MAJOR, 0, 0, 0, 0, PULSE_KIND_TRANSLATION, "test.reloadable", PROFILE_TAG,
    PULSE_BUILD_INFO, nullptr, init, deinit,
};
#else
const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_TRANSLATION, "test.reloadable", PROFILE_TAG),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};
#endif

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
