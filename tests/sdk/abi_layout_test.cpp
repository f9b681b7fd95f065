// Compiles the frozen v1 layout table with a C++ compiler; a drift fails the build.
#include "abi_layout_v1.inc"

#include <cstdio>
#include <type_traits>

static_assert(std::is_standard_layout_v<pulse_plugin_info_t>);
static_assert(std::is_trivially_copyable_v<pulse_host_api_t>);

int main() {
    std::puts("abi layout v1.0 (C++): ok");
    return 0;
}
