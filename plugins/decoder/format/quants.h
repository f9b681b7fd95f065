// Weight formats: row dequantization to f32 (the reference path every kernel is checked
// against) and quantizers for writing test and demo files. Layouts: docs/DECODER.md, "The model" (Weights), and
// ggml's block_q4_K / block_q6_K.
#pragma once

#include <cstdint>
#include <vector>

namespace pulse::decoder {

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);  // round to nearest even
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even

// Decodes `n` consecutive elements (a multiple of the type's block) starting at `src`.
void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n);

// Encodes `n` floats (a multiple of the block) in `type`. For F16/BF16/Q8_0 the usual round to
// nearest; TQ1_0/TQ2_0/PTQ1_0 store t·amax with t = round(x/amax) in {-1, 0, 1}; the Q2_0
// layouts t·d with t in {-1, 0, 1, 2}; Q1_0 signs times mean |x|; Q4_K/Q6_K use a simple
// per-sub-block fit (any valid encoding: tests compare decoders on the same bytes).
std::vector<uint8_t> quantize(uint32_t type, const float* src, int64_t n);

}  // namespace pulse::decoder
