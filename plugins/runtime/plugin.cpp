// Runtime controller plugin "recipe": `pulse model ...` for recipe-driven runtimes. The work is
// in controller.cpp; this file binds it to the SDK (create from the [controller] table, command).
//
// [controller] keys (relative paths start at the pulse config's directory):
//   nodes = "nodes.toml"                 the site's nodes file
//   profiles = "<datadir>/pulse/profiles"  runtime families and profiles (a build tree that is
//                                        not installed uses the source tree's profiles/)
//   state_dir = "/var/lib/pulse-gateway" node state, run logs, locks
#include <pulse/plugin.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "controller.h"

#ifndef PULSE_PROFILES_DIR
#define PULSE_PROFILES_DIR "/usr/share/pulse-gateway/profiles"
#endif
#ifndef PULSE_STATE_DIR
#define PULSE_STATE_DIR "/var/lib/pulse-gateway"
#endif
#ifndef PULSE_SOURCE_PROFILES_DIR
#define PULSE_SOURCE_PROFILES_DIR ""
#endif

namespace {

namespace fs = std::filesystem;
const pulse_host_api_t* g_host = nullptr;

struct Instance {
    pulse::runtime::Settings settings;
};

pulse_status_t create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        pulse::Json c(g_host->json, config);
        if (config && !c.is_object()) throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "[controller] must be a table");
        static const char* const known[] = {"nodes", "profiles", "state_dir", "config_dir", "gateway"};
        for (size_t i = 0; i < c.size(); ++i) {
            auto key = c.member_at(i).first;
            bool ok = false;
            for (const char* k : known) ok = ok || key == k;
            if (!ok)
                throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "[controller]: unknown key '" + std::string(key) +
                                                                 "'; allowed: nodes, profiles, state_dir");
        }
        fs::path base(std::string(c["config_dir"].string_or(".")));
        auto path = [&](const char* key, const std::string& dflt) {
            auto v = c[key].string();
            if (c[key].present() && !v) throw pulse::Error(PULSE_E_INVALID_ARGUMENT, std::string("[controller] ") + key + " must be a string");
            fs::path p(v ? std::string(*v) : dflt);
            return p.is_relative() ? (base / p).lexically_normal() : p;
        };
        auto inst = std::make_unique<Instance>();
        inst->settings.nodes_file = path("nodes", "nodes.toml");
        inst->settings.profiles_dir = path("profiles", PULSE_PROFILES_DIR);
        // Run from a build tree (not installed): the source tree's profiles.
        std::error_code ec;
        if (!c["profiles"].present() && !fs::exists(inst->settings.profiles_dir, ec) && fs::exists(PULSE_SOURCE_PROFILES_DIR, ec))
            inst->settings.profiles_dir = PULSE_SOURCE_PROFILES_DIR;
        inst->settings.state_dir = path("state_dir", PULSE_STATE_DIR);
        pulse::Json gw = c["gateway"];
        inst->settings.gateway.url = std::string(gw["url"].string_or("http://127.0.0.1:8800"));
        inst->settings.gateway.endpoint_fragments = std::string(gw["endpoint_fragments"].string_or(""));
        inst->settings.gateway.api_key = std::string(gw["api_key"].string_or(""));
        *out = inst.release();
        return PULSE_OK;
    });
}

void destroy(void* p) { delete static_cast<Instance*>(p); }

pulse_status_t command(void* p, pulse_call_t* call, size_t argc, const pulse_str_t* argv, pulse_output_t* out,
                       int32_t* exit_code) {
    return pulse::guard(g_host, call, [&] {
        auto* inst = static_cast<Instance*>(p);
        std::vector<std::string> args;
        for (size_t i = 0; i < argc; ++i) args.emplace_back(pulse::view(argv[i]));
        pulse::runtime::Controller ctl(inst->settings, [&](std::string_view text) { g_host->output_write(out, pulse::str(text)); });
        *exit_code = ctl.command(args);
        return PULSE_OK;
    });
}

const pulse_controller_vt_t kVt = {sizeof(pulse_controller_vt_t), "recipe", create, destroy, command, nullptr, nullptr};

pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    g_host = host;
    *state = nullptr;
    return pulse::guard(host, call, [&] { return host->register_controller(ctx, &kVt, sizeof kVt, nullptr); });
}
void deinit(void*) {}

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_CONTROLLER, "pulse.controller.recipe", "0.1.0"), PULSE_BUILD_INFO, nullptr, init, deinit,
};

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
