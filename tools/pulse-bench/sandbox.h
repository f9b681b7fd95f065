// Runs untrusted model-written code (HumanEval completions, agent tasks' commands) in a sandbox: a child in fresh
// user, PID, network, mount, IPC and UTS namespaces, no network (loopback down), a read-only
// view of /usr, /lib and /etc with one writable work directory, rlimits on CPU time, address
// space, file size, processes and open files, a wall-clock timeout, and the whole namespace
// killed at the end. When run as root it first drops to nobody/nogroup.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace pulse::bench {

struct SandboxLimits {
    double wall_s = 10;
    int cpu_s = 5;
    uint64_t memory_bytes = 1ull << 30;  // RLIMIT_AS
    uint64_t file_bytes = 16ull << 20;   // RLIMIT_FSIZE
    int processes = 32;                  // on top of what the sandbox user already runs
    int open_files = 64;
};

enum class Outcome { passed, failed, timeout, crashed, error };
const char* outcome_name(Outcome o);

struct SandboxResult {
    Outcome outcome = Outcome::error;
    int exit_code = -1;   // when it exited
    int signal = 0;       // when a signal ended it
    double wall_s = 0, cpu_s = 0;
    std::string output;   // stdout+stderr, at most 64 KiB (the tail is dropped)
    std::string detail;   // why: "wall timeout", "CPU limit", "signal 11", sandbox set-up errors
};

// exit 0 = passed, other exit = failed, time limits = timeout, other signals = crashed, a
// sandbox that could not be set up = error (never counted as a failure of the model).
SandboxResult run_python_sandboxed(const std::string& program, const SandboxLimits& limits);

// A small tree of text files by relative path (an agent task's repository).
using Files = std::map<std::string, std::string>;

// Runs `sh -c command` in the same sandbox with `files` as its work directory; afterwards
// `files` holds what the work directory holds (regular files only, at most 256 of 1 MiB each).
// A path that leaves the directory ("..", absolute) is refused before anything runs (error).
SandboxResult run_shell_sandboxed(const std::string& command, Files& files, const SandboxLimits& limits);

}  // namespace pulse::bench
