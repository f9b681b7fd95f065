// How a step's script reaches a node: bash here, or bash over ssh. One small interface so
// tests (and sites with other remote shells) can swap it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nodes.h"

namespace pulse::runtime {

struct RunResult {
    int exit_code = -1;      // -1 when it did not run or was killed
    bool timed_out = false;
    std::string output;      // stdout and stderr, interleaved
    std::string spawn_error;  // non-empty when the process could not start
    bool ok() const { return exit_code == 0 && !timed_out && spawn_error.empty(); }
};

class Transport {
public:
    virtual ~Transport() = default;
    // Runs `script` with bash on the node; kills it (process group) after `timeout_s`.
    virtual RunResult run(const std::string& script, double timeout_s) = 0;
    // "bash (local)" or "ssh -o BatchMode=yes ops@spark1": shown in dry runs and logs.
    virtual std::string describe() const = 0;
};

// argv[0] is looked up on PATH; `input` is written to its stdin.
RunResult run_process(const std::vector<std::string>& argv, const std::string& input, double timeout_s);

// `bash -s` for local nodes; `ssh -o BatchMode=yes -o ConnectTimeout=10 [ssh_options] TARGET
// bash -s` for the others (never a password prompt: a missing key fails the step).
std::unique_ptr<Transport> make_transport(const Node& node);

}  // namespace pulse::runtime
