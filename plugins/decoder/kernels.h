// CPU kernels behind one small interface: the forward pass calls these, and each has an AVX2
// (+FMA, F16C) implementation chosen at run time with a portable scalar fallback. Activations
// stay f32 (llama.cpp rounds them to 8 bits for quantized weights; we keep the accuracy and
// fuse the weight decode into the dot product instead).
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

// Int8 activations (the llama.cpp way, opt-in): x quantized per 32-element block to int8 with an
// f32 scale, dotted against Q8_0 or TQ2_0 rows with 8-bit multiplies. Four activation rows at a
// time. `xq`/`xd` hold 4 rows, each n int8 values / n/32 scales. Returns false when this CPU or
// type has no int8 kernel (the caller then uses the f32 path).
void quantize_act_q8(const float* x, int64_t n, int8_t* q, float* d);
bool dot4_row_i8(uint32_t type, const uint8_t* row, const int8_t* xq, const float* xd, int64_t n, float out[4]);
bool has_i8_kernel(uint32_t type);

// "avx2" or "scalar": what this CPU runs (for logs and benchmarks).
const char* kernel_name();

}  // namespace pulse::decoder
