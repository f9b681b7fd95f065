// What `pulse model` runs on a node, and how it reads the answers. Every step is a bash script
// run through a Transport (here with bash, or over ssh); these functions write those scripts
// (`--dry-run` prints them as they are) and parse their marked-up output. Nothing here runs
// anything or touches a file.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "catalog.h"
#include "nodes.h"

namespace pulse::runtime::scripts {

// A node script's exit when the recipe directory is not there (its prologue's verdict).
constexpr int kNoRecipeDir = 90;

// Read-only checks: the recipe directory, its start/stop commands, its .env.sample, every path
// the profile names, the GPU's processes and the recipe's own server's pids.
std::string preflight(const Profile& p, const Node& n, const Rendered& r);
// Path-typed keys and the node paths the profile uses: each must exist on the node.
std::vector<std::pair<std::string, std::string>> paths_to_check(const Profile& p, const Node& n, const Rendered& r);
// The recipe's stop command (`p` null: ./stop.sh, when no profile is known).
std::string stop(const Profile* p, const Node& n);
// MemAvailable in KiB.
std::string meminfo(const Node& n);
// The new .env, the previous one kept as `backup`.
std::string write_env(const Node& n, const std::string& env_text, const std::string& backup);
// The start command, detached; its exit status lands in .pulse-start.rc.
std::string start(const Profile& p, const Node& n);
// GET /v1/models on the node; with `start_state`, also how the start command ended.
std::string models_probe(const Node& n, const std::string& port, bool start_state);
// The server's log (the node's or the family's log command), its last 20000 lines.
std::string server_log(const Profile& p, const Node& n);
// The backup put back (`backup` empty: the new .env removed, there was none).
std::string restore_env(const Node& n, const std::string& backup);

// ---- their output --------------------------------------------------------------------------
std::vector<std::string> lines_of(const std::string& s);
// The text between "BEGIN" and "END" marker lines of a script's output.
std::string section(const std::string& out, const std::string& begin, const std::string& end);

// What a preflight found: lines to show, problems that stop the run.
struct PreflightReport {
    std::vector<std::string> notes;
    std::vector<std::string> problems;
};
PreflightReport read_preflight(const std::string& output, int exit_code, const Profile& p, const Node& n);

// A models probe's answer: the HTTP status ("000" when nothing listens), the body when 200, how
// the start command ended ("" while it runs) and its log's last lines when it failed.
struct ProbeAnswer {
    std::string code, body, start_exit, log_tail;
};
ProbeAnswer read_probe(const std::string& output);

}  // namespace pulse::runtime::scripts
