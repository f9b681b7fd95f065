// Loads plugins from the plugin directories, validates them, and keeps the registry of the
// components they provide (translation profiles, backends, runtime controllers).
//
// All loading happens on the control thread, before the HTTP server starts. A plugin that fails
// any check produces one status line naming the file, what was expected, what was found and the
// fix; it never crashes the host. Loaded code is pinned (never dlclose'd) by default: see
// docs/SDK.md, "Unloading".
#pragma once

#include <pulse/plugin.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plugin/host_api.h"

namespace boost::dll {
class shared_library;
}

namespace pulse::plugin {

enum class State { loaded, skipped, rejected, failed };
const char* state_name(State s);

// What `pulse plugins` shows: one row per plugin file.
struct PluginStatus {
    std::filesystem::path path;
    std::string id, version, build_info;  // copied out of the plugin (survive unloading)
    uint32_t kinds = 0;
    uint16_t abi_major = 0, abi_minor_built = 0, abi_minor_required = 0;
    State state = State::rejected;
    std::string reason;  // for anything but `loaded`: the one-line explanation
    bool required = false;
    std::vector<std::string> components;  // "translation qwen38", ...

    // The log line: "plugin PATH (id version): rejected: ...".
    std::string describe() const;
};

std::string kinds_text(uint32_t kinds);

// One loaded copy of a plugin: its library handle, info, state and init context.
struct Generation {
    std::unique_ptr<boost::dll::shared_library> library;
    const pulse_plugin_info_t* info = nullptr;
    std::filesystem::path path;
    pulse_host_ctx ctx;
    void* state = nullptr;
    bool initialized = false;

    Generation();
    ~Generation();
    Generation(const Generation&) = delete;
    Generation& operator=(const Generation&) = delete;
};

// A registered component. Holding the shared_ptr is the lease that keeps its code alive.
struct Component {
    std::shared_ptr<Generation> generation;
    host::Registration registration;

    const std::string& plugin_id() const { return generation->ctx.plugin_id; }
};
using ComponentLease = std::shared_ptr<const Component>;

struct Options {
    std::vector<std::filesystem::path> dirs;         // configured: a missing dir is a warning
    std::vector<std::filesystem::path> dropin_dirs;  // per-site: a missing dir is normal
    std::vector<std::string> require;                // plugin ids that must load
    uid_t service_uid = static_cast<uid_t>(-1);      // besides root, the owner we accept; -1 = euid
};

class PluginManager {
public:
    explicit PluginManager(Options options);
    ~PluginManager();

    // Scans every directory and loads every plugin found. Never throws for a bad plugin: each
    // outcome is recorded in statuses() and logged (WARN for optional, ERROR for required).
    void load_all();

    // Loads one file (exposed for tests and for drop-in rescans).
    const PluginStatus& load_file(const std::filesystem::path& path);

    const std::vector<PluginStatus>& statuses() const { return statuses_; }

    // Reasons startup must stop: required plugins that did not load. Empty when all is well.
    std::vector<std::string> fatal_problems() const;

    ComponentLease translation(const std::string& name) const;
    ComponentLease backend(const std::string& name) const;
    ComponentLease controller(const std::string& name) const;
    std::vector<std::string> component_names(uint32_t kind) const;

    // deinit every plugin in reverse load order (control thread). Code stays mapped.
    void shutdown();

private:
    void record(PluginStatus status);
    void scan_dir(const std::filesystem::path& dir, bool configured);
    bool is_required(const std::string& id) const;

    Options options_;
    std::vector<PluginStatus> statuses_;
    std::vector<std::shared_ptr<Generation>> generations_;  // load order
    std::map<std::string, std::filesystem::path> ids_;      // id -> path, for duplicates
    mutable std::mutex mutex_;                              // guards the component maps
    std::map<std::string, std::shared_ptr<const Component>> components_[3];
    uint64_t next_generation_ = 1;
};

// Pre-flight checks that run no plugin code. Each returns "" when fine, else the problem text
// (with the fix). Exposed for tests.
std::string check_permissions(const std::filesystem::path& path, uid_t service_uid);
std::string preflight(const std::filesystem::path& path);

}  // namespace pulse::plugin
