/* Compiles the frozen v1 layout table with a C compiler; a drift fails the build. */
#include "abi_layout_v1.inc"
#include <stdio.h>

int main(void) {
    /* PULSE_HAS_FIELD against a struct "built" with an older, smaller size. */
    pulse_host_api_t host = {0};
    host.struct_size = (uint32_t)offsetof(pulse_host_api_t, json);
    if (!PULSE_HAS_FIELD(&host, pulse_host_api_t, register_controller)) return 1;
    if (PULSE_HAS_FIELD(&host, pulse_host_api_t, json)) return 1;
    puts("abi layout v1.0 (C): ok");
    return 0;
}
