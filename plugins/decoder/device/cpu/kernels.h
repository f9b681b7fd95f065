// CPU kernels behind one small interface: the forward pass calls these, and each has its
// architecture's implementations, chosen at run time by level (kernel_levels: x86-64 AVX2 +
// FMA + F16C, then AVX-512 VNNI; aarch64 NEON, then dotprod, then i8mm, in kernels_arm*.cpp),
// over a portable C++ level ("scalar") that every architecture has. Activations are f32 in the
// exact path (the weight decode fused into the dot product) and int8 in the fast one (below).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pulse::decoder {

// sum_i a[i] * b[i]
float dot_f32(const float* a, const float* b, int64_t n);
// sum_i x[i]² in double (the RMS and L2 norms' sums), sixteen at a time with AVX2: one running
// double sum is a chain of dependent adds, four cycles an element, and a verification step
// normalises every row of every layer (the Q8_0 bench model at five rows: its norm, add and
// SwiGLU ops 0.53-0.59 -> 0.37-0.46 ms a step).
double sum_squares(const float* x, int64_t n);
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
int64_t i8_block(uint32_t type);  // the activation block for `type`; 0: no int8 dot for it
// Quantizes `rows` rows of n floats for `type` into q (rows*n), d and sum (rows*n/block each).
void quantize_rows_i8(uint32_t type, const float* x, int64_t rows, int64_t n, int8_t* q, float* d, int32_t* sum);

// Activation rows quantized for one weight type, owning their codes, scales and sums; rows[t]
// views row t. `shape` keeps the buffers' capacity, so a caller that reuses one allocates only
// when a step is larger than any before.
struct QuantizedRows {
    uint32_t type = 0;
    int64_t n = 0;  // values per row
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> sum;
    std::vector<QuantRow> rows;
    void shape(uint32_t type, int64_t rows, int64_t n);  // sizes the buffers and the views
    void quantize_row(int64_t t, const float* x);         // row t from x's n values
    void quantize(uint32_t type, const float* x, int64_t rows, int64_t n);  // shape, then every row
};

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

// The int8 dot's arithmetic, which the portable level runs and every aarch64 level reproduces
// bit for bit (the x86 levels sum in their own lane order, within rounding of it): per
// activation block b, the exact integer p_b = Σ w·q of the block's signed weight codes and
// activation codes, its scale s_b = d_w·d_x in f32, four accumulators with block b added into
// a[b mod 4] by one fused multiply-add (a = fma(p_b, s_b, a)), and the row's value
// (a0 + a1) + (a2 + a3). Four accumulators, so a vector unit can take four blocks at once.
float i8_dot_reference(uint32_t type, const uint8_t* row, const QuantRow& x, int64_t n);

// Q8_0 interleaved by eight rows (the VNNI path's own layout; CpuDevice::prepare makes it
// once): per 32-weight block of eight rows, their eight f16 scales, then 256 bytes in eight
// runs of 32 = four consecutive codes of each row in turn, stored + 128 (unsigned). One dpbusd
// of four activation bytes (broadcast) against a run adds to each int32 lane one row's
// products, so after the eight runs lane r holds row r's whole block dot (less 128·Σx, which
// the quantized activation carries), and one conversion and one multiply-add apply all eight
// rows' scales. 272 bytes per 8×32 weights: the file's size.
constexpr int64_t kQ8x8Bytes = 16 + 256;
bool has_x8();  // the CPU has the interleaved kernels (AVX512-VNNI): Q8_0 and TQ2_0
// Rows r0..r0+7 of a Q8_0 matrix (`row_bytes` apart, n values each) into out (n/32 blocks).
void repack_q8_0x8(const uint8_t* rows, uint64_t row_bytes, int64_t n, uint8_t* out);

// TQ2_0 interleaved by eight rows, the same way: per 256-weight block of eight rows, their eight
// f16 scales, then 16 runs of 32 bytes; in run j, row r's 32-bit word has in byte k, bits
// 2l..2l+1, the code (value + 1) of element 16j + 4l + k. Masking a run with 3 << 2l (no shift)
// leaves 4^l·code in each byte, facing four consecutive activation bytes (one broadcast), so
// each plane l sums into an accumulator of its own, divided by 4^l (an exact shift) at the
// block's end. 528 bytes per 8×256 weights: the file's size.
constexpr int64_t kTQ2x8Bytes = 16 + 512;
// Rows r0..r0+7 of a TQ2_0 matrix (`row_bytes` apart, n values each) into out (n/256 blocks).
void repack_tq2_0x8(const uint8_t* rows, uint64_t row_bytes, int64_t n, uint8_t* out);

// The interleaved kernels (VNNI): two groups of eight rows of a Q8_0 or TQ2_0 matrix in one pass,
// in 512-bit registers, `packed` the first group and `packed + next` the second (next = 0: the
// same group twice, for a matrix's odd last group). out[r*T + t] = row r · x_t for r < 16 (rows
// 8..15: the second group's), T = 1 to dot_x16_tokens(type) quantized activation rows.
void dot_x16(uint32_t type, const uint8_t* packed, uint64_t next, const QuantRow* x, int T, int64_t n, float* out);
// Up to 8 tokens in one pass, both types (a speculative step's 1 + k rows read and unpack each
// weight once, not once per four of them; TQ2_0 past four tokens with one accumulator per token).
int dot_x16_tokens(uint32_t type);
constexpr int kDotX16MaxTokens = 8;

// One Gated DeltaNet value head over T tokens and its S×S state (S[i][j]: key dim i, value dim
// j): per token, with e = exp(g) the decay and β the write strength,
//   δ = β·(v − e·Sᵀk),  o = (e·Sᵀq + δ·(k·q)) / √S,  S ← e·S + k·δᵀ
// (the delta rule with the read o = S′ᵀq/√S folded in). Inputs per token at the given strides
// (q and k already L2-normalised; g is the log of the decay, so products of many decays never
// underflow). gdn_head picks one of two forms:
// - recurrent, token by token: one read-write pass over the state per token (the update of
//   token t also accumulates Sᵀk and Sᵀq for token t+1). Decode and short runs.
// - chunked, kGdnChunk tokens at a time as matrix products (the WY form of the delta rule):
//   within a chunk with cumulative log decays Γ_t, the δ of every token solves the triangular
//   system (I + A)Δ = β(V − e^Γ·K·S₀), A[t][s] = β_t·e^(Γ_t−Γ_s)·(k_t·k_s) for s < t; then
//   O = (e^Γ·Q·S₀ + M·Δ)/√S with M[t][s] = e^(Γ_t−Γ_s)·(q_t·k_s) for s ≤ t, and
//   S ← e^(Γ_last)·S₀ + Kᵀ·(e^(Γ_last−Γ)·Δ). About 1.5× the recurrent form's arithmetic, but
//   in gemm_f32's register tiles instead of a pass over the state per token: with S = 128 on
//   an AVX2 Zen 4 core, 1.4-1.9× faster per token from 8 tokens on, 0.55× for one (chunks of
//   32 beat 64, whose L² terms, the solve and the decay factors, grow).
struct GdnHeadArgs {
    float* state;
    int64_t S, T;
    const float *q, *k, *v, *beta, *log_decay;  // beta and log_decay: one per token
    int64_t qk_stride, v_stride, gate_stride;
    float* out;  // T rows of S
    int64_t out_stride;
    // Where set, the state before the tokens, read and left as it is (`state` is then only
    // written: the state after them); else `state` is updated in place.
    const float* state_in = nullptr;
    // The next head's state buffers (read, and written when it differs), fetched into cache
    // while this head runs: its passes after the first find their state in L2 and leave the
    // memory idle, so a stack of heads otherwise waits on each head's first pass.
    const float* next_in = nullptr;
    float* next_out = nullptr;
};
constexpr int64_t kGdnChunk = 32;
constexpr int64_t kGdnChunkedFrom = 8;  // runs this long (tokens) take the chunked form
void gdn_head(const GdnHeadArgs& a);
void gdn_head_recurrent(const GdnHeadArgs& a);  // each form alone (tests, benchmarks)
void gdn_head_chunked(const GdnHeadArgs& a);

// Small f32 matrix products (attention tiles, the chunked delta rule), row-major with leading
// dimensions: C[i][j] = Σ_k A[i][k]·B[k][j] (or += with `accumulate`) for i < M, j < N, k < K.
// Four rows of A by sixteen columns at a time, B's rows loaded once per four rows of C: the
// operands are laid out by the caller so no product needs a horizontal sum.
void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);
// C[i][j] = Σ_k A[i][k]·B[j][k]: against B's rows as they are (attention scores against cached
// keys, no transposed copy): four rows of A by two of B at a time, one horizontal sum per pair.
void gemm_f32_nt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc);

// dst[r·dst_stride + i] = the IEEE binary16 value src[r·src_stride + i] as f32, for r < rows and
// i < n (a tile of the f16 KV cache, widened for gemm_f32). Exact: every f16 value is an f32.
void f16_to_f32_rows(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst, int64_t dst_stride);

// s[i] = e^(s[i] - m) for i < n, and their sum: a softmax row's weights (attention). Eight lanes
// at a time with silu_mul's e^x where the CPU has AVX2 (within 2 ulp of expf), else expf.
float exp_shifted(float* s, int64_t n, float m);

// dst[i] = src[i] rounded to IEEE binary16, to nearest even (the KV cache's stores): eight per
// F16C conversion where the CPU has it, the same bits as f32_to_fp16 for every non-NaN value;
// a NaN stays a NaN.
void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n);

// y[i] = silu(x[i])·u[i] (u null: silu alone); y may be x. Vectorised with its own e^x where
// the CPU has AVX2 (within a few ulp of blocks::silu, which the scalar path is).
void silu_mul(const float* x, const float* u, float* y, int64_t n);

// The kernel level in force: "avx512vnni", "avx2" (x86-64), "i8mm", "dotprod", "neon"
// (aarch64) or "scalar" (logs, benchmarks).
const char* kernel_name();
// The levels this CPU can run, lowest ("scalar") first.
std::vector<std::string> kernel_levels();
// Caps the kernels at a level of this architecture (tests of each level on a CPU that has more;
// "" lifts the cap; another name is std::invalid_argument naming the levels). Set it before any
// decoding starts.
void limit_kernels(const char* name);

}  // namespace pulse::decoder
