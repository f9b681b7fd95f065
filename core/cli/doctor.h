// `pulse doctor`: what each endpoint's server can do for Codex, checked before the first turn
// instead of found out turn by turn (a window that does not match, a template that drops the
// tools, a model name the server does not serve, a prefix cache that never hits, a prefill that
// outlasts the timeouts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pulse::cli {

extern const char* kDoctorFooter;  // `pulse doctor --help`: what it checks, exit codes

// One endpoint to examine, and what the config says of its model (empty when given as a URL).
struct DoctorTarget {
    std::string model_id;        // the model Codex asks for ("" for a bare URL: the server's first)
    std::string upstream_model;  // the name the server is asked for
    std::string endpoint;        // the endpoint's name in the config (the URL for a bare URL)
    std::string url;             // http://host:port/v1
    int64_t context_window = 0;  // the config's, 0 when unknown
};

struct DoctorSettings {
    std::vector<DoctorTarget> targets;
    std::string config_path;  // "" when run on bare URLs
    std::string gateway_url;  // the gateway the config serves on ("" to skip the turn through Pulse)
    std::string api_key;
    double head_timeout_s = 300, keepalive_s = 10;
    bool json = false;
    std::string write_catalog;  // a Codex model catalog to write with the servers' real window
};

// Runs every check and prints the report (text, or JSON with `json`). Exit 0 when nothing
// failed, 1 when something did, 3 when the catalog could not be written.
int run_doctor(const DoctorSettings& s);

}  // namespace pulse::cli
