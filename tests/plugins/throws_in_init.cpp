// Conformance plugin: init throws; plugin.hpp's guard must turn it into INTERNAL + what().
#include <pulse/plugin.hpp>

#include <stdexcept>

namespace {
pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t*, pulse_call_t* call, void** state) {
    *state = nullptr;
    return pulse::guard(host, call, []() -> pulse_status_t { throw std::runtime_error("boom from init"); });
}
void deinit(void*) {}
const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_TRANSLATION, "test.throws-in-init", "0.0.1"),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};
}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
