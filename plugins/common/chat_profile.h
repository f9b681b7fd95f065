// The translation-profile plumbing every Chat Completions profile shares: the vtable functions
// over chat_translation, parameterised by a Dialect. A profile plugin defines its Dialect and
// its vtable from these functions, registers with `user` = &its Dialect, and is done.
#pragma once

#include <pulse/plugin.hpp>

#include "chat_translation.h"

namespace pulse::chat {

struct Dialect {
    const char* name;  // for messages ("qwen38", "llamacpp")
    // Applies the dialect's defaults and checks to freshly parsed options (throw pulse::Error).
    void (*adjust)(Options& options, const Json& config);
};

// Call from the plugin's init before registering: keeps the host table and context.
void bind_host(const pulse_host_api_t* host, pulse_host_ctx_t* ctx);

pulse_status_t profile_create(void* dialect, pulse_call_t* call, const pulse_json_t* config, void** out);
void profile_destroy(void* instance);
pulse_status_t profile_build_request(void* instance, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t* model,
                                     pulse_upstream_req_t* out);
pulse_status_t profile_stream_open(void* instance, pulse_call_t* call, const pulse_json_t* request, void** out);
pulse_status_t profile_resume(void* instance, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t* model,
                              const pulse_json_t* partial, pulse_upstream_req_t* out, void** out_stream);
pulse_status_t profile_stream_feed(void* stream, pulse_call_t* call, pulse_str_t data, pulse_delta_sink_t* sink);
pulse_status_t profile_stream_finish(void* stream, pulse_call_t* call, pulse_stream_end_t how, pulse_delta_sink_t* sink);
void profile_stream_close(void* stream);
pulse_status_t profile_map_error(void* instance, pulse_call_t* call, int32_t status, pulse_str_t body);
pulse_status_t profile_prepare(void* instance, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t* model,
                               pulse_upstream_req_t* out);
pulse_status_t profile_warm_request(void* instance, pulse_call_t* call, const pulse_json_t* sent, pulse_upstream_req_t* out);
pulse_status_t profile_cache_request(void* instance, pulse_call_t* call, pulse_cache_op_t op, int32_t slot, pulse_str_t name,
                                     pulse_upstream_req_t* out);
pulse_status_t profile_cache_answer(void* instance, pulse_call_t* call, pulse_cache_op_t op, int32_t status, pulse_str_t body,
                                    int32_t* out_count);
pulse_status_t profile_probe_answer(void* instance, pulse_call_t* call, int32_t status, pulse_str_t body);

}  // namespace pulse::chat

// A complete translation vtable for a Dialect-based profile named NAME.
#define PULSE_CHAT_PROFILE_VTABLE(NAME)                                                                           \
    {sizeof(pulse_translation_vt_t), NAME, pulse::chat::profile_create, pulse::chat::profile_destroy,             \
     pulse::chat::profile_build_request, pulse::chat::profile_stream_open, pulse::chat::profile_stream_feed,      \
     pulse::chat::profile_stream_finish, pulse::chat::profile_stream_close, pulse::chat::profile_map_error,        \
     pulse::chat::profile_resume, pulse::chat::profile_prepare, pulse::chat::profile_warm_request,                \
     pulse::chat::profile_cache_request, pulse::chat::profile_cache_answer, pulse::chat::profile_probe_answer}

// Defines a whole translation-profile plugin around a Dialect: the vtable, init (which binds
// the host and registers the profile with `user` = &DIALECT), deinit, the info struct and the
// exported entry. ID and VERSION are the plugin's id and version strings.
#define PULSE_CHAT_PROFILE_PLUGIN(ID, VERSION, NAME, DIALECT)                                              \
    namespace {                                                                                            \
    const pulse_translation_vt_t kChatProfileVt = PULSE_CHAT_PROFILE_VTABLE(NAME);                         \
    pulse_status_t chat_profile_init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, \
                                     void** state) {                                                       \
        pulse::chat::bind_host(host, ctx);                                                                 \
        *state = nullptr;                                                                                  \
        return pulse::guard(host, call, [&] {                                                              \
            return host->register_translation(ctx, &kChatProfileVt, sizeof kChatProfileVt,                \
                                              const_cast<pulse::chat::Dialect*>(&(DIALECT)));              \
        });                                                                                                \
    }                                                                                                      \
    void chat_profile_deinit(void*) {}                                                                     \
    const pulse_plugin_info_t kChatProfileInfo = {                                                         \
        PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_TRANSLATION, ID, VERSION), PULSE_BUILD_INFO, nullptr,            \
        chat_profile_init, chat_profile_deinit,                                                            \
    };                                                                                                     \
    }                                                                                                      \
    extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kChatProfileInfo; }
