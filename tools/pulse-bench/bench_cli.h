// The `pulse-bench` program (run as `pulse bench ...`): measurement tools. Returns the exit code.
#pragma once

namespace pulse::bench {

int run_bench(int argc, const char* const* argv);  // argv[0] is the program, argv[1] the tool

}  // namespace pulse::bench
