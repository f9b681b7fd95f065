#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gguf.h"
#include "quants.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define PULSE_X86 1
#endif

namespace pulse::decoder {

namespace {

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

// |w| x sign(x, w): the maddubs trick for signed x signed int8 products.
__attribute__((target("avx2,fma"))) inline void i8_block4(__m256i w, const int8_t* xq, int64_t n, const float* scale, __m256 acc[4]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i aw = _mm256_sign_epi8(w, w);
    for (int k = 0; k < 4; ++k) {
        __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + k * n));
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones);
        acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale[k]), acc[k]);
    }
}

__attribute__((target("avx2,fma,f16c"))) void dot4_q8_0_i8(const uint8_t* s, const int8_t* xq, const float* xd, int64_t n, float out[4]) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; ++b, s += 34) {
        float dw = _cvtsh_ss(rd16(s));
        float sc[4] = {dw * xd[b], dw * xd[nb + b], dw * xd[2 * nb + b], dw * xd[3 * nb + b]};
        i8_block4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2)), xq + 32 * b, n, sc, acc);
    }
    for (int k = 0; k < 4; ++k) out[k] = hsum(acc[k]);
}

__attribute__((target("avx2,fma,f16c"))) void dot4_tq2_0_i8(const uint8_t* s, const int8_t* xq, const float* xd, int64_t n, float out[4]) {
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const int64_t nb = n / 32;
    for (int64_t blk = 0; blk < n / 256; ++blk, s += 66) {
        float dw = _cvtsh_ss(rd16(s + 64));
        for (int h = 0; h < 2; ++h) {
            __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32 * h));
            for (int l = 0; l < 4; ++l) {
                int64_t j = blk * 8 + 4 * h + l;  // the 32-element activation block
                float sc[4] = {dw * xd[j], dw * xd[nb + j], dw * xd[2 * nb + j], dw * xd[3 * nb + j]};
                __m256i w = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 2 * l), three), one);
                i8_block4(w, xq + 32 * j, n, sc, acc);
            }
        }
    }
    for (int k = 0; k < 4; ++k) out[k] = hsum(acc[k]);
}

bool have_avx2() {
    // F16C through cpuid: not every compiler's __builtin_cpu_supports knows "f16c" (clang 14).
    static const bool yes = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }();
    return yes;
}
#endif

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) {
#ifdef PULSE_X86
    if (have_avx2()) return dot_f32_avx2(a, b, n);
#endif
    return dot_f32_scalar(a, b, n);
}

void dot4_f32(const float* w, const float* x, int64_t n, float out[4]) {
#ifdef PULSE_X86
    if (have_avx2()) return dot4_f32_avx2(w, x, n, out);
#endif
    for (int k = 0; k < 4; ++k) out[k] = dot_f32_scalar(w, x + k * n, n);
}

void quantize_act_q8(const float* x, int64_t n, int8_t* q, float* d) {
    for (int64_t b = 0; b < n / 32; ++b) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
        float scale = amax / 127, inv = scale ? 1 / scale : 0;
        d[b] = scale;
        for (int i = 0; i < 32; ++i) q[32 * b + i] = static_cast<int8_t>(std::lrint(x[32 * b + i] * inv));
    }
}

bool has_i8_kernel(uint32_t type) {
#ifdef PULSE_X86
    return have_avx2() && (type == kQ8_0 || type == kTQ2_0);
#else
    (void)type;
    return false;
#endif
}

bool dot4_row_i8(uint32_t type, const uint8_t* row, const int8_t* xq, const float* xd, int64_t n, float out[4]) {
#ifdef PULSE_X86
    if (have_avx2()) {
        if (type == kQ8_0) return dot4_q8_0_i8(row, xq, xd, n, out), true;
        if (type == kTQ2_0) return dot4_tq2_0_i8(row, xq, xd, n, out), true;
    }
#endif
    (void)type, (void)row, (void)xq, (void)xd, (void)n, (void)out;
    return false;
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

const char* kernel_name() {
#ifdef PULSE_X86
    if (have_avx2()) return "avx2";
#endif
    return "scalar";
}

}  // namespace pulse::decoder
