// Test policy "test-policy": answers as its options say, faults included.
//   mode = "decide"     write `decision` (an inline table, as given)
//   mode = "sleep"      sleep `sleep_ms` (watching call_cancelled), then decide
//   mode = "junk"       {"reasoning_budget": "lots"}
//   mode = "unknown"    {"color": 1}
//   mode = "incomplete" an object never closed
//   mode = "error"      UNAVAILABLE with a message
//   mode = "throw"      a C++ exception inside the plugin (pulse::guard makes it INTERNAL)
// Every call appends the request summary it got to `record` (a file), one line each.
#include <pulse/plugin.hpp>

#include <chrono>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace {

const pulse_host_api_t* g_host = nullptr;
std::mutex g_mu;

struct Policy {
    std::string mode = "decide", decision = "{}", record;
    int64_t sleep_ms = 0;
};

pulse_status_t create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        pulse::Json cfg(g_host->json, config);
        auto p = std::make_unique<Policy>();
        p->mode = std::string(cfg["mode"].string_or("decide"));
        if (cfg["decision"].present()) p->decision = cfg["decision"].dump();
        p->record = std::string(cfg["record"].string_or(""));
        p->sleep_ms = cfg["sleep_ms"].i64().value_or(0);
        if (p->mode == "refuse") throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "test-policy: refused on purpose");
        *out = p.release();
        return PULSE_OK;
    });
}
void destroy(void* p) { delete static_cast<Policy*>(p); }

pulse_status_t decide(void* policy, pulse_call_t* call, const pulse_json_t* request, pulse_json_writer_t* out) {
    return pulse::guard(g_host, call, [&] {
        const auto& p = *static_cast<Policy*>(policy);
        if (!p.record.empty()) {
            std::lock_guard lock(g_mu);
            std::ofstream(p.record, std::ios::app) << pulse::Json(g_host->json, request).dump() << "\n";
        }
        pulse::Writer w(g_host->json, out);
        if (p.mode == "sleep") {
            auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(p.sleep_ms);
            while (std::chrono::steady_clock::now() < until && !g_host->call_cancelled(call))
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        if (p.mode == "junk") return w.begin_object().kv("reasoning_budget", "lots").end_object().ok() ? PULSE_OK : PULSE_E_INTERNAL;
        if (p.mode == "unknown") return w.begin_object().kv("color", int64_t(1)).end_object().ok() ? PULSE_OK : PULSE_E_INTERNAL;
        if (p.mode == "incomplete") return w.begin_object().ok() ? PULSE_OK : PULSE_E_INTERNAL;
        if (p.mode == "error") return g_host->set_error(call, PULSE_E_UNAVAILABLE, pulse::str("test-policy: the decision service is down"));
        if (p.mode == "throw") throw std::runtime_error("test-policy: boom");
        return w.raw(p.decision).ok() ? PULSE_OK : PULSE_E_INTERNAL;
    });
}

const pulse_policy_vt_t kPolicy = {sizeof(pulse_policy_vt_t), "test-policy", create, destroy, decide};

pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    g_host = host;
    *state = nullptr;
    return pulse::guard(host, call, [&] { return host->register_policy(ctx, &kPolicy, sizeof kPolicy, nullptr); });
}
void deinit(void*) {}

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_POLICY, "test.policy", "0.1.0"),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
