#include "device/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/blocks.h"
#include "format/gguf.h"
#include "format/quants.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define PULSE_X86 1
#endif
#if defined(__aarch64__)
#include "device/cpu/kernels_arm.h"
#define PULSE_ARM64 1
#endif

namespace pulse::decoder {

namespace {

// The kernel levels of this architecture, lowest first (kernels.h, kernel_levels): level 0 is
// the portable C++, the others what the CPU must have for them.
#if defined(PULSE_X86)
constexpr const char* kLevelNames[] = {"scalar", "avx2", "avx512vnni"};
#elif defined(PULSE_ARM64)
constexpr const char* kLevelNames[] = {"scalar", "neon", "dotprod", "i8mm"};
#else
constexpr const char* kLevelNames[] = {"scalar"};
#endif
constexpr int kTopLevel = static_cast<int>(std::size(kLevelNames)) - 1;
int kernel_cap = kTopLevel;  // limit_kernels

#ifdef PULSE_ARM64
bool have_neon() { return kernel_cap >= 1; }
bool have_dotprod() { return kernel_cap >= 2 && arm::cpu_has_dotprod(); }
bool have_i8mm() { return kernel_cap >= 3 && arm::cpu_has_i8mm(); }
#endif

float dot_f32_scalar(const float* a, const float* b, int64_t n) {
    // Eight partial sums: lets the compiler vectorise without reassociation flags.
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
    float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; ++i) acc += a[i] * b[i];
    return acc;
}

uint16_t rd16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

#ifdef PULSE_X86
__attribute__((target("avx2,fma"))) float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) float dot_f32_avx2(const float* a, const float* b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float acc = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; ++i) acc += a[i] * b[i];
    return acc;
}

// 32 int8 weights (sign-extended in 8-lane groups) times 32 f32 activations.
__attribute__((target("avx2,fma"))) inline __m256 dot32_i8(__m256i q, const float* x, __m256 acc) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(x), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), _mm256_loadu_ps(x + 8), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(x + 16), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), _mm256_loadu_ps(x + 24), acc);
    return acc;
}

__attribute__((target("avx2,fma,f16c"))) float dot_q8_0_avx2(const uint8_t* s, const float* x, int64_t n) {
    __m256 total = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; ++b, s += 34, x += 32) {
        __m256 acc = dot32_i8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2)), x, _mm256_setzero_ps());
        total = _mm256_fmadd_ps(acc, _mm256_set1_ps(_cvtsh_ss(rd16(s))), total);
    }
    return hsum(total);
}

// TQ2_0: 64 bytes of 2-bit codes (value = code - 1), scale last. Byte 32h+m holds elements
// 128h+32l+m in bits 2l..2l+1: a shift and mask per l gives 32 consecutive elements.
__attribute__((target("avx2,fma,f16c"))) float dot_tq2_0_avx2(const uint8_t* s, const float* x, int64_t n) {
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256 total = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; ++b, s += 66, x += 256) {
        __m256 acc = _mm256_setzero_ps();
        for (int h = 0; h < 2; ++h) {
            __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32 * h));
            for (int l = 0; l < 4; ++l) {
                __m256i c = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 2 * l), three), one);
                acc = dot32_i8(c, x + 128 * h + 32 * l, acc);
            }
        }
        total = _mm256_fmadd_ps(acc, _mm256_set1_ps(_cvtsh_ss(rd16(s + 64))), total);
    }
    return hsum(total);
}

__attribute__((target("avx2,fma"))) void dot4_f32_avx2(const float* w, const float* x, int64_t n, float out[4]) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 wv = _mm256_loadu_ps(w + i);
        s0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + n + i), s1);
        s2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 2 * n + i), s2);
        s3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 3 * n + i), s3);
    }
    out[0] = hsum(s0);
    out[1] = hsum(s1);
    out[2] = hsum(s2);
    out[3] = hsum(s3);
    for (; i < n; ++i)
        for (int k = 0; k < 4; ++k) out[k] += w[i] * x[k * n + i];
}

// What the CPU has, probed once; the cap (limit_kernels) applies on top at each call, so a probe
// made while a cap is set never sticks.
bool cpu_has_avx2() {
    // F16C through cpuid: not every compiler's __builtin_cpu_supports knows "f16c" (clang 14).
    static const bool yes = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }();
    return yes;
}

bool have_avx2() { return kernel_cap >= 1 && cpu_has_avx2(); }

// 512-bit float kernels (the delta rule in registers, f16 widening): AVX512F, with VL for their
// 256-bit tails. Skylake-X and later Intel, Zen 4 and later AMD.
bool have_avx512() {
    static const bool yes = cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
    return kernel_cap >= 2 && yes;
}

bool have_vnni() {
    // The interleaved kernels run 512-bit integer ops (AVX512F + BW) beside VNNI's dpbusd.
    static const bool yes = cpu_has_avx2() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    return kernel_cap >= 2 && yes;
}

// Sum of eight int32 lanes.
__attribute__((target("avx2"))) inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

// The per-token and per-plane loops must be unrolled so the accumulators live in registers (at
// -O2 GCC keeps a loop over a local array in memory: a store and a reload per instruction).
#if defined(__clang__)
#define PULSE_UNROLL _Pragma("unroll")
#else
#define PULSE_UNROLL _Pragma("GCC unroll 8")
#endif

constexpr int kI8Prefetch = 2048;
// The kernels, once per instruction set: DP(acc, u, s) adds to each int32 lane the four
// products of unsigned bytes u and signed bytes s (maddubs + madd on AVX2, dpbusd with VNNI).
// Ternary and 2-bit codes are unsigned (code = value + 1): Σ value·x = Σ code·x − Σ x, and Σ x
// per block comes with the quantized row. Q8_0's signed weights use |w| and sign(x, w).
#define PULSE_I8_KERNELS(SUFFIX, TARGET, DP)                                                                               \
    /* R weight rows against T activation rows: out[r*T + t]. */                                                         \
    template <int R, int T>                                                                                              \
    __attribute__((target(TARGET))) void i8_q8_0_##SUFFIX(const uint8_t* const* w, const QuantRow* x, int64_t n, float* out) { \
        __m256 acc[R][T];                                                                                                \
        PULSE_UNROLL for (int r = 0; r < R; ++r) PULSE_UNROLL for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps(); \
        for (int64_t b = 0; b < n / 32; ++b) {                                                                           \
            __m256i wv[R], aw[R];                                                                                        \
            float dw[R];                                                                                                 \
            PULSE_UNROLL for (int r = 0; r < R; ++r) {                                                                   \
                wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + 34 * b + 2));                         \
                aw[r] = _mm256_sign_epi8(wv[r], wv[r]);                                                                  \
                dw[r] = _cvtsh_ss(rd16(w[r] + 34 * b));                                                                  \
            }                                                                                                            \
            PULSE_UNROLL for (int t = 0; t < T; ++t) {                                                                   \
                const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].q + 32 * b));                \
                const float dx = x[t].d[b];                                                                              \
                PULSE_UNROLL for (int r = 0; r < R; ++r) {                                                               \
                    __m256i p = DP(_mm256_setzero_si256(), aw[r], _mm256_sign_epi8(xv, wv[r]));                          \
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw[r] * dx), acc[r][t]);           \
                }                                                                                                        \
            }                                                                                                            \
        }                                                                                                                \
        PULSE_UNROLL for (int r = 0; r < R; ++r) PULSE_UNROLL for (int t = 0; t < T; ++t) out[r * T + t] = hsum(acc[r][t]); \
    }                                                                                                                    \
    /* TQ2_0: byte 32h+m holds elements 128h+32l+m in bits 2l..2l+1 (contiguous per plane). */                           \
    template <int R, int T>                                                                                              \
    __attribute__((target(TARGET))) void i8_tq2_0_##SUFFIX(const uint8_t* const* w, const QuantRow* x, int64_t n, float* out) { \
        const __m256i three = _mm256_set1_epi8(3);                                                                       \
        __m256 acc[R][T];                                                                                                \
        float corr[R][T];                                                                                                \
        PULSE_UNROLL for (int r = 0; r < R; ++r) PULSE_UNROLL for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps(), corr[r][t] = 0; \
        for (int64_t b = 0; b < n / 256; ++b) {                                                                          \
            __m256i ip[R][T];                                                                                            \
            PULSE_UNROLL for (int r = 0; r < R; ++r) PULSE_UNROLL for (int t = 0; t < T; ++t) ip[r][t] = _mm256_setzero_si256(); \
            if constexpr (T > 1) PULSE_UNROLL for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(w[r] + 66 * b) + kI8Prefetch, _MM_HINT_T0); \
            PULSE_UNROLL for (int h = 0; h < 2; ++h) {                                                                   \
                __m256i q[R];                                                                                            \
                PULSE_UNROLL for (int r = 0; r < R; ++r) q[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + 66 * b + 32 * h)); \
                PULSE_UNROLL for (int l = 0; l < 4; ++l) {                                                               \
                    __m256i u[R];                                                                                        \
                    PULSE_UNROLL for (int r = 0; r < R; ++r) u[r] = _mm256_and_si256(_mm256_srli_epi16(q[r], 2 * l), three); \
                    PULSE_UNROLL for (int t = 0; t < T; ++t) {                                                           \
                        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].q + 256 * b + 128 * h + 32 * l)); \
                        PULSE_UNROLL for (int r = 0; r < R; ++r) ip[r][t] = DP(ip[r][t], u[r], xv);                      \
                    }                                                                                                    \
                }                                                                                                        \
            }                                                                                                            \
            PULSE_UNROLL for (int r = 0; r < R; ++r) {                                                                   \
                const float dw = _cvtsh_ss(rd16(w[r] + 66 * b + 64));                                                    \
                PULSE_UNROLL for (int t = 0; t < T; ++t) {                                                               \
                    const float sc = dw * x[t].d[b];                                                                     \
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ip[r][t]), _mm256_set1_ps(sc), acc[r][t]);            \
                    corr[r][t] += sc * static_cast<float>(x[t].sum[b]);                                                  \
                }                                                                                                        \
            }                                                                                                            \
        }                                                                                                                \
        PULSE_UNROLL for (int r = 0; r < R; ++r) PULSE_UNROLL for (int t = 0; t < T; ++t) out[r * T + t] = hsum(acc[r][t]) - corr[r][t]; \
    }                                                                                                                    \
    /* Q2_0 layouts: scale first, G/4 code bytes; plane l of the bytes holds elements 4i+l, */                           \
    /* which the permuted activation keeps at l*(G/4)+i, quantized per 32 (as llama.cpp's Q8_0). */                      \
    template <int R, int T, int G>                                                                                       \
    __attribute__((target(TARGET))) void i8_q2_0_##SUFFIX(const uint8_t* const* w, const QuantRow* x, int64_t n, float* out) { \
        const __m256i three = _mm256_set1_epi8(3);                                                                       \
        __m256 acc[R][T];                                                                                                \
        float corr[R][T];                                                                                                \
        PULSE_UNROLL for (int r = 0; r < R; ++r) PULSE_UNROLL for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps(), corr[r][t] = 0; \
        constexpr int64_t bytes = 2 + G / 4;                                                                             \
        for (int64_t b = 0; b < n / G; ++b) {                                                                            \
            float dw[R];                                                                                                 \
            __m256i u[R][G / 32];                                                                                        \
            PULSE_UNROLL for (int r = 0; r < R; ++r) {                                                                   \
                const uint8_t* s = w[r] + bytes * b;                                                                     \
                dw[r] = _cvtsh_ss(rd16(s));                                                                              \
                if constexpr (G == 128) {                                                                                \
                    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2));                       \
                    PULSE_UNROLL for (int l = 0; l < 4; ++l) u[r][l] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * l), three); \
                } else {                                                                                                 \
                    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2));                          \
                    const __m256i qq = _mm256_set_m128i(_mm_srli_epi16(q, 2), q);                                        \
                    PULSE_UNROLL for (int l = 0; l < 2; ++l) u[r][l] = _mm256_and_si256(_mm256_srli_epi16(qq, 4 * l), three); \
                }                                                                                                        \
            }                                                                                                            \
            PULSE_UNROLL for (int l = 0; l < G / 32; ++l) {                                                              \
                const int64_t blk = b * (G / 32) + l;                                                                    \
                PULSE_UNROLL for (int t = 0; t < T; ++t) {                                                               \
                    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].q + 32 * blk));          \
                    const float dx = x[t].d[blk], sx = static_cast<float>(x[t].sum[blk]);                                \
                    PULSE_UNROLL for (int r = 0; r < R; ++r) {                                                           \
                        const __m256i p = DP(_mm256_setzero_si256(), u[r][l], xv);                                       \
                        const float sc = dw[r] * dx;                                                                     \
                        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(sc), acc[r][t]);               \
                        corr[r][t] += sc * sx;                                                                           \
                    }                                                                                                    \
                }                                                                                                        \
            }                                                                                                            \
        }                                                                                                                \
        PULSE_UNROLL for (int r = 0; r < R; ++r) PULSE_UNROLL for (int t = 0; t < T; ++t) out[r * T + t] = hsum(acc[r][t]) - corr[r][t]; \
    }                                                                                                                    \
    /* Rows [o0, o1) against T tokens in one call: the per-row work is the kernel's alone. */                            \
    template <int K, int R, int T>                                                                                       \
    __attribute__((target(TARGET))) inline void i8_kernel_##SUFFIX(const uint8_t* const* w, const QuantRow* x, int64_t n, float* o) { \
        if constexpr (K == 0) i8_q8_0_##SUFFIX<R, T>(w, x, n, o);                                                        \
        else if constexpr (K == 1) i8_tq2_0_##SUFFIX<R, T>(w, x, n, o);                                                  \
        else if constexpr (K == 2) i8_q2_0_##SUFFIX<R, T, 64>(w, x, n, o);                                               \
        else i8_q2_0_##SUFFIX<R, T, 128>(w, x, n, o);                                                                    \
    }                                                                                                                    \
    template <int K, int R, int T>                                                                                       \
    __attribute__((target(TARGET))) void i8_range_##SUFFIX(const RowRange& rr, const QuantRow* x, int64_t n) {           \
        float r[R * T];                                                                                                  \
        int64_t o = rr.o0;                                                                                               \
        for (; o + R <= rr.o1; o += R) {                                                                                 \
            const uint8_t* w[R];                                                                                         \
            PULSE_UNROLL for (int i = 0; i < R; ++i) w[i] = rr.base + static_cast<uint64_t>(o + i) * rr.row_bytes;      \
            i8_kernel_##SUFFIX<K, R, T>(w, x, n, r);                                                                     \
            PULSE_UNROLL for (int i = 0; i < R; ++i) PULSE_UNROLL for (int k = 0; k < T; ++k) rr.y[k * rr.y_stride + o + i] = r[i * T + k] * rr.scale; \
        }                                                                                                                \
        for (; o < rr.o1; ++o) {                                                                                         \
            const uint8_t* w[1] = {rr.base + static_cast<uint64_t>(o) * rr.row_bytes};                                 \
            i8_kernel_##SUFFIX<K, 1, T>(w, x, n, r);                                                                     \
            PULSE_UNROLL for (int k = 0; k < T; ++k) rr.y[k * rr.y_stride + o] = r[k] * rr.scale;                        \
        }                                                                                                                \
    }                                                                                                                    \
    template <int R, int T>                                                                                              \
    __attribute__((target(TARGET))) void i8_rows_range_##SUFFIX(uint32_t type, const RowRange& rr, const QuantRow* x, int64_t n) { \
        switch (type) {                                                                                                  \
            case kQ8_0: return i8_range_##SUFFIX<0, R, T>(rr, x, n);                                                     \
            case kTQ2_0: return i8_range_##SUFFIX<1, R, T>(rr, x, n);                                                    \
            case kQ2_0: return i8_range_##SUFFIX<2, R, T>(rr, x, n);                                                     \
            default: return i8_range_##SUFFIX<3, R, T>(rr, x, n);                                                        \
        }                                                                                                                \
    }

__attribute__((target("avx2"))) inline __m256i dp_avx2(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
__attribute__((target("avx512vnni,avx512vl,avx2"))) inline __m256i dp_vnni(__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(acc, u, s);
}
PULSE_I8_KERNELS(avx2, "avx2,fma,f16c", dp_avx2)

// Weights stream from memory once per step; with several tokens per block the compute between
// loads outlasts the hardware prefetcher's reach, so each block asks for the one ~15 ahead
// (measured on Zen 4: 4 tokens per step +13 %, single-token decode unchanged).
constexpr int kQ8x8Prefetch = 4096;
// Two groups of eight interleaved rows (sixteen rows) in 512-bit registers: each run of the
// first group in the low half, the same run of the second in the high half, one broadcast of
// the activation bytes facing both. Against a 256-bit pass over one group (the kernels before
// these), twice the rows per instruction: on cores with full-width AVX-512 units twice the
// multiply-adds per cycle, which bound the several-token steps; where a 512-bit op is two
// 256-bit halves (Zen 4), the activation loads and block ends are shared. A matrix's odd last
// group runs as both halves (`next` = 0), its high half discarded.
// GCC 12's AVX-512 headers start several intrinsics from a self-initialised "undefined" vector
// (`__m512 __Y = __Y;`), which -Wmaybe-uninitialized reports once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) inline __m512i two_runs(const uint8_t* lo, const uint8_t* hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)), 1);
}
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) inline __m512 two_scales(const uint8_t* lo, const uint8_t* hi) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1));
}
// acc + dpbusd(w, four activation bytes x[0..3] in every 32-bit lane), the bytes broadcast by
// the dpbusd itself from memory (EVEX embedded broadcast, m32{1to16}). Written as intrinsics
// (_mm512_set1_epi32 of the four bytes), GCC 12 emits a separate vpbroadcastd for each: with
// several tokens a block is bound by issuing these instructions, and the separate broadcasts
// were a third of them (`decoder_ops kernels`, one thread, in L1, ns per 8-row block: TQ2_0 one
// token 17.8-18.5 -> 15.9, Q8_0 five tokens 9.2-9.9 -> 8.9-9.2).
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,avx2,fma,f16c"), always_inline)) inline __m512i dpbusd_x4(__m512i acc, __m512i w, const int8_t* x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
    return acc;
}
// The packed bytes a kernel reads ~kQ8x8Prefetch bytes ahead, in the order it reads them: its
// two groups (`next` apart) as two streams, then the pair after them (a thread's next call,
// the two groups that follow). Prefetching a fixed distance past each stream instead would land
// in the pair's other group, and leave the start of the next pair's second group unfetched
// (`decoder_ops verify`, Q8_0 bench model, 2-core Xeon: a verification's matmuls +2.8-3.8 ms
// over a one-token step's -> +1.8-2.1 ms).
class PairPrefetch {
public:
    PairPrefetch(const uint8_t* p, uint64_t next) : next_(next) {
        const uint64_t d = kQ8x8Prefetch;
        at_ = next ? p + d + d / next * next : p + d;
        off_ = next ? d % next : 0;
    }
    // Ask for `lines` cache lines at the point ahead, in both groups; then move it on a block.
    inline __attribute__((always_inline)) void block(int lines, uint64_t block_bytes) {
        for (int l = 0; l < lines; ++l) {
            _mm_prefetch(reinterpret_cast<const char*>(at_) + 64 * l, _MM_HINT_T0);
            if (next_) _mm_prefetch(reinterpret_cast<const char*>(at_ + next_) + 64 * l, _MM_HINT_T0);
        }
        at_ += block_bytes;
        if (next_ && (off_ += block_bytes) >= next_) {
            off_ -= next_;
            at_ += next_;
        }
    }

private:
    const uint8_t* at_;
    uint64_t next_, off_;
};
template <int T>
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,avx2,fma,f16c"))) void store_x16(const __m512* acc, float* out) {
    PULSE_UNROLL for (int t = 0; t < T; ++t) {
        float lanes[16];
        _mm512_storeu_ps(lanes, acc[t]);
        for (int r = 0; r < 16; ++r) out[r * T + t] = lanes[r];
    }
}
template <int T>
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,avx2,fma,f16c"))) void q8_0x16_vnni(const uint8_t* p, uint64_t next, const QuantRow* x, int64_t n, float* out) {
    __m512 acc[T];
    PULSE_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    PairPrefetch ahead(p, next);
    for (int64_t b = 0; b < n / 32; ++b, p += kQ8x8Bytes) {
        const uint8_t* q = p + next;
        ahead.block(5, kQ8x8Bytes);
        const __m512 dw = two_scales(p, q);
        __m512i w[8];
        PULSE_UNROLL for (int k = 0; k < 8; ++k) w[k] = two_runs(p + 16 + 32 * k, q + 16 + 32 * k);
        PULSE_UNROLL for (int t = 0; t < T; ++t) {
            const int8_t* xq = x[t].q + 32 * b;
            // Two chains of four dependent dpbusd instead of one of eight (latency, not
            // throughput, bounds a block otherwise).
            __m512i ip0 = _mm512_setzero_si512(), ip1 = _mm512_setzero_si512();
            PULSE_UNROLL for (int k = 0; k < 8; k += 2) {
                ip0 = dpbusd_x4(ip0, w[k], xq + 4 * k);
                ip1 = dpbusd_x4(ip1, w[k + 1], xq + 4 * k + 4);
            }
            // Σ (w + 128)·x = Σ w·x + 128·Σ x
            const __m512i ip = _mm512_sub_epi32(_mm512_add_epi32(ip0, ip1), _mm512_set1_epi32(128 * x[t].sum[b]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(dw, _mm512_set1_ps(x[t].d[b])), acc[t]);
        }
    }
    store_x16<T>(acc, out);
}
template <int T>
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,avx2,fma,f16c"))) void tq2_0x16_vnni(const uint8_t* p, uint64_t next, const QuantRow* x, int64_t n, float* out) {
    const __m512i m0 = _mm512_set1_epi8(0x03), m1 = _mm512_set1_epi8(0x0c), m2 = _mm512_set1_epi8(0x30), m3 = _mm512_set1_epi8(static_cast<char>(0xc0));
    __m512 acc[T];
    PULSE_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    PairPrefetch ahead(p, next);
    for (int64_t b = 0; b < n / 256; ++b, p += kTQ2x8Bytes) {
        const uint8_t* q = p + next;
        ahead.block(9, kTQ2x8Bytes);
        const __m512 dw = two_scales(p, q);
        // One accumulator per (token, plane), each plane its own named array: written as one
        // ip[T][4] array (or with the 16 runs in an outer loop GCC does not unroll), GCC 12
        // shuffled the accumulators between registers and the stack around every dpbusd, and
        // a block took ~1.5x the dpbusd issue bound at four tokens (Zen 4, in cache).
        __m512i a0[T], a1[T], a2[T], a3[T];
        PULSE_UNROLL for (int t = 0; t < T; ++t) a0[t] = a1[t] = a2[t] = a3[t] = _mm512_setzero_si512();
        for (int j0 = 0; j0 < 16; j0 += 4) PULSE_UNROLL for (int jj = 0; jj < 4; ++jj) {
            const int j = j0 + jj;
            const __m512i w = two_runs(p + 16 + 32 * j, q + 16 + 32 * j);
            const __m512i u0 = _mm512_and_si512(w, m0), u1 = _mm512_and_si512(w, m1), u2 = _mm512_and_si512(w, m2), u3 = _mm512_and_si512(w, m3);
            PULSE_UNROLL for (int t = 0; t < T; ++t) {
                const int8_t* xq = x[t].q + 256 * b + 16 * j;
                a0[t] = dpbusd_x4(a0[t], u0, xq);
                a1[t] = dpbusd_x4(a1[t], u1, xq + 4);
                a2[t] = dpbusd_x4(a2[t], u2, xq + 8);
                a3[t] = dpbusd_x4(a3[t], u3, xq + 12);
            }
        }
        PULSE_UNROLL for (int t = 0; t < T; ++t) {
            // Σ code·x over the block, less Σ x: Σ value·x (value = code - 1).
            __m512i sum = _mm512_add_epi32(_mm512_add_epi32(a0[t], _mm512_srai_epi32(a1[t], 2)), _mm512_add_epi32(_mm512_srai_epi32(a2[t], 4), _mm512_srai_epi32(a3[t], 6)));
            sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(x[t].sum[b]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(x[t].d[b])), acc[t]);
        }
    }
    store_x16<T>(acc, out);
}
// Five to eight tokens (a verification's rows): each plane shifted down to its 2-bit codes (a
// 16-bit shift and the low mask), so that the planes add into fewer accumulators per token —
// four per token, as above, would not fit the registers. Two per token up to six tokens (planes
// 0-1 and 2-3), one for seven and eight: a token's dpbusd chain is then 64 long per block, and
// at five tokens five such chains did not cover dpbusd's latency (the block took 3.5x one
// token's time against 2.6x at four). The integer sums are the same, so the results equal the
// narrow kernel's bit for bit.
template <int T>
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,avx2,fma,f16c"))) void tq2_0x16_vnni_wide(const uint8_t* p, uint64_t next, const QuantRow* x, int64_t n, float* out) {
    const __m512i m0 = _mm512_set1_epi8(0x03);
    __m512 acc[T];
    PULSE_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    PairPrefetch ahead(p, next);
    for (int64_t b = 0; b < n / 256; ++b, p += kTQ2x8Bytes) {
        const uint8_t* q = p + next;
        ahead.block(9, kTQ2x8Bytes);
        const __m512 dw = two_scales(p, q);
        constexpr bool kTwo = T <= 6;
        __m512i a[T], c[kTwo ? T : 1];
        PULSE_UNROLL for (int t = 0; t < T; ++t) a[t] = _mm512_setzero_si512();
        if constexpr (kTwo) PULSE_UNROLL for (int t = 0; t < T; ++t) c[t] = _mm512_setzero_si512();
        for (int j = 0; j < 16; ++j) {
            const __m512i w = two_runs(p + 16 + 32 * j, q + 16 + 32 * j);
            const __m512i u0 = _mm512_and_si512(w, m0), u1 = _mm512_and_si512(_mm512_srli_epi16(w, 2), m0),
                          u2 = _mm512_and_si512(_mm512_srli_epi16(w, 4), m0), u3 = _mm512_and_si512(_mm512_srli_epi16(w, 6), m0);
            PULSE_UNROLL for (int t = 0; t < T; ++t) {
                const int8_t* xq = x[t].q + 256 * b + 16 * j;
                a[t] = dpbusd_x4(a[t], u0, xq);
                a[t] = dpbusd_x4(a[t], u1, xq + 4);
                if constexpr (kTwo) {
                    c[t] = dpbusd_x4(c[t], u2, xq + 8);
                    c[t] = dpbusd_x4(c[t], u3, xq + 12);
                } else {
                    a[t] = dpbusd_x4(a[t], u2, xq + 8);
                    a[t] = dpbusd_x4(a[t], u3, xq + 12);
                }
            }
        }
        PULSE_UNROLL for (int t = 0; t < T; ++t) {
            __m512i code_x = a[t];
            if constexpr (kTwo) code_x = _mm512_add_epi32(a[t], c[t]);
            const __m512i sum = _mm512_sub_epi32(code_x, _mm512_set1_epi32(x[t].sum[b]));  // Σ code·x − Σ x: Σ value·x
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(x[t].d[b])), acc[t]);
        }
    }
    store_x16<T>(acc, out);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
PULSE_I8_KERNELS(vnni, "avx512vnni,avx512vl,avx2,fma,f16c", dp_vnni)
#undef PULSE_I8_KERNELS
#endif

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) {
#ifdef PULSE_X86
    if (have_avx2()) return dot_f32_avx2(a, b, n);
#endif
#ifdef PULSE_ARM64
    if (have_neon()) return arm::dot_f32(a, b, n);
#endif
    return dot_f32_scalar(a, b, n);
}

void dot4_f32(const float* w, const float* x, int64_t n, float out[4]) {
#ifdef PULSE_X86
    if (have_avx2()) return dot4_f32_avx2(w, x, n, out);
#endif
#ifdef PULSE_ARM64
    if (have_neon()) return arm::dot4_f32(w, x, n, out);
#endif
    for (int k = 0; k < 4; ++k) out[k] = dot_f32_scalar(w, x + k * n, n);
}

namespace {

void gemm_f32_scalar(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
    for (int64_t i = 0; i < M; ++i) {
        float* c = C + i * ldc;
        if (!accumulate) std::fill(c, c + N, 0.f);
        for (int64_t k = 0; k < K; ++k) {
            const float a = A[i * lda + k];
            const float* b = B + k * ldb;
            for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
        }
    }
}

#ifdef PULSE_X86
// RR rows of C (1-4) × 16 columns per block: 2·RR accumulators stay in registers over all of
// K, each pair of B vectors loaded once for the RR rows.
template <int RR>
__attribute__((target("avx2,fma"))) void gemm_rows_avx2(int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
    int64_t j0 = 0;
    for (; j0 + 16 <= N; j0 += 16) {
        __m256 acc[RR][2];
#pragma GCC unroll 4
        for (int i = 0; i < RR; ++i) {
            acc[i][0] = accumulate ? _mm256_loadu_ps(C + i * ldc + j0) : _mm256_setzero_ps();
            acc[i][1] = accumulate ? _mm256_loadu_ps(C + i * ldc + j0 + 8) : _mm256_setzero_ps();
        }
        for (int64_t k = 0; k < K; ++k) {
            const __m256 b0 = _mm256_loadu_ps(B + k * ldb + j0), b1 = _mm256_loadu_ps(B + k * ldb + j0 + 8);
    #pragma GCC unroll 4
        for (int i = 0; i < RR; ++i) {
                const __m256 a = _mm256_broadcast_ss(A + i * lda + k);
                acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < RR; ++i) {
            _mm256_storeu_ps(C + i * ldc + j0, acc[i][0]);
            _mm256_storeu_ps(C + i * ldc + j0 + 8, acc[i][1]);
        }
    }
    for (; j0 + 8 <= N; j0 += 8) {
        __m256 acc[RR];
#pragma GCC unroll 4
        for (int i = 0; i < RR; ++i) acc[i] = accumulate ? _mm256_loadu_ps(C + i * ldc + j0) : _mm256_setzero_ps();
        for (int64_t k = 0; k < K; ++k) {
            const __m256 b0 = _mm256_loadu_ps(B + k * ldb + j0);
    #pragma GCC unroll 4
        for (int i = 0; i < RR; ++i) acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(A + i * lda + k), b0, acc[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < RR; ++i) _mm256_storeu_ps(C + i * ldc + j0, acc[i]);
    }
    for (; j0 < N; ++j0)
#pragma GCC unroll 4
        for (int i = 0; i < RR; ++i) {
            float acc = accumulate ? C[i * ldc + j0] : 0.f;
            for (int64_t k = 0; k < K; ++k) acc += A[i * lda + k] * B[k * ldb + j0];
            C[i * ldc + j0] = acc;
        }
}

template <int RR, int CC>
__attribute__((target("avx2,fma"))) void gemm_nt_block_avx2(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
    __m256 acc[RR][CC];
#pragma GCC unroll 4
    for (int i = 0; i < RR; ++i)
#pragma GCC unroll 2
        for (int j = 0; j < CC; ++j) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 b[CC];
#pragma GCC unroll 2
        for (int j = 0; j < CC; ++j) b[j] = _mm256_loadu_ps(B + j * ldb + k);
#pragma GCC unroll 4
        for (int i = 0; i < RR; ++i) {
            const __m256 a = _mm256_loadu_ps(A + i * lda + k);
#pragma GCC unroll 2
            for (int j = 0; j < CC; ++j) acc[i][j] = _mm256_fmadd_ps(a, b[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < RR; ++i)
#pragma GCC unroll 2
        for (int j = 0; j < CC; ++j) {
            float s = hsum(acc[i][j]);
            for (int64_t kk = k; kk < K; ++kk) s += A[i * lda + kk] * B[j * ldb + kk];
            C[i * ldc + j] = s;
        }
}

template <int RR>
__attribute__((target("avx2,fma"))) void gemm_nt_rows_avx2(int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
    int64_t j = 0;
    for (; j + 2 <= N; j += 2) gemm_nt_block_avx2<RR, 2>(K, A, lda, B + j * ldb, ldb, C + j, ldc);
    if (j < N) gemm_nt_block_avx2<RR, 1>(K, A, lda, B + j * ldb, ldb, C + j, ldc);
}

__attribute__((target("avx2,fma"))) void gemm_f32_nt_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) gemm_nt_rows_avx2<4>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc);
    switch (M - i) {
        case 3: gemm_nt_rows_avx2<3>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc); break;
        case 2: gemm_nt_rows_avx2<2>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc); break;
        case 1: gemm_nt_rows_avx2<1>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc); break;
        default: break;
    }
}

__attribute__((target("avx2,fma"))) void gemm_f32_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) gemm_rows_avx2<4>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate);
    switch (M - i) {
        case 3: gemm_rows_avx2<3>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate); break;
        case 2: gemm_rows_avx2<2>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate); break;
        case 1: gemm_rows_avx2<1>(N, K, A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate); break;
        default: break;
    }
}
#endif

}  // namespace

void gemm_f32_nt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
#ifdef PULSE_X86
    if (have_avx2()) return gemm_f32_nt_avx2(M, N, K, A, lda, B, ldb, C, ldc);
#endif
#ifdef PULSE_ARM64
    if (have_neon()) return arm::gemm_f32_nt(M, N, K, A, lda, B, ldb, C, ldc);
#endif
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = dot_f32_scalar(A + i * lda, B + j * ldb, K);
}

namespace {

#ifdef PULSE_X86
// e^x for eight lanes: x = n·ln2 + r with |r| <= ln2/2 (ln2 split in two so r stays exact),
// e^r by the degree-7 Taylor-like minimax polynomial of Cephes' expf, 2^n into the exponent.
// Within 2 ulp of expf over the range; x is clamped to [-87.3, 88] (results stay normal and
// finite), a NaN stays NaN (min/max return their second operand when one is NaN).
__attribute__((target("avx2,fma"))) __m256 exp_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
    x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma"))) float exp_shifted_avx2(float* s, int64_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float total = hsum(sum);
    for (; i < n; ++i) total += (s[i] = std::exp(s[i] - m));
    return total;
}

__attribute__((target("avx2,fma"))) void silu_mul_avx2(const float* x, const float* u, float* y, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        __m256 s = _mm256_div_ps(v, _mm256_add_ps(one, exp_avx2(_mm256_sub_ps(zero, v))));
        if (u) s = _mm256_mul_ps(s, _mm256_loadu_ps(u + i));
        _mm256_storeu_ps(y + i, s);
    }
    for (; i < n; ++i) y[i] = blocks::silu(x[i]) * (u ? u[i] : 1.f);
}

// f16 values s[i..n) widened into d: eight per F16C conversion, then one by one.
__attribute__((target("avx2,f16c"), always_inline)) inline void widen_from(const uint16_t* s, float* d, int64_t i, int64_t n) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    for (; i < n; ++i) d[i] = fp16_to_f32(s[i]);
}

__attribute__((target("avx2,f16c"))) void f32_to_f16_row_f16c(const float* s, uint16_t* d, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; ++i) d[i] = f32_to_fp16(s[i]);
}

__attribute__((target("avx2,f16c"))) void f16_to_f32_rows_avx2(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst,
                                                               int64_t dst_stride) {
    for (int64_t r = 0; r < rows; ++r) widen_from(src + r * src_stride, dst + r * dst_stride, 0, n);
}

// GCC 12's _mm512_cvtph_ps starts from a self-initialised "undefined" vector (see the
// interleaved kernels above).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f,avx2,f16c"))) void f16_to_f32_rows_avx512(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst,
                                                                         int64_t dst_stride) {
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* s = src + r * src_stride;
        float* d = dst + r * dst_stride;
        int64_t i = 0;
        for (; i + 32 <= n; i += 32) {
            _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
            _mm512_storeu_ps(d + i + 16, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 16))));
        }
        widen_from(s, d, i, n);
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace

void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) {
#ifdef PULSE_X86
    if (have_avx2()) return f32_to_f16_row_f16c(src, dst, n);
#endif
#ifdef PULSE_ARM64
    if (have_neon()) return arm::f32_to_f16_row(src, dst, n);
#endif
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_fp16(src[i]);
}

void f16_to_f32_rows(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst, int64_t dst_stride) {
#ifdef PULSE_X86
    if (have_avx512()) return f16_to_f32_rows_avx512(src, src_stride, rows, n, dst, dst_stride);
    if (have_avx2()) return f16_to_f32_rows_avx2(src, src_stride, rows, n, dst, dst_stride);
#endif
#ifdef PULSE_ARM64
    if (have_neon()) return arm::f16_to_f32_rows(src, src_stride, rows, n, dst, dst_stride);
#endif
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i) dst[r * dst_stride + i] = fp16_to_f32(src[r * src_stride + i]);
}

namespace {
double sum_squares_scalar(const float* x, int64_t n) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    return ss;
}
#ifdef PULSE_X86
// Four chains of four doubles: a multiply-add's latency covered, 16 elements an iteration.
__attribute__((target("avx2,fma"))) double sum_squares_avx2(const float* x, int64_t n) {
    __m256d s[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        PULSE_UNROLL for (int k = 0; k < 4; ++k) {
            const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * k));
            s[k] = _mm256_fmadd_pd(v, v, s[k]);
        }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(s[0], s[1]), _mm256_add_pd(s[2], s[3])));
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + sum_squares_scalar(x + i, n - i);
}
#endif
}  // namespace

double sum_squares(const float* x, int64_t n) {
#ifdef PULSE_X86
    if (have_avx2()) return sum_squares_avx2(x, n);
#endif
#ifdef PULSE_ARM64
    if (have_neon()) return arm::sum_squares(x, n);
#endif
    return sum_squares_scalar(x, n);
}

float exp_shifted(float* s, int64_t n, float m) {
#ifdef PULSE_X86
    if (have_avx2()) return exp_shifted_avx2(s, n, m);
#endif
#ifdef PULSE_ARM64
    if (have_neon()) return arm::exp_shifted(s, n, m);
#endif
    float total = 0;
    for (int64_t i = 0; i < n; ++i) total += (s[i] = std::exp(s[i] - m));
    return total;
}

void silu_mul(const float* x, const float* u, float* y, int64_t n) {
#ifdef PULSE_X86
    if (have_avx2()) return silu_mul_avx2(x, u, y, n);
#endif
#ifdef PULSE_ARM64
    if (have_neon()) return arm::silu_mul(x, u, y, n);
#endif
    for (int64_t i = 0; i < n; ++i) y[i] = blocks::silu(x[i]) * (u ? u[i] : 1.f);
}

void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
#ifdef PULSE_X86
    if (have_avx2()) return gemm_f32_avx2(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
#endif
#ifdef PULSE_ARM64
    if (have_neon()) return arm::gemm_f32(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
#endif
    gemm_f32_scalar(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

namespace {

// The next head's state (GdnHeadArgs::next_in/next_out), a few cache lines per state row the
// head visits: the whole of it spread over the head's passes (1 + T of S rows each).
class NextHeadPrefetch {
public:
    NextHeadPrefetch(const GdnHeadArgs& g)
        : in_(reinterpret_cast<const char*>(g.next_in)), out_(g.next_out != g.next_in ? reinterpret_cast<const char*>(g.next_out) : nullptr) {
        const int64_t lines = (g.S * g.S * 4 + 63) / 64;
        in_lines_ = in_ ? lines : 0;
        out_lines_ = out_ ? lines : 0;
        const int64_t rows = (1 + g.T) * g.S;
        per_row_ = (in_lines_ + out_lines_ + rows - 1) / rows;
    }
    inline __attribute__((always_inline)) void row() {
        for (int64_t n = 0; n < per_row_; ++n) {
            if (in_at_ < in_lines_) __builtin_prefetch(in_ + 64 * in_at_++, 0, 2);
            else if (out_at_ < out_lines_) __builtin_prefetch(out_ + 64 * out_at_++, 1, 2);
            else return;
        }
    }

private:
    const char *in_, *out_;
    int64_t in_lines_ = 0, out_lines_ = 0, in_at_ = 0, out_at_ = 0, per_row_ = 0;
};

inline __attribute__((always_inline)) void gdn_head_body(const GdnHeadArgs& g) {
    const int64_t S = g.S;
    float* st = g.state;
    // The first token reads the state before the step; later ones the one being written.
    const float* src = g.state_in ? g.state_in : st;
    NextHeadPrefetch ahead(g);
    const float inv_sqrt = 1.f / std::sqrt(static_cast<float>(S));
    float a[512], b[512], delta[512];  // S <= 512 (checked by the caller)
    for (int64_t j = 0; j < S; ++j) a[j] = b[j] = 0;
    for (int64_t i = 0; i < S; ++i) {
        const float* row = src + i * S;
        ahead.row();
        const float ki = g.k[i], qi = g.q[i];
#pragma omp simd
        for (int64_t j = 0; j < S; ++j) {
            a[j] += row[j] * ki;
            b[j] += row[j] * qi;
        }
    }
    for (int64_t t = 0; t < g.T; ++t) {
        const float* k = g.k + t * g.qk_stride;
        const float* q = g.q + t * g.qk_stride;
        const float* v = g.v + t * g.v_stride;
        const float e = std::exp(g.log_decay[t * g.gate_stride]), bt = g.beta[t * g.gate_stride];
        float kq = 0;
        for (int64_t i = 0; i < S; ++i) kq += k[i] * q[i];
        float* o = g.out + t * g.out_stride;
#pragma omp simd
        for (int64_t j = 0; j < S; ++j) {
            delta[j] = bt * (v[j] - e * a[j]);
            o[j] = (e * b[j] + delta[j] * kq) * inv_sqrt;
            a[j] = b[j] = 0;
        }
        const float* from = t == 0 ? src : st;
        if (t + 1 == g.T) {  // the last token: the update alone
            for (int64_t i = 0; i < S; ++i) {
                float* row = st + i * S;
                const float* old = from + i * S;
                const float ki = k[i];
                ahead.row();
#pragma omp simd
                for (int64_t j = 0; j < S; ++j) row[j] = e * old[j] + ki * delta[j];
            }
            break;
        }
        const float* kn = k + g.qk_stride;
        const float* qn = q + g.qk_stride;
        for (int64_t i = 0; i < S; ++i) {
            float* row = st + i * S;
            const float* old = from + i * S;
            const float ki = k[i], kni = kn[i], qni = qn[i];
            ahead.row();
#pragma omp simd
            for (int64_t j = 0; j < S; ++j) {
                const float r = e * old[j] + ki * delta[j];
                row[j] = r;
                a[j] += r * kni;
                b[j] += r * qni;
            }
        }
    }
}



// The chunked form (kernels.h): per chunk of up to kGdnChunk tokens, every product through
// gemm_f32, the triangular solve as one row of it per token.
inline __attribute__((always_inline)) void gdn_chunked_body(const GdnHeadArgs& g) {
    const int64_t S = g.S, L = kGdnChunk;
    float* st = g.state;
    const float* src = g.state_in ? g.state_in : st;  // the first chunk's state (the next ones': st)
    const float inv_sqrt = 1.f / std::sqrt(static_cast<float>(S));
    // Kᵀ [S][L]; k·k and q·k [L][L]; S₀ᵀk, S₀ᵀq, Δ [L][S]; the solve's row [L].
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(S * L + 2 * L * L + 3 * L * S + L));
    float* kt = buf.data();
    float* kk = kt + S * L;
    float* qk = kk + L * L;
    float* ks = qk + L * L;
    float* qs = ks + L * S;
    float* dl = qs + L * S;
    float* arow = dl + L * S;
    float gam[kGdnChunk], bet[kGdnChunk];
    for (int64_t c0 = 0; c0 < g.T; c0 += L) {
        const int64_t n = std::min(L, g.T - c0);
        const float* K = g.k + c0 * g.qk_stride;
        const float* Q = g.q + c0 * g.qk_stride;
        const float* V = g.v + c0 * g.v_stride;
        float* O = g.out + c0 * g.out_stride;
        float acc = 0;
        for (int64_t t = 0; t < n; ++t) {
            gam[t] = (acc += g.log_decay[(c0 + t) * g.gate_stride]);
            bet[t] = g.beta[(c0 + t) * g.gate_stride];
        }
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < S; ++i) kt[i * L + t] = K[t * g.qk_stride + i];
        gemm_f32(n, n, S, K, g.qk_stride, kt, L, kk, L, false);
        gemm_f32(n, n, S, Q, g.qk_stride, kt, L, qk, L, false);
        const float* s0 = c0 == 0 ? src : st;
        gemm_f32(n, S, S, K, g.qk_stride, s0, S, ks, S, false);
        gemm_f32(n, S, S, Q, g.qk_stride, s0, S, qs, S, false);
        // Δ row by row: δ_t = β_t(v_t − e^Γt·S₀ᵀk_t) − Σ_{s<t} A[t][s]·δ_s.
        for (int64_t t = 0; t < n; ++t) {
            const float eg = std::exp(gam[t]), bt = bet[t];
            float* d = dl + t * S;
            const float* v = V + t * g.v_stride;
            const float* kst = ks + t * S;
#pragma omp simd
            for (int64_t j = 0; j < S; ++j) d[j] = bt * (v[j] - eg * kst[j]);
            if (t == 0) continue;
            for (int64_t s = 0; s < t; ++s) arow[s] = -bt * std::exp(gam[t] - gam[s]) * kk[t * L + s];
            gemm_f32(1, S, t, arow, L, dl, S, d, S, true);
        }
        // Outputs: (e^Γ·S₀ᵀq + M·Δ)/√S, M the decayed causal q·k (written over qk).
        for (int64_t t = 0; t < n; ++t) {
            float* m = qk + t * L;
            for (int64_t s = 0; s <= t; ++s) m[s] *= std::exp(gam[t] - gam[s]);
            for (int64_t s = t + 1; s < n; ++s) m[s] = 0;
            const float eg = std::exp(gam[t]);
            float* o = O + t * g.out_stride;
            const float* qst = qs + t * S;
#pragma omp simd
            for (int64_t j = 0; j < S; ++j) o[j] = eg * qst[j];
        }
        gemm_f32(n, S, n, qk, L, dl, S, O, g.out_stride, true);
        for (int64_t t = 0; t < n; ++t) {
            float* o = O + t * g.out_stride;
#pragma omp simd
            for (int64_t j = 0; j < S; ++j) o[j] *= inv_sqrt;
        }
        // The state: e^Γlast·S₀ + Kᵀ·(e^(Γlast−Γ_s)·δ_s).
        const float glast = gam[n - 1], elast = std::exp(glast);
        for (int64_t t = 0; t < n; ++t) {
            const float w = std::exp(glast - gam[t]);
            float* d = dl + t * S;
#pragma omp simd
            for (int64_t j = 0; j < S; ++j) d[j] *= w;
        }
#pragma omp simd
        for (int64_t i = 0; i < S * S; ++i) st[i] = elast * s0[i];
        gemm_f32(S, S, n, kt, L, dl, S, st, S, true);
    }
}

#ifdef PULSE_X86
__attribute__((target("avx2,fma"))) void gdn_head_avx2(const GdnHeadArgs& g) { gdn_head_body(g); }
// The recurrent form with a whole state row in registers (S = 16·NV, up to 128): Sᵀk, Sᵀq and δ
// stay in 512-bit registers for the head's whole run, so each pass over the state is one load
// (and in the update one store) per 16 entries. The portable body keeps them in arrays: a load
// and a store per entry for each of them, which bound it (in L2, ~2.5x this one's time per head).
template <int NV>
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void gdn_head_avx512(const GdnHeadArgs& g) {
    constexpr int64_t S = 16 * NV;
    float* st = g.state;
    const float* src = g.state_in ? g.state_in : st;  // as in gdn_head_body
    NextHeadPrefetch ahead(g);
    const __m512 inv_sqrt = _mm512_set1_ps(1.f / std::sqrt(static_cast<float>(S)));
    __m512 a[NV], b[NV], d[NV];
    PULSE_UNROLL for (int v = 0; v < NV; ++v) a[v] = b[v] = _mm512_setzero_ps();
    for (int64_t i = 0; i < S; ++i) {
        const float* row = src + i * S;
        ahead.row();
        const __m512 ki = _mm512_set1_ps(g.k[i]), qi = _mm512_set1_ps(g.q[i]);
        PULSE_UNROLL for (int v = 0; v < NV; ++v) {
            const __m512 r = _mm512_loadu_ps(row + 16 * v);
            a[v] = _mm512_fmadd_ps(r, ki, a[v]);
            b[v] = _mm512_fmadd_ps(r, qi, b[v]);
        }
    }
    for (int64_t t = 0; t < g.T; ++t) {
        const float* k = g.k + t * g.qk_stride;
        const float* q = g.q + t * g.qk_stride;
        const float* vt = g.v + t * g.v_stride;
        const float e = std::exp(g.log_decay[t * g.gate_stride]), bt = g.beta[t * g.gate_stride];
        float kq = 0;
        for (int64_t i = 0; i < S; ++i) kq += k[i] * q[i];
        const __m512 ev = _mm512_set1_ps(e), bv = _mm512_set1_ps(bt), kqv = _mm512_set1_ps(kq);
        float* o = g.out + t * g.out_stride;
        PULSE_UNROLL for (int v = 0; v < NV; ++v) {
            d[v] = _mm512_mul_ps(bv, _mm512_fnmadd_ps(ev, a[v], _mm512_loadu_ps(vt + 16 * v)));
            _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(_mm512_fmadd_ps(ev, b[v], _mm512_mul_ps(d[v], kqv)), inv_sqrt));
            a[v] = b[v] = _mm512_setzero_ps();
        }
        const float* from = t == 0 ? src : st;
        if (t + 1 == g.T) {  // the last token: the update alone
            for (int64_t i = 0; i < S; ++i) {
                float* row = st + i * S;
                const float* old = from + i * S;
                const __m512 ki = _mm512_set1_ps(k[i]);
                ahead.row();
                PULSE_UNROLL for (int v = 0; v < NV; ++v)
                    _mm512_storeu_ps(row + 16 * v, _mm512_fmadd_ps(ki, d[v], _mm512_mul_ps(ev, _mm512_loadu_ps(old + 16 * v))));
            }
            break;
        }
        const float* kn = k + g.qk_stride;
        const float* qn = q + g.qk_stride;
        for (int64_t i = 0; i < S; ++i) {
            float* row = st + i * S;
            const float* old = from + i * S;
            const __m512 ki = _mm512_set1_ps(k[i]), kni = _mm512_set1_ps(kn[i]), qni = _mm512_set1_ps(qn[i]);
            ahead.row();
            PULSE_UNROLL for (int v = 0; v < NV; ++v) {
                const __m512 r = _mm512_fmadd_ps(ki, d[v], _mm512_mul_ps(ev, _mm512_loadu_ps(old + 16 * v)));
                _mm512_storeu_ps(row + 16 * v, r);
                a[v] = _mm512_fmadd_ps(r, kni, a[v]);
                b[v] = _mm512_fmadd_ps(r, qni, b[v]);
            }
        }
    }
}
__attribute__((target("avx2,fma"))) void gdn_chunked_avx2(const GdnHeadArgs& g) { gdn_chunked_body(g); }
#endif
void gdn_head_generic(const GdnHeadArgs& g) { gdn_head_body(g); }
void gdn_chunked_generic(const GdnHeadArgs& g) { gdn_chunked_body(g); }

}  // namespace

void gdn_head_recurrent(const GdnHeadArgs& g) {
#ifdef PULSE_X86
    if (have_avx512()) switch (g.S) {
            case 128: return gdn_head_avx512<8>(g);
            case 64: return gdn_head_avx512<4>(g);
            case 32: return gdn_head_avx512<2>(g);
            case 16: return gdn_head_avx512<1>(g);
            default: break;
        }
    if (have_avx2()) return gdn_head_avx2(g);
#endif
    gdn_head_generic(g);
}

void gdn_head_chunked(const GdnHeadArgs& g) {
#ifdef PULSE_X86
    if (have_avx2()) return gdn_chunked_avx2(g);
#endif
    gdn_chunked_generic(g);
}

void gdn_head(const GdnHeadArgs& g) {
    if (g.T >= kGdnChunkedFrom) return gdn_head_chunked(g);
    gdn_head_recurrent(g);
}

int64_t i8_block(uint32_t type) {
    switch (type) {
        case kQ8_0:
        case kQ2_0:
        case kPQ2_0:
        case kQ2_0_G128: return 32;
        case kTQ2_0: return 256;
        default: return 0;
    }
}

namespace {

// Block b's weight scale and the integer Σ code·x of its signed weight codes against the
// activation codes xq (the block's blk values), for each layout as i8_block reads it.
float i8_weight_scale(uint32_t type, const uint8_t* row, int64_t b) {
    switch (type) {
        case kQ8_0: return fp16_to_f32(rd16(row + 34 * b));
        case kTQ2_0: return fp16_to_f32(rd16(row + 66 * b + 64));
        case kQ2_0: return fp16_to_f32(rd16(row + 18 * (b / 2)));
        default: return fp16_to_f32(rd16(row + 34 * (b / 4)));
    }
}

int32_t i8_block_sum(uint32_t type, const uint8_t* row, int64_t b, const int8_t* xq) {
    int32_t s = 0;
    switch (type) {
        case kQ8_0:
            for (int i = 0; i < 32; ++i) s += static_cast<int8_t>(row[34 * b + 2 + i]) * xq[i];
            break;
        case kTQ2_0:  // byte 32h+m holds element 128h+32l+m in bits 2l..2l+1
            for (int e = 0; e < 256; ++e) s += (((row[66 * b + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) - 1) * xq[e];
            break;
        case kQ2_0:  // planes 2p, 2p+1 (p = b mod 2) of group b/2, at 16l' + i
            for (int e = 0; e < 32; ++e) s += (((row[18 * (b / 2) + 2 + e % 16] >> (2 * (2 * (b % 2) + e / 16))) & 3) - 1) * xq[e];
            break;
        default:  // plane b mod 4 of group b/4
            for (int e = 0; e < 32; ++e) s += (((row[34 * (b / 4) + 2 + e] >> (2 * (b % 4))) & 3) - 1) * xq[e];
            break;
    }
    return s;
}

}  // namespace

float i8_dot_reference(uint32_t type, const uint8_t* row, const QuantRow& x, int64_t n) {
    const int64_t blk = i8_block(type);
    if (!blk) throw std::invalid_argument("i8_dot_reference: no int8 dot for weight type " + std::to_string(type));
    float a[4] = {0, 0, 0, 0};
    for (int64_t b = 0; b < n / blk; ++b)
        a[b & 3] = std::fma(static_cast<float>(i8_block_sum(type, row, b, x.q + b * blk)), i8_weight_scale(type, row, b) * x.d[b], a[b & 3]);
    return (a[0] + a[1]) + (a[2] + a[3]);
}

namespace {

// One block of `blk` floats (a multiple of 32) to int8: scale max|x|/127, codes rounded to
// nearest even, their sum.
void quantize_block_scalar(const float* src, int64_t blk, int8_t* q, float* d, int32_t* sum) {
    float amax = 0;
    for (int64_t i = 0; i < blk; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float scale = amax / 127, inv = scale > 0 ? 1 / scale : 0;
    int32_t s = 0;
    for (int64_t i = 0; i < blk; ++i) s += (q[i] = static_cast<int8_t>(std::nearbyint(src[i] * inv)));
    *d = scale;
    *sum = s;
}

#ifdef PULSE_X86
__attribute__((target("avx2,fma"))) void quantize_block_avx2(const float* src, int64_t blk, int8_t* q, float* d, int32_t* sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int64_t i = 0; i < blk; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float amax = _mm_cvtss_f32(m4), scale = amax / 127, inv = scale > 0 ? 1 / scale : 0;
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i total = _mm256_setzero_si256();
    for (int64_t i = 0; i < blk; i += 32) {
        // cvtps rounds to nearest even (the default MXCSR mode), like nearbyint above
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i), vinv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 8), vinv));
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 16), vinv));
        __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 24), vinv));
        total = _mm256_add_epi32(total, _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, e)));
        // pack 32 int32 -> 32 int8 in order (packs work per 128-bit lane: fix the order after)
        __m256i ab = _mm256_packs_epi32(a, b), ce = _mm256_packs_epi32(c, e);
        __m256i all = _mm256_packs_epi16(ab, ce);
        all = _mm256_permutevar8x32_epi32(all, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), all);
    }
    *d = scale;
    *sum = hsum_i32(total);
}
#endif

}  // namespace

void QuantizedRows::shape(uint32_t t, int64_t count, int64_t width) {
    type = t;
    n = width;
    const int64_t nb = n / i8_block(type);
    q.resize(static_cast<size_t>(count * n));
    d.resize(static_cast<size_t>(count * nb));
    sum.resize(d.size());
    rows.resize(static_cast<size_t>(count));
    for (int64_t r = 0; r < count; ++r) rows[static_cast<size_t>(r)] = QuantRow{q.data() + r * n, d.data() + r * nb, sum.data() + r * nb};
}

void QuantizedRows::quantize_row(int64_t t, const float* x) {
    const int64_t nb = n / i8_block(type);
    quantize_rows_i8(type, x, 1, n, q.data() + t * n, d.data() + t * nb, sum.data() + t * nb);
}

void QuantizedRows::quantize(uint32_t t, const float* x, int64_t count, int64_t width) {
    shape(t, count, width);
    quantize_rows_i8(type, x, count, n, q.data(), d.data(), sum.data());
}

void quantize_rows_i8(uint32_t type, const float* x, int64_t rows, int64_t n, int8_t* q, float* d, int32_t* sum) {
    const int64_t blk = i8_block(type), per_row = n / blk;
    // The Q2_0 layouts: element 4i+l of each weight group of G goes to l*(G/4)+i first.
    const int64_t group = type == kQ2_0 ? 64 : type == kPQ2_0 || type == kQ2_0_G128 ? 128 : 0;
    std::vector<float> perm(group ? static_cast<size_t>(n) : 0);
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = x + r * n;
        if (group) {
            for (int64_t g = 0; g < n; g += group)
                for (int64_t i = 0; i < group / 4; ++i)
                    for (int64_t l = 0; l < 4; ++l) perm[static_cast<size_t>(g + l * (group / 4) + i)] = row[g + 4 * i + l];
            row = perm.data();
        }
        for (int64_t b = 0; b < per_row; ++b) {
#ifdef PULSE_X86
            if (have_avx2()) {
                quantize_block_avx2(row + b * blk, blk, q + r * n + b * blk, d + r * per_row + b, sum + r * per_row + b);
                continue;
            }
#endif
#ifdef PULSE_ARM64
            if (have_neon()) {
                arm::quantize_block(row + b * blk, blk, q + r * n + b * blk, d + r * per_row + b, sum + r * per_row + b);
                continue;
            }
#endif
            quantize_block_scalar(row + b * blk, blk, q + r * n + b * blk, d + r * per_row + b, sum + r * per_row + b);
        }
    }
}

bool has_x8() {
#ifdef PULSE_X86
    return have_vnni();
#else
    return false;
#endif
}

void repack_q8_0x8(const uint8_t* rows, uint64_t row_bytes, int64_t n, uint8_t* out) {
    for (int64_t b = 0; b < n / 32; ++b, out += kQ8x8Bytes) {
        for (int r = 0; r < 8; ++r) {
            const uint8_t* blk = rows + static_cast<uint64_t>(r) * row_bytes + 34 * b;
            std::memcpy(out + 2 * r, blk, 2);  // the f16 scale
            for (int k = 0; k < 8; ++k)
                for (int j = 0; j < 4; ++j) out[16 + 32 * k + 4 * r + j] = static_cast<uint8_t>(blk[2 + 4 * k + j] ^ 0x80);  // + 128
        }
    }
}

void repack_tq2_0x8(const uint8_t* rows, uint64_t row_bytes, int64_t n, uint8_t* out) {
    for (int64_t b = 0; b < n / 256; ++b, out += kTQ2x8Bytes) {
        for (int r = 0; r < 8; ++r) {
            const uint8_t* blk = rows + static_cast<uint64_t>(r) * row_bytes + 66 * b;
            std::memcpy(out + 2 * r, blk + 64, 2);  // the f16 scale
            // The file's byte 32h+m holds elements 128h+32l+m in bits 2l..2l+1.
            auto code = [&](int e) { return (blk[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; };
            for (int j = 0; j < 16; ++j)
                for (int k = 0; k < 4; ++k) {
                    int byte = 0;
                    for (int l = 0; l < 4; ++l) byte |= code(16 * j + 4 * l + k) << (2 * l);
                    out[16 + 32 * j + 4 * r + k] = static_cast<uint8_t>(byte);
                }
        }
    }
}

int dot_x16_tokens(uint32_t) { return kDotX16MaxTokens; }

void dot_x16(uint32_t type, const uint8_t* packed, uint64_t next, const QuantRow* x, int T, int64_t n, float* out) {
    if (T < 1 || T > dot_x16_tokens(type)) throw std::invalid_argument("dot_x16: " + std::to_string(T) + " tokens in one pass");
#ifdef PULSE_X86
    if (have_vnni()) {
        if (type == kQ8_0) switch (T) {
                case 8: return q8_0x16_vnni<8>(packed, next, x, n, out);
                case 7: return q8_0x16_vnni<7>(packed, next, x, n, out);
                case 6: return q8_0x16_vnni<6>(packed, next, x, n, out);
                case 5: return q8_0x16_vnni<5>(packed, next, x, n, out);
                case 4: return q8_0x16_vnni<4>(packed, next, x, n, out);
                case 3: return q8_0x16_vnni<3>(packed, next, x, n, out);
                case 2: return q8_0x16_vnni<2>(packed, next, x, n, out);
                default: return q8_0x16_vnni<1>(packed, next, x, n, out);
            }
        switch (T) {
            case 8: return tq2_0x16_vnni_wide<8>(packed, next, x, n, out);
            case 7: return tq2_0x16_vnni_wide<7>(packed, next, x, n, out);
            case 6: return tq2_0x16_vnni_wide<6>(packed, next, x, n, out);
            case 5: return tq2_0x16_vnni_wide<5>(packed, next, x, n, out);
            case 4: return tq2_0x16_vnni<4>(packed, next, x, n, out);
            case 3: return tq2_0x16_vnni<3>(packed, next, x, n, out);
            case 2: return tq2_0x16_vnni<2>(packed, next, x, n, out);
            default: return tq2_0x16_vnni<1>(packed, next, x, n, out);
        }
    }
#endif
    (void)type, (void)packed, (void)next, (void)x, (void)T, (void)n, (void)out;
}

void matmul_rows_i8(uint32_t type, const RowRange& rr, const QuantRow* x, int T, int64_t n) {
    if (T < 1 || T > 4) throw std::invalid_argument("matmul_rows_i8: " + std::to_string(T) + " tokens in one call (1 to 4)");
    if (!i8_block(type)) throw std::invalid_argument("matmul_rows_i8: no int8 dot for weight type " + std::to_string(type));
#ifdef PULSE_ARM64
    if (have_i8mm()) return arm::matmul_rows_i8_i8mm(type, rr, x, T, n);
    if (have_dotprod()) return arm::matmul_rows_i8_dotprod(type, rr, x, T, n);
    if (have_neon()) return arm::matmul_rows_i8_neon(type, rr, x, T, n);
#endif
#ifdef PULSE_X86
    // Several tokens: two rows at a time with VNNI (AVX512VL's 32 registers hold them); one row
    // per call otherwise and for single tokens (decode reads one weight stream per thread).
    if (have_vnni()) switch (T) {
            case 4: return i8_rows_range_vnni<2, 4>(type, rr, x, n);
            case 3: return i8_rows_range_vnni<2, 3>(type, rr, x, n);
            case 2: return i8_rows_range_vnni<2, 2>(type, rr, x, n);
            default: return i8_rows_range_vnni<1, 1>(type, rr, x, n);
        }
    if (have_avx2()) switch (T) {
            case 4: return i8_rows_range_avx2<1, 4>(type, rr, x, n);
            case 3: return i8_rows_range_avx2<1, 3>(type, rr, x, n);
            case 2: return i8_rows_range_avx2<1, 2>(type, rr, x, n);
            default: return i8_rows_range_avx2<1, 1>(type, rr, x, n);
        }
#endif
    // The portable path: the reference arithmetic itself.
    for (int64_t o = rr.o0; o < rr.o1; ++o)
        for (int t = 0; t < T; ++t)
            rr.y[t * rr.y_stride + o] = i8_dot_reference(type, rr.base + static_cast<uint64_t>(o) * rr.row_bytes, x[t], n) * rr.scale;
}

float dot_row(uint32_t type, const uint8_t* row, const float* x, int64_t n, float* scratch) {
#ifdef PULSE_X86
    if (have_avx2()) {
        if (type == kQ8_0) return dot_q8_0_avx2(row, x, n);
        if (type == kTQ2_0) return dot_tq2_0_avx2(row, x, n);
    }
#endif
    if (type == kF32) return dot_f32(reinterpret_cast<const float*>(row), x, n);
    dequantize_row(type, row, scratch, n);
    return dot_f32(scratch, x, n);
}

void limit_kernels(const char* name) {
    const std::string n = name ? name : "";
    if (n.empty()) {
        kernel_cap = kTopLevel;
        return;
    }
    for (int l = 0; l <= kTopLevel; ++l)
        if (n == kLevelNames[l]) {
            kernel_cap = l;
            return;
        }
    std::string known;
    for (const char* k : kLevelNames) known += (known.empty() ? "" : ", ") + std::string(k);
    throw std::invalid_argument("unknown kernel level '" + n + "' (this architecture has: " + known + ")");
}

const char* kernel_name() {
#ifdef PULSE_X86
    if (have_vnni()) return "avx512vnni";
    if (have_avx2()) return "avx2";
#endif
#ifdef PULSE_ARM64
    if (have_i8mm()) return "i8mm";
    if (have_dotprod()) return "dotprod";
    if (have_neon()) return "neon";
#endif
    return "scalar";
}

std::vector<std::string> kernel_levels() {
    const int saved = kernel_cap;
    std::vector<std::string> levels;
    for (int l = 0; l <= kTopLevel; ++l) {
        kernel_cap = l;
        if (kernel_name() == std::string(kLevelNames[l])) levels.push_back(kLevelNames[l]);
    }
    kernel_cap = saved;
    return levels;
}

}  // namespace pulse::decoder
