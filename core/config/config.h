// Pulse configuration: the TOML schema as C++ values, its loader and validation.
// The schema is documented key by key in config/pulse.toml (the shipped default).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pulse::config {

// Thrown for any invalid configuration. what() is one or more lines, each
// "FILE:LINE:COL: problem; what is allowed".
class ConfigError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct Endpoint {
    std::string name;  // for logs, metrics and /health
    std::string url;   // "http://host:port/v1" or "plugin://backend-name"
    std::string options_json = "null";  // [models.X.endpoints.options] as JSON (backends)
    double weight = 1;  // routing = "sticky": the share of conversations this endpoint gets
    // Not in the rotation: serves a request only when no other endpoint can (every one down,
    // or the retry window spent), e.g. a small local model behind decoder://.
    bool last_resort = false;

    bool is_plugin() const { return url.rfind("plugin://", 0) == 0; }
    std::string plugin_name() const { return is_plugin() ? url.substr(9) : std::string(); }
};

struct Sampling {
    std::optional<double> temperature, top_p, min_p, presence_penalty, repetition_penalty;
    std::optional<int64_t> top_k, max_output_tokens;
};

// [models.X.policy]: the request policy a model consults (docs/OPERATIONS.md, "Policies").
struct ModelPolicy {
    std::string name;                  // a policy component, e.g. "static"
    int64_t timeout_ms = 200;          // how long a request waits for the decision
    std::string options_json = "null"; // [models.X.policy.options] as JSON
};

struct Model {
    std::string id;              // what clients send as "model"
    std::string profile;         // translation profile component name, e.g. "qwen38"
    std::string upstream_model;  // the backend's served model name (defaults to id)
    int64_t context_window = 0;  // tokens; 0 = unknown
    std::vector<Endpoint> endpoints;  // failover order
    // Which endpoint a request tries first (docs/OPERATIONS.md, "Routing"): "failover" (the
    // first healthy in config order), "round_robin" (rotating), "sticky" (each conversation
    // to one endpoint by weighted rendezvous hashing, so it lands where its prefix is cached).
    enum class Routing { failover, round_robin, sticky };
    Routing routing = Routing::failover;
    // Mid-stream resume (docs/OPERATIONS.md, "Mid-stream resume"): a response whose backend
    // fails after output reached the client continues on another endpoint.
    bool resume = true;
    std::optional<ModelPolicy> policy;
    Sampling sampling;
    std::string profile_options_json = "null";  // [models.X.profile_options] as JSON
    // How model reasoning reaches the client: "summary" (shown by Codex by default), "raw"
    // (reasoning_text events, shown only with show_raw_agent_reasoning) or "both".
    std::string reasoning_output = "summary";
    // A demonstration model (random weights): listed as such in /health, and `pulse codex`
    // never picks it unless it is named with --model.
    bool demo = false;
};

struct Listen {
    std::string host = "127.0.0.1";
    uint16_t port = 8800;
    bool is_loopback() const;
};

struct Server {
    Listen listen;
    std::string api_key;                 // empty = no auth
    bool protect_status = false;         // require the key on /health and /metrics too
    bool allow_public_without_key = false;
    int64_t max_body_bytes = 32 * 1024 * 1024;
    int64_t max_body_memory_bytes = 256 * 1024 * 1024;  // all request bodies held at once
    int64_t max_streams = 256;           // concurrent requests (worker threads)
    int64_t queue = 1024;                // listen backlog: connections the kernel holds before accept
    double send_timeout_s = 30;
    double header_timeout_s = 10;        // a request head must arrive within this from its first byte
    // A request body must arrive within body_timeout_s of its head, and past the first 5 s at
    // body_min_rate bytes/s on average (0 = no rate rule): a slow sender cannot hold memory.
    double body_timeout_s = 60;
    int64_t body_min_rate = 16384;
    double idle_timeout_s = 60;          // an idle keep-alive client connection is closed after this
    int64_t stream_threads = 1;          // epoll threads relaying HTTP streams
    double drain_timeout_s = 30;
    std::string trace_file;
};

struct Plugins {
    std::vector<std::filesystem::path> dirs;         // empty = the compiled-in default
    std::vector<std::filesystem::path> dropin_dirs;  // optional per-site drop-ins
    std::vector<std::string> require;                // plugin ids that must load
    std::filesystem::path runtime_dir = "/run/pulse-gateway";
};

struct Upstream {
    double connect_timeout_s = 3;
    double retry_window_s = 180;
    double keepalive_s = 10;
    double idle_timeout_s = 300;  // longest gap between upstream chunks once streaming
    double head_timeout_s = 300;  // longest wait for a backend's response head after the request was sent
    // A request that has heard nothing from its backend for liveness_after_s asks the backend,
    // on another connection, whether it is alive (GET {base}/models): no answer within
    // liveness_timeout_s means frozen, and the request moves on at once (0 = never ask).
    double liveness_after_s = 8;
    double liveness_timeout_s = 4;
    // A backend that reports prefill progress (llama-server, asked with return_progress) and
    // makes none for stall_after_s while still answering is stalled: the request fails over (or
    // resumes) then. A prefill that keeps progressing is never cut. 0 = never.
    double stall_after_s = 30;
    double health_interval_s = 5;
    // Directory of endpoint fragments (*.toml) written by `pulse model up`; "" = none.
    std::filesystem::path endpoint_fragments;
};

struct Warmup {
    bool enabled = true;
    std::string state_file;
    int64_t max_prefixes = 32;
    double slot_save_interval_s = 30;  // llama-server --slot-save-path: save its slots at most this often
    // A replay starts only after the endpoint went this long without real traffic: a server
    // that just came back is about to get the requests that waited for it.
    double quiet_s = 2;
};

struct Config {
    std::filesystem::path source;  // the file it was read from ("" for defaults)
    std::vector<std::string> env_overrides;  // what apply_env changed, one line each (said at startup)
    Server server;
    Plugins plugins;
    Upstream upstream;
    Warmup warmup;
    std::vector<Model> models;
    std::string log_level = "info";
    std::string controller_json = "null";  // [controller] as JSON, for the runtime controller plugin
    std::vector<std::string> warnings;     // non-fatal problems found while loading (logged by the CLI)

    const Model* find_model(std::string_view id) const;
};

// Reads and validates `path`. Relative paths inside resolve against the file's directory.
// Throws ConfigError.
Config load_file(const std::filesystem::path& path);
// Same, from text (for tests); `name` is used in messages.
Config load_string(std::string_view text, const std::string& name,
                   const std::filesystem::path& base_dir = ".");

// Applies the environment overrides the deployed sites use:
//   PULSE_QWEN_BACKENDS="MODEL: name=url,..." endpoints (failover order) of that qwen38 model;
//                                           "MODEL:" may be left out while one model uses qwen38
//   PULSE_GATEWAY_API_KEY                   server.api_key
//   PULSE_GATEWAY_TRACE_FILE                server.trace_file
//   PULSE_GATEWAY_WARMUP_STATE_FILE         warmup.state_file
//   PULSE_PLUGIN_DIRS="dir:dir"             plugins.dirs
// `getenv` is injectable for tests. Throws ConfigError for malformed values.
using Getenv = const char* (*)(const char*);
void apply_env(Config& cfg, Getenv getenv_fn);

// Merges the endpoint fragments in upstream.endpoint_fragments (files `*.toml`, name order):
//   [[endpoints]]  upstream_model = "served-name"  name = "node"  url = "http://host:port/v1"
// Each endpoint is added to every model whose upstream_model matches, after the configured ones;
// one with the same name replaces it, one with the same url is already there. A fragment that
// matches no model is a warning, a malformed one a ConfigError naming the file. A missing
// directory means no fragments.
void apply_fragments(Config& cfg);

// Checks that need the whole config (after env overrides): exposure rules and so on.
void validate(const Config& cfg);

// Parses "host:port", "[v6]:port". Throws ConfigError(context + message).
Listen parse_listen(std::string_view text, const std::string& context);

}  // namespace pulse::config
