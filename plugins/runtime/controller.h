// `pulse model ...`: profiles, render, up, down, status for recipe-driven runtimes (vLLM's
// single-Spark recipe first). Every step that touches a node is a bash script run through a
// Transport; `--dry-run` prints those exact scripts instead of running them.
//
// What it writes, and nothing else: on the node the recipe's .env, a timestamped backup of the
// previous one and the start log (.pulse-start.log, .pulse-start.rc); here the node state
// (STATE/nodes/NODE.json), a run log (STATE/logs/NODE.log), the lock (STATE/locks/NODE.lock) and
// the gateway's endpoint fragment (FRAGMENTS/NODE.toml).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "transport.h"

namespace pulse::runtime {

struct GatewayInfo {
    std::string url;                 // how this host reaches the gateway (http://127.0.0.1:8800)
    std::string endpoint_fragments;  // the gateway's upstream.endpoint_fragments ("" = none)
    std::string api_key;             // for /admin/reload and /health when protected
};

struct Settings {
    std::filesystem::path nodes_file;
    std::filesystem::path profiles_dir;
    std::filesystem::path state_dir;
    GatewayInfo gateway;
};

using Print = std::function<void(std::string_view)>;
using TransportFactory = std::function<std::unique_ptr<Transport>(const Node&)>;

// Exit codes of `pulse model`.
constexpr int kOk = 0, kFailed = 1, kUsage = 2, kBadConfig = 3, kLocked = 5;

class Controller {
public:
    Controller(Settings settings, Print out, TransportFactory transports = make_transport);
    int command(const std::vector<std::string>& args);

private:
    struct Impl;
    std::shared_ptr<Impl> impl_;
};

}  // namespace pulse::runtime
