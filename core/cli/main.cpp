// `pulse`: the one binary. Subcommands: serve, plugins, config check, model, version.
//
// Exit codes (documented in README.md, docs/OPERATIONS.md and `pulse --help`):
//   0 success
//   1 runtime failure (cannot listen, I/O error, ...)
//   2 usage error (unknown command or option)
//   3 configuration error
//   4 plugin error (a required plugin or component is missing or failed)
#include <pulse/plugin.h>
#include <rapidjson/document.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <sys/inotify.h>
#include <systemd/sd-daemon.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "args/args.h"
#include "cli/codex_launcher.h"
#include "cli/continuity_cmd.h"
#include "cli/doctor.h"
#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"
#include "config/config.h"
#include "gateway/gateway.h"
#include "plugin/host_api.h"
#include "plugin/plugin_manager.h"
#include "server/http_server.h"

#ifndef PULSE_VERSION
#define PULSE_VERSION "0.0.0"
#endif
#ifndef PULSE_PLUGIN_DIR
#define PULSE_PLUGIN_DIR "/usr/local/lib/pulse-gateway/plugins"
#endif
#ifndef PULSE_SYSCONF_DIR
#define PULSE_SYSCONF_DIR "/usr/local/etc/pulse-gateway"
#endif

namespace {

namespace fs = std::filesystem;
using namespace pulse;

constexpr int kExitOk = 0, kExitRuntime = 1, kExitConfig = 3, kExitPlugin = 4, kExitOptionalPlugin = 5;

const char* kAbout = "Pulse: a Responses API gateway that lets the Codex CLI work against local models.";

const char* kMainFooter =
    "Every command takes --help. Without --config the config file is the first of: $PULSE_CONFIG,\n"
    "~/.config/pulse-gateway/pulse.toml ($XDG_CONFIG_HOME), " PULSE_SYSCONF_DIR "/pulse.toml, and for a\n"
    "binary in its build tree, the source tree's config/pulse.toml.\n"
    "\n"
    "exit codes: 0 ok, 1 runtime failure, 2 usage error, 3 config error, 4 plugin error\n";

const char* kServeFooter =
    "Loads the config and every plugin, then serves HTTP on server.listen (default\n"
    "127.0.0.1:8800): POST /v1/responses, GET /v1/models, /health, /metrics.\n"
    "SIGTERM/SIGINT: drain (server.drain_timeout_s) and stop. SIGHUP: reload the config and\n"
    "changed translation-profile plugins (also done when a plugin directory changes).\n"
    "\n"
    "environment overrides: PULSE_QWEN_BACKENDS=\"MODEL: name=url,...\" PULSE_GATEWAY_API_KEY\n"
    "PULSE_GATEWAY_TRACE_FILE PULSE_GATEWAY_WARMUP_STATE_FILE PULSE_PLUGIN_DIRS=dir:dir\n";

const char* kPluginsFooter =
    "Scans the plugin directories of the config (or the built-in defaults when no config\n"
    "exists), loads each plugin and prints one row per file: id, kind, version, ABI and\n"
    "status or the reason it was rejected or skipped. Exit 4 if a required plugin did not\n"
    "load, or if a model of the config needs a translation profile or plugin:// backend that no\n"
    "plugin provides (each named on stderr); exit 5 if only optional plugins were rejected or\n"
    "failed (a file skipped for its name, or a plugin that said it cannot run here, is no\n"
    "failure).\n"
    "\n"
    "Without plugin directories in the config: the installed plugin directory (" PULSE_PLUGIN_DIR ")\n"
    "and the site drop-ins; a pulse run from its build directory uses that build's plugins.\n";

const char* kConfigFooter =
    "Checks FILE as `pulse serve` would before serving: parses and validates it (with the\n"
    "environment overrides applied), loads the plugins it names, checks that every model's\n"
    "translation profile, policy and plugin:// backend is provided, and creates each profile\n"
    "with its profile_options (a misspelt name or option is named, with the closest known one).\n"
    "In-process backends are not started (that would load their models): their options are\n"
    "checked when `pulse serve` starts them.\n"
    "Exit 0 when valid; 3 with FILE:LINE:COL or the option at fault when the config is not; 4\n"
    "when a plugin it needs is missing or failed to load (each named on stderr).\n";

const char* kModelFooter =
    "Runtime controller commands. They are implemented by the runtime controller plugin;\n"
    "run `pulse model help` to see what the installed controller offers. Every argument but\n"
    "--config and --log-level goes to the controller.\n";

// The options of the commands that read the config.
struct Args {
    std::optional<std::string> config;
    std::optional<std::string> log_level;
};

void add_config_option(CLI::App& cmd, Args& a) {
    cmd.add_option("-c,--config", a.config, "the config file (default: see `pulse --help`)")->option_text("FILE");
}

void add_log_level_option(CLI::App& cmd, Args& a) {
    cmd.add_option("--log-level", a.log_level, "trace, debug, info, warn, error or off (default: the config's log_level)")
        ->option_text("LEVEL")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
}

// A `pulse` run from the build directory it was linked in (build/core/pulse) finds that build's
// plugins, as an installed one finds the installed plugin directory: the path of the running
// binary, not a flag, tells the two apart.
std::optional<fs::path> build_tree_plugin_dir() {
#if defined(PULSE_BUILD_EXE) && defined(PULSE_BUILD_PLUGIN_DIR)
    std::error_code ec;
    fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (ec) return std::nullopt;
    fs::path built = fs::weakly_canonical(PULSE_BUILD_EXE, ec);
    if (ec || self != built || !fs::is_directory(PULSE_BUILD_PLUGIN_DIR, ec)) return std::nullopt;
    return fs::path(PULSE_BUILD_PLUGIN_DIR);
#else
    return std::nullopt;
#endif
}

// `pulse bench ARGS` runs the pulse-bench program, `pulse decode|gguf ARGS` the pulse-decoder
// program (git-style: the host binary carries neither): next to this binary (an install puts
// them all in BINDIR), this build's (a binary in its build tree), else the first on PATH.
// `args` is the companion's argv, its program name first.
int exec_companion(const char* program, const char* build_path, std::vector<std::string> args) {
    std::error_code ec;
    fs::path self = fs::read_symlink("/proc/self/exe", ec);
    std::vector<fs::path> candidates;
    if (!ec) candidates.push_back(self.parent_path() / program);
    if (build_path && build_tree_plugin_dir()) candidates.push_back(build_path);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (const auto& c : candidates)
        if (::access(c.c_str(), X_OK) == 0) {
            ::execv(c.c_str(), argv.data());
            std::fprintf(stderr, "pulse: cannot run %s: %s\n", c.c_str(), std::strerror(errno));
            return kExitRuntime;
        }
    ::execvp(program, argv.data());
    std::string looked;
    for (const auto& c : candidates) looked += c.string() + ", ";
    std::fprintf(stderr, "pulse: the %s program was not found (looked at %sthen PATH): it is installed with Pulse, next to pulse\n", program,
                 looked.c_str());
    return kExitRuntime;
}

// `pulse bench ARGS` is `pulse-bench ARGS`; `pulse decode|gguf|distill ARGS` is
// `pulse-decoder decode|gguf|distill ARGS`. Their arguments are theirs: pulse passes them on as given.
int cmd_bench(const std::vector<std::string>& rest) {
    std::vector<std::string> args{"pulse-bench"};
    args.insert(args.end(), rest.begin(), rest.end());
#if defined(PULSE_BUILD_BENCH)
    return exec_companion("pulse-bench", PULSE_BUILD_BENCH, args);
#else
    return exec_companion("pulse-bench", nullptr, args);
#endif
}

int cmd_decoder_tool(const std::string& command, const std::vector<std::string>& rest) {
    std::vector<std::string> args{"pulse-decoder", command};
    args.insert(args.end(), rest.begin(), rest.end());
#if defined(PULSE_BUILD_DECODER_TOOL)
    return exec_companion("pulse-decoder", PULSE_BUILD_DECODER_TOOL, args);
#else
    return exec_companion("pulse-decoder", nullptr, args);
#endif
}

// The config a command reads without --config, the first that exists of: $PULSE_CONFIG (used
// even when missing: the load error then names it), the user's ($XDG_CONFIG_HOME or ~/.config)
// /pulse-gateway/pulse.toml (before 0.1: .../pulse/pulse.toml, still read; that directory is
// PulseAudio's), the installed SYSCONFDIR/pulse-gateway/pulse.toml, and for a binary run from
// its build tree, the source tree's config/pulse.toml.
std::vector<fs::path> config_candidates() {
    std::vector<fs::path> c;
    const char* xdg = std::getenv("XDG_CONFIG_HOME");
    const char* home = std::getenv("HOME");
    fs::path user = xdg && *xdg ? fs::path(xdg) : home && *home ? fs::path(home) / ".config" : fs::path();
    if (!user.empty()) {
        c.push_back(user / "pulse-gateway" / "pulse.toml");
        c.push_back(user / "pulse" / "pulse.toml");
    }
    c.push_back(fs::path(PULSE_SYSCONF_DIR) / "pulse.toml");
#if defined(PULSE_SOURCE_CONFIG)
    if (build_tree_plugin_dir()) c.push_back(PULSE_SOURCE_CONFIG);
#endif
    return c;
}

std::optional<fs::path> default_config() {
    if (const char* env = std::getenv("PULSE_CONFIG"); env && *env) return fs::path(env);
    std::error_code ec;
    for (const auto& p : config_candidates())
        if (fs::is_regular_file(p, ec)) return p;
    return std::nullopt;
}

// Loads the config the command asked for. With `required` false and no file anywhere, returns
// the built-in defaults.
config::Config load_config(const Args& a, bool required) {
    std::optional<fs::path> path = a.config ? std::optional<fs::path>(*a.config) : default_config();
    config::Config cfg;
    if (path) {
        cfg = config::load_file(*path);
    } else if (required) {
        std::string looked;
        for (const auto& p : config_candidates()) looked += (looked.empty() ? "" : ", ") + p.string();
        throw config::ConfigError("no config file: pass --config FILE or set PULSE_CONFIG (looked for " + looked + ")");
    }
    config::apply_env(cfg, [](const char* n) -> const char* { return std::getenv(n); });
    config::apply_fragments(cfg);
    for (const auto& w : cfg.warnings) log::warn("config", w);
    for (const auto& o : cfg.env_overrides) log::info("config", o);
    if (cfg.plugins.dirs.empty()) {
        if (auto build = build_tree_plugin_dir()) {
            cfg.plugins.dirs.push_back(*build);  // this build's plugins, never an installed site's drop-ins
        } else {
            cfg.plugins.dirs.push_back(PULSE_PLUGIN_DIR);
            if (cfg.plugins.dropin_dirs.empty() && cfg.source.empty())
                cfg.plugins.dropin_dirs.push_back(fs::path(PULSE_SYSCONF_DIR) / "plugins.d");
        }
    }
    config::validate(cfg);
    return cfg;
}

plugin::Options plugin_options(const config::Config& cfg) {
    plugin::Options o;  // no runtime_dir: listing commands load in place and stage nothing
    o.dirs = cfg.plugins.dirs;
    o.dropin_dirs = cfg.plugins.dropin_dirs;
    o.require = cfg.plugins.require;
    return o;
}

void apply_log_level(const Args& a, const config::Config& cfg) {
    log::Level l = log::Level::info;
    const std::string& text = a.log_level ? *a.log_level : cfg.log_level;
    if (!log::parse_level(text, l)) throw config::ConfigError("log level '" + text + "' is not one of trace, debug, info, warn, error, off");
    log::set_level(l);
}

std::string version_text();

int cmd_version() {
    std::printf("%s\n", version_text().c_str());
    return kExitOk;
}

int cmd_config_check(const Args& a, const std::string& file) {
    Args b = a;
    b.config = file;
    config::Config cfg = load_config(b, true);
    // As serve does before it listens: the plugins, the components, each profile's options.
    if (!a.log_level) log::set_level(log::Level::error);  // problems are printed below, not logged twice
    plugin::PluginManager pm(plugin_options(cfg));
    pm.load_all();
    auto problems = pm.fatal_problems();
    auto missing = gateway::SnapshotBuilder::check_components(cfg, pm);
    problems.insert(problems.end(), missing.begin(), missing.end());
    if (!problems.empty()) {
        for (const auto& p : problems) std::fprintf(stderr, "%s: %s\n", file.c_str(), p.c_str());
        return kExitPlugin;
    }
    gateway::SnapshotBuilder(pm).build(cfg, gateway::SnapshotBuilder::Backends::skip);  // a rejected option: ConfigError (exit 3)
    std::printf("%s: ok (%zu model%s, listen %s:%u)\n", file.c_str(), cfg.models.size(),
                cfg.models.size() == 1 ? "" : "s", cfg.server.listen.host.c_str(), cfg.server.listen.port);
    for (const auto& o : cfg.env_overrides) std::printf("  from the environment: %s\n", o.c_str());
    return kExitOk;
}

std::string gateway_client_url(const config::Config& cfg);

// pulse doctor: the endpoints of the config (or the URLs given), checked for what Codex needs.
struct DoctorArgs {
    Args common;
    std::optional<std::string> model;
    std::vector<std::string> urls;
    cli::DoctorSettings settings;
};

CLI::App* add_doctor_command(CLI::App& pulse, DoctorArgs& d) {
    CLI::App* cmd = pulse.add_subcommand("doctor", "what each endpoint's server can do for Codex, and the fixes");
    cmd->footer(cli::kDoctorFooter);
    add_config_option(*cmd, d.common);
    cmd->add_option("--model", d.model, "only this model's endpoints (with URLs: the model name to ask for)")->option_text("ID");
    cmd->add_flag("--json", d.settings.json, "the report as one JSON object");
    cmd->add_option("--write-catalog", d.settings.write_catalog,
                    "write the Codex model catalog for the model with the servers' real context window (an existing FILE is kept as FILE.bak)")
        ->option_text("FILE");
    cmd->add_option("URL", d.urls, "check these servers instead of the config's endpoints (e.g. http://127.0.0.1:8080/v1)")
        ->type_name("")
        ->check([](const std::string& u) -> std::string {
            return u.rfind("http://", 0) == 0 || u.rfind("https://", 0) == 0 ? "" : "'" + u + "' is not a URL (URLs start with http://)";
        });
    return cmd;
}

int cmd_doctor(const CLI::App& cmd, DoctorArgs& d) {
    auto& a = d.common;
    auto& s = d.settings;
    auto& urls = d.urls;
    auto& model = d.model;
    if (!urls.empty()) {
        if (a.config) return args::usage_error(cmd, "give --config or URLs, not both");
        for (const auto& u : urls) s.targets.push_back({"", model.value_or(""), u, u, 0});
        return cli::run_doctor(s);
    }
    config::Config cfg = load_config(a, false);
    s.config_path = cfg.source.string();
    s.gateway_url = gateway_client_url(cfg);
    s.api_key = cfg.server.api_key;
    s.head_timeout_s = cfg.upstream.head_timeout_s;
    s.keepalive_s = cfg.upstream.keepalive_s;
    for (const auto& m : cfg.models) {
        if (model && m.id != *model) continue;
        for (const auto& e : m.endpoints) {
            if (e.is_plugin()) {
                std::fprintf(stderr, "pulse doctor: model %s, endpoint %s: an in-process backend (%s): only the turn through the gateway checks it\n",
                             m.id.c_str(), e.name.c_str(), e.url.c_str());
                continue;
            }
            s.targets.push_back({m.id, m.upstream_model, e.name, e.url, m.context_window});
        }
    }
    if (model && std::none_of(cfg.models.begin(), cfg.models.end(), [&](const config::Model& m) { return m.id == *model; }))
        return args::usage_error(cmd, "no model '" + *model + "' in " + (s.config_path.empty() ? std::string("the config") : s.config_path));
    return cli::run_doctor(s);
}

int cmd_plugins(const Args& a, bool verbose) {
    config::Config cfg = load_config(a, false);
    if (!a.log_level) log::set_level(log::Level::error);  // the table says it all
    else apply_log_level(a, cfg);
    plugin::PluginManager pm(plugin_options(cfg));
    pm.load_all();
    std::printf("%-32s %-22s %-10s %-5s %s\n", "ID", "KIND", "VERSION", "ABI", "STATUS");
    for (const auto& s : pm.statuses()) {
        std::string abi = s.abi_major ? std::to_string(s.abi_major) + "." + std::to_string(s.abi_minor_built) : "-";
        std::string status = plugin::state_name(s.state);
        if (s.state == plugin::State::loaded) {
            std::string comps;
            for (const auto& c : s.components) comps += (comps.empty() ? "" : ", ") + c;
            status += " (" + s.path.string() + (comps.empty() ? "" : "; " + comps) + ")";
        } else {
            status += ": " + s.path.string() + ": " + s.reason;
        }
        if (s.required) status += " [required]";
        std::printf("%-32s %-22s %-10s %-5s %s\n", s.id.empty() ? "-" : s.id.c_str(),
                    plugin::kinds_text(s.kinds).c_str(), s.version.empty() ? "-" : s.version.c_str(), abi.c_str(),
                    status.c_str());
        if (verbose && !s.build_info.empty()) std::printf("%-32s built: %s\n", "", s.build_info.c_str());
    }
    if (pm.statuses().empty()) {
        std::string dirs;
        for (const auto& d : cfg.plugins.dirs) dirs += " " + d.string();
        for (const auto& d : cfg.plugins.dropin_dirs) dirs += " " + d.string();
        std::printf("(no plugin files found in:%s)\n", dirs.c_str());
    }
    // The config's needs, as `serve` would check them: a model whose profile or plugin://
    // backend no plugin provides cannot start.
    auto fatal = pm.fatal_problems();
    auto missing = gateway::SnapshotBuilder::check_components(cfg, pm);
    fatal.insert(fatal.end(), missing.begin(), missing.end());
    for (const auto& f : fatal) std::fprintf(stderr, "pulse: %s\n", f.c_str());
    if (!fatal.empty()) return kExitPlugin;
    size_t refused = 0;
    for (const auto& s : pm.statuses()) refused += s.state == plugin::State::rejected || s.state == plugin::State::failed;
    if (refused) {
        std::fprintf(stderr, "pulse: %zu optional plugin file%s rejected or failed (see the table)\n", refused, refused == 1 ? " was" : "s were");
        return kExitOptionalPlugin;
    }
    return kExitOk;
}

// How a client on this host reaches the gateway (a wildcard listen address means loopback).
std::string gateway_client_url(const config::Config& cfg) {
    std::string host = cfg.server.listen.host;
    if (host == "0.0.0.0") host = "127.0.0.1";
    if (host == "::") host = "::1";
    if (host.find(':') != std::string::npos) host = "[" + host + "]";
    return "http://" + host + ":" + std::to_string(cfg.server.listen.port);
}

int cmd_model(const Args& a, const std::vector<std::string>& rest) {
    config::Config cfg = load_config(a, false);
    if (!a.log_level) log::set_level(log::Level::warn);
    else apply_log_level(a, cfg);
    plugin::PluginManager pm(plugin_options(cfg));
    pm.load_all();
    auto names = pm.component_names(PULSE_KIND_CONTROLLER);
    if (names.empty()) {
        std::fprintf(stderr,
                     "pulse: no runtime controller plugin is loaded, so `pulse model` is not available "
                     "(run `pulse plugins` to see what was found)\n");
        return kExitPlugin;
    }
    if (names.size() > 1) {
        std::fprintf(stderr, "pulse: more than one runtime controller is loaded (%s, %s); keep exactly one\n",
                     names[0].c_str(), names[1].c_str());
        return kExitPlugin;
    }
    auto lease = pm.controller(names[0]);
    const auto& vt = lease->registration.controller;
    // The [controller] table, plus what the host knows that the controller needs: where relative
    // paths start, and how to reach this site's gateway (URL, fragment directory, API key).
    rapidjson::Document ccfg;
    ccfg.Parse(cfg.controller_json.c_str());
    if (!ccfg.IsObject()) ccfg.SetObject();
    auto& al = ccfg.GetAllocator();
    auto str = [&](const std::string& v) { return rapidjson::Value(v.c_str(), static_cast<rapidjson::SizeType>(v.size()), al); };
    fs::path config_dir = cfg.source.empty() ? fs::current_path() : cfg.source.parent_path();
    ccfg.RemoveMember("config_dir");
    ccfg.AddMember("config_dir", str(config_dir.string()), al);
    rapidjson::Value gw(rapidjson::kObjectType);
    gw.AddMember("url", str(gateway_client_url(cfg)), al);
    gw.AddMember("endpoint_fragments", str(cfg.upstream.endpoint_fragments.string()), al);
    gw.AddMember("api_key", str(cfg.server.api_key), al);
    ccfg.RemoveMember("gateway");
    ccfg.AddMember("gateway", gw, al);
    pulse_call call;
    void* ctl = nullptr;
    pulse_status_t rc = vt.create(lease->registration.user, &call, host::view(&ccfg), &ctl);
    if (rc != PULSE_OK) {
        std::fprintf(stderr, "pulse: controller %s: create failed: %s\n", names[0].c_str(),
                     host::call_error(call, rc, lease->plugin_id()).c_str());
        return kExitPlugin;
    }
    struct StdOut : pulse_output {
        void write(std::string_view t) override { std::fwrite(t.data(), 1, t.size(), stdout); }
    } out;
    std::vector<pulse_str_t> av;
    for (const auto& s : rest) av.push_back({s.data(), s.size()});
    int32_t exit_code = 0;
    call.clear_error();
    rc = vt.command(ctl, &call, av.size(), av.data(), &out, &exit_code);
    std::fflush(stdout);
    if (vt.destroy) vt.destroy(ctl);
    if (rc != PULSE_OK) {
        std::fprintf(stderr, "pulse: model: %s\n", host::call_error(call, rc, lease->plugin_id()).c_str());
        return kExitRuntime;
    }
    return exit_code;
}

// The directory hot-reloadable plugin copies are staged in: systemd's RuntimeDirectory, the
// configured one, or a private fallback when that is not writable (e.g. not root).
fs::path pick_runtime_dir(const config::Config& cfg) {
    std::vector<fs::path> candidates;
    if (const char* rd = std::getenv("RUNTIME_DIRECTORY"); rd && *rd) candidates.emplace_back(std::string(rd).substr(0, std::string(rd).find(':')));
    candidates.push_back(cfg.plugins.runtime_dir);
    if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) candidates.push_back(fs::path(x) / "pulse-gateway");  // not .../pulse: PulseAudio's socket
    candidates.push_back(fs::temp_directory_path() / ("pulse-gateway-" + std::to_string(::geteuid())));
    for (const auto& d : candidates) {
        std::error_code ec;
        fs::create_directories(d, ec);
        if (!ec && ::access(d.c_str(), W_OK | X_OK) == 0) return d;
    }
    return {};
}

// Watches the plugin directories and raises SIGUSR1 (debounced) when a file appears or changes.
class PluginDirWatcher {
public:
    explicit PluginDirWatcher(const std::vector<fs::path>& dirs) {
        fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
        if (fd_ < 0) return;
        for (const auto& d : dirs)
            inotify_add_watch(fd_, d.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ATTRIB);
        if (::pipe2(stop_, O_CLOEXEC) != 0) return;
        thread_ = std::thread([this] { run(); });
    }
    ~PluginDirWatcher() {
        if (thread_.joinable()) {
            ssize_t n = ::write(stop_[1], "x", 1);
            (void)n;
            thread_.join();
        }
        for (int fd : {fd_, stop_[0], stop_[1]})
            if (fd >= 0) ::close(fd);
    }

private:
    void run() {
        char buf[4096];
        bool pending = false;
        for (;;) {
            pollfd p[2] = {{fd_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
            int n = ::poll(p, 2, pending ? 300 : -1);
            if (n < 0 && errno != EINTR) return;
            if (p[1].revents) return;
            if (n == 0 && pending) {  // quiet for 300 ms after the last change
                pending = false;
                ::kill(::getpid(), SIGUSR1);
                continue;
            }
            if (p[0].revents & POLLIN) {
                while (::read(fd_, buf, sizeof buf) > 0) {
                }
                pending = true;
            }
        }
    }
    int fd_ = -1;
    int stop_[2] = {-1, -1};
    std::thread thread_;
};

// Process-wide settings every server thread inherits; returns the control signals, blocked
// before any thread starts so only sigtimedwait() sees them.
sigset_t prepare_serving_process() {
    // Request bodies and their upstream copies run to tens of MiB. glibc's default raises its
    // mmap threshold to the size of each large block freed (up to 32 MiB), after which such
    // blocks come from the worker threads' arenas and their pages stay with the process when
    // freed (12 bodies of 31 MB left 456 MB resident). A fixed threshold keeps every block of
    // 4 MiB or more mapped on its own and returned to the system when freed.
    ::mallopt(M_MMAP_THRESHOLD, 4 << 20);
    // POCO masks SIGPIPE per thread; ignore it for all.
    ::signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&set, s);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    return set;
}

// A started server's control thread: reloads on SIGHUP (or POST /admin/reload) and on plugin
// directory changes, the systemd watchdog, retired snapshots and plugin generations, then the
// drain on SIGTERM / SIGINT.
struct ServeLoop {
    const Args& args;
    config::Config& cfg;
    plugin::PluginManager& pm;
    gateway::Gateway& gw;
    server::HttpServer& http;
    std::string where;
    sigset_t signals;
    bool watchdog = false;
    uint64_t watchdog_usec = 0;
    std::atomic<bool>& reload_over_http;

    // Hot reload of translation profiles, then a new config snapshot that leases them.
    void reload(bool reread_config) {
        sd_notify(0, "RELOADING=1\nSTATUS=reloading");
        auto rep = pm.reload();
        std::string refused;
        try {
            config::Config next = cfg;
            if (reread_config) {
                Args b = args;
                b.config = cfg.source.string();
                next = load_config(b, true);
            }
            gw.reload(next);
            cfg = next;
        } catch (const config::ConfigError& e) {
            log::error("reload", std::string("configuration not reloaded, the previous one keeps serving: ") + e.what());
            metrics::global().counter(metrics::kConfigReloadFailures.name, metrics::kConfigReloadFailures.help).add();
            refused = e.what();
        }
        std::string plugins = "plugins: " + std::to_string(rep.reloaded) + " reloaded, " + std::to_string(rep.added) + " added, " +
                              std::to_string(rep.failed) + " failed";
        gw.note_reload(refused.empty() && rep.failed == 0,
                       refused.empty() ? plugins + (rep.failed ? " (the previous versions keep serving; see `pulse plugins`)" : "")
                                       : "configuration refused, the previous one keeps serving: " + refused + "; " + plugins);
        sd_notifyf(0, "READY=1\nSTATUS=serving on %s (plugins: %d reloaded, %d added, %d failed)", where.c_str(), rep.reloaded,
                   rep.added, rep.failed);
    }

    // How often the control thread wakes: to feed the systemd watchdog (twice per period, as
    // sd_watchdog_enabled(3) advises) and to release retired snapshots and plugin generations.
    std::chrono::microseconds watchdog_period() const {
        const auto half = std::chrono::microseconds(watchdog && watchdog_usec / 2 < 500000 ? watchdog_usec / 2 : 500000);
        return std::max(half, std::chrono::microseconds(1000));
    }

    // Until SIGTERM / SIGINT.
    void run() {
        const auto period = watchdog_period();
        const timespec tick{static_cast<time_t>(period.count() / 1000000), static_cast<long>(period.count() % 1000000 * 1000)};
        for (;;) {
            int sig = sigtimedwait(&signals, nullptr, &tick);
            if (watchdog) sd_notify(0, "WATCHDOG=1");
            gw.collect_retired();
            pm.collect_retired();
            if (sig < 0) continue;
            if (sig == SIGHUP) {
                log::info("serve", reload_over_http.exchange(false) ? "POST /admin/reload: reloading configuration and translation profiles"
                                                                    : "SIGHUP: reloading configuration and translation profiles");
                reload(true);
            } else if (sig == SIGUSR1) {
                log::info("serve", "plugin directory changed: reloading translation profiles");
                reload(false);
            } else {
                return;
            }
        }
    }

    // Graceful drain: new requests get 503 + Retry-After at once (the listener stays open, so
    // nobody is reset), streams in flight get drain_timeout_s to finish, and those still
    // running then end with response.failed rather than a cut connection.
    void drain() {
        log::info("serve", "received SIGTERM: draining (up to " + std::to_string(static_cast<int>(cfg.server.drain_timeout_s)) + " s)");
        sd_notify(0, "STOPPING=1\nSTATUS=draining");
        gw.set_draining(true);
        http.drain();
        // Woken by the last request's end; the watchdog is fed meanwhile, as run() feeds it.
        auto wait_idle = [&](double seconds) {
            using std::chrono::steady_clock;
            const auto until = steady_clock::now() + std::chrono::duration_cast<steady_clock::duration>(std::chrono::duration<double>(seconds));
            while (!gw.wait_idle(std::min(until, steady_clock::now() + watchdog_period())) && steady_clock::now() < until)
                if (watchdog) sd_notify(0, "WATCHDOG=1");
        };
        wait_idle(cfg.server.drain_timeout_s);
        if (int left = gw.active_requests(); left > 0) {
            log::warn("serve", std::to_string(left) + " requests still in flight at the drain deadline: ending them with response.failed");
            gw.cut_streams();
            // They end within a send timeout at worst (a client that does not read its end).
            wait_idle(std::min(cfg.server.send_timeout_s, 10.0));
        }
    }
};

// Plugins load before the server starts, so a startup failure never serves partial traffic.
// Returns the problems that forbid starting (each logged), empty when there are none.
size_t report_startup_problems(const config::Config& cfg, const plugin::PluginManager& pm) {
    auto fatal = pm.fatal_problems();
    auto missing = gateway::SnapshotBuilder::check_components(cfg, pm);
    fatal.insert(fatal.end(), missing.begin(), missing.end());
    if (fatal.empty()) return 0;
    for (const auto& f : fatal) log::error("serve", f);
    for (const auto& s : pm.statuses())
        if (s.state != plugin::State::loaded && !s.required) log::error("serve", "  (possibly related) " + s.describe());
    std::fprintf(stderr, "pulse: cannot start: %zu plugin problem%s (see above)\n", fatal.size(), fatal.size() == 1 ? "" : "s");
    return fatal.size();
}

int cmd_serve(const Args& a) {
    config::Config cfg = load_config(a, true);
    apply_log_level(a, cfg);
    if (!cfg.server.listen.is_loopback() && cfg.server.api_key.empty())
        log::warn("serve", "listening on " + cfg.server.listen.host + " without an API key (server.allow_public_without_key = true): "
                           "anyone who can reach this address can use the backends");
    const sigset_t signals = prepare_serving_process();

    plugin::Options popts = plugin_options(cfg);
    popts.runtime_dir = pick_runtime_dir(cfg);
    plugin::PluginManager pm(popts);
    pm.load_all();
    gateway::Gateway gw(cfg, pm);
    if (report_startup_problems(cfg, pm) > 0) return kExitPlugin;
    // An HTTP reload joins the SIGHUP path (one reload at a time, on this thread); the flag makes
    // its log line say where it came from.
    static std::atomic<bool> reload_over_http{false};
    gw.set_reload_hook([] {
        reload_over_http = true;
        ::kill(::getpid(), SIGHUP);
    });
    gw.start();  // profile and backend instances; a rejected option is a config error (exit 3)

    server::HttpServer http(cfg.server, [&gw](server::Exchange& ex) { gw.handle(ex); });
    try {
        http.start();
    } catch (const std::exception& e) {
        log::error("serve", e.what());
        return kExitRuntime;
    }
    ServeLoop loop{a, cfg, pm, gw, http, "http://" + cfg.server.listen.host + ":" + std::to_string(http.port()), signals, false, 0, reload_over_http};
    log::info("serve", "pulse " + std::string(PULSE_VERSION) + " listening on " + loop.where + " (" + std::to_string(cfg.models.size()) + " models)");
    std::vector<fs::path> watched = cfg.plugins.dirs;
    watched.insert(watched.end(), cfg.plugins.dropin_dirs.begin(), cfg.plugins.dropin_dirs.end());
    PluginDirWatcher watcher(watched);
    loop.watchdog = sd_watchdog_enabled(0, &loop.watchdog_usec) > 0;
    sd_notifyf(0, "READY=1\nSTATUS=serving on %s\nMAINPID=%lu", loop.where.c_str(), static_cast<unsigned long>(::getpid()));

    loop.run();
    loop.drain();
    http.stop();
    gw.stop();
    gw.collect_retired();
    pm.shutdown();
    log::info("serve", "stopped");
    return kExitOk;
}


// Every command, as the parser knows it (its options, its help), and what ran.
struct Commands {
    Args serve, plugins, config, model;
    bool plugins_verbose = false, model_help = false;
    std::string config_file;
    DoctorArgs doctor;
    cli::CodexArgs codex;
    cli::ContinuityArgs continuity;
    CLI::App *serve_cmd, *plugins_cmd, *config_cmd, *model_cmd, *doctor_cmd, *codex_cmd, *continuity_cmd, *version_cmd, *help_cmd;
    std::vector<CLI::App*> companions;  // bench, decode, gguf, distill: other programs (main() runs them)

    explicit Commands(CLI::App& pulse) {
        serve_cmd = pulse.add_subcommand("serve", "run the gateway");
        serve_cmd->footer(kServeFooter);
        add_config_option(*serve_cmd, serve);
        add_log_level_option(*serve_cmd, serve);

        plugins_cmd = pulse.add_subcommand("plugins", "list plugins found, with status or rejection reason");
        plugins_cmd->footer(kPluginsFooter);
        add_config_option(*plugins_cmd, plugins);
        add_log_level_option(*plugins_cmd, plugins);
        plugins_cmd->add_flag("-v,--verbose", plugins_verbose, "each plugin's build description (PULSE_BUILD_INFO: compiler, SDK version, build type)");

        config_cmd = pulse.add_subcommand("config", "config check FILE: validate a config file and exit");
        config_cmd->require_subcommand(1);
        CLI::App* check = config_cmd->add_subcommand("check", "validate a config file as `pulse serve` would, and exit");
        check->footer(kConfigFooter);
        check->add_option("FILE", config_file, "the config file")->type_name("")->required();
        add_log_level_option(*check, config);

        doctor_cmd = add_doctor_command(pulse, doctor);

        model_cmd = pulse.add_subcommand("model", "runtime controller commands (provided by a plugin)");
        model_cmd->footer(kModelFooter);
        add_config_option(*model_cmd, model);
        add_log_level_option(*model_cmd, model);
        model_cmd->allow_extras();  // the controller's own command line
        model_cmd->set_help_flag();
        model_cmd->add_flag("-h,--help", model_help, "this help; after a controller command, that command's help");

        const std::pair<const char*, const char*> companion_list[] = {
            {"bench", "decode|accept|ttft|quality|drift|agent: measurements against any OpenAI-compatible server"},
            {"decode", "MODEL.gguf --prompt TEXT: run the in-process decoder directly"},
            {"gguf", "make-demo [--mtp] [FILE] | info FILE: the random-weight demo model; inspect a GGUF file"},
            {"distill", "collect MODEL.gguf --prompts F --out DIR: the model's own continuations and hidden states"},
        };
        for (const auto& [name, about] : companion_list) companions.push_back(pulse.add_subcommand(name, about));
        codex_cmd = cli::add_codex_command(pulse, codex);
        continuity_cmd = cli::add_continuity_command(pulse, continuity);
        version_cmd = pulse.add_subcommand("version", "print version and plugin ABI");
        help_cmd = pulse.add_subcommand("help", "this help")->group("");
    }
};

std::string version_text() {
    return "pulse " PULSE_VERSION " (plugin ABI " + std::to_string(PULSE_ABI_MAJOR) + "." + std::to_string(PULSE_ABI_MINOR) + ")";
}

int run(CLI::App& pulse, Commands& c) {
    if (*c.version_cmd) return cmd_version();
    if (*c.help_cmd) return std::fputs(pulse.help().c_str(), stdout), kExitOk;
    if (*c.serve_cmd) return cmd_serve(c.serve);
    if (*c.plugins_cmd) return cmd_plugins(c.plugins, c.plugins_verbose);
    if (*c.config_cmd) return cmd_config_check(c.config, c.config_file);
    if (*c.doctor_cmd) return cmd_doctor(*c.doctor_cmd, c.doctor);
    if (*c.model_cmd) {
        std::vector<std::string> rest = c.model_cmd->remaining();
        if (c.model_help && rest.empty()) return std::fputs(c.model_cmd->help("pulse").c_str(), stdout), kExitOk;
        if (c.model_help) rest.push_back("--help");
        return cmd_model(c.model, rest);
    }
    if (*c.codex_cmd) {
        auto listen_of = [](const std::string* config) {
            Args a;
            if (config) a.config = *config;
            return gateway_client_url(load_config(a, false));
        };
        auto find_config = [] {
            auto p = default_config();
            return p ? p->string() : std::string();
        };
        c.codex.passthrough = c.codex_cmd->remaining();
        return cli::cmd_codex(c.codex, fs::read_symlink("/proc/self/exe").string(), listen_of, find_config);
    }
    if (*c.continuity_cmd) return cli::cmd_continuity(c.continuity, fs::read_symlink("/proc/self/exe").string());
    return args::usage_error(pulse, "missing command");
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App pulse{kAbout, "pulse"};
    args::style(pulse);
    pulse.footer(kMainFooter);
    pulse.set_version_flag("--version", version_text());
    Commands commands(pulse);
    // `pulse bench|decode|gguf|distill ARGS`: another program's arguments, read by no parser
    // here (on the parser only for the command list).
    if (argc >= 2)
        for (CLI::App* companion : commands.companions)
            if (companion->get_name() == argv[1]) {
                const std::vector<std::string> rest(argv + 2, argv + argc);
                return companion->get_name() == "bench" ? cmd_bench(rest) : cmd_decoder_tool(argv[1], rest);
            }
    // `pulse codex ARGS -- CODEX ARGS`: what follows "--" is codex's, read by no parser here.
    int parsed_argc = argc;
    if (argc >= 2 && std::string(argv[1]) == "codex")
        for (int i = 2; i < argc; ++i)
            if (std::string(argv[i]) == "--") {
                commands.codex.passthrough_after_dashes.assign(argv + i + 1, argv + argc);
                parsed_argc = i;
                break;
            }
    if (auto exit = args::parse(pulse, parsed_argc, argv)) return *exit;
    try {
        return run(pulse, commands);
    } catch (const config::ConfigError& e) {
        std::fprintf(stderr, "pulse: config error:\n%s\n", e.what());
        return kExitConfig;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pulse: %s\n", e.what());
        return kExitRuntime;
    }
}
