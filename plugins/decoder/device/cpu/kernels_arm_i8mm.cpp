// FEAT_I8MM kernels (kernels_arm.h): built with -march=armv8.2-a+dotprod+i8mm, run only where
// HWCAP2 says the CPU has i8mm. smmla multiplies a 2×8 int8 block by an 8×2 one into a 2×2
// int32 tile: with two weight rows as the first operand and two tokens' activations as the
// second, one instruction does the work of four 8-byte dot products, where sdot's sixteen
// products serve one row and one token. That is what lets k + 1 rows of a speculative
// verification (or a prefill batch) cost less than k + 1 single-token passes over the weights.
#if defined(__aarch64__)
#include "device/cpu/kernels_arm.h"
#include "device/cpu/kernels_arm_i8.h"

#include <vector>

namespace pulse::decoder::arm {
namespace {

inline int32x4_t sdot(int32x4_t acc, int8x16_t w, int8x16_t x) { return vdotq_s32(acc, w, x); }

// [a's low 8 bytes | b's low 8 bytes] and [a's high | b's high]: two rows' 8-byte runs laid as
// smmla's 2×8 operand.
inline int8x16_t lows(int8x16_t a, int8x16_t b) { return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b))); }
inline int8x16_t highs(int8x16_t a, int8x16_t b) { return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b))); }

// Two tokens' activations laid out once per call as smmla's second operand: per 16 codes of the
// row, 32 bytes — both tokens' first eight, then both tokens' last eight — and per activation
// block the four scales (da, db, da, db) that a tile's lanes take. Every row pair of the call
// reads them as they are (the zips are paid once per call, not once per row pair).
struct TokenPair {
    std::vector<int8_t> q;  // 2n
    std::vector<float> d;   // 4 per block
    void lay(const QuantRow& a, const QuantRow& b, int64_t n, int64_t blk) {
        q.resize(static_cast<size_t>(2 * n));
        d.resize(static_cast<size_t>(4 * (n / blk)));
        for (int64_t c = 0; c < n / 16; ++c) {
            const int8x16_t x0 = vld1q_s8(a.q + 16 * c), x1 = vld1q_s8(b.q + 16 * c);
            vst1q_s8(q.data() + 32 * c, lows(x0, x1));
            vst1q_s8(q.data() + 32 * c + 16, highs(x0, x1));
        }
        for (int64_t k = 0; k < n / blk; ++k) {
            const float v[4] = {a.d[k], b.d[k], a.d[k], b.d[k]};
            vst1q_f32(d.data() + 4 * k, vld1q_f32(v));
        }
    }
};

// One block b of rows r0, r1 against P token pairs: each pair's tile holds the four integers
// (r0·t0, r0·t1, r1·t0, r1·t1), scaled by the four products of the rows' and tokens' scales and
// added into a[p] (the accumulators of lane b mod 4).
template <Layout K, int P>
inline __attribute__((always_inline)) void mmla_block(const uint8_t* r0, const uint8_t* r1, const TokenPair* pairs, int64_t b, float32x4_t* a) {
    constexpr int64_t blk = kBlock<K>;
    // Both rows' weight vectors first, then plain loops (no accumulator inside a lambda: GCC 12
    // would keep it in memory).
    int8x16_t w0[kVecs<K>], w1[kVecs<K>];
    each_weight<K>(r0, b, [&](int v, int8x16_t w) PULSE_ARM_INLINE { w0[v] = w; });
    each_weight<K>(r1, b, [&](int v, int8x16_t w) PULSE_ARM_INLINE { w1[v] = w; });
    const int8_t* xp[P];
    PULSE_ARM_UNROLL for (int p = 0; p < P; ++p) xp[p] = pairs[p].q.data() + 2 * blk * b;
    int32x4_t tile[P];
    PULSE_ARM_UNROLL for (int p = 0; p < P; ++p) tile[p] = vdupq_n_s32(0);
    PULSE_ARM_UNROLL for (int v = 0; v < kVecs<K>; ++v) {
        const int8x16_t lo = lows(w0[v], w1[v]), hi = highs(w0[v], w1[v]);
        PULSE_ARM_UNROLL for (int p = 0; p < P; ++p) {
            tile[p] = vmmlaq_s32(tile[p], lo, vld1q_s8(xp[p] + 32 * v));
            tile[p] = vmmlaq_s32(tile[p], hi, vld1q_s8(xp[p] + 32 * v + 16));
        }
    }
    const uint16_t s0 = scale_bits<K>(r0, b), s1 = scale_bits<K>(r1, b);
    const uint16_t bits[4] = {s0, s0, s1, s1};
    const float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(bits)));  // exact, as fp16_to_f32
    PULSE_ARM_UNROLL for (int p = 0; p < P; ++p)
        a[p] = vfmaq_f32(a[p], vcvtq_f32_s32(tile[p]), vmulq_f32(dw, vld1q_f32(pairs[p].d.data() + 4 * b)));
}

// Rows r0, r1 against P token pairs: per lane, exactly i8_dot_reference (block b into
// accumulator b mod 4, then (a0 + a1) + (a2 + a3)). out: [2][2P].
// Not inlined, as rows_dot (tools/bench/arm-kernel-census reads its loop).
template <Layout K, int P>
__attribute__((noinline)) void two_rows(const uint8_t* r0, const uint8_t* r1, const TokenPair* pairs, int64_t n, float* out) {
    const int64_t nb = n / kBlock<K>;
    float32x4_t acc[4][P];
    PULSE_ARM_UNROLL for (int j = 0; j < 4; ++j)
        PULSE_ARM_UNROLL for (int p = 0; p < P; ++p) acc[j][p] = vdupq_n_f32(0.f);
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        mmla_block<K, P>(r0, r1, pairs, b, acc[0]);
        mmla_block<K, P>(r0, r1, pairs, b + 1, acc[1]);
        mmla_block<K, P>(r0, r1, pairs, b + 2, acc[2]);
        mmla_block<K, P>(r0, r1, pairs, b + 3, acc[3]);
    }
    for (; b < nb; ++b) switch (b & 3) {
            case 0: mmla_block<K, P>(r0, r1, pairs, b, acc[0]); break;
            case 1: mmla_block<K, P>(r0, r1, pairs, b, acc[1]); break;
            default: mmla_block<K, P>(r0, r1, pairs, b, acc[2]); break;  // a tail has at most three
        }
    for (int p = 0; p < P; ++p) {
        float v[4];
        vst1q_f32(v, vaddq_f32(vaddq_f32(acc[0][p], acc[1][p]), vaddq_f32(acc[2][p], acc[3][p])));
        out[2 * p] = v[0], out[2 * p + 1] = v[1];                  // row 0: tokens 2p, 2p+1
        out[2 * P + 2 * p] = v[2], out[2 * P + 2 * p + 1] = v[3];  // row 1
    }
}

// T = 2..4 tokens: pairs (0,1) and (2,3), T = 3 as (0,1) and (2,2) with the copy dropped.
template <Layout K>
void rows_mmla(const RowRange& rr, const QuantRow* x, int T, int64_t n) {
    thread_local TokenPair pairs[2];
    const int P = T > 2 ? 2 : 1;
    pairs[0].lay(x[0], x[1], n, kBlock<K>);
    if (P == 2) pairs[1].lay(x[2], x[T > 3 ? 3 : 2], n, kBlock<K>);
    int64_t o = rr.o0;
    for (; o + 2 <= rr.o1; o += 2) {
        const uint8_t* r0 = rr.base + static_cast<uint64_t>(o) * rr.row_bytes;
        float r[2 * 4];
        if (P == 2) two_rows<K, 2>(r0, r0 + rr.row_bytes, pairs, n, r);
        else two_rows<K, 1>(r0, r0 + rr.row_bytes, pairs, n, r);
        for (int t = 0; t < T; ++t) {
            rr.y[t * rr.y_stride + o] = r[t] * rr.scale;
            rr.y[t * rr.y_stride + o + 1] = r[2 * P + t] * rr.scale;
        }
    }
    if (o < rr.o1) {  // an odd last row: sdot, the same arithmetic
        RowRange last = rr;
        last.o0 = o;
        matmul_rows(static_cast<uint32_t>(K == Layout::q8_0 ? kQ8_0 : K == Layout::tq2_0 ? kTQ2_0 : K == Layout::q2_0_g64 ? kQ2_0 : kPQ2_0),
                    last, x, T, n, sdot);
    }
}

}  // namespace

void matmul_rows_i8_i8mm(uint32_t type, const RowRange& rr, const QuantRow* x, int T, int64_t n) {
    if (T < 2) return matmul_rows(type, rr, x, T, n, sdot);  // one token: nothing to pair
    switch (type) {
        case kQ8_0: return rows_mmla<Layout::q8_0>(rr, x, T, n);
        case kTQ2_0: return rows_mmla<Layout::tq2_0>(rr, x, T, n);
        case kQ2_0: return rows_mmla<Layout::q2_0_g64>(rr, x, T, n);
        default: return rows_mmla<Layout::q2_0_g128>(rr, x, T, n);
    }
}

}  // namespace pulse::decoder::arm
#endif
