// CPU kernels behind one small interface: the forward pass calls these, and each has an AVX2
// (+FMA, F16C) implementation chosen at run time with a portable scalar fallback. Activations
// are f32 in the exact path (the weight decode fused into the dot product) and int8 in the fast
// one (below).
#pragma once

#include <cstdint>

namespace pulse::decoder {

// sum_i a[i] * b[i]
float dot_f32(const float* a, const float* b, int64_t n);
// out[k] = sum_i w[i] * x[k*n + i] for k < 4: four activation rows against one weight row,
// loading the weights once.
void dot4_f32(const float* w, const float* x, int64_t n, float out[4]);
// sum_i decode(row)[i] * x[i] for one row of `type` (n elements; `scratch` holds n floats for
// the types without a fused kernel).
float dot_row(uint32_t type, const uint8_t* row, const float* x, int64_t n, float* scratch);

// Int8 activations (the llama.cpp way; the default path, Model::exact turns it off): each
// activation row is quantized once per matmul to int8 in blocks of the weight's group (32 for
// Q8_0, 256 for TQ2_0 like llama.cpp's Q8_K, 64/128 for the Q2_0 layouts), with an f32 scale
// and the block's sum of codes, and dotted against the weight rows with 8-bit multiplies
// (AVX2 maddubs, or AVX512-VNNI dpbusd where the CPU has it). The Q2_0 layouts keep four
// consecutive weights in one byte; their activation rows are permuted within each group to
// the weights' bit-plane order once, so the dot needs no byte shuffles.
struct QuantRow {
    const int8_t* q;     // n codes
    const float* d;      // per block: scale
    const int32_t* sum;  // per block: sum of the codes
};
int64_t i8_block(uint32_t type);  // the activation block for `type`; 0: no int8 kernel here
// Quantizes `rows` rows of n floats for `type` into q (rows*n), d and sum (rows*n/block each).
void quantize_rows_i8(uint32_t type, const float* x, int64_t rows, int64_t n, int8_t* q, float* d, int32_t* sum);

// y[t * y_stride + o] = scale · (row o · x_t) for o in [o0, o1) and T = 1 to 4 tokens: a run of
// rows in one call, so nothing is dispatched per row.
struct RowRange {
    const uint8_t* base;  // row 0
    uint64_t row_bytes;
    int64_t o0, o1;
    float* y;
    int64_t y_stride;
    float scale;
};
void matmul_rows_i8(uint32_t type, const RowRange& rows, const QuantRow* x, int T, int64_t n);

// Q8_0 interleaved by eight rows (the VNNI path's own layout; CpuDevice::prepare makes it
// once): per 32-weight block of eight rows, their eight f16 scales, then 256 bytes in eight
// runs of 32 = four consecutive codes of each row in turn, stored + 128 (unsigned). One dpbusd
// of four activation bytes (broadcast) against a run adds to each int32 lane one row's
// products, so after the eight runs lane r holds row r's whole block dot (less 128·Σx, which
// the quantized activation carries), and one conversion and one multiply-add apply all eight
// rows' scales. 272 bytes per 8×32 weights: the file's size.
constexpr int64_t kQ8x8Bytes = 16 + 256;
bool has_q8_0x8();  // the CPU has the kernel (AVX512-VNNI)
// Rows r0..r0+7 of a Q8_0 matrix (`row_bytes` apart, n values each) into out (n/32 blocks).
void repack_q8_0x8(const uint8_t* rows, uint64_t row_bytes, int64_t n, uint8_t* out);
// out[r*T + t] = row r of the group · x_t, r < 8, for T = 1 to 4 quantized activation rows.
void dot_q8_0x8(const uint8_t* packed, const QuantRow* x, int T, int64_t n, float* out);

// One Gated DeltaNet value head over T tokens, its S×S state (S[i][j]: key dim i, value dim j)
// kept hot in cache: per token, with e the decay and β the write strength,
//   δ = β·(v − e·Sᵀk),  o = (e·Sᵀq + δ·(k·q)) / √S,  S ← e·S + k·δᵀ
// (the delta rule with the read o = S′ᵀq/√S folded in). One read-write pass over the state per
// token: the update of token t also accumulates Sᵀk and Sᵀq for token t+1. Inputs per token at
// the given strides (q and k already L2-normalised).
struct GdnHeadArgs {
    float* state;
    int64_t S, T;
    const float *q, *k, *v, *beta, *decay;  // beta and decay: one per token
    int64_t qk_stride, v_stride, gate_stride;
    float* out;  // T rows of S
    int64_t out_stride;
};
void gdn_head(const GdnHeadArgs& a);

// "avx512vnni", "avx2" or "scalar": the kernels this CPU runs (logs, benchmarks).
const char* kernel_name();
// Caps the kernels at "avx2" or "scalar" (tests of each set on a CPU that has more; "" lifts the
// cap). Set it before any decoding starts.
void limit_kernels(const char* name);

}  // namespace pulse::decoder
