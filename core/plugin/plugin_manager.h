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
    // The last hot reload of this file that was refused (the loaded version keeps serving);
    // cleared when a reload of it succeeds.
    std::string reload_refused;
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
    std::filesystem::path path;    // the plugin file as installed
    std::filesystem::path mapped;  // what was dlopen'ed: a content-addressed copy, or `path`
    std::string sha256;            // of the file's contents
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
    // Where loaded plugins are staged as <name>-<sha256>.so copies (mode 0500) before dlopen,
    // so replacing a file in the plugin directory never touches mapped code and a rebuild at
    // the same path is a new file to the loader. Empty or unusable: load in place (and hot
    // reload is refused).
    std::filesystem::path runtime_dir;
    size_t max_retired_per_plugin = 16;
};

struct ReloadReport {
    int reloaded = 0, added = 0, unchanged = 0, failed = 0;
    std::vector<std::string> messages;  // one line per change or failure
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

    // The control thread's view (no lock: only the control thread changes it).
    const std::vector<PluginStatus>& statuses() const { return statuses_; }
    // A copy for other threads (/health), consistent against a reload in progress.
    std::vector<PluginStatus> status_snapshot() const;

    // Reasons startup must stop: required plugins that did not load. Empty when all is well.
    std::vector<std::string> fatal_problems() const;

    ComponentLease translation(const std::string& name) const;
    ComponentLease backend(const std::string& name) const;
    ComponentLease controller(const std::string& name) const;
    ComponentLease policy(const std::string& name) const;
    std::vector<std::string> component_names(uint32_t kind) const;

    // Hot reload (control thread): a translation-profile plugin whose file changed is loaded as
    // a new generation and its components replace the old ones for new leases; streams in
    // flight keep the old generation. New translation plugins are added. Changed backends and
    // controllers and policies are refused ("requires restart"). A failure keeps the old generation.
    ReloadReport reload();
    // deinit of retired generations that no lease holds any more (control thread).
    void collect_retired();

    // deinit every plugin in reverse load order (control thread). Code stays mapped. Every
    // instance must be destroyed first (the gateway releases its models: Gateway::stop): a
    // plugin still leased is not deinit'ed, and that is logged as an error.
    void shutdown();

private:
    // Steps 0-6 of loading (checks, staging, dlopen, validation, probe, init) without
    // registering anything. Fills `st`; returns null on failure (st.state/reason say why).
    std::shared_ptr<Generation> load_generation(const std::filesystem::path& path, PluginStatus& st, bool reloading);
    std::string check_info(const pulse_plugin_info_t& info, const std::filesystem::path& path, PluginStatus& st, bool reloading) const;
    static std::pair<State, std::string> run_init(Generation& gen, const std::string& id);
    // reload(), file by file.
    std::vector<std::filesystem::path> reload_files(ReloadReport& rep);
    void reload_new(const std::filesystem::path& f, ReloadReport& rep);
    void reload_changed(std::shared_ptr<Generation>& cur, const std::filesystem::path& f, ReloadReport& rep);
    void reload_failed(ReloadReport& rep, const std::string& msg);
    void reload_refused(ReloadReport& rep, const std::filesystem::path& f, const std::string& msg);
    std::string stage(const std::filesystem::path& path, const std::string& sha, std::filesystem::path& out);
    // "" when none of the generation's component names is taken, else the message.
    std::string conflict(const Generation& gen) const;
    // Makes a generation's components the current ones (replacing those of `replaced`, if any)
    // and lists them in `st`.
    void publish(const std::shared_ptr<Generation>& gen, PluginStatus& st, const std::shared_ptr<Generation>& replaced = nullptr);
    void record(PluginStatus status);
    // Takes back a plugin loaded from `loaded` whose id `other` has too (startup only).
    void retract(const std::string& id, const std::filesystem::path& loaded, const std::filesystem::path& other);
    void scan_dir(const std::filesystem::path& dir, bool configured);
    static bool might_be_plugin(const std::filesystem::path& p);
    bool is_required(const std::string& id) const;

    Options options_;
    std::vector<PluginStatus> statuses_;
    std::vector<std::shared_ptr<Generation>> generations_;  // current generations, load order
    std::vector<std::shared_ptr<Generation>> retired_;      // replaced by a reload; deinit when unleased
    std::map<std::string, size_t> retired_per_id_;
    std::map<std::string, std::filesystem::path> ids_;      // id -> path, for duplicates
    mutable std::mutex mutex_;                              // guards the component maps
    mutable std::mutex status_mutex_;                       // guards statuses_ against status_snapshot()
    std::map<std::string, std::shared_ptr<const Component>> components_[4];  // by kind_slot()
    uint64_t next_generation_ = 1;
};

// Pre-flight checks that run no plugin code. Each returns "" when fine, else the problem text
// (with the fix). Exposed for tests.
std::string check_permissions(const std::filesystem::path& path, uid_t service_uid);
// Every directory from / down to `dir` (resolved): owned by root or the service user, and not
// writable by group or others unless sticky (as /tmp).
std::string check_directory_path(const std::filesystem::path& dir, uid_t service_uid);
// check_permissions, and for a symlink also every directory of every hop and of the target.
std::string check_file(const std::filesystem::path& path, uid_t service_uid);
// The one-line reason for a failed dlopen of `path` (mapped from the staged copy `mapped`):
// the loader's own text with the original path, the symbol or library named, and the fix.
std::string dlopen_failure(const std::string& raw, const std::filesystem::path& mapped, const std::filesystem::path& path);
// Runs the plugin's deinit if its init succeeded and deinit has not run yet: exactly once.
void finalize(Generation& g);
std::string preflight(const std::filesystem::path& path);

}  // namespace pulse::plugin
