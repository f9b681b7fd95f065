// FEAT_DotProd kernels (kernels_arm.h): built with -march=armv8.2-a+dotprod, run only where
// HWCAP says the CPU has it. sdot adds sixteen int8 products into four int32 lanes, four to a
// lane: one instruction per 16 weights of a row against one token (NEON's widening multiplies
// take three).
#if defined(__aarch64__)
#include "device/cpu/kernels_arm.h"
#include "device/cpu/kernels_arm_i8.h"

namespace pulse::decoder::arm {

void matmul_rows_i8_dotprod(uint32_t type, const RowRange& rr, const QuantRow* x, int T, int64_t n) {
    matmul_rows(type, rr, x, T, n, [](int32x4_t acc, int8x16_t w, int8x16_t s) { return vdotq_s32(acc, w, s); });
}

}  // namespace pulse::decoder::arm
#endif
