// Per-element math shared by every device: the weight formats' element decoders, the
// activation functions, the RoPE frequencies and the Gated DeltaNet gates, `__host__ __device__`
// under nvcc and plain inline functions in C++. The CPU device calls the activations, gates,
// RoPE and half conversion directly; for weights it decodes whole rows (quants.cpp, a block's
// scales once), and a test checks these element decoders give that row decoder's bits on random
// blocks of every type. So what the CUDA kernels run is checked on a machine without a GPU.
//
// Element j of a block: `element<TYPE>(block, j)`, for j below `Format<TYPE>::elems`, reading
// only that block's bytes. Layouts: docs/DECODER.md, "The model" (Weights).
#pragma once

#include <math.h>
#include <stdint.h>

#include "format/gguf.h"  // the type numbers

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define PULSE_HD __host__ __device__ __forceinline__
#else
#define PULSE_HD inline
#endif

namespace pulse::decoder::blocks {

PULSE_HD float bits_to_float(uint32_t bits) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
#endif
}

// IEEE half to float, exact for every input (subnormals, infinities, NaN payloads); the GPU's
// own conversion is exact too, so both give the same bits.
PULSE_HD float half_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#endif
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while (!(mant & 0x400u));
            bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    return bits_to_float(bits);
}

PULSE_HD float bf16_bits_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

PULSE_HD uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Elements and bytes per block.
template <uint32_t T> struct Format;
template <> struct Format<kF32> { static constexpr int elems = 1, bytes = 4; };
template <> struct Format<kF16> { static constexpr int elems = 1, bytes = 2; };
template <> struct Format<kBF16> { static constexpr int elems = 1, bytes = 2; };
template <> struct Format<kQ8_0> { static constexpr int elems = 32, bytes = 34; };
template <> struct Format<kTQ2_0> { static constexpr int elems = 256, bytes = 66; };
template <> struct Format<kTQ1_0> { static constexpr int elems = 256, bytes = 54; };
template <> struct Format<kQ2_0> { static constexpr int elems = 64, bytes = 18; };
template <> struct Format<kPQ2_0> { static constexpr int elems = 128, bytes = 34; };
template <> struct Format<kQ2_0_G128> { static constexpr int elems = 128, bytes = 34; };
template <> struct Format<kQ1_0> { static constexpr int elems = 128, bytes = 18; };
template <> struct Format<kPTQ1_0> { static constexpr int elems = 128, bytes = 28; };
template <> struct Format<kQ4_K> { static constexpr int elems = 256, bytes = 144; };
template <> struct Format<kQ6_K> { static constexpr int elems = 256, bytes = 210; };

// Trit n (0 = most significant) of a byte holding five (or four) base-3 digits as
// ceil(v·256/243): ggml's kTQ1_0 packing.
PULSE_HD int trit(uint8_t b, int n) {
    const int pow3 = n == 0 ? 1 : n == 1 ? 3 : n == 2 ? 9 : n == 3 ? 27 : 81;
    return static_cast<int>((static_cast<uint8_t>(b * pow3) * 3u) >> 8);
}

// The base-3 layouts: a bytes of five trits (element a·t + m in trit t of byte m), b bytes of
// five trits (elements 5a + b·t + m), h bytes of four trits (5a + 5b + h·t + j), the f16 scale.
template <int A, int B, int H>
PULSE_HD float base3_element(const uint8_t* s, int j) {
    const float d = half_to_float(rd16(s + A + B + H));
    int byte, t;
    if (j < 5 * A) {
        byte = j % A, t = j / A;
    } else if (j < 5 * A + 5 * B) {
        byte = A + (j - 5 * A) % B, t = (j - 5 * A) / B;
    } else {
        byte = A + B + (j - 5 * A - 5 * B) % H, t = (j - 5 * A - 5 * B) / H;
    }
    return static_cast<float>(trit(s[byte], t) - 1) * d;
}

// kQ2_0 layouts: the f16 scale, then four 2-bit codes per byte (element j in bits 2(j%4) of
// byte j/4); value (code - 1)·d, so code 3 is +2d.
PULSE_HD float q2_element(const uint8_t* s, int j) {
    return static_cast<float>(((s[2 + j / 4] >> (2 * (j % 4))) & 3) - 1) * half_to_float(rd16(s));
}

// kQ4_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
PULSE_HD void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

template <uint32_t T> PULSE_HD float element(const uint8_t* s, int j);

template <> PULSE_HD float element<kF32>(const uint8_t* s, int) {
    return bits_to_float(static_cast<uint32_t>(s[0]) | (static_cast<uint32_t>(s[1]) << 8) | (static_cast<uint32_t>(s[2]) << 16) |
                         (static_cast<uint32_t>(s[3]) << 24));
}
template <> PULSE_HD float element<kF16>(const uint8_t* s, int) { return half_to_float(rd16(s)); }
template <> PULSE_HD float element<kBF16>(const uint8_t* s, int) { return bf16_bits_to_float(rd16(s)); }
template <> PULSE_HD float element<kQ8_0>(const uint8_t* s, int j) {
    return half_to_float(rd16(s)) * static_cast<float>(static_cast<int8_t>(s[2 + j]));
}
// kTQ2_0: 64 bytes of four 2-bit codes (element 128h + 32l + m in bits 2l of byte 32h + m), then
// the f16 scale; value (code - 1)·d.
template <> PULSE_HD float element<kTQ2_0>(const uint8_t* s, int j) {
    const int h = j / 128, l = (j % 128) / 32, m = j % 32;
    return static_cast<float>(((s[32 * h + m] >> (2 * l)) & 3) - 1) * half_to_float(rd16(s + 64));
}
template <> PULSE_HD float element<kTQ1_0>(const uint8_t* s, int j) { return base3_element<32, 16, 4>(s, j); }
template <> PULSE_HD float element<kPTQ1_0>(const uint8_t* s, int j) { return base3_element<16, 8, 2>(s, j); }
template <> PULSE_HD float element<kQ2_0>(const uint8_t* s, int j) { return q2_element(s, j); }
template <> PULSE_HD float element<kPQ2_0>(const uint8_t* s, int j) { return q2_element(s, j); }
template <> PULSE_HD float element<kQ2_0_G128>(const uint8_t* s, int j) { return q2_element(s, j); }
// kQ1_0: the f16 scale, then one bit per weight (element j in bit j%8 of byte j/8): +d or -d.
template <> PULSE_HD float element<kQ1_0>(const uint8_t* s, int j) {
    const float d = half_to_float(rd16(s));
    return (s[2 + j / 8] >> (j % 8)) & 1 ? d : -d;
}
// kQ4_K: f16 d and dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles: chunk c of 64
// elements is the low nibbles (first 32, sub-block 2c) then the high ones (sub-block 2c+1) of
// bytes 32c..32c+31.
template <> PULSE_HD float element<kQ4_K>(const uint8_t* s, int j) {
    const float d = half_to_float(rd16(s)), dmin = half_to_float(rd16(s + 2));
    const int c = j / 64, hi = (j % 64) / 32, l = j % 32;
    uint8_t a, m;
    scale_min_k4(2 * c + hi, s + 4, a, m);
    const uint8_t q = s[16 + 32 * c + l];
    return d * a * static_cast<float>(hi ? q >> 4 : q & 0xF) - dmin * m;
}
// kQ6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, f16 d; each half of
// 128 elements in four quarters of 32 (ggml's dequantize_row_q6_K order).
template <> PULSE_HD float element<kQ6_K>(const uint8_t* s, int j) {
    const int k = j / 128, qq = (j % 128) / 32, l = j % 32;
    const uint8_t* ql = s + 64 * k;
    const uint8_t* qh = s + 128 + 32 * k;
    const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192 + 8 * k);
    const uint8_t low = ql[l + 32 * (qq & 1)];
    const int q = ((qq >= 2 ? low >> 4 : low & 0xF) | (((qh[l] >> (2 * qq)) & 3) << 4)) - 32;
    return half_to_float(rd16(s + 208)) * sc[l / 16 + 2 * qq] * static_cast<float>(q);
}

// f(Tag<TYPE>{}) for the type number `type` (host code: it picks the kernel to run); false
// when it is not a weight format here.
template <uint32_t T> struct Tag { static constexpr uint32_t type = T; };
template <class F>
inline bool with_type(uint32_t type, F&& f) {
    switch (type) {
        case kF32: f(Tag<kF32>{}); return true;
        case kF16: f(Tag<kF16>{}); return true;
        case kBF16: f(Tag<kBF16>{}); return true;
        case kQ8_0: f(Tag<kQ8_0>{}); return true;
        case kTQ2_0: f(Tag<kTQ2_0>{}); return true;
        case kTQ1_0: f(Tag<kTQ1_0>{}); return true;
        case kQ2_0: f(Tag<kQ2_0>{}); return true;
        case kPQ2_0: f(Tag<kPQ2_0>{}); return true;
        case kQ2_0_G128: f(Tag<kQ2_0_G128>{}); return true;
        case kQ1_0: f(Tag<kQ1_0>{}); return true;
        case kPTQ1_0: f(Tag<kPTQ1_0>{}); return true;
        case kQ4_K: f(Tag<kQ4_K>{}); return true;
        case kQ6_K: f(Tag<kQ6_K>{}); return true;
        default: return false;
    }
}

// Activations and gates.
PULSE_HD float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
PULSE_HD float silu(float x) { return x * sigmoid(x); }
PULSE_HD float softplus(float x) { return x > 20 ? x : log1pf(expf(x)); }
// Gated DeltaNet: the write strength β = σ(b) and the decay e = exp(softplus(a + dt_bias)·A),
// A = -exp(A_log) as stored at load.
PULSE_HD float gdn_beta(float b) { return sigmoid(b); }
PULSE_HD float gdn_log_decay(float alpha, float dt_bias, float a) { return softplus(alpha + dt_bias) * a; }
PULSE_HD float gdn_decay(float alpha, float dt_bias, float a) { return expf(gdn_log_decay(alpha, dt_bias, a)); }

// NeoX partial RoPE over the first R dims: pair (i, i + R/2) turns by pos · base^(-2i/R).
PULSE_HD double rope_inv_freq(double base, int64_t i, int64_t R) {
    return pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(R));
}
// A pair turned by the angle whose cosine and sine (as f32) are c and sn: the CPU device works
// them out once per position and turns every head's pairs with them.
PULSE_HD void rotate_pair(float& a, float& b, float c, float sn) {
    const float x = a, y = b;
    a = x * c - y * sn;
    b = x * sn + y * c;
}
// The angle's cosine and sine as the rotation takes them (computed in double, rounded to f32).
PULSE_HD void rope_cos_sin(double theta, float& c, float& sn) {
    c = static_cast<float>(cos(theta));
    sn = static_cast<float>(sin(theta));
}
PULSE_HD void rope_pair(float& a, float& b, double theta) {
    float c, sn;
    rope_cos_sin(theta, c, sn);
    rotate_pair(a, b, c, sn);
}

// The Hadamard fold's head permutation (hadamard.h): the Gated DeltaNet output's element in
// tiled head order (d + S·m + S·Hk·r) to its place in grouped order (d + S·r + S·rep·m).
PULSE_HD int64_t grouped_index(int64_t tiled, int64_t S, int64_t Hk, int64_t rep) {
    const int64_t d = tiled % S, m = (tiled / S) % Hk, r = tiled / (S * Hk);
    return d + S * r + S * rep * m;
}

}  // namespace pulse::decoder::blocks
