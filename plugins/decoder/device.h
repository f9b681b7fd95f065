// The compute device the qwen35 forward pass runs on: the model (model.cpp) is written once as
// a sequence of these ops — ggml's backend split — and each device implements them. `cpu`
// (device_cpu.cpp: OpenMP threads, the AVX2/scalar kernels of kernels.h) is the one this part
// ships; a CUDA device (a later issue) implements the same ops. Buffers are host float arrays
// in this version: a device that keeps them in its own memory will take ownership of the work
// and state buffers through this interface when it arrives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf.h"
#include "hadamard.h"

namespace pulse::decoder {

// A matmul weight: rows of `n_in` values in the tensor's type, with an optional output scale.
// `rot`: a Hadamard-folded weight, whose input is rotated first (hadamard.h).
struct Matrix {
    const TensorInfo* t = nullptr;
    int64_t n_in = 0, n_out = 0;
    float scale = 1;
    const Rotation* rot = nullptr;
};

// Gated attention for B new tokens at positions pos0..pos0+B-1, between the q/k/v projections
// and the output projection: per-head RMSNorm of q and k, partial NeoX RoPE, append to the
// cache, causal softmax attention with GQA, sigmoid gate.
struct AttentionOp {
    const float* qg;  // [B][H][2][D]: query and gate, interleaved per head
    const float* k;   // [B][Hkv*D]
    const float* v;   // [B][Hkv*D]
    int64_t B, pos0, H, Hkv, D, R;
    double rope_base, eps, scale;
    const float* q_norm;  // [D]
    const float* k_norm;  // [D]
    std::vector<float>* k_cache;  // [pos][Hkv*D], grown by B rows
    std::vector<float>* v_cache;
    float* out;  // [B][H*D]
};

// Gated DeltaNet for B new tokens, between the input projections and ssm_out: causal conv +
// SiLU, L2-normed q/k per key head, the delta rule per value head (tiled key head), gated
// RMSNorm.
struct DeltaNetOp {
    const float *qkv, *z, *beta, *alpha;  // [B][conv_dim], [B][Hv*S], [B][Hv], [B][Hv]
    int64_t B, K, C, S, Hk, Hv;
    double eps;
    const float* conv;      // [C][K]
    const float* dt_bias;   // [Hv]
    const float* ssm_a;     // [Hv] (already -exp(A_log))
    const float* ssm_norm;  // [S]
    float* conv_state;      // [(K-1)][C]
    float* state;           // [Hv][S][S]
    float* out;             // [B][Hv*S]
};

class Device {
public:
    virtual ~Device() = default;
    virtual const char* name() const = 0;
    // y[b][n_out] = W · x[b][n_in] for b < B (int8: 8-bit activations where the device has a
    // kernel for the weight type; else exact f32)
    virtual void matmul(const Matrix& w, const float* x, int64_t B, float* y, bool int8) const = 0;
    // RMSNorm of `rows` rows of n values with weight w
    virtual void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, double eps) const = 0;
    virtual void swiglu(float* g, const float* u, int64_t n) const = 0;  // g = silu(g) * u
    virtual void add(float* x, const float* y, int64_t n) const = 0;    // x += y
    // out[b] = the rotation of x[b] for b < B (rows of r.width values)
    virtual void rotate(const Rotation& r, const float* x, float* out, int64_t B) const = 0;
    virtual void attention(const AttentionOp& op) const = 0;
    virtual void deltanet(const DeltaNetOp& op) const = 0;
};

// "cpu" (the default); anything else is std::invalid_argument naming what this build has.
std::unique_ptr<Device> make_device(const std::string& name);

}  // namespace pulse::decoder
