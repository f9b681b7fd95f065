// `pulse codex`: launch the Codex CLI against this gateway for one process.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pulse::cli {

// What `pulse codex` was asked for.
struct CodexArgs {
    std::optional<std::string> model, gateway, config, codex;
    bool start = false, keep = false, no_continuity = false;
    std::vector<std::string> passthrough;              // arguments pulse does not know, for codex, in order
    std::vector<std::string> passthrough_after_dashes;  // everything after "--", for codex, as given
};

// The command and its options on the `pulse` parser; the arguments pulse does not know are
// the command's remaining() ones.
CLI::App* add_codex_command(CLI::App& pulse, CodexArgs& a);

// The Codex model catalog entry for `model` with `context_window` (JSON text); also written
// by `pulse doctor --write-catalog`.
std::string catalog_json(const std::string& model, int64_t context_window);

// `self_exe` starts the gateway for --start-gateway; `listen_of(config)` gives the gateway URL
// a config file listens on (nullptr: built-in defaults); `find_config()` is the config `pulse
// serve` would read without --config ("" = none). Runs codex as a child and returns its exit code.
int cmd_codex(const CodexArgs& a, const std::string& self_exe, const std::function<std::string(const std::string*)>& listen_of,
              const std::function<std::string()>& find_config);

}  // namespace pulse::cli
