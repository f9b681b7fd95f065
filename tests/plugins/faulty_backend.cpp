// A backend that fails on purpose, for the gateway's status-code drills: every stream fails at
// `stream_start` or at its first `stream_next` with the configured status.
//   options = { fail = "start" | "next", status = "internal" | "cancelled" | "abi" | "unavailable" | "deadline" }
#include <pulse/plugin.hpp>

#include <atomic>
#include <memory>
#include <string>

namespace {

const pulse_host_api_t* g_host = nullptr;
std::atomic<int> g_streams{0};

struct Backend {
    bool at_start = false;
    pulse_status_t status = PULSE_E_INTERNAL;
};

pulse_status_t parse_status(std::string_view s) {
    if (s == "internal") return PULSE_E_INTERNAL;
    if (s == "cancelled") return PULSE_E_CANCELLED;
    if (s == "abi") return PULSE_E_ABI;
    if (s == "unavailable") return PULSE_E_UNAVAILABLE;
    if (s == "deadline") return PULSE_E_DEADLINE;
    throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "test-faulty: unknown status '" + std::string(s) + "'");
}

pulse_status_t create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        pulse::Json cfg(g_host->json, config);
        auto b = std::make_unique<Backend>();
        b->at_start = cfg["fail"].string_or("next") == "start";
        b->status = parse_status(cfg["status"].string_or("internal"));
        *out = b.release();
        return PULSE_OK;
    });
}

void destroy(void* b) { delete static_cast<Backend*>(b); }

pulse_status_t stream_start(void* backend, pulse_call_t* call, const pulse_json_t*, void** out) {
    const auto& b = *static_cast<Backend*>(backend);
    int n = ++g_streams;
    if (b.at_start) return g_host->set_error(call, b.status, pulse::str("test-faulty: refused stream " + std::to_string(n) + " at start"));
    *out = new Backend(b);
    return PULSE_OK;
}

pulse_status_t stream_next(void* stream, pulse_call_t* call, uint32_t, pulse_chunk_sink_t*) {
    const auto& s = *static_cast<Backend*>(stream);
    return g_host->set_error(call, s.status, pulse::str("test-faulty: failed stream " + std::to_string(g_streams.load()) + " at its first chunk"));
}

void stream_cancel(void*) {}
void stream_close(void* stream) { delete static_cast<Backend*>(stream); }

const pulse_backend_vt_t kBackend = {
    sizeof(pulse_backend_vt_t), "test-faulty", create, destroy, stream_start, stream_next, stream_cancel, stream_close, nullptr,
};

pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    g_host = host;
    *state = nullptr;
    return pulse::guard(host, call, [&] { return host->register_backend(ctx, &kBackend, sizeof kBackend, nullptr); });
}

void deinit(void*) {}

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_BACKEND, "test.faulty-backend", "1.0.0"),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
