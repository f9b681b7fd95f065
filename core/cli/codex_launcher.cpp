// `pulse codex`: start the Codex CLI for the current project against Pulse, for this one
// process, without touching ~/.codex/config.toml. Checks the gateway first (and can start it),
// writes a model catalog for the chosen model, and passes provider, catalog, model and
// auto-compaction settings as -c flags.
#include "cli/codex_launcher.h"
#include "cli/continuity_cmd.h"
#include "http/client.h"

#include <fcntl.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace pulse::cli {
namespace {

namespace fs = std::filesystem;

const char* kFooter =
    "Runs the Codex CLI against Pulse for this one process (your ~/.codex/config.toml is not\n"
    "touched). It checks the gateway's /health, writes a model catalog for the model, and passes\n"
    "the provider, catalog, model and auto-compaction settings to codex as -c flags.\n"
    "\n"
    "Everything after `--` (or any argument pulse does not know) goes to codex, e.g.\n"
    "  pulse codex -- exec --full-auto \"fix the failing test\"\n"
    "(`codex exec` is read-only unless given --full-auto or --sandbox workspace-write: without\n"
    "them it cannot edit files, and pulse codex says so.)\n"
    "If PULSE_GATEWAY_API_KEY is set, codex sends it as the bearer key.\n";

struct Http {
    int status = 0;  // 0: could not connect
    std::string body, error;
};

Http get(const std::string& base, const std::string& path, double timeout_s = 3) {
    http::Request req;
    req.target = path;
    if (const char* key = std::getenv("PULSE_GATEWAY_API_KEY"); key && *key) req.fields.emplace_back("Authorization", std::string("Bearer ") + key);
    http::Answer a = http::fetch(base, req, http::Timeouts::all(timeout_s), 16u << 20);
    return {a.status, std::move(a.body), std::move(a.error)};
}

std::string quote_toml(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
    }
    return o + "\"";
}

}  // namespace

// The Codex 0.169 model catalog entry for `model` (docs/CODEX.md, "Run Codex": the catalog Codex needs).
std::string catalog_json(const std::string& model, int64_t context_window) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    auto kv = [&](const char* k, const std::string& v) {
        w.Key(k);
        w.String(v.c_str());
    };
    w.StartObject();
    w.Key("models");
    w.StartArray();
    w.StartObject();
    kv("slug", model);
    kv("display_name", model + " (local, via Pulse)");
    kv("description", "A local model served through the Pulse gateway");
    kv("default_reasoning_level", "medium");
    w.Key("supported_reasoning_levels");
    w.StartArray();
    for (const char* level : {"minimal", "low", "medium", "high"}) {
        w.StartObject();
        kv("effort", level);
        kv("description", std::string(level) == "minimal" ? "thinking off" : "thinking on");
        w.EndObject();
    }
    w.EndArray();
    kv("shell_type", "shell_command");
    kv("visibility", "list");
    w.Key("supported_in_api");
    w.Bool(true);
    w.Key("priority");
    w.Int(1);
    kv("base_instructions",
       "You are Codex, a coding agent running on a local model through Pulse. You work in the user's project directory. "
       "Read files before you change them, make focused edits with the apply_patch tool, run commands with exec_command "
       "to check your work, and finish with a short summary of what you changed and how you verified it. Be concise.");
    kv("default_reasoning_summary", "auto");
    w.Key("support_verbosity");
    w.Bool(false);
    kv("apply_patch_tool_type", "freeform");
    w.Key("truncation_policy");
    w.StartObject();
    kv("mode", "tokens");
    w.Key("limit");
    w.Int(10000);
    w.EndObject();
    w.Key("context_window");
    w.Int64(context_window);
    w.Key("max_context_window");
    w.Int64(context_window);
    w.Key("auto_compact_token_limit");
    w.Int64(context_window * 9 / 10);
    w.Key("effective_context_window_percent");
    w.Int(95);
    w.Key("experimental_supported_tools");
    w.StartArray();
    w.EndArray();
    w.Key("input_modalities");
    w.StartArray();
    w.String("text");
    w.EndArray();
    w.EndObject();
    w.EndArray();
    w.EndObject();
    return b.GetString();
}

namespace {

// A private directory for the catalog (it is ours alone; 0700).
fs::path private_dir() {
    const char* x = std::getenv("XDG_RUNTIME_DIR");
    // Not $XDG_RUNTIME_DIR/pulse: that is PulseAudio's (its native socket).
    fs::path d = x && *x ? fs::path(x) / "pulse-gateway" : fs::temp_directory_path() / ("pulse-gateway-" + std::to_string(::geteuid()));
    fs::create_directories(d);
    fs::permissions(d, fs::perms::owner_all);
    return d;
}

int fail(const std::string& msg) {
    std::fprintf(stderr, "pulse codex: %s\n", msg.c_str());
    return 1;
}

}  // namespace

// `codex exec` runs in a read-only sandbox unless its arguments say otherwise: the run can
// read and answer but every edit is refused, and codex still exits 0. True when `args` (what
// goes to codex) is an exec run that cannot write.
static bool read_only_exec(const std::vector<std::string>& args) {
    bool exec = false;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (!exec && !a.empty() && a[0] != '-') {
            if (a != "exec" && a != "e") return false;  // another subcommand, or an interactive prompt
            exec = true;
            continue;
        }
        if (a == "--full-auto" || a == "--dangerously-bypass-approvals-and-sandbox" || a == "--yolo") return false;
        std::string mode;
        if ((a == "-s" || a == "--sandbox") && i + 1 < args.size()) mode = args[i + 1];
        if (a.rfind("--sandbox=", 0) == 0) mode = a.substr(10);
        if ((a == "-c" || a == "--config") && i + 1 < args.size() && args[i + 1].rfind("sandbox_mode=", 0) == 0) {
            mode = args[i + 1].substr(13);
            std::erase(mode, '"');
        }
        if (mode == "workspace-write" || mode == "danger-full-access") return false;
    }
    return exec;
}

namespace {
pid_t g_codex = 0;  // forwarded SIGTERM/SIGHUP go to it
void forward(int sig) {
    if (g_codex > 0) ::kill(g_codex, sig);
}
}  // namespace

CLI::App* add_codex_command(CLI::App& pulse, CodexArgs& a) {
    CLI::App* cmd = pulse.add_subcommand("codex", "run the Codex CLI against this gateway");
    cmd->footer(kFooter);
    cmd->add_option("--model", a.model, "the model (default: the first model with a healthy backend)")->option_text("ID");
    cmd->add_option("--gateway", a.gateway, "the gateway (default: server.listen of --config, else http://127.0.0.1:8800)")->option_text("URL");
    cmd->add_flag("--start-gateway", a.start, "start `pulse serve` in the background if none is running; it is stopped (drained) when codex exits");
    cmd->add_flag("--keep-gateway", a.keep, "leave the gateway it started running after codex exits");
    cmd->add_option("--config", a.config,
                    "the gateway config (for --gateway and --start-gateway); default: the one `pulse serve` reads")
        ->option_text("FILE");
    cmd->add_option("--codex", a.codex, "the codex executable (default $PULSE_CODEX_BIN, else `codex` on PATH)")->option_text("BIN");
    cmd->add_flag("--no-continuity", a.no_continuity,
                  "leave out the task-continuity hooks (`pulse continuity --help`), and with them --dangerously-bypass-hook-trust, which they need");
    cmd->allow_extras();  // codex's own options
    return cmd;
}

namespace {

// The gateway a run started (--start-gateway), stopped when the run ends unless it is kept
// (--keep-gateway): SIGTERM drains it, bounded.
struct StartedGateway {
    pid_t pid = 0;
    bool keep = false;
    StartedGateway() = default;
    StartedGateway(const StartedGateway&) = delete;
    StartedGateway& operator=(const StartedGateway&) = delete;
    ~StartedGateway() {
        if (pid <= 0 || keep) return;
        ::kill(pid, SIGTERM);
        int st = 0;
        for (int i = 0; i < 600 && ::waitpid(pid, &st, WNOHANG) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (::waitpid(pid, &st, WNOHANG) == 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &st, 0);
        }
        std::fprintf(stderr, "pulse codex: stopped the gateway it started (pid %d)\n", pid);
    }

    // `pulse serve` in a session of its own (it outlives this process's terminal), its output
    // in `log`; then waits up to 60 s for its /health. The last /health answer.
    Http start(const std::string& self_exe, const std::optional<std::string>& config, const std::string& url) {
        fs::path log = private_dir() / "gateway.log";
        pid_t child = ::fork();
        if (child == 0) {
            ::setsid();
            int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
            if (fd >= 0) {
                ::dup2(fd, 1);
                ::dup2(fd, 2);
            }
            int nul = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (nul >= 0) ::dup2(nul, 0);
            if (config)
                ::execl(self_exe.c_str(), self_exe.c_str(), "serve", "--config", config->c_str(), static_cast<char*>(nullptr));
            else  // no config file anywhere: the built-in defaults
                ::execl(self_exe.c_str(), self_exe.c_str(), "serve", static_cast<char*>(nullptr));
            ::_exit(127);
        }
        pid = child;
        std::fprintf(stderr, "pulse codex: started the gateway (pid %d, config %s, log %s)%s\n", child,
                     config ? config->c_str() : "built-in defaults", log.c_str(),
                     keep ? "; it keeps running after codex exits (stop it with `kill PID`)" : "; it stops when codex exits");
        Http health = get(url, "/health");
        for (int i = 0; i < 600 && health.status == 0; ++i) {  // up to 60 s
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            health = get(url, "/health");
        }
        if (health.status == 0) health.error = "the gateway did not come up at " + url + " within 60 s; see " + log.string();
        return health;
    }
};

bool any_healthy(const rapidjson::Value& model) {
    if (model.HasMember("endpoints") && model["endpoints"].IsArray())
        for (const auto& e : model["endpoints"].GetArray())
            if (e.HasMember("state") && e["state"].IsString() && std::string(e["state"].GetString()) == "healthy") return true;
    return false;
}
bool is_demo(const rapidjson::Value& m) { return m.HasMember("demo") && m["demo"].IsBool() && m["demo"].GetBool(); }

// The model to run from /health's list: the one named, else the first (config order) with a
// healthy backend, else the first; never a demo model (random weights) unless named. Null and
// `error` set when there is none; `why` says how it was chosen.
const rapidjson::Value* choose_model(const rapidjson::Value& models, const std::optional<std::string>& name, std::string& why,
                                     std::string& error) {
    const rapidjson::Value* m = nullptr;
    std::string known;
    for (const auto& x : models.GetArray()) {
        std::string id = x["id"].GetString();
        known += (known.empty() ? "" : ", ") + id;
        if (!m && name && *name == id) m = &x;
    }
    why = "named with --model";
    if (!name) {
        std::string demos;
        for (const auto& x : models.GetArray()) {
            if (is_demo(x)) demos += (demos.empty() ? "" : ", ") + std::string(x["id"].GetString());
            else if (!m && any_healthy(x)) m = &x, why = "the first model in the config with a healthy backend";
        }
        for (const auto& x : models.GetArray())
            if (!m && !is_demo(x)) m = &x, why = "the first model in the config (none has a healthy backend)";
        if (!m && !demos.empty()) {
            error = "the gateway serves only the demo model " + demos +
                    ", whose weights are random (it answers with random text); to use it anyway: pulse codex --model " +
                    demos.substr(0, demos.find(','));
            return nullptr;
        }
    }
    if (!m)
        error = name ? "the gateway has no model '" + *name + "' (it has: " + (known.empty() ? "none" : known) + ")"
                     : std::string("the gateway has no models configured");
    return m;
}

// The model's context window from /v1/models (131072 when it says none).
int64_t context_window_of(const Http& models, const std::string& id) {
    int64_t context = 131072;
    if (models.status != 200) return context;
    rapidjson::Document d;
    d.Parse(models.body.c_str());
    if (d.IsObject() && d.HasMember("data") && d["data"].IsArray())
        for (const auto& x : d["data"].GetArray())
            if (x.HasMember("id") && id == x["id"].GetString() && x.HasMember("context_window") && x["context_window"].IsInt64())
                context = x["context_window"].GetInt64();
    return context;
}

// Codex's command line: the provider, the catalog, the model and its window, the continuity
// hooks, then what the user passed through.
std::vector<std::string> codex_command(const std::string& bin, const std::string& url, const fs::path& catalog, const std::string& id,
                                       int64_t context, bool continuity, const std::string& self_exe,
                                       const std::vector<std::string>& passthrough) {
    std::string provider = "model_providers.pulse={name=\"pulse\",base_url=" + quote_toml(url + "/v1") + ",wire_api=\"responses\"";
    if (const char* key = std::getenv("PULSE_GATEWAY_API_KEY"); key && *key) provider += ",env_key=\"PULSE_GATEWAY_API_KEY\"";
    provider += ",stream_idle_timeout_ms=300000}";
    std::vector<std::string> args = {bin,
                                     "-c", "model_provider=\"pulse\"",
                                     "-c", provider,
                                     "-c", "model_catalog_json=" + quote_toml(catalog.string()),
                                     "-c", "model=" + quote_toml(id),
                                     "-c", "model_context_window=" + std::to_string(context),
                                     "-c", "model_auto_compact_token_limit=" + std::to_string(context * 9 / 10)};
    if (continuity) {
        // The task-continuity hook for this run only (~/.codex is not touched). Hooks given on
        // the command line have no persisted trust, so Codex runs them only with
        // --dangerously-bypass-hook-trust — which, for this run, also runs any other enabled hook
        // the user has not reviewed. Said once on stderr; --no-continuity leaves both out.
        const std::string handler = "{type=\"command\",command=" + quote_toml(self_exe + " continuity hook") + ",timeout=10}";
        for (const auto& event : continuity_events()) {
            args.push_back("-c");
            args.push_back("hooks." + event + "=[{hooks=[" + handler + "]}]");
        }
        args.push_back("--dangerously-bypass-hook-trust");
        std::fprintf(stderr,
                     "pulse codex: task continuity on (the task state survives compaction; `pulse continuity list`). "
                     "It needs --dangerously-bypass-hook-trust, which also runs your other enabled hooks unreviewed "
                     "for this run; --no-continuity turns both off.\n");
    }
    if (read_only_exec(passthrough))
        std::fprintf(stderr,
                     "pulse codex: warning: `codex exec` runs read-only unless told otherwise: it can answer but cannot edit "
                     "files (and still exits 0). Add --full-auto (or --sandbox workspace-write) after `exec` to let it write.\n");
    args.insert(args.end(), passthrough.begin(), passthrough.end());
    return args;
}

// Codex runs as a child, so that what this run set up ends with it: the catalog file, and the
// gateway it started. It shares the terminal: Ctrl-C and Ctrl-\ are its to handle. Its exit
// status (128 + the signal that ended it).
int run_codex(std::vector<std::string> args) {
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    av.push_back(nullptr);
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t child = ::fork();
    if (child < 0) return fail(std::string("fork: ") + std::strerror(errno));
    if (child == 0) {
        ::execvp(av[0], av.data());
        std::fprintf(stderr, "pulse codex: cannot run %s: %s (install it with `npm install -g @openai/codex`, or pass --codex PATH)\n",
                     av[0], std::strerror(errno));
        ::_exit(127);
    }
    g_codex = child;
    struct sigaction ignore {}, pass {};
    ignore.sa_handler = SIG_IGN;
    pass.sa_handler = forward;
    ::sigaction(SIGINT, &ignore, nullptr);
    ::sigaction(SIGQUIT, &ignore, nullptr);
    ::sigaction(SIGTERM, &pass, nullptr);
    ::sigaction(SIGHUP, &pass, nullptr);
    int st = 0;
    while (::waitpid(child, &st, 0) < 0 && errno == EINTR) {
    }
    g_codex = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

}  // namespace

int cmd_codex(const CodexArgs& opts, const std::string& self_exe, const std::function<std::string(const std::string*)>& listen_of,
              const std::function<std::string()>& find_config) {
    std::optional<std::string> config = opts.config;
    std::vector<std::string> passthrough = opts.passthrough;
    passthrough.insert(passthrough.end(), opts.passthrough_after_dashes.begin(), opts.passthrough_after_dashes.end());
    if (!config)
        if (std::string found = find_config(); !found.empty()) config = found;
    std::string url;
    try {
        url = opts.gateway ? *opts.gateway : listen_of(config ? &*config : nullptr);
    } catch (const std::exception& e) {
        return fail(e.what()), 3;
    }
    while (!url.empty() && url.back() == '/') url.pop_back();
    if (url.size() > 3 && url.substr(url.size() - 3) == "/v1") url.resize(url.size() - 3);

    // 1. Is a gateway there? Start one if asked.
    StartedGateway started;
    started.keep = opts.keep;
    Http health = get(url, "/health");
    if (health.status == 0 && opts.start) {
        health = started.start(self_exe, config, url);
        if (health.status == 0) return fail(health.error);
    }
    if (health.status == 0)
        return fail("no Pulse gateway at " + url + " (" + health.error + "). Start one with `pulse serve" +
                    (config ? " --config " + *config : std::string()) + "`, or run `pulse codex --start-gateway`");
    Http models = get(url, "/v1/models");  // /v1 is where the key is checked
    if (health.status == 401 || models.status == 401)
        return fail("the gateway at " + url + " wants an API key: export PULSE_GATEWAY_API_KEY");

    // 2. The model, and a healthy backend for it.
    rapidjson::Document h;
    h.Parse(health.body.c_str());
    if (!h.IsObject() || !h.HasMember("models") || !h["models"].IsArray())
        return fail(url + "/health did not answer like a Pulse gateway (HTTP " + std::to_string(health.status) + ")");
    std::string why, error;
    const rapidjson::Value* m = choose_model(h["models"], opts.model, why, error);
    if (!m) return fail(error);
    std::string id = (*m)["id"].GetString();
    std::fprintf(stderr, "pulse codex: model %s (%s)%s\n", id.c_str(), why.c_str(),
                 is_demo(*m) ? "; a demo model: its weights are random, it answers with random text" : "");
    std::string states;
    for (const auto& e : (*m)["endpoints"].GetArray()) {
        states += "\n  " + std::string(e["name"].GetString()) + " (" + e["url"].GetString() + "): " + e["state"].GetString();
        if (e.HasMember("last_error")) states += " - " + std::string(e["last_error"].GetString());
    }
    if (!any_healthy(*m)) return fail("model '" + id + "' has no healthy backend right now:" + states);

    // 3. Its context window, then the catalog: one per run, so concurrent runs (other models,
    // other context windows) never share one.
    const int64_t context = context_window_of(models, id);
    fs::path catalog = private_dir() / ("codex-catalog-" + id + "-" + std::to_string(::getpid()) + ".json");
    {
        std::string text = catalog_json(id, context);
        int fd = ::open(catalog.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
            return fail("cannot write " + catalog.string() + ": " + std::strerror(errno));
        ::close(fd);
    }

    // 4. Codex, with everything on the command line.
    std::string bin = opts.codex ? *opts.codex : [] {
        const char* b = std::getenv("PULSE_CODEX_BIN");
        return std::string(b && *b ? b : "codex");
    }();
    const int rc = run_codex(codex_command(bin, url, catalog, id, context, !opts.no_continuity, self_exe, passthrough));
    std::error_code ec;
    fs::remove(catalog, ec);
    return rc;
}

}  // namespace pulse::cli
