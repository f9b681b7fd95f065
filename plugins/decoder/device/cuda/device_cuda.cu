// The CUDA device (device.h): the qwen35 forward pass's ops as CUDA kernels over device memory,
// built into its own shared object (pulse-device-cuda.so) that the decoder loads only after a
// probe has found an NVIDIA driver and a GPU (device.cpp), so a machine without one never
// needs the CUDA libraries.
//
// What it does, op by op:
//   weights   uploaded once in the file's quantized bytes (every format blocks.h decodes);
//   matmul    up to 8 tokens: one warp per output row decodes each weight once (blocks.h's
//             element decoders, the CPU's own) against all the tokens; more tokens: the rows
//             are decoded to a scratch matrix in chunks and multiplied with cuBLAS (f32 SGEMM
//             on the exact path, f16 tensor cores with f32 accumulation otherwise);
//   attention q/k RMSNorm + partial RoPE + cache store (f16-rounded, as the CPU), then split-K
//             causal attention with an online softmax, merged per (token, head) with the gate;
//   deltanet  causal conv + SiLU per channel, L2 norms per key head, the delta rule with one
//             thread per state column, gated RMSNorm;
//   the rest  RMSNorm, SwiGLU, add, the Hadamard rotation (shared-memory transform), embedding.
// Everything runs on one stream; download() is the only point that waits for the GPU.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/device.h"
#include "format/blocks.h"

namespace pulse::decoder {
namespace {

namespace bk = blocks;

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string("cuda device: ") + what + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("cuda device: ") + what + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}
void check_launch(const char* what) { check(cudaGetLastError(), what); }

float* raw(DevPtr p) { return DeviceMemory::raw(p); }

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// ---------------------------------------------------------------------------------------------
// Reductions.

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    __syncthreads();  // part[] may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < static_cast<int>(blockDim.x / 32) ? part[lane] : 0.f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

int round_threads(int64_t n) { return static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (n + 31) / 32 * 32))); }

// ---------------------------------------------------------------------------------------------
// Weights.

// One warp per output row: each weight is decoded once and multiplied with all NT tokens.
template <uint32_t T, int NT>
__global__ void matvec_kernel(const uint8_t* w, uint64_t row_bytes, int64_t n_in, int64_t n_out, const float* x, int B, float* y,
                              float scale) {
    constexpr int E = bk::Format<T>::elems, bytes = bk::Format<T>::bytes;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= n_out) return;
    const uint8_t* r = w + static_cast<uint64_t>(row) * row_bytes;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0;
    if (n_in % 128 == 0 && (E == 1 || E % 4 == 0)) {
        // Four consecutive elements per lane (one block's, so its scale is read once).
        for (int64_t e = 4 * lane; e < n_in; e += 128) {
            const uint8_t* blk = r + (e / E) * bytes;
            float wv[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                wv[u] = E == 1 ? bk::element<T>(r + (e + u) * bytes, 0) : bk::element<T>(blk, static_cast<int>(e % E) + u);
#pragma unroll
            for (int t = 0; t < NT; ++t)
                if (t < B)
#pragma unroll
                    for (int u = 0; u < 4; ++u) acc[t] += wv[u] * x[t * n_in + e + u];
        }
    } else {
        for (int64_t e = lane; e < n_in; e += 32) {
            const float wv = bk::element<T>(r + (e / E) * bytes, static_cast<int>(e % E));
#pragma unroll
            for (int t = 0; t < NT; ++t)
                if (t < B) acc[t] += wv * x[t * n_in + e];
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < B) y[t * n_out + row] = s * scale;
    }
}

// Rows [r0, r0 + rows) decoded into out (rows × n_in, row-major), as f32 or f16.
template <uint32_t T, class Out>
__global__ void dequantize_kernel(const uint8_t* w, uint64_t row_bytes, int64_t n_in, int64_t r0, int64_t rows, Out* out) {
    constexpr int E = bk::Format<T>::elems, bytes = bk::Format<T>::bytes;
    const int64_t total = rows * n_in;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = r0 + i / n_in, e = i % n_in;
        const float v = bk::element<T>(w + static_cast<uint64_t>(row) * row_bytes + (e / E) * bytes, static_cast<int>(e % E));
        if constexpr (sizeof(Out) == 2) out[i] = __float2half(v);
        else out[i] = v;
    }
}

// out[b] = row tokens[b] of the table.
template <uint32_t T>
__global__ void embed_kernel(const uint8_t* w, uint64_t row_bytes, int64_t n_in, const int32_t* tokens, int64_t B, float* out) {
    constexpr int E = bk::Format<T>::elems, bytes = bk::Format<T>::bytes;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < B * n_in; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t b = i / n_in, e = i % n_in;
        out[i] = bk::element<T>(w + static_cast<uint64_t>(tokens[b]) * row_bytes + (e / E) * bytes, static_cast<int>(e % E));
    }
}

__global__ void to_half_kernel(const float* x, int64_t n, __half* out) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        out[i] = __float2half(x[i]);
}

// ---------------------------------------------------------------------------------------------
// Element-wise ops.

__global__ void rmsnorm_kernel(const float* x, const float* w, float* out, int64_t n, float eps) {
    const float* xr = x + blockIdx.x * n;
    float* orow = out + blockIdx.x * n;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    const float r = rsqrtf(block_sum(ss) / static_cast<float>(n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * r * w[i];
}

__global__ void swiglu_kernel(float* g, const float* u, int64_t n) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        g[i] = bk::silu(g[i]) * u[i];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) x[i] += y[i];
}

// The fold's head permutation (scatter; the transform below applies the signs).
__global__ void group_heads_kernel(const float* x, float* out, int64_t width, int64_t B, int64_t S, int64_t Hk, int64_t rep) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < B * width; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t b = i / width, e = i % width;
        out[b * width + bk::grouped_index(e, S, Hk, rep)] = x[i];
    }
}

// One Hadamard block of one row per CUDA block, in shared memory: forward x ← H·(s ⊙ x),
// inverse x ← s ⊙ (H·x) (hadamard.h).
__global__ void hadamard_kernel(const float* in, float* out, const float* signs, int64_t width, int64_t block, bool inverse) {
    extern __shared__ float v[];
    const int64_t row = blockIdx.y, first = static_cast<int64_t>(blockIdx.x) * block;
    const float* src = in + row * width + first;
    float* dst = out + row * width + first;
    for (int64_t i = threadIdx.x; i < block; i += blockDim.x) v[i] = inverse ? src[i] : src[i] * signs[first + i];
    __syncthreads();
    for (int64_t len = 1; len < block; len <<= 1) {
        for (int64_t k = threadIdx.x; k < block / 2; k += blockDim.x) {
            const int64_t i = (k / len) * 2 * len + k % len;
            const float a = v[i], c = v[i + len];
            v[i] = a + c;
            v[i + len] = a - c;
        }
        __syncthreads();
    }
    const float norm = rsqrtf(static_cast<float>(block));
    for (int64_t i = threadIdx.x; i < block; i += blockDim.x) dst[i] = inverse ? v[i] * norm * signs[first + i] : v[i] * norm;
}

// ---------------------------------------------------------------------------------------------
// Attention.

struct AttnArgs {
    const float *qg, *k, *v, *q_norm, *k_norm;
    __half *k_cache, *v_cache;  // f16 (device.h)
    float *q, *out;
    int64_t B, pos0, H, Hkv, D, R;
    float eps, scale;
    double rope_base;
};

constexpr int kMaxHeadDim = 512;  // per lane: kMaxHeadDim / 32 accumulators

// blockIdx.x: token; blockIdx.y: a query head (< H) or a KV head (H + j). One thread per dim.
__global__ void attn_prepare_kernel(AttnArgs a) {
    __shared__ float row[kMaxHeadDim];
    const int64_t b = blockIdx.x, p = a.pos0 + b, d = threadIdx.x;
    const bool query = blockIdx.y < a.H;
    const int64_t head = query ? blockIdx.y : blockIdx.y - a.H;
    const float* src = query ? a.qg + (b * a.H + head) * 2 * a.D : a.k + (b * a.Hkv + head) * a.D;
    const float x = d < a.D ? src[d] : 0.f;
    const float r = rsqrtf(block_sum(x * x) / static_cast<float>(a.D) + a.eps);
    if (d < a.D) row[d] = x * r * (query ? a.q_norm : a.k_norm)[d];
    __syncthreads();
    if (d < a.R / 2) {
        float lo = row[d], hi = row[d + a.R / 2];
        bk::rope_pair(lo, hi, static_cast<double>(p) * bk::rope_inv_freq(a.rope_base, d, a.R));
        row[d] = lo;
        row[d + a.R / 2] = hi;
    }
    __syncthreads();
    if (d >= a.D) return;
    if (query) {
        a.q[(b * a.H + head) * a.D + d] = row[d];
    } else {  // the cache holds K and V in f16, as the CPU device's does
        a.k_cache[(p * a.Hkv + head) * a.D + d] = __float2half(row[d]);
        a.v_cache[(p * a.Hkv + head) * a.D + d] = __float2half(a.v[(b * a.Hkv + head) * a.D + d]);
    }
}

// Split-K attention: blockIdx = (token, head, split); the split's positions of the token's
// causal window in four warps, each with its own online softmax, merged at the end of the
// block into one partial (max, sum, D weighted values) per split.
constexpr int kAttnWarps = 4;

__global__ void attn_partial_kernel(AttnArgs a, int64_t per_split, float* part_m, float* part_l, float* part_acc) {
    __shared__ float q[kMaxHeadDim];
    __shared__ float wm[kAttnWarps], wl[kAttnWarps];
    __shared__ float wacc[kAttnWarps][kMaxHeadDim];
    const int64_t b = blockIdx.x, j = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t D = a.D, kvh = j / (a.H / a.Hkv), n = a.pos0 + b + 1;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) q[d] = a.q[(b * a.H + j) * D + d];
    __syncthreads();
    const int64_t t0 = split * per_split, t1 = min(n, t0 + per_split);
    constexpr int kPer = kMaxHeadDim / 32;
    float acc[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] = 0;
    float m = -INFINITY, l = 0;
    for (int64_t t = t0 + warp; t < t1; t += kAttnWarps) {
        const __half* kt = a.k_cache + (t * a.Hkv + kvh) * D;
        float s = 0;
        for (int64_t d = lane; d < D; d += 32) s += q[d] * __half2float(kt[d]);
        s = warp_sum(s) * a.scale;
        const float mn = fmaxf(m, s), c = expf(m - mn), pw = expf(s - mn);
        l = l * c + pw;
        const __half* vt = a.v_cache + (t * a.Hkv + kvh) * D;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            const int64_t d = lane + 32 * i;
            if (d < D) acc[i] = acc[i] * c + pw * __half2float(vt[d]);
        }
        m = mn;
    }
    if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
        if (lane + 32 * i < D) wacc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, wm[w]);
    const int64_t slot = (b * a.H + j) * splits + split;
    float L = 0;
    for (int w = 0; w < kAttnWarps; ++w) L += wm[w] == -INFINITY ? 0.f : wl[w] * expf(wm[w] - M);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        float s = 0;
        for (int w = 0; w < kAttnWarps; ++w) s += wm[w] == -INFINITY ? 0.f : wacc[w][d] * expf(wm[w] - M);
        part_acc[slot * D + d] = s;
    }
    if (threadIdx.x == 0) part_m[slot] = M, part_l[slot] = L;
}

// Merges the splits of each (token, head) and applies the sigmoid gate.
__global__ void attn_merge_kernel(AttnArgs a, int64_t splits, const float* part_m, const float* part_l, const float* part_acc) {
    const int64_t b = blockIdx.x, j = blockIdx.y, D = a.D, base = (b * a.H + j) * splits;
    float M = -INFINITY;
    for (int64_t s = 0; s < splits; ++s) M = fmaxf(M, part_m[base + s]);
    float L = 0;
    for (int64_t s = 0; s < splits; ++s) L += part_m[base + s] == -INFINITY ? 0.f : part_l[base + s] * expf(part_m[base + s] - M);
    const float* gate = a.qg + (b * a.H + j) * 2 * D + D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0;
        for (int64_t s = 0; s < splits; ++s)
            if (part_m[base + s] != -INFINITY) o += part_acc[(base + s) * D + d] * expf(part_m[base + s] - M);
        a.out[(b * a.H + j) * D + d] = o / L * bk::sigmoid(gate[d]);
    }
}

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet.

struct GdnArgs {
    const float *qkv, *z, *beta, *alpha, *conv, *dt_bias, *ssm_a, *ssm_norm;
    float *conv_state, *state, *y, *out;
    int64_t B, K, C, S, Hk, Hv;
    float eps;
};

constexpr int kMaxConv = 8;

// One thread per channel: the causal depthwise conv over the K-1 kept rows and the B new
// ones, SiLU, then the window's last K-1 rows kept.
__global__ void gdn_conv_kernel(GdnArgs a) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= a.C) return;
    const int64_t K = a.K, C = a.C;
    float window[kMaxConv];
    for (int64_t r = 0; r < K - 1; ++r) window[r] = a.conv_state[r * C + c];
    for (int64_t b = 0; b < a.B; ++b) {
        window[K - 1] = a.qkv[b * C + c];
        float acc = 0;
        for (int64_t t = 0; t < K; ++t) acc += a.conv[c * K + t] * window[t];
        a.y[b * C + c] = bk::silu(acc);
        for (int64_t r = 0; r + 1 < K; ++r) window[r] = window[r + 1];
    }
    for (int64_t r = 0; r < K - 1; ++r) a.conv_state[r * C + c] = window[r];
}

// blockIdx = (token, q or k section of a key head): L2 norm in place. One thread per element.
__global__ void gdn_l2norm_kernel(GdnArgs a) {
    const int64_t b = blockIdx.x, sec = blockIdx.y, S = a.S;
    float* v = a.y + b * a.C + (sec % 2 ? a.Hk * S : 0) + (sec / 2) * S;
    const float x = threadIdx.x < S ? v[threadIdx.x] : 0.f;
    const float r = rsqrtf(block_sum(x * x) + a.eps);
    if (threadIdx.x < S) v[threadIdx.x] = x * r;
}

// One value head per block, one thread per state column j (S[i][j]: key dim i, value dim j):
// per token δ_j = β(v_j − e·Σ_i S[i][j]k_i), S ← e·S + k·δᵀ, o_j = Σ_i S[i][j]q_i / √S, then the
// gated RMSNorm of o over the head.
__global__ void gdn_recurrent_kernel(GdnArgs a) {
    extern __shared__ float qk[];  // q then k, S each
    const int64_t hh = blockIdx.x, j = threadIdx.x, S = a.S, kd = a.Hk * S, VD = a.Hv * S;
    const int64_t m = hh % a.Hk;  // tiled key head for this value head
    float* st = a.state + hh * S * S;
    const float inv_sqrt = rsqrtf(static_cast<float>(S));
    for (int64_t b = 0; b < a.B; ++b) {
        const float* yb = a.y + b * a.C;
        __syncthreads();  // the previous token's q/k are no longer read
        if (j < S) {
            qk[j] = yb[m * S + j];
            qk[S + j] = yb[kd + m * S + j];
        }
        __syncthreads();
        float o = 0;
        if (j < S) {
            const float beta = bk::gdn_beta(a.beta[b * a.Hv + hh]);
            const float e = bk::gdn_decay(a.alpha[b * a.Hv + hh], a.dt_bias[hh], a.ssm_a[hh]);
            float kv = 0;
            for (int64_t i = 0; i < S; ++i) kv += st[i * S + j] * qk[S + i];
            const float delta = beta * (yb[2 * kd + hh * S + j] - e * kv);
            for (int64_t i = 0; i < S; ++i) {
                const float s = e * st[i * S + j] + qk[S + i] * delta;
                st[i * S + j] = s;
                o += s * qk[i];
            }
            o *= inv_sqrt;
        }
        const float r = rsqrtf(block_sum(j < S ? o * o : 0.f) / static_cast<float>(S) + a.eps);
        if (j < S) a.out[b * VD + hh * S + j] = o * r * a.ssm_norm[j] * bk::silu(a.z[b * VD + hh * S + j]);
    }
}

// ---------------------------------------------------------------------------------------------

struct Weight {
    uint32_t type = 0;
    uint64_t row_bytes = 0;
    uint8_t* data = nullptr;  // the tensor's bytes in device memory
};

// f(Tag) for a weight type with a decoder; a clear error otherwise.
template <class F>
void dispatch(uint32_t type, F&& f) {
    if (!bk::with_type(type, f)) throw std::invalid_argument("cuda device: no kernel for ggml type " + std::to_string(type));
}

class CudaDevice : public Device {
public:
    explicit CudaDevice(int ordinal) {
        check(cudaSetDevice(ordinal), "cudaSetDevice");
        check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
        check(cublasCreate(&blas_), "cublasCreate");
        check(cublasSetStream(blas_, stream_), "cublasSetStream");
        cudaDeviceProp prop{};
        check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
        max_shared_ = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
        check(cudaFuncSetAttribute(hadamard_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(max_shared_)),
              "cudaFuncSetAttribute");
    }
    ~CudaDevice() override {
        cudaStreamSynchronize(stream_);
        for (auto& w : weights_) cudaFree(w->data);
        for (auto& [p, d] : signs_) cudaFree(d);
        for (void* p : scratch_) cudaFree(p);
        cublasDestroy(blas_);
        cudaStreamDestroy(stream_);
    }
    const char* name() const override { return "cuda"; }

    Buffer alloc(size_t n) const override {
        void* p = nullptr;
        check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float)), "cudaMalloc (out of device memory?)");
        check(cudaMemsetAsync(p, 0, std::max<size_t>(n, 1) * sizeof(float), stream_), "cudaMemset");
        return Buffer(this, DeviceMemory::wrap(static_cast<float*>(p)), n);
    }
    void release(DevPtr p) const override {
        cudaStreamSynchronize(stream_);  // no kernel still reads it
        cudaFree(raw(p));
    }
    void upload(const float* host, DevPtr to, size_t n) const override {
        // From pageable memory: the call has read `host` when it returns (staged), so the
        // caller may free it; the GPU sees the data in stream order.
        check(cudaMemcpyAsync(raw(to), host, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "upload");
    }
    void download(DevPtr from, float* host, size_t n) const override {
        check(cudaMemcpyAsync(host, raw(from), n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "download");
        check(cudaStreamSynchronize(stream_), "download (a kernel of this step failed?)");
    }
    void copy(DevPtr from, DevPtr to, size_t n) const override {
        check(cudaMemcpyAsync(raw(to), raw(from), n * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "copy");
    }
    bool copies_weights() const override { return true; }

    // The tensor's bytes, uploaded: one copy serves every use (a tied output is registered once,
    // Use::both). No index by tensor address, which a tensor made where a freed one was would hit.
    const void* prepare(const Matrix& w, Use) override {
        const TensorInfo& t = *w.t;
        auto wt = std::make_unique<Weight>();
        wt->type = t.type;
        dispatch(t.type, [&](auto tag) {
            constexpr uint32_t T = decltype(tag)::type;
            wt->row_bytes = static_cast<uint64_t>(w.n_in / bk::Format<T>::elems) * bk::Format<T>::bytes;
        });
        const uint64_t bytes = wt->row_bytes * static_cast<uint64_t>(w.n_out);
        check(cudaMalloc(&wt->data, bytes), "cudaMalloc for a weight (out of device memory?)");
        check(cudaMemcpy(wt->data, t.data, bytes, cudaMemcpyHostToDevice), "weight upload");
        const Weight* p = wt.get();
        weights_.push_back(std::move(wt));
        return p;
    }

    void embed(const Matrix& table, const int32_t* tokens, int64_t B, DevPtr out) const override {
        const auto& w = weight(table);
        int32_t* tok = static_cast<int32_t*>(scratch(kTokens, static_cast<size_t>(B) * sizeof(int32_t)));
        check(cudaMemcpyAsync(tok, tokens, static_cast<size_t>(B) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_), "embed tokens");  // staged, as upload()
        dispatch(w.type, [&](auto tag) {
            embed_kernel<decltype(tag)::type><<<blocks_for(B * table.n_in, 256), 256, 0, stream_>>>(w.data, w.row_bytes, table.n_in, tok, B, raw(out));
        });
        check_launch("embed");
    }

    void matmul(const Matrix& m, DevPtr x, int64_t B, DevPtr y, bool int8) const override {
        const auto& w = weight(m);
        if (B <= 8) {
            dispatch(w.type, [&](auto tag) {
                constexpr uint32_t T = decltype(tag)::type;
                const unsigned grid = blocks_for(m.n_out, 4);
                auto launch = [&](auto kernel) {
                    kernel<<<grid, 128, 0, stream_>>>(w.data, w.row_bytes, m.n_in, m.n_out, raw(x), static_cast<int>(B), raw(y), m.scale);
                };
                if (B == 1) launch(matvec_kernel<T, 1>);
                else if (B == 2) launch(matvec_kernel<T, 2>);
                else if (B <= 4) launch(matvec_kernel<T, 4>);
                else launch(matvec_kernel<T, 8>);
            });
            return check_launch("matmul");
        }
        // Weights decoded in chunks of rows into scratch, then one GEMM per chunk:
        // y[b][r0 + r] = scale · Σ_i W[r0 + r][i] x[b][i] (cuBLAS column-major: C = Wᵀ-op · X).
        constexpr int64_t kChunkElems = int64_t{32} << 20;
        const int64_t rows_per_chunk = std::max<int64_t>(1, std::min<int64_t>(m.n_out, kChunkElems / m.n_in));
        const float alpha = m.scale, beta = 0;
        void* xh = nullptr;
        if (int8) {  // f16 activations for the tensor cores (the fast path; exact = f32)
            xh = scratch(kHalfActivations, static_cast<size_t>(B * m.n_in) * sizeof(__half));
            to_half_kernel<<<blocks_for(B * m.n_in, 256), 256, 0, stream_>>>(raw(x), B * m.n_in, static_cast<__half*>(xh));
            check_launch("to_half");
        }
        void* wd = scratch(kDecodedWeights, static_cast<size_t>(rows_per_chunk * m.n_in) * (int8 ? sizeof(__half) : sizeof(float)));
        for (int64_t r0 = 0; r0 < m.n_out; r0 += rows_per_chunk) {
            const int64_t rows = std::min(rows_per_chunk, m.n_out - r0);
            const unsigned grid = std::min<unsigned>(blocks_for(rows * m.n_in, 256), 65535u);
            dispatch(w.type, [&](auto tag) {
                constexpr uint32_t T = decltype(tag)::type;
                if (int8) dequantize_kernel<T, __half><<<grid, 256, 0, stream_>>>(w.data, w.row_bytes, m.n_in, r0, rows, static_cast<__half*>(wd));
                else dequantize_kernel<T, float><<<grid, 256, 0, stream_>>>(w.data, w.row_bytes, m.n_in, r0, rows, static_cast<float*>(wd));
            });
            check_launch("dequantize");
            if (int8)
                check(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(B), static_cast<int>(m.n_in), &alpha, wd,
                                   CUDA_R_16F, static_cast<int>(m.n_in), xh, CUDA_R_16F, static_cast<int>(m.n_in), &beta, raw(y) + r0, CUDA_R_32F,
                                   static_cast<int>(m.n_out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
            else
                check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(B), static_cast<int>(m.n_in), &alpha,
                                  static_cast<float*>(wd), static_cast<int>(m.n_in), raw(x), static_cast<int>(m.n_in), &beta, raw(y) + r0,
                                  static_cast<int>(m.n_out)),
                      "cublasSgemm");
        }
    }

    void rmsnorm(DevPtr x, DevPtr w, DevPtr out, int64_t rows, int64_t n, double eps) const override {
        if (rows == 0) return;
        rmsnorm_kernel<<<static_cast<unsigned>(rows), 256, 0, stream_>>>(raw(x), raw(w), raw(out), n, static_cast<float>(eps));
        check_launch("rmsnorm");
    }
    void swiglu(DevPtr g, DevPtr u, int64_t n) const override {
        swiglu_kernel<<<std::min<unsigned>(blocks_for(n, 256), 65535u), 256, 0, stream_>>>(raw(g), raw(u), n);
        check_launch("swiglu");
    }
    void add(DevPtr x, DevPtr y, int64_t n) const override {
        add_kernel<<<std::min<unsigned>(blocks_for(n, 256), 65535u), 256, 0, stream_>>>(raw(x), raw(y), n);
        check_launch("add");
    }
    void rotate(const Rotation& r, DevPtr x, DevPtr out, int64_t B) const override {
        if (B == 0) return;
        const size_t shared = static_cast<size_t>(r.block) * sizeof(float);
        if (static_cast<int64_t>(shared) > max_shared_)
            throw std::invalid_argument("cuda device: Hadamard block " + std::to_string(r.block) + " does not fit in shared memory");
        const float* in = raw(x);
        if (r.grouped_heads && !r.inverse) {
            group_heads_kernel<<<std::min<unsigned>(blocks_for(B * r.width, 256), 65535u), 256, 0, stream_>>>(raw(x), raw(out), r.width, B, r.state,
                                                                                                          r.key_heads, r.rep);
            check_launch("rotate (head order)");
            in = raw(out);
        }
        const dim3 grid(static_cast<unsigned>(r.width / r.block), static_cast<unsigned>(B));
        const int threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, r.block / 2)));
        hadamard_kernel<<<grid, threads, shared, stream_>>>(in, raw(out), signs(r), r.width, r.block, r.inverse);
        check_launch("rotate");
    }

    void attention(const AttentionOp* ops, size_t n) const override {
        for (size_t i = 0; i < n; ++i) attention_one(ops[i]);
    }
    void deltanet(const DeltaNetOp* ops, size_t n) const override {
        for (size_t i = 0; i < n; ++i) deltanet_one(ops[i]);
    }

private:
    const Weight& weight(const Matrix& m) const {
        if (!m.prepared) throw std::logic_error("cuda device: a weight was used before prepare()");
        return *static_cast<const Weight*>(m.prepared);
    }

    // The scratch buffers, one per use.
    enum Slot : size_t { kTokens, kHalfActivations, kDecodedWeights, kQueries, kPartMax, kPartSum, kPartValues, kConvOut, kSlots };

    // Scratch `slot`, at least `bytes` long (grown, never shrunk; the stream is drained before a
    // buffer in use is replaced).
    void* scratch(Slot slot, size_t bytes) const {
        std::lock_guard<std::mutex> lock(scratch_mu_);
        if (scratch_bytes_[slot] < bytes) {
            check(cudaStreamSynchronize(stream_), "scratch");
            cudaFree(scratch_[slot]);
            scratch_[slot] = nullptr;
            check(cudaMalloc(&scratch_[slot], bytes), "cudaMalloc for scratch (out of device memory?)");
            scratch_bytes_[slot] = bytes;
        }
        return scratch_[slot];
    }

    const float* signs(const Rotation& r) const {
        std::lock_guard<std::mutex> lock(scratch_mu_);
        auto it = signs_.find(r.signs);
        if (it != signs_.end()) return it->second;
        float* d = nullptr;
        check(cudaMalloc(&d, static_cast<size_t>(r.width) * sizeof(float)), "cudaMalloc for Hadamard signs");
        check(cudaMemcpy(d, r.signs, static_cast<size_t>(r.width) * sizeof(float), cudaMemcpyHostToDevice), "Hadamard signs");
        signs_[r.signs] = d;
        return d;
    }

    void attention_one(const AttentionOp& op) const {
        if (op.B == 0) return;
        if (op.D > kMaxHeadDim) throw std::invalid_argument("cuda device: head size " + std::to_string(op.D) + " is above " + std::to_string(kMaxHeadDim));
        AttnArgs a{raw(op.qg), raw(op.k), raw(op.v), raw(op.q_norm), raw(op.k_norm), reinterpret_cast<__half*>(DeviceMemory::raw(op.k_cache)),
                   reinterpret_cast<__half*>(DeviceMemory::raw(op.v_cache)), nullptr, raw(op.out),
                   op.B, op.pos0, op.H, op.Hkv, op.D, op.R, static_cast<float>(op.eps), static_cast<float>(op.scale), op.rope_base};
        a.q = static_cast<float*>(scratch(kQueries, static_cast<size_t>(op.B * op.H * op.D) * sizeof(float)));
        attn_prepare_kernel<<<dim3(static_cast<unsigned>(op.B), static_cast<unsigned>(op.H + op.Hkv)), round_threads(op.D), 0, stream_>>>(a);
        check_launch("attention (prepare)");
        // Splits of at least 256 positions, at most 32 per (token, head).
        const int64_t longest = op.pos0 + op.B;
        const int64_t splits = std::clamp<int64_t>((longest + 255) / 256, 1, 32), per_split = (longest + splits - 1) / splits;
        const size_t slots = static_cast<size_t>(op.B * op.H * splits);
        float* pm = static_cast<float*>(scratch(kPartMax, slots * sizeof(float)));
        float* pl = static_cast<float*>(scratch(kPartSum, slots * sizeof(float)));
        float* pacc = static_cast<float*>(scratch(kPartValues, slots * static_cast<size_t>(op.D) * sizeof(float)));
        attn_partial_kernel<<<dim3(static_cast<unsigned>(op.B), static_cast<unsigned>(op.H), static_cast<unsigned>(splits)), 32 * kAttnWarps, 0,
                              stream_>>>(a, per_split, pm, pl, pacc);
        check_launch("attention");
        attn_merge_kernel<<<dim3(static_cast<unsigned>(op.B), static_cast<unsigned>(op.H)), round_threads(op.D), 0, stream_>>>(a, splits, pm, pl, pacc);
        check_launch("attention (merge)");
    }

    void deltanet_one(const DeltaNetOp& op) const {
        if (op.B == 0) return;
        if (op.K > kMaxConv) throw std::invalid_argument("cuda device: conv kernel " + std::to_string(op.K) + " is above " + std::to_string(kMaxConv));
        if (op.S > 1024) throw std::invalid_argument("cuda device: Gated DeltaNet state size " + std::to_string(op.S) + " is above 1024");
        // A tentative step: the window and state before it copied to where the step's go, then
        // updated there in place (a device-to-device copy, cheap beside the step on a GPU).
        if (op.conv_state_in) copy(op.conv_state_in, op.conv_state, static_cast<size_t>((op.K - 1) * op.C));
        if (op.state_in) copy(op.state_in, op.state, static_cast<size_t>(op.Hv * op.S * op.S));
        GdnArgs a{raw(op.qkv), raw(op.z), raw(op.beta), raw(op.alpha), raw(op.conv), raw(op.dt_bias), raw(op.ssm_a), raw(op.ssm_norm),
                  raw(op.conv_state), raw(op.state), nullptr, raw(op.out), op.B, op.K, op.C, op.S, op.Hk, op.Hv, static_cast<float>(op.eps)};
        a.y = static_cast<float*>(scratch(kConvOut, static_cast<size_t>(op.B * op.C) * sizeof(float)));
        gdn_conv_kernel<<<blocks_for(op.C, 256), 256, 0, stream_>>>(a);
        check_launch("deltanet (conv)");
        gdn_l2norm_kernel<<<dim3(static_cast<unsigned>(op.B), static_cast<unsigned>(2 * op.Hk)), round_threads(op.S), 0, stream_>>>(a);
        check_launch("deltanet (norms)");
        gdn_recurrent_kernel<<<static_cast<unsigned>(op.Hv), round_threads(op.S), static_cast<size_t>(2 * op.S) * sizeof(float), stream_>>>(a);
        check_launch("deltanet");
    }

    cudaStream_t stream_ = nullptr;
    cublasHandle_t blas_ = nullptr;
    int64_t max_shared_ = 48 << 10;
    std::vector<std::unique_ptr<Weight>> weights_;
    mutable std::mutex scratch_mu_;
    mutable void* scratch_[kSlots] = {};
    mutable size_t scratch_bytes_[kSlots] = {};
    mutable std::map<const float*, float*> signs_;
};

}  // namespace
}  // namespace pulse::decoder

// The entry point device.cpp looks up (device.h, kDeviceInterfaceVersion). On success returns
// the device and writes a description of the GPU into `note`; on failure returns null and
// writes why (no device, a driver older than this runtime, ...).
extern "C" __attribute__((visibility("default"))) pulse::decoder::Device* pulse_cuda_device_create(int interface_version, char* note,
                                                                                                   size_t note_size) {
    auto say = [&](const std::string& s) {
        if (note_size) std::snprintf(note, note_size, "%s", s.c_str());
    };
    if (interface_version != pulse::decoder::kDeviceInterfaceVersion) {
        say("pulse-device-cuda.so was built for device interface " + std::to_string(pulse::decoder::kDeviceInterfaceVersion) + ", the decoder has " +
            std::to_string(interface_version) + " (a library from another build)");
        return nullptr;
    }
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
        say(std::string("no usable CUDA GPU: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "the runtime reports none"));
        return nullptr;
    }
    try {
        cudaDeviceProp prop{};
        if (cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) {
            say(std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e));
            return nullptr;
        }
        auto* dev = new pulse::decoder::CudaDevice(0);
        char gib[32];
        std::snprintf(gib, sizeof gib, "%.1f", static_cast<double>(prop.totalGlobalMem) / (1 << 30));
        say(std::string(prop.name) + ", " + gib + " GiB, sm_" + std::to_string(prop.major) + std::to_string(prop.minor));
        return dev;
    } catch (const std::exception& e) {
        say(e.what());
        return nullptr;
    }
}
