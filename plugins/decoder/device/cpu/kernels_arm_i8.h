// The aarch64 int8 dots (kernels_arm.h), written once over a 16-byte signed dot product and
// included by each translation unit that has one: NEON's widening multiplies, sdot. Internal
// to those units (everything here has internal linkage).
//
// Every supported layout is read as activation blocks (32 values; TQ2_0: 256) of signed weight
// codes facing 32 (256) consecutive activation codes, in vectors of 16: `each_weight` turns block b
// of a row into those vectors (TQ2_0's 2-bit codes minus one, the Q2_0 layouts' planes facing
// their permuted activations), so the dot itself is one loop for every type.
#pragma once

#include <arm_neon.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "device/cpu/kernels.h"
#include "format/gguf.h"
#include "format/quants.h"

// The per-vector, per-block and per-token loops must be unrolled so the weight vectors and the
// accumulators live in registers (at -O2 GCC keeps a loop over a local array in memory: a
// store and a reload per instruction).
#if defined(__clang__)
#define PULSE_ARM_UNROLL _Pragma("unroll")
#else
#define PULSE_ARM_UNROLL _Pragma("GCC unroll 16")
#endif
// The lambdas the kernels are written with, inlined where they are called (GCC otherwise calls
// a visitor per weight vector).
#define PULSE_ARM_INLINE __attribute__((always_inline))

namespace pulse::decoder::arm {
namespace {

enum class Layout { q8_0, tq2_0, q2_0_g64, q2_0_g128 };

template <Layout K>
constexpr int64_t kBlock = K == Layout::tq2_0 ? 256 : 32;  // activation values per block
template <Layout K>
constexpr int kVecs = static_cast<int>(kBlock<K> / 16);  // int8x16 vectors per block

// The f16 bits of the weight scale that block b of a row is multiplied by.
template <Layout K>
inline uint16_t scale_bits(const uint8_t* row, int64_t b) {
    const uint8_t* p;
    if constexpr (K == Layout::q8_0) p = row + 34 * b;
    else if constexpr (K == Layout::tq2_0) p = row + 66 * b + 64;
    else if constexpr (K == Layout::q2_0_g64) p = row + 18 * (b >> 1);  // two activation blocks a group
    else p = row + 34 * (b >> 2);                                       // four
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// Vector V of block b's signed weight codes: the 16 that face activation codes 16V..16V+15 of
// the block. Made from the row's bytes where it is used (a load from L1 and two or three
// operations), so a kernel holds the vectors it is using, not a block's sixteen.
template <Layout K, int V>
inline __attribute__((always_inline)) int8x16_t weight_vector(const uint8_t* row, int64_t b) {
    const int8x16_t one = vdupq_n_s8(1);
    auto code = [&](uint8x16_t q) { return vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(3))), one); };
    if constexpr (K == Layout::q8_0) {
        return vld1q_s8(reinterpret_cast<const int8_t*>(row + 34 * b + 2 + 16 * V));
    } else if constexpr (K == Layout::tq2_0) {
        // Byte 32h+m holds element 128h+32l+m in bits 2l..2l+1: V = 8h + 2l + half.
        constexpr int h = V / 8, l = (V % 8) / 2, half = V % 2;
        const uint8x16_t q = vld1q_u8(row + 66 * b + 32 * h + 16 * half);
        if constexpr (l == 0) return code(q);
        else if constexpr (l == 3) return vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 6)), one);
        else return code(vshrq_n_u8(q, 2 * l));
    } else if constexpr (K == Layout::q2_0_g64) {
        // Group b/2's 16 code bytes; this block is planes 2p and 2p+1 (p = b & 1), which the
        // permuted activation keeps at 0..15 and 16..31.
        uint8x16_t q = vld1q_u8(row + 18 * (b >> 1) + 2);
        if (b & 1) q = vshrq_n_u8(q, 4);
        return V == 0 ? code(q) : code(vshrq_n_u8(q, 2));
    } else {
        // Group b/4's 32 code bytes; this block is plane b & 3 of all of them.
        return code(vshlq_u8(vld1q_u8(row + 34 * (b >> 2) + 2 + 16 * V), vdupq_n_s8(static_cast<int8_t>(-2 * (b & 3)))));
    }
}

// f(v, w) for each vector v of block b of a row, in order.
template <Layout K, class F>
inline __attribute__((always_inline)) void each_weight(const uint8_t* row, int64_t b, F f) {
    [&]<int... V>(std::integer_sequence<int, V...>) PULSE_ARM_INLINE { (f(V, weight_vector<K, V>(row, b)), ...); }(std::make_integer_sequence<int, kVecs<K>>{});
}

// Σ w·x over block b for T tokens, each as four int32 lanes (their sum is the block's integer).
// The block's weight vectors first, then plain loops over them and the tokens: GCC 12 keeps
// accumulators that a visitor lambda captures in memory, a store and a load per instruction.
template <Layout K, int T, class Dot>
inline __attribute__((always_inline)) void block_dots(const uint8_t* row, int64_t b, const QuantRow* x, Dot dot, int32x4_t* s) {
    int8x16_t w[kVecs<K>];
    each_weight<K>(row, b, [&](int v, int8x16_t wv) PULSE_ARM_INLINE { w[v] = wv; });
    PULSE_ARM_UNROLL for (int t = 0; t < T; ++t) s[t] = vdupq_n_s32(0);
    PULSE_ARM_UNROLL for (int v = 0; v < kVecs<K>; ++v)
        PULSE_ARM_UNROLL for (int t = 0; t < T; ++t) s[t] = dot(s[t], w[v], vld1q_s8(x[t].q + kBlock<K> * b + 16 * v));
}

// Rows [o0, o1) against T tokens, a row at a time: blocks in fours, their integers reduced into
// one vector (lane j: block b + j), scaled and added into accumulator lane j — i8_dot_reference's
// a[b mod 4] — by one fused multiply-add; the blocks past the last four one at a time, as scalars.
// Not inlined: it is called once per range of rows, and its loop stays one function for
// tools/bench/arm-kernel-census to read.
template <Layout K, int T, class Dot>
__attribute__((noinline)) void rows_dot(const RowRange& rr, const QuantRow* x, int64_t n, Dot dot) {
    const int64_t nb = n / kBlock<K>;
    for (int64_t o = rr.o0; o < rr.o1; ++o) {
        const uint8_t* row = rr.base + static_cast<uint64_t>(o) * rr.row_bytes;
        float32x4_t acc[T];
        PULSE_ARM_UNROLL for (int t = 0; t < T; ++t) acc[t] = vdupq_n_f32(0.f);
        int64_t b = 0;
        for (; b + 4 <= nb; b += 4) {
            // Blocks b, b+1 and then b+2, b+3, each pair's lanes folded at once: two vectors a
            // token live instead of four.
            auto fold_two = [&](int64_t first, int32x4_t* folded) PULSE_ARM_INLINE {
                int32x4_t s0[T], s1[T];
                block_dots<K, T>(row, first, x, dot, s0);
                block_dots<K, T>(row, first + 1, x, dot, s1);
                PULSE_ARM_UNROLL for (int t = 0; t < T; ++t) folded[t] = vpaddq_s32(s0[t], s1[t]);
            };
            int32x4_t lo[T], hi[T];
            fold_two(b, lo);
            fold_two(b + 2, hi);
            const uint16_t bits[4] = {scale_bits<K>(row, b), scale_bits<K>(row, b + 1), scale_bits<K>(row, b + 2), scale_bits<K>(row, b + 3)};
            const float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(bits)));
            PULSE_ARM_UNROLL for (int t = 0; t < T; ++t) {
                const int32x4_t sums = vpaddq_s32(lo[t], hi[t]);  // lane j: block b + j
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(sums), vmulq_f32(dw, vld1q_f32(x[t].d + b)));
            }
        }
        for (int t = 0; t < T; ++t) {
            float a[4];
            vst1q_f32(a, acc[t]);
            for (int64_t r = b; r < nb; ++r) {
                int32x4_t lanes;
                block_dots<K, 1>(row, r, x + t, dot, &lanes);
                const int32_t sum = vaddvq_s32(lanes);
                a[r & 3] = std::fma(static_cast<float>(sum), fp16_to_f32(scale_bits<K>(row, r)) * x[t].d[r], a[r & 3]);
            }
            rr.y[t * rr.y_stride + o] = ((a[0] + a[1]) + (a[2] + a[3])) * rr.scale;
        }
    }
}

template <int T, class Dot>
void rows_dot_any(uint32_t type, const RowRange& rr, const QuantRow* x, int64_t n, Dot dot) {
    switch (type) {
        case kQ8_0: return rows_dot<Layout::q8_0, T>(rr, x, n, dot);
        case kTQ2_0: return rows_dot<Layout::tq2_0, T>(rr, x, n, dot);
        case kQ2_0: return rows_dot<Layout::q2_0_g64, T>(rr, x, n, dot);
        default: return rows_dot<Layout::q2_0_g128, T>(rr, x, n, dot);  // PQ2_0, Q2_0_G128
    }
}

template <class Dot>
void matmul_rows(uint32_t type, const RowRange& rr, const QuantRow* x, int T, int64_t n, Dot dot) {
    switch (T) {
        case 4: return rows_dot_any<4>(type, rr, x, n, dot);
        case 3: return rows_dot_any<3>(type, rr, x, n, dot);
        case 2: return rows_dot_any<2>(type, rr, x, n, dot);
        default: return rows_dot_any<1>(type, rr, x, n, dot);
    }
}

}  // namespace
}  // namespace pulse::decoder::arm
