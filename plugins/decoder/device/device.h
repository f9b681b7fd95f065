// The compute device the qwen35 forward pass runs on (ggml's backend split). The model
// (model.cpp) is written once as a sequence of these ops over memory the device owns: weights
// registered once (`prepare`), norms and other parameters uploaded at load, per-sequence state
// and KV caches, the work buffers of a step, and an explicit read-back of the logits. `cpu`
// (device_cpu.cpp: OpenMP threads, the kernels of kernels.h) is always there; `cuda`
// (cuda/device_cuda.cu) is a shared object of its own, built where nvcc is and loaded only when
// a probe finds a GPU (device.cpp). Both run the per-element math of blocks.h.
//
// Device memory is reached only through typed device pointers (DevPtr: floats; DevHalfPtr:
// binary16 values), addresses in the device's own space that the model offsets (in elements of
// their type) and hands to ops but cannot dereference (the type has no way to), so nothing
// outside a device reads or writes device memory except through upload/download/copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/hadamard.h"

namespace pulse::decoder {

class Device;

// One IEEE binary16 value as the KV cache stores it (arithmetic is done in f32).
struct Half {
    uint16_t bits;
};

template <class T>
class DevPtrOf {
public:
    DevPtrOf() = default;
    DevPtrOf operator+(int64_t elements) const { return DevPtrOf(p_ + elements); }
    explicit operator bool() const { return p_ != nullptr; }

private:
    explicit DevPtrOf(T* p) : p_(p) {}
    T* p_ = nullptr;
    friend struct DeviceMemory;
};
using DevPtr = DevPtrOf<float>;
using DevHalfPtr = DevPtrOf<Half>;

// How a device turns its addresses into something it can use (device implementations, and the
// buffer types below, only).
struct DeviceMemory {
    template <class T>
    static T* raw(DevPtrOf<T> p) { return p.p_; }
    static DevPtr wrap(float* p) { return DevPtr(p); }
    // binary16 values laid over float storage, two to a slot (HalfBuffer).
    static DevHalfPtr halves(DevPtr p) { return DevHalfPtr(reinterpret_cast<Half*>(p.p_)); }
};

// An owned run of `size()` floats in device memory, freed by its device.
class Buffer {
public:
    Buffer() = default;
    Buffer(const Device* dev, DevPtr p, size_t n) : dev_(dev), p_(p), n_(n) {}
    Buffer(Buffer&& o) noexcept { *this = std::move(o); }
    inline Buffer& operator=(Buffer&& o) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    inline ~Buffer();
    DevPtr ptr() const { return p_; }
    size_t size() const { return n_; }

private:
    const Device* dev_ = nullptr;
    DevPtr p_;
    size_t n_ = 0;
};

// A matmul weight: rows of `n_in` values in the tensor's type, with an optional output scale.
// `rot`: a Hadamard-folded weight, whose input is rotated first (hadamard.h). `prepared`: what
// the device made of it at registration (its own layout or copy; opaque to the model).
struct Matrix {
    const TensorInfo* t = nullptr;
    int64_t n_in = 0, n_out = 0;
    float scale = 1;
    const Rotation* rot = nullptr;
    const void* prepared = nullptr;
};

// An owned run of `size()` binary16 values in device memory: the KV cache, which holds IEEE
// binary16 values (llama.cpp's default cache type): K and V rounded to f16 on the way in,
// widened on the way out, half the bytes of an f32 cache to keep and to read every token. A
// device allocates floats; this type lays the values over them, two to a slot, so that no one
// else counts in slots.
class HalfBuffer {
public:
    HalfBuffer() = default;
    inline HalfBuffer(const Device& dev, size_t n);  // zeroed
    DevHalfPtr ptr() const { return DeviceMemory::halves(storage_.ptr()); }
    size_t size() const { return n_; }
    // Copies the first `n` values into `to` (device to device; `to` holds at least n).
    inline void copy_to(HalfBuffer& to, size_t n) const;
    // The first values from the host, or all of them back, as binary16 bits (tests).
    inline void upload(const std::vector<uint16_t>& bits);
    inline std::vector<uint16_t> download() const;
    // The float slots that hold `n` values.
    static constexpr size_t slots(size_t n) { return (n + 1) / 2; }

private:
    Buffer storage_;
    size_t n_ = 0;
    const Device* dev_ = nullptr;
};

// Gated attention for B new tokens at positions pos0..pos0+B-1, between the q/k/v projections
// and the output projection: per-head RMSNorm of q and k, partial NeoX RoPE, store into the
// cache at pos0.., causal softmax attention with GQA, sigmoid gate.
struct AttentionOp {
    DevPtr qg;  // [B][H][2][D]: query and gate, interleaved per head
    DevPtr k;   // [B][Hkv*D]
    DevPtr v;   // [B][Hkv*D]
    int64_t B, pos0, H, Hkv, D, R;
    double rope_base, eps, scale;
    DevPtr q_norm;   // [D]
    DevPtr k_norm;   // [D]
    DevHalfPtr k_cache;  // [capacity >= pos0 + B][Hkv*D]; positions < pos0 filled
    DevHalfPtr v_cache;
    DevPtr out;  // [B][H*D]
};

// Gated DeltaNet for B new tokens, between the input projections and ssm_out: causal conv +
// SiLU, L2-normed q/k per key head, the delta rule per value head (tiled key head), gated
// RMSNorm.
struct DeltaNetOp {
    DevPtr qkv, z, beta, alpha;  // [B][conv_dim], [B][Hv*S], [B][Hv], [B][Hv]
    int64_t B, K, C, S, Hk, Hv;
    double eps;
    DevPtr conv;        // [C][K]
    DevPtr dt_bias;     // [Hv]
    DevPtr ssm_a;       // [Hv] (already -exp(A_log))
    DevPtr ssm_norm;    // [S]
    DevPtr conv_state;  // [(K-1)][C]: the window after the B tokens
    DevPtr state;       // [Hv][S][S]: the state after them
    DevPtr out;         // [B][Hv*S]
    // Where set, the window and state before the tokens are read from here and left as they
    // are (a tentative step: Model::keep_tentative may go back to them); else from conv_state
    // and state, updated in place.
    DevPtr conv_state_in = {}, state_in = {};
};

// Bumped whenever this header changes: a device library built from another revision is
// refused by its number, not run against a different layout.
constexpr int kDeviceInterfaceVersion = 5;

class Device {
public:
    virtual ~Device() = default;
    virtual const char* name() const = 0;

    // Memory. alloc: `n` zeroed floats. copy: device to device.
    virtual Buffer alloc(size_t n) const = 0;
    virtual void release(DevPtr p) const = 0;  // Buffer's destructor
    virtual void upload(const float* host, DevPtr to, size_t n) const = 0;
    virtual void download(DevPtr from, float* host, size_t n) const = 0;
    virtual void copy(DevPtr from, DevPtr to, size_t n) const = 0;
    Buffer upload(const std::vector<float>& host) const;  // alloc + upload

    // Registers a weight (load time) for a use: returns what goes in Matrix::prepared. The
    // device owns it (a repacked copy, an upload) until it is destroyed; each call registers
    // anew (a device keeps no index of tensors by address: a tensor freed and another made in
    // its place must not get the first one's copy). A tensor that is both the embedding table
    // and a matmul weight (a tied output) is registered once, Use::both, for one copy.
    enum class Use { matmul, embedding, both };
    virtual const void* prepare(const Matrix& w, Use use) = 0;
    // The device keeps its own copy of every prepared weight, so the file's pages behind them
    // can leave the process's resident set after load (Model::load does that).
    virtual bool copies_weights() const { return false; }

    // out[b] = row tokens[b] of `table` (an embedding: n_in values per row), for b < B
    virtual void embed(const Matrix& table, const int32_t* tokens, int64_t B, DevPtr out) const = 0;
    // y[b][n_out] = W · x[b][n_in] for b < B (int8: 8-bit activations where the device has a
    // kernel for the weight type; else exact f32)
    virtual void matmul(const Matrix& w, DevPtr x, int64_t B, DevPtr y, bool int8) const = 0;
    // y[i] = W[i] · x for i < n: the matmuls of a layer that read one input (the q/k/v or Gated
    // DeltaNet projections, FFN gate and up), each with the same result as matmul(). A device
    // may run them as one pass: the CPU quantizes x once and splits all their rows between its
    // threads in one parallel loop. The default calls matmul() for each. (Defined here: the
    // class has no out-of-line virtual, so a device library needs nothing from the decoder's.)
    virtual void matmuls(const Matrix* const* w, const DevPtr* y, size_t n, DevPtr x, int64_t B, bool int8) const {
        for (size_t i = 0; i < n; ++i) matmul(*w[i], x, B, y[i], int8);
    }
    // RMSNorm of `rows` rows of n values with weight w
    virtual void rmsnorm(DevPtr x, DevPtr w, DevPtr out, int64_t rows, int64_t n, double eps) const = 0;
    virtual void swiglu(DevPtr g, DevPtr u, int64_t n) const = 0;  // g = silu(g) * u
    virtual void add(DevPtr x, DevPtr y, int64_t n) const = 0;     // x += y
    // out[b] = the rotation of x[b] for b < B (rows of r.width values; r.signs is host memory
    // the model keeps alive: a device may cache its own copy by that address)
    virtual void rotate(const Rotation& r, DevPtr x, DevPtr out, int64_t B) const = 0;
    // One layer's token mixer for `n` sequences of a step (one op each, all with the layer's
    // sizes and parameters, each against its own cache or state): a device runs them together.
    virtual void attention(const AttentionOp* ops, size_t n) const = 0;
    virtual void deltanet(const DeltaNetOp* ops, size_t n) const = 0;
};

inline Buffer& Buffer::operator=(Buffer&& o) noexcept {
    if (this != &o) {
        if (dev_ && p_) dev_->release(p_);
        dev_ = o.dev_, p_ = o.p_, n_ = o.n_;
        o.dev_ = nullptr, o.p_ = DevPtr(), o.n_ = 0;
    }
    return *this;
}

inline Buffer::~Buffer() {
    if (dev_ && p_) dev_->release(p_);
}

inline HalfBuffer::HalfBuffer(const Device& dev, size_t n) : storage_(dev.alloc(slots(n))), n_(n), dev_(&dev) {}

inline void HalfBuffer::upload(const std::vector<uint16_t>& bits) {
    if (bits.size() > n_) throw std::out_of_range("HalfBuffer::upload: more values than the buffer holds");
    std::vector<float> staging(slots(bits.size()));
    std::memcpy(staging.data(), bits.data(), bits.size() * sizeof(uint16_t));
    if (!staging.empty()) dev_->upload(staging.data(), storage_.ptr(), staging.size());
}

inline std::vector<uint16_t> HalfBuffer::download() const {
    std::vector<float> staging(storage_.size());
    if (!staging.empty()) dev_->download(storage_.ptr(), staging.data(), staging.size());
    std::vector<uint16_t> bits(n_);
    std::memcpy(bits.data(), staging.data(), n_ * sizeof(uint16_t));
    return bits;
}

inline void HalfBuffer::copy_to(HalfBuffer& to, size_t n) const {
    if (n > n_ || n > to.n_) throw std::out_of_range("HalfBuffer::copy_to: more values than a buffer holds");
    if (n) dev_->copy(storage_.ptr(), to.storage_.ptr(), slots(n));
}

// The devices this build has, by name ("cpu" first).
std::vector<std::string> device_names();
// A device this build has but this machine cannot run ("cuda" without a GPU): a bad choice of
// device like a name the build lacks, so the same exception type.
class DeviceUnavailable : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};
// `name`: "cpu", "cuda", or "" = the best one this machine can run (cuda where the build has it
// and a GPU answers the probe, else cpu). A name the build lacks is std::invalid_argument naming
// what it has; "cuda" on a machine without a usable GPU is DeviceUnavailable saying why.
// `note` (optional) gets one line on the choice: the GPU chosen, or why the CPU was.
std::unique_ptr<Device> make_device(const std::string& name, std::string* note = nullptr);

}  // namespace pulse::decoder
