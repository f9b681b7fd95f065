// `pulse continuity`: the Codex hook command that keeps a task's state across compaction, and
// the commands people use to look at that state (docs/CODEX.md, "Task continuity").
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace pulse::cli {

// What `pulse continuity` was asked for: the subcommand that ran (one of them is set) and its arguments.
struct ContinuityArgs {
    CLI::App *hook = nullptr, *show = nullptr, *clear = nullptr, *list = nullptr, *prune = nullptr, *hooks_json = nullptr;
    std::string session;            // show, clear
    bool all = false;               // clear --all
    std::string older_than;         // prune --older-than AGE
    size_t keep = SIZE_MAX;         // prune --keep N
};

// The command and its subcommands on the `pulse` parser.
CLI::App* add_continuity_command(CLI::App& pulse, ContinuityArgs& a);

// Runs the subcommand that was parsed. Returns the exit code.
int cmd_continuity(const ContinuityArgs& a, const std::string& self_exe);

// The Codex hook events the continuity hook listens to.
const std::vector<std::string>& continuity_events();

}  // namespace pulse::cli
