#include "format/quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "format/blocks.h"
#include "format/gguf.h"

namespace pulse::decoder {

float fp16_to_f32(uint16_t h) { return blocks::half_to_float(h); }

uint16_t f32_to_fp16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return static_cast<uint16_t>(sign);
        mant |= 0x800000u;
        uint32_t shift = static_cast<uint32_t>(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) ++half;
        return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;  // may carry into the exponent: correct
    return static_cast<uint16_t>(half);
}

float bf16_to_f32(uint16_t h) { return blocks::bf16_bits_to_float(h); }

uint16_t f32_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 64);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1);
    return static_cast<uint16_t>(x >> 16);
}

namespace {

using blocks::rd16;
using blocks::scale_min_k4;
using blocks::trit;

float round_half_away(float x) { return x < 0 ? -std::floor(-x + 0.5f) : std::floor(x + 0.5f); }

// The base-3 ternary layouts (TQ1_0, PTQ1_0): a run of `a` bytes of five trits (element a·t + m
// in trit t of byte m, the first the most significant), a run of `b` bytes of five trits
// (elements 5a + b·t + m), `h` bytes of four trits (5a + 5b + h·t + j), then the f16 scale.
struct Base3 {
    int a, b, h;
    int block() const { return 5 * a + 5 * b + 4 * h; }
    int bytes() const { return a + b + h + 2; }
};
constexpr Base3 kTq1{32, 16, 4}, kPtq1{16, 8, 2};

void dequantize_base3(const Base3& g, const uint8_t* s, float* y, int64_t n) {
    for (int64_t blk = 0; blk < n / g.block(); ++blk, s += g.bytes(), y += g.block()) {
        float d = fp16_to_f32(rd16(s + g.a + g.b + g.h));
        for (int t = 0; t < 5; ++t)
            for (int m = 0; m < g.a; ++m) y[g.a * t + m] = static_cast<float>(trit(s[m], t) - 1) * d;
        for (int t = 0; t < 5; ++t)
            for (int m = 0; m < g.b; ++m) y[5 * g.a + g.b * t + m] = static_cast<float>(trit(s[g.a + m], t) - 1) * d;
        for (int t = 0; t < 4; ++t)
            for (int j = 0; j < g.h; ++j) y[5 * g.a + 5 * g.b + g.h * t + j] = static_cast<float>(trit(s[g.a + g.b + j], t) - 1) * d;
    }
}

// t·amax with t = round(x/amax) in {-1, 0, 1}; byte = ceil(v·256/243) of the trits' value v.
void quantize_base3(const Base3& g, const float* x, uint8_t* o, int64_t n) {
    for (int64_t blk = 0; blk < n / g.block(); ++blk, o += g.bytes(), x += g.block()) {
        float amax = 0;
        for (int j = 0; j < g.block(); ++j) amax = std::max(amax, std::fabs(x[j]));
        float id = amax ? 1 / amax : 0;
        auto t = [&](int e) { return static_cast<int>(round_half_away(x[e] * id)) + 1; };
        auto pack = [](int v) { return static_cast<uint8_t>((v * 256 + 242) / 243); };
        auto run = [&](int first_byte, int count, int first_elem, int trits) {
            for (int m = 0; m < count; ++m) {
                int v = 0;
                for (int k = 0; k < trits; ++k) v = v * 3 + t(first_elem + count * k + m);
                o[first_byte + m] = pack(trits == 5 ? v : v * 3);
            }
        };
        run(0, g.a, 0, 5);
        run(g.a, g.b, 5 * g.a, 5);
        run(g.a + g.b, g.h, 5 * g.a + 5 * g.b, 4);
        uint16_t d = f32_to_fp16(amax);
        std::memcpy(o + g.a + g.b + g.h, &d, 2);
    }
}

}  // namespace

// Whole rows, block by block, for the CPU: a block's scales decoded once. blocks.h's element
// decoders (what the CUDA kernels run) are checked bit for bit against this on every type.
void dequantize_row(uint32_t type, const uint8_t* s, float* y, int64_t n) {
    switch (type) {
        case kF32: std::memcpy(y, s, static_cast<size_t>(n) * 4); return;
        case kF16:
            for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_f32(rd16(s + 2 * i));
            return;
        case kBF16:
            for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(rd16(s + 2 * i));
            return;
        case kQ8_0:
            for (int64_t b = 0; b < n / 32; ++b, s += 34) {
                float d = fp16_to_f32(rd16(s));
                for (int j = 0; j < 32; ++j) *y++ = d * static_cast<float>(static_cast<int8_t>(s[2 + j]));
            }
            return;
        case kTQ2_0:
            for (int64_t b = 0; b < n / 256; ++b, s += 66, y += 256) {
                float d = fp16_to_f32(rd16(s + 64));
                for (int h = 0; h < 2; ++h)
                    for (int l = 0; l < 4; ++l)
                        for (int m = 0; m < 32; ++m) y[128 * h + 32 * l + m] = static_cast<float>(((s[32 * h + m] >> (2 * l)) & 3) - 1) * d;
            }
            return;
        case kTQ1_0: return dequantize_base3(kTq1, s, y, n);
        case kQ2_0:
        case kPQ2_0:
        case kQ2_0_G128: {
            // Scale first, then four 2-bit codes per byte (element j in bits 2(j%4) of byte j/4);
            // value (code - 1)·d, so code 3 is +2d.
            const int64_t g = type == kQ2_0 ? 64 : 128;
            for (int64_t b = 0; b < n / g; ++b, s += 2 + g / 4, y += g) {
                float d = fp16_to_f32(rd16(s));
                for (int64_t j = 0; j < g; ++j) y[j] = static_cast<float>(((s[2 + j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
            }
            return;
        }
        case kQ1_0:
            for (int64_t b = 0; b < n / 128; ++b, s += 18, y += 128) {
                float d = fp16_to_f32(rd16(s));
                for (int j = 0; j < 128; ++j) y[j] = (s[2 + j / 8] >> (j % 8)) & 1 ? d : -d;
            }
            return;
        case kPTQ1_0: return dequantize_base3(kPtq1, s, y, n);  // TQ1_0's packing in groups of 128
        case kQ4_K:
            for (int64_t b = 0; b < n / 256; ++b, s += 144) {
                float d = fp16_to_f32(rd16(s)), dmin = fp16_to_f32(rd16(s + 2));
                const uint8_t* sc = s + 4;
                const uint8_t* q = s + 16;
                for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
                    uint8_t a, m;
                    scale_min_k4(is, sc, a, m);
                    float d1 = d * a, m1 = dmin * m;
                    scale_min_k4(is + 1, sc, a, m);
                    float d2 = d * a, m2 = dmin * m;
                    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
                    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
                }
            }
            return;
        case kQ6_K:
            for (int64_t b = 0; b < n / 256; ++b, s += 210) {
                const uint8_t* ql = s;
                const uint8_t* qh = s + 128;
                const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192);
                float d = fp16_to_f32(rd16(s + 208));
                for (int k = 0; k < 256; k += 128, y += 128, ql += 64, qh += 32, sc += 8)
                    for (int l = 0; l < 32; ++l) {
                        int is = l / 16;
                        int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                        int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                        int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                        int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                        y[l] = d * sc[is] * static_cast<float>(q1);
                        y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
                        y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
                        y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
                    }
            }
            return;
        default: throw std::invalid_argument("dequantize_row: unsupported type " + type_name(type));
    }
}

std::vector<uint8_t> quantize(uint32_t type, const float* x, int64_t n) {
    const TypeTraits* tt = type_traits(type);
    if (!tt || !tt->supported || n % tt->block) throw std::invalid_argument("quantize: bad type or length");
    std::vector<uint8_t> out(static_cast<size_t>(n / tt->block * tt->bytes));
    uint8_t* o = out.data();
    auto put16 = [](uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); };
    switch (type) {
        case kF32: std::memcpy(o, x, static_cast<size_t>(n) * 4); break;
        case kF16:
            for (int64_t i = 0; i < n; ++i) put16(o + 2 * i, f32_to_fp16(x[i]));
            break;
        case kBF16:
            for (int64_t i = 0; i < n; ++i) put16(o + 2 * i, f32_to_bf16(x[i]));
            break;
        case kQ8_0:
            for (int64_t b = 0; b < n / 32; ++b, o += 34, x += 32) {
                float amax = 0;
                for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
                float d = amax / 127, id = d ? 1 / d : 0;
                put16(o, f32_to_fp16(d));
                for (int j = 0; j < 32; ++j) o[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(round_half_away(x[j] * id)));
            }
            break;
        case kTQ2_0:
            for (int64_t b = 0; b < n / 256; ++b, o += 66, x += 256) {
                float amax = 0;
                for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[j]));
                float id = amax ? 1 / amax : 0;
                std::memset(o, 0, 64);
                for (int e = 0; e < 256; ++e) {
                    int q = static_cast<int>(round_half_away(x[e] * id)) + 1;
                    int h = e / 128, l = (e % 128) / 32, m = e % 32;
                    o[32 * h + m] |= static_cast<uint8_t>(q << (2 * l));
                }
                put16(o + 64, f32_to_fp16(amax));
            }
            break;
        case kTQ1_0: quantize_base3(kTq1, x, o, n); break;
        case kQ2_0:
        case kPQ2_0:
        case kQ2_0_G128: {
            // d = max(largest negative magnitude, largest positive / 2): weights t·d with t in
            // {-1, 0, 1, 2} round-trip exactly (llama.cpp's reference quantizer never uses +2).
            const int64_t g = type == kQ2_0 ? 64 : 128;
            for (int64_t b = 0; b < n / g; ++b, o += 2 + g / 4, x += g) {
                float neg = 0, pos = 0;
                for (int64_t j = 0; j < g; ++j) neg = std::max(neg, -x[j]), pos = std::max(pos, x[j]);
                uint16_t dh = f32_to_fp16(std::max(neg, pos / 2));
                float d = fp16_to_f32(dh), id = d ? 1 / d : 0;
                put16(o, dh);
                std::memset(o + 2, 0, static_cast<size_t>(g / 4));
                for (int64_t j = 0; j < g; ++j) {
                    int q = std::clamp(static_cast<int>(round_half_away(x[j] * id)), -1, 2) + 1;
                    o[2 + j / 4] |= static_cast<uint8_t>(q << (2 * (j % 4)));
                }
            }
            break;
        }
        case kQ1_0:
            for (int64_t b = 0; b < n / 128; ++b, o += 18, x += 128) {
                float sum = 0;  // llama.cpp's reference: d = mean |x|, one sign bit each
                for (int j = 0; j < 128; ++j) sum += std::fabs(x[j]);
                put16(o, f32_to_fp16(sum / 128));
                std::memset(o + 2, 0, 16);
                for (int j = 0; j < 128; ++j)
                    if (x[j] >= 0) o[2 + j / 8] |= static_cast<uint8_t>(1 << (j % 8));
            }
            break;
        case kPTQ1_0: quantize_base3(kPtq1, x, o, n); break;
        case kQ4_K:
            for (int64_t b = 0; b < n / 256; ++b, o += 144, x += 256) {
                // Per 32-element sub-block: x ≈ s·q − m with q in 0..15, m >= 0.
                float sub_s[8], sub_m[8];
                for (int k = 0; k < 8; ++k) {
                    float lo = 0, hi = 0;
                    for (int j = 0; j < 32; ++j) lo = std::min(lo, x[32 * k + j]), hi = std::max(hi, x[32 * k + j]);
                    sub_m[k] = -lo;
                    sub_s[k] = (hi - lo) / 15;
                }
                float ms = *std::max_element(sub_s, sub_s + 8), mm = *std::max_element(sub_m, sub_m + 8);
                float d = ms / 63, dmin = mm / 63;
                put16(o, f32_to_fp16(d));
                put16(o + 2, f32_to_fp16(dmin));
                float df = fp16_to_f32(f32_to_fp16(d)), dminf = fp16_to_f32(f32_to_fp16(dmin));
                uint8_t sc[8], mn[8];
                for (int k = 0; k < 8; ++k) {
                    sc[k] = static_cast<uint8_t>(std::clamp(static_cast<int>(std::lround(df ? sub_s[k] / df : 0)), 0, 63));
                    mn[k] = static_cast<uint8_t>(std::clamp(static_cast<int>(std::lround(dminf ? sub_m[k] / dminf : 0)), 0, 63));
                }
                uint8_t* s12 = o + 4;
                std::memset(s12, 0, 12);
                for (int j = 0; j < 4; ++j) {
                    s12[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
                    s12[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
                    s12[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
                }
                uint8_t* q = o + 16;
                for (int j = 0; j < 256; j += 64, q += 32) {
                    int k0 = j / 32, k1 = k0 + 1;
                    float s0 = df * sc[k0], m0 = dminf * mn[k0], s1 = df * sc[k1], m1 = dminf * mn[k1];
                    for (int l = 0; l < 32; ++l) {
                        int a = s0 ? std::clamp(static_cast<int>(std::lround((x[j + l] + m0) / s0)), 0, 15) : 0;
                        int c = s1 ? std::clamp(static_cast<int>(std::lround((x[j + 32 + l] + m1) / s1)), 0, 15) : 0;
                        q[l] = static_cast<uint8_t>(a | (c << 4));
                    }
                }
            }
            break;
        case kQ6_K:
            for (int64_t b = 0; b < n / 256; ++b, o += 210, x += 256) {
                float sub[16];
                for (int k = 0; k < 16; ++k) {
                    float amax = 0;
                    for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[16 * k + j]));
                    sub[k] = amax / 31;
                }
                float ms = *std::max_element(sub, sub + 16);
                float d = ms / 127;
                put16(o + 208, f32_to_fp16(d));
                float df = fp16_to_f32(f32_to_fp16(d));
                int8_t* sc = reinterpret_cast<int8_t*>(o + 192);
                for (int k = 0; k < 16; ++k) sc[k] = static_cast<int8_t>(std::clamp(static_cast<int>(std::lround(df ? sub[k] / df : 0)), -128, 127));
                int qv[256];
                for (int e = 0; e < 256; ++e) {
                    float s = df * sc[e / 16];
                    qv[e] = (s ? std::clamp(static_cast<int>(std::lround(x[e] / s)), -32, 31) : 0) + 32;
                }
                uint8_t* ql = o;
                uint8_t* qh = o + 128;
                std::memset(o, 0, 192);
                for (int k = 0; k < 256; k += 128, ql += 64, qh += 32)
                    for (int l = 0; l < 32; ++l) {
                        int q1 = qv[k + l], q2 = qv[k + l + 32], q3 = qv[k + l + 64], q4 = qv[k + l + 96];
                        ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
                        ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
                        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
                    }
            }
            break;
    }
    return out;
}

}  // namespace pulse::decoder
