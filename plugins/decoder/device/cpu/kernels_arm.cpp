// NEON kernels (kernels_arm.h): ARMv8-A's baseline SIMD, so they need no probe. The f32 ones
// mirror kernels.cpp's AVX2 ones at 128 bits (four accumulators where those have one or two,
// to cover the multiply-add latency with the same elements in flight); the int8 dots here use
// widening multiplies for cores without sdot.
#if defined(__aarch64__)
#include "device/cpu/kernels_arm.h"

#include <arm_neon.h>
#include <sys/auxv.h>

#include <algorithm>
#include <cmath>

#include "device/cpu/kernels_arm_i8.h"
#include "format/blocks.h"
#include "format/quants.h"

// Older kernel headers lack the newer bits; their values are the kernel's ABI.
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif

namespace pulse::decoder::arm {

bool cpu_has_dotprod() {
    static const bool yes = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    return yes;
}

bool cpu_has_i8mm() {
    static const bool yes = cpu_has_dotprod() && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
    return yes;
}

float dot_f32(const float* a, const float* b, int64_t n) {
    float32x4_t s0 = vdupq_n_f32(0.f), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float acc = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; ++i) acc += a[i] * b[i];
    return acc;
}

void dot4_f32(const float* w, const float* x, int64_t n, float out[4]) {
    float32x4_t s[4][2];
    for (auto& r : s) r[0] = r[1] = vdupq_n_f32(0.f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t w0 = vld1q_f32(w + i), w1 = vld1q_f32(w + i + 4);
        for (int k = 0; k < 4; ++k) {
            s[k][0] = vfmaq_f32(s[k][0], w0, vld1q_f32(x + k * n + i));
            s[k][1] = vfmaq_f32(s[k][1], w1, vld1q_f32(x + k * n + i + 4));
        }
    }
    for (int k = 0; k < 4; ++k) {
        out[k] = vaddvq_f32(vaddq_f32(s[k][0], s[k][1]));
        for (int64_t j = i; j < n; ++j) out[k] += w[j] * x[k * n + j];
    }
}

// Four chains of two doubles: eight elements an iteration, a multiply-add's latency covered.
double sum_squares(const float* x, int64_t n) {
    float64x2_t s[4] = {vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0)};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
        const float64x2_t v[4] = {vcvt_f64_f32(vget_low_f32(a)), vcvt_high_f64_f32(a), vcvt_f64_f32(vget_low_f32(b)), vcvt_high_f64_f32(b)};
        for (int k = 0; k < 4; ++k) s[k] = vfmaq_f64(s[k], v[k], v[k]);
    }
    double ss = vaddvq_f64(vaddq_f64(vaddq_f64(s[0], s[1]), vaddq_f64(s[2], s[3])));
    for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    return ss;
}

namespace {

// e^x for four lanes, the same reduction and polynomial as kernels.cpp's exp_avx2 (within 2 ulp
// of expf; x clamped to [-87.3, 88]; a NaN stays NaN: FMINNM/FMAXNM would drop it, FMIN/FMAX
// keep it).
inline float32x4_t exp_neon(float32x4_t x) {
    x = vminq_f32(x, vdupq_n_f32(88.0f));
    x = vmaxq_f32(x, vdupq_n_f32(-87.3f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

}  // namespace

float exp_shifted(float* s, int64_t n, float m) {
    const float32x4_t mv = vdupq_n_f32(m);
    float32x4_t sum = vdupq_n_f32(0.f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp_neon(vsubq_f32(vld1q_f32(s + i), mv));
        vst1q_f32(s + i, e);
        sum = vaddq_f32(sum, e);
    }
    float total = vaddvq_f32(sum);
    for (; i < n; ++i) total += (s[i] = std::exp(s[i] - m));
    return total;
}

void silu_mul(const float* x, const float* u, float* y, int64_t n) {
    const float32x4_t one = vdupq_n_f32(1.f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        float32x4_t s = vdivq_f32(v, vaddq_f32(one, exp_neon(vnegq_f32(v))));
        if (u) s = vmulq_f32(s, vld1q_f32(u + i));
        vst1q_f32(y + i, s);
    }
    for (; i < n; ++i) y[i] = blocks::silu(x[i]) * (u ? u[i] : 1.f);
}

// FCVTN/FCVTL: binary16 conversions in hardware on every AArch64 core, rounding to nearest even
// (FPCR's default mode), subnormals kept (FZ16 is off).
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(src + i)), vld1q_f32(src + i + 4));
        vst1q_u16(dst + i, vreinterpretq_u16_f16(h));
    }
    for (; i < n; ++i) dst[i] = f32_to_fp16(src[i]);
}

void f16_to_f32_rows(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst, int64_t dst_stride) {
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* s = src + r * src_stride;
        float* d = dst + r * dst_stride;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(s + i));
            vst1q_f32(d + i, vcvt_f32_f16(vget_low_f16(h)));
            vst1q_f32(d + i + 4, vcvt_high_f32_f16(h));
        }
        for (; i < n; ++i) d[i] = fp16_to_f32(s[i]);
    }
}

namespace {

// RR rows of C (1-4) × 16 columns per block, 4·RR accumulators over all of K (16 of the 32
// registers at RR = 4), each row of B's four vectors loaded once for the RR rows.
template <int RR>
void gemm_rows(int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
    int64_t j0 = 0;
    for (; j0 + 16 <= N; j0 += 16) {
        float32x4_t acc[RR][4];
        for (int i = 0; i < RR; ++i)
            for (int v = 0; v < 4; ++v) acc[i][v] = accumulate ? vld1q_f32(C + i * ldc + j0 + 4 * v) : vdupq_n_f32(0.f);
        for (int64_t k = 0; k < K; ++k) {
            const float* b = B + k * ldb + j0;
            const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8), b3 = vld1q_f32(b + 12);
            for (int i = 0; i < RR; ++i) {
                const float a = A[i * lda + k];
                acc[i][0] = vfmaq_n_f32(acc[i][0], b0, a);
                acc[i][1] = vfmaq_n_f32(acc[i][1], b1, a);
                acc[i][2] = vfmaq_n_f32(acc[i][2], b2, a);
                acc[i][3] = vfmaq_n_f32(acc[i][3], b3, a);
            }
        }
        for (int i = 0; i < RR; ++i)
            for (int v = 0; v < 4; ++v) vst1q_f32(C + i * ldc + j0 + 4 * v, acc[i][v]);
    }
    for (; j0 + 4 <= N; j0 += 4) {
        float32x4_t acc[RR];
        for (int i = 0; i < RR; ++i) acc[i] = accumulate ? vld1q_f32(C + i * ldc + j0) : vdupq_n_f32(0.f);
        for (int64_t k = 0; k < K; ++k) {
            const float32x4_t b0 = vld1q_f32(B + k * ldb + j0);
            for (int i = 0; i < RR; ++i) acc[i] = vfmaq_n_f32(acc[i], b0, A[i * lda + k]);
        }
        for (int i = 0; i < RR; ++i) vst1q_f32(C + i * ldc + j0, acc[i]);
    }
    for (; j0 < N; ++j0)
        for (int i = 0; i < RR; ++i) {
            float acc = accumulate ? C[i * ldc + j0] : 0.f;
            for (int64_t k = 0; k < K; ++k) acc += A[i * lda + k] * B[k * ldb + j0];
            C[i * ldc + j0] = acc;
        }
}

// RR rows of A against CC rows of B, along K four at a time, one horizontal sum per pair.
template <int RR, int CC>
void gemm_nt_block(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
    float32x4_t acc[RR][CC];
    for (int i = 0; i < RR; ++i)
        for (int j = 0; j < CC; ++j) acc[i][j] = vdupq_n_f32(0.f);
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        float32x4_t b[CC];
        for (int j = 0; j < CC; ++j) b[j] = vld1q_f32(B + j * ldb + k);
        for (int i = 0; i < RR; ++i) {
            const float32x4_t a = vld1q_f32(A + i * lda + k);
            for (int j = 0; j < CC; ++j) acc[i][j] = vfmaq_f32(acc[i][j], a, b[j]);
        }
    }
    for (int i = 0; i < RR; ++i)
        for (int j = 0; j < CC; ++j) {
            float s = vaddvq_f32(acc[i][j]);
            for (int64_t kk = k; kk < K; ++kk) s += A[i * lda + kk] * B[j * ldb + kk];
            C[i * ldc + j] = s;
        }
}

template <int RR>
void gemm_nt_rows(int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
    int64_t j = 0;
    for (; j + 4 <= N; j += 4) gemm_nt_block<RR, 4>(K, A, lda, B + j * ldb, ldb, C + j, ldc);
    for (; j < N; ++j) gemm_nt_block<RR, 1>(K, A, lda, B + j * ldb, ldb, C + j, ldc);
}

template <class Rows>
void by_four_rows(int64_t M, Rows rows) {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) rows.template operator()<4>(i);
    switch (M - i) {
        case 3: rows.template operator()<3>(i); break;
        case 2: rows.template operator()<2>(i); break;
        case 1: rows.template operator()<1>(i); break;
        default: break;
    }
}

}  // namespace

void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
    by_four_rows(M, [&]<int RR>(int64_t i) { gemm_rows<RR>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate); });
}

void gemm_f32_nt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
    by_four_rows(M, [&]<int RR>(int64_t i) { gemm_nt_rows<RR>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc); });
}

void quantize_block(const float* src, int64_t blk, int8_t* q, float* d, int32_t* sum) {
    float32x4_t mx = vdupq_n_f32(0.f);
    for (int64_t i = 0; i < blk; i += 4) mx = vmaxq_f32(mx, vabsq_f32(vld1q_f32(src + i)));
    const float amax = vmaxvq_f32(mx), scale = amax / 127, inv = scale > 0 ? 1 / scale : 0;
    const float32x4_t vinv = vdupq_n_f32(inv);
    int32x4_t total = vdupq_n_s32(0);
    for (int64_t i = 0; i < blk; i += 16) {
        int32x4_t c[4];
        for (int k = 0; k < 4; ++k) {
            c[k] = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(src + i + 4 * k), vinv));  // nearest, ties to even
            total = vaddq_s32(total, c[k]);
        }
        const int16x8_t lo = vcombine_s16(vqmovn_s32(c[0]), vqmovn_s32(c[1])), hi = vcombine_s16(vqmovn_s32(c[2]), vqmovn_s32(c[3]));
        vst1q_s8(q + i, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
    }
    *d = scale;
    *sum = vaddvq_s32(total);
}

// Sixteen int8 products into four int32 lanes without sdot: SMULL/SMLAL2 pair them in int16
// (|w·x| <= 128·127, two of them fit), SADALP adds the pairs into the lanes.
void matmul_rows_i8_neon(uint32_t type, const RowRange& rr, const QuantRow* x, int T, int64_t n) {
    matmul_rows(type, rr, x, T, n, [](int32x4_t acc, int8x16_t w, int8x16_t s) {
        return vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(s)), w, s));
    });
}

}  // namespace pulse::decoder::arm
#endif
