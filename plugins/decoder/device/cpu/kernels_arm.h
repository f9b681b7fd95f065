// The aarch64 kernels behind kernels.h (kernels.cpp dispatches to them by level). Three
// translation units, one per instruction set, so that no compiler needs per-function targets
// for the Arm intrinsics (Clang 14 has none) and nothing built for a newer core leaks into code
// an older one runs:
//   kernels_arm.cpp          NEON (every ARMv8-A core): the f32/f16 paths, activation
//                            quantization, the int8 dots by widening multiplies, the CPU probe
//   kernels_arm_dotprod.cpp  FEAT_DotProd (sdot: 16 int8 products into four int32 lanes)
//   kernels_arm_i8mm.cpp     FEAT_I8MM (smmla: a 2×8 by 8×2 int8 block per instruction), the
//                            several-token dots: two weight rows against two tokens at once
// Every int8 kernel here computes kernels.h's int8 arithmetic exactly (i8_dot_reference): the
// same integer per activation block, the same f32 operations in the same order, so each level
// gives the portable path's bits.
#pragma once

#include <cstdint>

#include "device/cpu/kernels.h"

namespace pulse::decoder::arm {

// What the CPU has, from the kernel's HWCAP/HWCAP2 words (getauxval), probed once.
bool cpu_has_dotprod();
bool cpu_has_i8mm();  // and dotprod: the i8mm level uses both

// NEON (kernels_arm.cpp)
float dot_f32(const float* a, const float* b, int64_t n);
void dot4_f32(const float* w, const float* x, int64_t n, float out[4]);
double sum_squares(const float* x, int64_t n);
float exp_shifted(float* s, int64_t n, float m);
void silu_mul(const float* x, const float* u, float* y, int64_t n);
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n);
void f16_to_f32_rows(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst, int64_t dst_stride);
void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);
void gemm_f32_nt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc);
// One activation block of `blk` floats to int8, as kernels.cpp's quantize_block_scalar does it
// (the same scale, codes and sum, bit for bit).
void quantize_block(const float* src, int64_t blk, int8_t* q, float* d, int32_t* sum);
// matmul_rows_i8 (kernels.h) for T = 1 to 4 tokens, one level each.
void matmul_rows_i8_neon(uint32_t type, const RowRange& rows, const QuantRow* x, int T, int64_t n);
void matmul_rows_i8_dotprod(uint32_t type, const RowRange& rows, const QuantRow* x, int T, int64_t n);
void matmul_rows_i8_i8mm(uint32_t type, const RowRange& rows, const QuantRow* x, int T, int64_t n);

}  // namespace pulse::decoder::arm
