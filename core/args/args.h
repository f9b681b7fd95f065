// How every Pulse program reads its command line: CLI11, one convention for help and errors.
//
//   --help / -h    the command's usage on stdout, exit 0
//   a usage error  "<program path>: <what is wrong>" and where to read the usage, on stderr; exit 2
//
// The usage text is CLI11's, generated from the options each command declares, with the same
// lower-case labels everywhere ("usage: pulse serve [options]"). Shared by the host, the
// runtime controller plugin and the companion programs (pulse-bench, pulse-decoder), so
// `pulse X --help` reads the same whichever program implements X.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pulse::args {

inline constexpr int kExitUsage = 2;

// Where help and errors go: stdout and stderr, unless a program says otherwise (a plugin's
// command prints through its host).
struct Output {
    std::function<void(const std::string&)> out, err;
};

// Applies the convention to a program's root app (subcommands added later inherit it).
void style(CLI::App& app);

// Parses the command line. nullopt: go on; otherwise the exit code (0 after help, 2 after a
// usage error, each already printed).
std::optional<int> parse(CLI::App& app, int argc, const char* const* argv, const Output& to = {});
// The same for arguments that do not start with a program name (a plugin's command line).
std::optional<int> parse(CLI::App& app, std::vector<std::string> args, const Output& to = {});

// A usage error found after parsing (a value out of range, options that exclude each other):
// printed as a parse error would be, for the deepest subcommand `app` ran; returns 2.
int usage_error(const CLI::App& app, const std::string& message, const Output& to = {});

}  // namespace pulse::args
