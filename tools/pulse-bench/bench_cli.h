// The `pulse-bench` program (run as `pulse bench ...`): measurement tools. Returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace pulse::bench {

extern const char* const kBenchHelp;
int run_bench(const std::vector<std::string>& args);  // args after "bench"

}  // namespace pulse::bench
