// `pulse codex`: launch the Codex CLI against this gateway for one process.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace pulse::cli {

// argv[1] is "codex". `self_exe` starts the gateway for --start-gateway; `listen_of(config)`
// gives the gateway URL a config file listens on (nullptr: built-in defaults); `find_config()`
// is the config `pulse serve` would read without --config ("" = none). Runs codex as a child
// and returns its exit code.
// The Codex model catalog entry for `model` with `context_window` (JSON text); also written
// by `pulse doctor --write-catalog`.
std::string catalog_json(const std::string& model, int64_t context_window);

int cmd_codex(int argc, char** argv, const std::string& self_exe, const std::function<std::string(const std::string*)>& listen_of,
              const std::function<std::string()>& find_config);

}  // namespace pulse::cli
