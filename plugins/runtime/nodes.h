// The site's nodes file (config/nodes.toml): where each node's recipe lives and how to reach it.
#pragma once

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace pulse::runtime {

struct Node {
    std::string name;
    std::string ssh = "local";             // "local" = run steps with bash here; else an ssh target
    std::vector<std::string> ssh_options;  // extra ssh arguments (-p 2222, -i KEY, ...)
    std::string host = "127.0.0.1";        // how the gateway reaches the server
    std::string recipe_dir;                // absolute, on the node
    std::string gateway_url;               // "" = the gateway of the pulse config
    std::map<std::string, std::string> paths;  // site paths, {{name}} in profiles
    double memory_threshold_gib = 100;
    double memory_timeout_s = 600;
    double stop_timeout_s = 180;
    double start_timeout_s = 60;    // for start.sh to return (it runs detached)
    double ready_timeout_s = 1200;  // for /v1/models to answer 200
    double poll_interval_s = 10;
    std::string meminfo = "/proc/meminfo";
    std::string gpu_apps_command =
        "nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>/dev/null || true";
    std::string own_pids_command;  // overrides the family's when set
    std::string log_command;       // overrides the family's when set

    bool local() const { return ssh == "local"; }
};

class NodesError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct Nodes {
    std::filesystem::path file;
    std::vector<Node> nodes;
    const Node& find(std::string_view name) const;  // throws NodesError listing the known ones
};

// Reads and validates the file ([defaults] then [nodes.NAME] tables). Throws NodesError with
// every problem, each "FILE:LINE: ...".
Nodes load_nodes(const std::filesystem::path& file);

}  // namespace pulse::runtime
