// pulse-bench: the measurement tools, a program of their own so the host process stays minimal.
// `pulse bench ARGS` runs `pulse-bench ARGS` (found next to `pulse`, or on PATH); both spellings
// take the same arguments.
#include "pulse-bench/bench_cli.h"

int main(int argc, char** argv) { return pulse::bench::run_bench(argc, argv); }
