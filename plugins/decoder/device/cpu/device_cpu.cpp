#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "device/cpu/kernels.h"
#include "device/device.h"
#include "format/blocks.h"
#include "format/quants.h"

namespace pulse::decoder {

namespace {

[[maybe_unused]] constexpr int64_t kSplitElements = 65536;  // element-wise ops this long are worth a fork-join (OpenMP's if clauses)
constexpr int64_t kMaxConv = 8;              // Gated DeltaNet conv taps (Qwen3.5: 4)
constexpr int64_t kConvBlock = 64;           // channels per conv work item

using blocks::sigmoid;

void rmsnorm_row(const float* x, const float* w, float* out, int64_t n, double eps) {
    const float r = static_cast<float>(1.0 / std::sqrt(sum_squares(x, n) / static_cast<double>(n) + eps));
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
}

void l2norm(float* x, int64_t n, double eps) {
    const float r = static_cast<float>(1.0 / std::sqrt(sum_squares(x, n) + eps));
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

// Per-thread buffer for one decoded weight row: matmuls run per token, so no allocation there.
std::vector<float>& row_scratch(int64_t n) {
    thread_local std::vector<float> buf;
    if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
    return buf;
}

void matvec(const Matrix& w, const float* x, float* y) {
    const TensorInfo& t = *w.t;
    const uint64_t rb = t.row_bytes();
#pragma omp parallel
    {
        std::vector<float>& scratch = row_scratch(w.n_in);
#pragma omp for schedule(static)
        for (int64_t o = 0; o < w.n_out; ++o)
            y[o] = dot_row(t.type, t.data + static_cast<uint64_t>(o) * rb, x, w.n_in, scratch.data()) * w.scale;
    }
}

// What CpuDevice::prepare makes of a Q8_0 or TQ2_0 matrix where the CPU has the interleaved
// kernels: its rows in groups of eight (kernels.h, repack_q8_0x8 / repack_tq2_0x8); rows past
// the last full group stay where the file is mapped.
struct Packed {
    uint32_t type = 0;
    int64_t groups = 0;
    uint64_t group_bytes = 0;
    const uint8_t* data = nullptr;  // in the device's WeightArena
};

// Where the repacked weights live: 2 MiB-aligned anonymous regions marked for transparent huge
// pages, matrices placed one after another in them. Decode streams every weight once per step;
// on 4 KiB pages each page is a TLB miss and a stop for the hardware prefetchers, and matrices
// are mostly smaller than a huge page, so one region each would not get one. (Q8_0 bench
// model's matrices in turn, 2 threads: 25-30 -> 36-44 GB/s at one token.) Where the kernel
// gives no huge pages (THP off) the regions are plain pages; touched pages only are resident.
class WeightArena {
public:
    WeightArena() = default;
    WeightArena(const WeightArena&) = delete;
    WeightArena& operator=(const WeightArena&) = delete;
    ~WeightArena() {
        for (const auto& r : regions_) ::munmap(r.base, r.bytes);
    }
    uint8_t* take(size_t bytes) {
        bytes = (bytes + 63) & ~size_t{63};
        if (regions_.empty() || used_ + bytes > regions_.back().bytes) {
            const size_t want = std::max(kRegion, (bytes + kHuge - 1) & ~(kHuge - 1));
            regions_.push_back(Region{map_aligned(want), want});
            used_ = 0;
        }
        uint8_t* p = static_cast<uint8_t*>(regions_.back().base) + used_;
        used_ += bytes;
        return p;
    }

private:
    static constexpr size_t kHuge = size_t{2} << 20, kRegion = size_t{64} << 20;
    struct Region {
        void* base;
        size_t bytes;
    };
    static void* map_aligned(size_t bytes) {
        void* m = ::mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) throw std::bad_alloc();
        const uintptr_t start = reinterpret_cast<uintptr_t>(m), aligned = (start + kHuge - 1) & ~(kHuge - 1);
        if (aligned > start) ::munmap(m, aligned - start);
        if (const size_t tail = start + bytes + kHuge - (aligned + bytes)) ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
        ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // best effort
        return reinterpret_cast<void*>(aligned);
    }
    std::vector<Region> regions_;
    size_t used_ = 0;
};

// f(b, T) over tokens 0..B-1: `most` at a time, then the rest (T < most) in one call.
template <class F>
void by_up_to(int most, int64_t B, F f) {
    int64_t b = 0;
    for (; b + most <= B; b += most) f(b, most);
    if (b < B) f(b, static_cast<int>(B - b));
}

constexpr size_t kMaxFused = 8;  // matrices in one matmats_i8 pass

// Whether `w` takes int8 activations here (a kernel for its type, whole activation blocks).
bool i8_ready(const Matrix& w) {
    const int64_t blk = i8_block(w.t->type);
    return blk && w.n_in % blk == 0;
}

// Int8 activations for up to kMaxFused matrices that all read X (i8_ready, one n_in): X
// quantized once per weight type among them, then one parallel loop over the rows of all of
// them, so a layer's projections cost one fork-join and their rows split evenly between the
// threads however small each matrix is. Each group of eight interleaved rows (or chunk of plain
// rows) takes the tokens four at a time: the rows are read once per four tokens, from cache
// after the first.
void matmats_i8(const Matrix* const* ws, float* const* ys, size_t n, const float* x, int64_t B) {
    const int64_t n_in = ws[0]->n_in;
    // X quantized per weight type among them: the calling thread's buffers, kept from call to
    // call so that nothing is allocated per token.
    thread_local std::vector<QuantizedRows> quant;
    size_t types = 0, slot[kMaxFused];
    for (size_t i = 0; i < n; ++i) {
        if (ws[i]->n_in != n_in) throw std::invalid_argument("matrices multiplied together must share their input width");
        const uint32_t type = ws[i]->t->type;
        size_t j = 0;
        while (j < types && quant[j].type != type) ++j;
        if (j == types) {
            if (quant.size() <= j) quant.resize(j + 1);
            quant[j].shape(type, B, n_in);
            ++types;
        }
        slot[i] = j;
    }
    // OpenMP's workers reach the calling thread's buffers through this pointer, never through
    // their own thread_local copies.
    QuantizedRows* const qs = quant.data();
    const int64_t jobs = static_cast<int64_t>(types) * B;
#pragma omp parallel for schedule(static) if (jobs * n_in >= kSplitElements)
    for (int64_t k = 0; k < jobs; ++k) {
        const int64_t b = k % B;
        qs[k / B].quantize_row(b, x + b * n_in);
    }

    // Every matrix's packed groups in pairs (one dot_x16 each; an odd last group as both halves), then its
    // remaining rows in chunks of kChunk (a chunk stays in cache while the tokens pass over it),
    // each numbered across the matrices.
    constexpr int64_t kChunk = 64;
    struct Part {
        const Matrix* w;
        const Packed* packed;
        const QuantRow* x;
        float* y;
        int64_t first_row;                  // the rows the plain kernels do: first_row..n_out
        int64_t pairs_begin, pairs_end;     // this part's pairs of groups among all parts'
        int64_t chunks_begin, chunks_end;   // and its chunks of plain rows
    } parts[kMaxFused];
    int64_t pairs = 0, chunks = 0;
    for (size_t i = 0; i < n; ++i) {
        const Matrix& w = *ws[i];
        const auto* packed = has_x8() ? static_cast<const Packed*>(w.prepared) : nullptr;
        const int64_t first_row = packed ? 8 * packed->groups : 0;
        const int64_t my_pairs = packed ? (packed->groups + 1) / 2 : 0, my_chunks = (w.n_out - first_row + kChunk - 1) / kChunk;
        parts[i] = Part{&w, packed, qs[slot[i]].rows.data(), ys[i], first_row, pairs, pairs + my_pairs, chunks, chunks + my_chunks};
        pairs += my_pairs;
        chunks += my_chunks;
    }
#pragma omp parallel
    {
        size_t i = 0;
#pragma omp for schedule(static) nowait
        for (int64_t u = 0; u < pairs; ++u) {
            while (u >= parts[i].pairs_end) ++i;
            const Part& pt = parts[i];
            const Packed& pk = *pt.packed;
            const int64_t g = 2 * (u - pt.pairs_begin), n_out = pt.w->n_out;
            const int rows = g + 1 < pk.groups ? 16 : 8;
            const uint8_t* p = pk.data + static_cast<uint64_t>(g) * pk.group_bytes;
            by_up_to(dot_x16_tokens(pk.type), B, [&](int64_t b, int T) {
                float r[16 * kDotX16MaxTokens];
                dot_x16(pk.type, p, rows == 16 ? pk.group_bytes : 0, pt.x + b, T, n_in, r);
                for (int k = 0; k < rows; ++k)
                    for (int t = 0; t < T; ++t) pt.y[(b + t) * n_out + 8 * g + k] = r[k * T + t] * pt.w->scale;
            });
        }
        i = 0;
#pragma omp for schedule(static) nowait
        for (int64_t c = 0; c < chunks; ++c) {
            while (c >= parts[i].chunks_end) ++i;
            const Part& pt = parts[i];
            const Matrix& w = *pt.w;
            const int64_t o0 = pt.first_row + (c - pt.chunks_begin) * kChunk, o1 = std::min(w.n_out, o0 + kChunk);
            by_up_to(4, B, [&](int64_t b, int T) {
                matmul_rows_i8(w.t->type, RowRange{w.t->data, w.t->row_bytes(), o0, o1, pt.y + b * w.n_out, w.n_out, w.scale}, pt.x + b, T, n_in);
            });
        }
    }
}

void matmat(const Matrix& w, const float* x, int64_t B, float* y, bool int8) {
    const TensorInfo& t = *w.t;
    if (int8 && i8_ready(w)) {
        const Matrix* ws = &w;
        return matmats_i8(&ws, &y, 1, x, B);
    }
    if (B == 1) return matvec(w, x, y);
    const uint64_t rb = t.row_bytes();
    const int64_t n = w.n_in;
#pragma omp parallel
    {
        std::vector<float>& scratch = row_scratch(n);
#pragma omp for schedule(static)
        for (int64_t o = 0; o < w.n_out; ++o) {
            const uint8_t* raw = t.data + static_cast<uint64_t>(o) * rb;
            int64_t b = 0;
            // Decode the row once, then one dot per token (four at a time).
            const float* r = reinterpret_cast<const float*>(raw);
            if (t.type != kF32) {
                dequantize_row(t.type, raw, scratch.data(), n);
                r = scratch.data();
            }
            for (; b + 4 <= B; b += 4) {
                float d[4];
                dot4_f32(r, x + b * n, n, d);
                for (int k = 0; k < 4; ++k) y[(b + k) * w.n_out + o] = d[k] * w.scale;
            }
            for (; b < B; ++b) y[b * w.n_out + o] = dot_f32(r, x + b * n, n) * w.scale;
        }
    }
}


float* raw(DevPtr p) { return DeviceMemory::raw(p); }
// The KV cache's binary16 values, as the f16 kernels read and write them.
uint16_t* f16(DevHalfPtr p) { return reinterpret_cast<uint16_t*>(DeviceMemory::raw(p)); }


class CpuDevice : public Device {
public:
    const char* name() const override { return "cpu"; }
    ~CpuDevice() override {
        for (const auto& [bytes, m] : spare_) ::munmap(m, bytes);
    }
    Buffer alloc(size_t n) const override {
        // 64-byte aligned (a cache line, an AVX-512 vector), zeroed. Large buffers (KV caches,
        // which grow by doubling; Gated DeltaNet states) are anonymous pages: fresh ones are
        // zero without being touched, so capacity not yet written costs no resident memory.
        // But each page's first touch is a fault (13-47 us on the VMs this was measured on: a
        // new sequence's 64-token prefill took twice as long for them), and a new sequence
        // touches all of its states at once: a released mapping is kept for the next buffer of
        // its size and zeroed here instead.
        const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
        if (bytes >= kMappedBytes) {
            void* m = nullptr;
            {
                std::lock_guard<std::mutex> lock(mapped_mutex_);
                if (auto it = spare_.find(bytes); it != spare_.end()) {
                    m = it->second;
                    spare_.erase(it);
                    spare_bytes_ -= bytes;
                }
            }
            if (m) {
                std::memset(m, 0, bytes);
            } else {
                m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (m == MAP_FAILED) throw std::bad_alloc();
            }
            std::lock_guard<std::mutex> lock(mapped_mutex_);
            mapped_[m] = bytes;
            return Buffer(this, DeviceMemory::wrap(static_cast<float*>(m)), n);
        }
        float* p = static_cast<float*>(::operator new[](bytes, std::align_val_t{64}));
        std::memset(p, 0, bytes);
        return Buffer(this, DeviceMemory::wrap(p), n);
    }
    void release(DevPtr p) const override {
        {
            std::lock_guard<std::mutex> lock(mapped_mutex_);
            if (auto it = mapped_.find(raw(p)); it != mapped_.end()) {
                if (spare_bytes_ + it->second <= kSpareBytes) {
                    spare_.emplace(it->second, it->first);
                    spare_bytes_ += it->second;
                } else {
                    ::munmap(it->first, it->second);
                }
                mapped_.erase(it);
                return;
            }
        }
        ::operator delete[](raw(p), std::align_val_t{64});
    }
    void upload(const float* host, DevPtr to, size_t n) const override { std::memcpy(raw(to), host, n * sizeof(float)); }
    void download(DevPtr from, float* host, size_t n) const override { std::memcpy(host, raw(from), n * sizeof(float)); }
    void copy(DevPtr from, DevPtr to, size_t n) const override { std::memcpy(raw(to), raw(from), n * sizeof(float)); }
    // The CPU reads weights where the file is mapped, except Q8_0 and TQ2_0 matrices where it
    // has the interleaved kernels: those are repacked, and the file's pages behind them let go
    // (RSS stays one copy). Each call packs anew: no index by tensor address, which a tensor
    // made where a freed one was would hit (the caller registers a tied tensor once: Use::both).
    const void* prepare(const Matrix& w, Use use) override {
        const TensorInfo& t = *w.t;
        const bool q8 = t.type == kQ8_0 && w.n_in % 32 == 0, tq2 = t.type == kTQ2_0 && w.n_in % 256 == 0;
        if (use == Use::embedding || !(q8 || tq2) || !has_x8() || w.n_out < 8) return nullptr;
        auto p = std::make_unique<Packed>();
        p->type = t.type;
        p->groups = w.n_out / 8;
        p->group_bytes = q8 ? static_cast<uint64_t>(w.n_in / 32) * kQ8x8Bytes : static_cast<uint64_t>(w.n_in / 256) * kTQ2x8Bytes;
        uint8_t* const data = arena_.take(static_cast<size_t>(p->groups) * p->group_bytes);
        p->data = data;
        const uint64_t rb = t.row_bytes();
#pragma omp parallel for schedule(static)
        for (int64_t g = 0; g < p->groups; ++g) {
            const uint8_t* rows = t.data + static_cast<uint64_t>(8 * g) * rb;
            uint8_t* out = data + static_cast<uint64_t>(g) * p->group_bytes;
            if (q8) repack_q8_0x8(rows, rb, w.n_in, out);
            else repack_tq2_0x8(rows, rb, w.n_in, out);
        }
        if (t.file) t.file->release_pages(t.data, static_cast<uint64_t>(8 * p->groups) * rb);
        packed_.push_back(std::move(p));
        return packed_.back().get();
    }
    void embed(const Matrix& table, const int32_t* tokens, int64_t B, DevPtr out) const override {
        const TensorInfo& t = *table.t;
        for (int64_t b = 0; b < B; ++b)
            dequantize_row(t.type, t.data + static_cast<uint64_t>(tokens[b]) * t.row_bytes(), raw(out) + b * table.n_in, table.n_in);
    }
    void matmul(const Matrix& w, DevPtr x, int64_t B, DevPtr y, bool int8) const override { matmat(w, raw(x), B, raw(y), int8); }
    // The int8 ones in one pass (kMaxFused at a time), the others one by one.
    void matmuls(const Matrix* const* w, const DevPtr* y, size_t n, DevPtr x, int64_t B, bool int8) const override {
        // One input, one width, whichever path each matrix takes (checked before anything runs).
        for (size_t i = 1; i < n; ++i)
            if (w[i]->n_in != w[0]->n_in) throw std::invalid_argument("matrices multiplied together must share their input width");
        const Matrix* fused[kMaxFused];
        float* out[kMaxFused];
        size_t k = 0;
        for (size_t i = 0; i < n; ++i) {
            if (!int8 || !i8_ready(*w[i])) {
                matmat(*w[i], raw(x), B, raw(y[i]), int8);
                continue;
            }
            fused[k] = w[i], out[k] = raw(y[i]);
            if (++k == kMaxFused) matmats_i8(fused, out, k, raw(x), B), k = 0;
        }
        if (k) matmats_i8(fused, out, k, raw(x), B);
    }
    // The element-wise ops split across the threads only when they are long: a fork-join costs
    // tens of microseconds where waking a sleeping thread is a VM exit, more than a few rows of
    // work (on this project's 2-vCPU VM, splitting from two rows on took the two-stream decode
    // aggregate from 40-46 down to 35-38 tok/s, Q8_0 bench model, alternating runs).
    void rmsnorm(DevPtr x, DevPtr w, DevPtr out, int64_t rows, int64_t n, double eps) const override {
        const float *xp = raw(x), *wp = raw(w);
        float* op = raw(out);
#pragma omp parallel for schedule(static) if (rows * n >= kSplitElements)
        for (int64_t r = 0; r < rows; ++r) rmsnorm_row(xp + r * n, wp, op + r * n, n, eps);
    }
    void swiglu(DevPtr g, DevPtr u, int64_t n) const override {
        float *gp = raw(g), *up = raw(u);
        constexpr int64_t kPiece = 8192;
#pragma omp parallel for schedule(static) if (n >= kSplitElements)
        for (int64_t i = 0; i < n; i += kPiece) silu_mul(gp + i, up + i, gp + i, std::min(kPiece, n - i));
    }
    void add(DevPtr x, DevPtr y, int64_t n) const override {
        float *xp = raw(x), *yp = raw(y);
#pragma omp parallel for simd schedule(static) if (n >= kSplitElements)
        for (int64_t i = 0; i < n; ++i) xp[i] += yp[i];
    }
    void rotate(const Rotation& r, DevPtr x, DevPtr out, int64_t B) const override {
        const float* xp = raw(x);
        float* op = raw(out);
#pragma omp parallel for schedule(static) if (B > 1)
        for (int64_t b = 0; b < B; ++b) rotate_row(r, xp + b * r.width, op + b * r.width);
    }
    void attention(const AttentionOp* ops, size_t n) const override;
    void deltanet(const DeltaNetOp* ops, size_t n) const override;

private:
    static constexpr size_t kMappedBytes = size_t{1} << 20;
    // Released mappings kept for reuse, up to this many bytes in all (resident memory the
    // process holds beyond its buffers: about two sequences' states of a 27B hybrid model).
    static constexpr size_t kSpareBytes = size_t{512} << 20;
    mutable std::mutex mapped_mutex_;
    mutable std::unordered_map<void*, size_t> mapped_;  // mmap'd buffers and their sizes
    mutable std::multimap<size_t, void*> spare_;        // released mappings by size
    mutable size_t spare_bytes_ = 0;
    WeightArena arena_;
    std::vector<std::unique_ptr<Packed>> packed_;
};

// Attention tiles: a tile's query rows are up to kAttnRows (tokens × the query heads that share
// one KV head, so each key and value is read once for all of them), its keys kAttnKeys at a
// time, with an online softmax (a running max and sum per row; the output rescaled when the
// max grows). Scores are gemm_f32_nt against the cached keys in place, the weighted values
// gemm_f32 (kernels.h).
constexpr int64_t kAttnRows = 32;
constexpr int64_t kAttnKeys = 64;
// A (sequence, KV head, query tile) with fewer keys than this is not split across threads.
constexpr int64_t kAttnMinSplitKeys = 512;

// Each phase runs every op of the call in one parallel region: first (op, token) pairs (q/k
// norms, RoPE, the cache store), then (op, KV head, query tile, key range) units, so several
// decoding sequences share one fork-join.
void CpuDevice::attention(const AttentionOp* ops, size_t n_ops) const {
    if (n_ops == 0) return;
    const AttentionOp& op0 = ops[0];
    const int64_t H = op0.H, Hkv = op0.Hkv, D = op0.D, R = op0.R;
    // NeoX partial RoPE: pairs (i, i + R/2) of the first R dims; frequency exponent over R.
    std::vector<double> inv_freq(static_cast<size_t>(R / 2));
    for (int64_t i = 0; i < R / 2; ++i) inv_freq[static_cast<size_t>(i)] = blocks::rope_inv_freq(op0.rope_base, i, R);
    // A position's cosines and sines (R/2 of each), worked out once for all H + Hkv heads of a
    // token instead of once per head.
    auto angles = [&](int64_t p, float* cs) {
        for (int64_t i = 0; i < R / 2; ++i) blocks::rope_cos_sin(static_cast<double>(p) * inv_freq[static_cast<size_t>(i)], cs[i], cs[R / 2 + i]);
    };
    auto rope = [&](float* v, const float* cs) {
        for (int64_t i = 0; i < R / 2; ++i) blocks::rotate_pair(v[i], v[i + R / 2], cs[i], cs[R / 2 + i]);
    };
    struct Item {
        const AttentionOp* op;
        int64_t b;  // token within the op
    };
    std::vector<Item> items;
    std::vector<int64_t> first(n_ops);  // op i's token 0 as an item (its q and gate rows)
    for (size_t i = 0; i < n_ops; ++i) {
        first[i] = static_cast<int64_t>(items.size());
        for (int64_t b = 0; b < ops[i].B; ++b) items.push_back(Item{&ops[i], b});
    }
    const int64_t N = static_cast<int64_t>(items.size());
    // The queries (normed, rotated, scaled), gates, and keys/values appended to each cache.
    std::vector<float> q(static_cast<size_t>(N * H * D)), gate(q.size());
#pragma omp parallel for schedule(static) if (N > 1)
    for (int64_t it = 0; it < N; ++it) {
        const AttentionOp& op = *items[static_cast<size_t>(it)].op;
        const int64_t b = items[static_cast<size_t>(it)].b, p = op.pos0 + b;
        const float* qg = raw(op.qg) + b * 2 * H * D;
        const float scale = static_cast<float>(op.scale);
        thread_local std::vector<float> cs;
        cs.resize(static_cast<size_t>(R));
        angles(p, cs.data());
        for (int64_t j = 0; j < H; ++j) {
            float* qj = q.data() + (it * H + j) * D;
            rmsnorm_row(qg + 2 * D * j, raw(op.q_norm), qj, D, op.eps);
            std::memcpy(gate.data() + (it * H + j) * D, qg + 2 * D * j + D, static_cast<size_t>(D) * 4);
            rope(qj, cs.data());
            for (int64_t d = 0; d < D; ++d) qj[d] *= scale;
        }
        // The cache holds K and V in f16 (device.h), as llama.cpp's default cache does.
        uint16_t* kn = f16(op.k_cache) + p * Hkv * D;
        uint16_t* vn = f16(op.v_cache) + p * Hkv * D;
        const float *kp = raw(op.k) + b * Hkv * D, *vp = raw(op.v) + b * Hkv * D;
        thread_local std::vector<float> kr;
        kr.resize(static_cast<size_t>(D));
        for (int64_t j = 0; j < Hkv; ++j) {
            rmsnorm_row(kp + j * D, raw(op.k_norm), kr.data(), D, op.eps);
            rope(kr.data(), cs.data());
            f32_to_f16_row(kr.data(), kn + j * D, D);
        }
        f32_to_f16_row(vp, vn, Hkv * D);
    }

    // The tiles. Query row r of a tile is token b0 + r / G, head kvh·G + r % G (GQA: blocks of
    // consecutive query heads share a KV head).
    const int64_t G = H / Hkv;
    const int64_t tile_tokens = std::max<int64_t>(1, kAttnRows / G);
    struct Tile {
        size_t op;
        int64_t kvh, b0, b1;
    };
    std::vector<Tile> tiles;
    int64_t most_keys = 0;
    for (size_t i = 0; i < n_ops; ++i) {
        for (int64_t kvh = 0; kvh < Hkv; ++kvh)
            for (int64_t b0 = 0; b0 < ops[i].B; b0 += tile_tokens) tiles.push_back(Tile{i, kvh, b0, std::min(ops[i].B, b0 + tile_tokens)});
        most_keys = std::max(most_keys, ops[i].pos0 + ops[i].B);
    }
    const int64_t n_tiles = static_cast<int64_t>(tiles.size());
    // Decoding one or two sequences makes fewer tiles than threads: then each tile's keys are
    // split into ranges (whole key tiles) run apart, and their partial softmaxes merged.
#ifdef _OPENMP
    const int64_t threads = omp_get_max_threads();
#else
    const int64_t threads = 1;
#endif
    int64_t splits = 1;
    if (n_tiles < threads && most_keys >= 2 * kAttnMinSplitKeys)
        splits = std::min((threads + n_tiles - 1) / n_tiles, most_keys / kAttnMinSplitKeys);
    const int64_t rows_max = tile_tokens * G;
    // Per (tile, split): each row's running max and sum, then its D outputs (unnormalized).
    const int64_t part_floats = rows_max * (D + 2);
    std::vector<float> parts(splits > 1 ? static_cast<size_t>(n_tiles * splits * part_floats) : 0);

    auto finish_row = [&](const Tile& tl, int64_t r, const float* o, float inv_sum) {
        const int64_t b = tl.b0 + r / G, h = tl.kvh * G + r % G;
        const int64_t it = first[tl.op] + b;
        const float* g = gate.data() + (it * H + h) * D;
        float* out = raw(ops[tl.op].out) + (b * H + h) * D;
        for (int64_t d = 0; d < D; ++d) out[d] = o[d] * inv_sum * sigmoid(g[d]);
    };

#pragma omp parallel
    {
        thread_local std::vector<float> qt, sc, acc, mx, sum, kt, vt;
        mx.resize(static_cast<size_t>(rows_max));
        sum.resize(static_cast<size_t>(rows_max));
        qt.resize(static_cast<size_t>(rows_max * D));
        acc.resize(static_cast<size_t>(rows_max * D));
        sc.resize(static_cast<size_t>(rows_max * kAttnKeys));
        kt.resize(static_cast<size_t>(kAttnKeys * D));  // a key tile's keys and values, widened to f32
        vt.resize(kt.size());
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < n_tiles * splits; ++u) {
            const Tile& tl = tiles[static_cast<size_t>(u / splits)];
            const int64_t split = u % splits;
            const AttentionOp& op = ops[tl.op];
            const int64_t rows = (tl.b1 - tl.b0) * G;
            // Keys [k_begin, k_end): the split's whole key tiles of the tile's causal range.
            const int64_t n_keys = op.pos0 + tl.b1;
            const int64_t per_split = (n_keys + splits * kAttnKeys - 1) / (splits * kAttnKeys) * kAttnKeys;
            const int64_t k_begin = std::min(n_keys, split * per_split), k_end = std::min(n_keys, k_begin + per_split);
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t it = first[tl.op] + tl.b0 + r / G, h = tl.kvh * G + r % G;
                std::memcpy(qt.data() + r * D, q.data() + (it * H + h) * D, static_cast<size_t>(D) * 4);
                mx[r] = -INFINITY;
                sum[r] = 0;
            }
            std::fill(acc.begin(), acc.begin() + rows * D, 0.f);
            const uint16_t* kc = f16(op.k_cache) + tl.kvh * D;
            const uint16_t* vc = f16(op.v_cache) + tl.kvh * D;
            const int64_t kv_stride = Hkv * D;
            for (int64_t k0 = k_begin; k0 < k_end; k0 += kAttnKeys) {
                const int64_t tk = std::min(kAttnKeys, k_end - k0);
                f16_to_f32_rows(kc + k0 * kv_stride, kv_stride, tk, D, kt.data(), D);
                f16_to_f32_rows(vc + k0 * kv_stride, kv_stride, tk, D, vt.data(), D);
                gemm_f32_nt(rows, tk, D, qt.data(), D, kt.data(), D, sc.data(), kAttnKeys);  // the scores
                for (int64_t r = 0; r < rows; ++r) {
                    float* s = sc.data() + r * kAttnKeys;
                    // Row r sees keys up to its own position: the first `valid` of this tile.
                    const int64_t valid = std::clamp<int64_t>(op.pos0 + tl.b0 + r / G + 1 - k0, 0, tk);
                    float m = mx[r];
                    for (int64_t t = 0; t < valid; ++t) m = std::max(m, s[t]);
                    if (valid == 0) {
                        std::fill(s, s + tk, 0.f);
                        continue;
                    }
                    if (m > mx[r]) {
                        const float c = std::exp(mx[r] - m);  // 0 on the first keys (max was -inf)
                        sum[r] *= c;
                        float* o = acc.data() + r * D;
                        for (int64_t d = 0; d < D; ++d) o[d] *= c;
                        mx[r] = m;
                    }
                    sum[r] += exp_shifted(s, valid, m);
                    std::fill(s + valid, s + tk, 0.f);
                }
                gemm_f32(rows, D, tk, sc.data(), kAttnKeys, vt.data(), D, acc.data(), D, true);  // += weights · values
            }
            if (splits == 1) {
                for (int64_t r = 0; r < rows; ++r) finish_row(tl, r, acc.data() + r * D, 1.f / sum[r]);
            } else {
                float* part = parts.data() + u * part_floats;
                for (int64_t r = 0; r < rows; ++r) {
                    part[r * (D + 2)] = mx[r];
                    part[r * (D + 2) + 1] = sum[r];
                    std::memcpy(part + r * (D + 2) + 2, acc.data() + r * D, static_cast<size_t>(D) * 4);
                }
            }
        }
    }
    if (splits == 1) return;
    // The splits' partial softmaxes of each row, merged: each rescaled to the common max.
#pragma omp parallel for schedule(static)
    for (int64_t ti = 0; ti < n_tiles; ++ti) {
        const Tile& tl = tiles[static_cast<size_t>(ti)];
        std::vector<float> o(static_cast<size_t>(D));
        for (int64_t r = 0; r < (tl.b1 - tl.b0) * G; ++r) {
            float m = -INFINITY;
            for (int64_t sp = 0; sp < splits; ++sp) m = std::max(m, parts[static_cast<size_t>((ti * splits + sp) * part_floats + r * (D + 2))]);
            std::fill(o.begin(), o.end(), 0.f);
            float total = 0;
            for (int64_t sp = 0; sp < splits; ++sp) {
                const float* part = parts.data() + (ti * splits + sp) * part_floats + r * (D + 2);
                if (part[1] == 0) continue;  // a range with no key this row may see
                const float c = std::exp(part[0] - m);
                total += c * part[1];
                for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(d)] += c * part[2 + d];
            }
            finish_row(tl, r, o.data(), 1.f / total);
        }
    }
}

void CpuDevice::deltanet(const DeltaNetOp* ops, size_t n_ops) const {
    if (n_ops == 0) return;
    const DeltaNetOp& op0 = ops[0];
    const int64_t K = op0.K, C = op0.C, S = op0.S, Hk = op0.Hk, Hv = op0.Hv;
    const int64_t kd = Hk * S, VD = Hv * S;
    if (S > 512) throw std::invalid_argument("Gated DeltaNet state size " + std::to_string(S) + " is above 512 (not supported)");
    if (K < 1 || K > kMaxConv) throw std::invalid_argument("Gated DeltaNet conv kernel of " + std::to_string(K) + " taps (1 to " + std::to_string(kMaxConv) + " supported)");
    const int64_t n = static_cast<int64_t>(n_ops);
    // Every op's conv output (B rows of C), one buffer for the call: the calling thread's, so no
    // allocation per layer and step; the workers see it through this pointer.
    thread_local std::vector<float> y_buf;
    std::vector<int64_t> y_at(n_ops + 1, 0);
    for (size_t i = 0; i < n_ops; ++i) y_at[i + 1] = y_at[i] + ops[i].B * C;
    if (y_buf.size() < static_cast<size_t>(y_at[n_ops])) y_buf.resize(static_cast<size_t>(y_at[n_ops]));
    float* const y = y_buf.data();
    // Causal depthwise conv + SiLU over each op's window: the K-1 rows its conv state keeps, then
    // its B new rows (read where they lie, not copied together). Per block of channels: the
    // block's taps transposed once (the file keeps each channel's K taps together), then every
    // op's tokens as runs of consecutive channels, the SiLU vectorised (kernels.h).
    const float* conv = raw(op0.conv);
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += kConvBlock) {
        const int64_t nc = std::min(kConvBlock, C - c0);
        float w[kMaxConv][kConvBlock];
        for (int64_t c = 0; c < nc; ++c)
            for (int64_t t = 0; t < K; ++t) w[t][c] = conv[(c0 + c) * K + t];
        for (int64_t i = 0; i < n; ++i) {
            const float *window = raw(ops[i].conv_state_in ? ops[i].conv_state_in : ops[i].conv_state), *in = raw(ops[i].qkv);
            for (int64_t b = 0; b < ops[i].B; ++b) {
                float* yo = y + y_at[static_cast<size_t>(i)] + b * C + c0;
                // Summed in a local block and vectorised by request (-O2's cost model kept the
                // taps scalar: 3x this conv's time at five rows).
                float acc[kConvBlock] = {};
                for (int64_t t = 0; t < K; ++t) {
                    const int64_t r = b + t;
                    const float* src = (r < K - 1 ? window + r * C : in + (r - (K - 1)) * C) + c0;
#pragma omp simd
                    for (int64_t c = 0; c < nc; ++c) acc[c] += w[t][c] * src[c];
                }
                silu_mul(acc, nullptr, yo, nc);
            }
        }
    }
    // Each op's window moves on: its last K-1 rows of [window; new rows].
    for (size_t i = 0; i < n_ops; ++i) {
        const int64_t B = ops[i].B, keep = K - 1;
        float* after = raw(ops[i].conv_state);
        const float* before = ops[i].conv_state_in ? raw(ops[i].conv_state_in) : after;
        const float* in = raw(ops[i].qkv);
        if (B >= keep) {
            std::memcpy(after, in + (B - keep) * C, static_cast<size_t>(keep * C) * 4);
        } else {
            std::memmove(after, before + B * C, static_cast<size_t>((keep - B) * C) * 4);
            std::memcpy(after + (keep - B) * C, in, static_cast<size_t>(B * C) * 4);
        }
    }
    // Per token: q and k L2-normalised per key head; the gates per value head.
    std::vector<std::vector<float>> beta(n_ops), log_decay(n_ops);
    const float *dt_bias = raw(op0.dt_bias), *ssm_a = raw(op0.ssm_a), *ssm_norm = raw(op0.ssm_norm);
    struct Row {
        size_t i;
        int64_t b;
    };
    std::vector<Row> rows;
    for (size_t i = 0; i < n_ops; ++i) {
        beta[i].resize(static_cast<size_t>(ops[i].B * Hv));
        log_decay[i].resize(beta[i].size());
        for (int64_t b = 0; b < ops[i].B; ++b) rows.push_back(Row{i, b});
    }
#pragma omp parallel for schedule(static) if (rows.size() > 1)
    for (size_t r = 0; r < rows.size(); ++r) {
        const auto [i, b] = rows[r];
        const DeltaNetOp& op = ops[i];
        float* yb = y + y_at[i] + b * C;
        for (int64_t m = 0; m < Hk; ++m) {
            l2norm(yb + m * S, S, op.eps);
            l2norm(yb + kd + m * S, S, op.eps);
        }
        const float *betap = raw(op.beta), *alphap = raw(op.alpha);
        for (int64_t hh = 0; hh < Hv; ++hh) {
            beta[i][static_cast<size_t>(b * Hv + hh)] = blocks::gdn_beta(betap[b * Hv + hh]);
            log_decay[i][static_cast<size_t>(b * Hv + hh)] = blocks::gdn_log_decay(alphap[b * Hv + hh], dt_bias[hh], ssm_a[hh]);
        }
    }
    // Each value head of each op runs its tokens in order with its state hot in cache (heads
    // and sequences are independent: one parallel region for all of them, not per token).
#pragma omp parallel
    {
        std::vector<float> normed(static_cast<size_t>(S));
#pragma omp for schedule(static) collapse(2)
        for (int64_t i = 0; i < n; ++i)
            for (int64_t hh = 0; hh < Hv; ++hh) {
                const DeltaNetOp& op = ops[i];
                const float* yi = y + y_at[static_cast<size_t>(i)];
                float* outp = raw(op.out);
                const int64_t m = hh % Hk;  // tiled key head for this value head
                GdnHeadArgs g{raw(op.state) + hh * S * S, S, op.B, yi + m * S, yi + kd + m * S, yi + 2 * kd + hh * S,
                              beta[static_cast<size_t>(i)].data() + hh, log_decay[static_cast<size_t>(i)].data() + hh, C, C, Hv, outp + hh * S, VD,
                              op.state_in ? raw(op.state_in) + hh * S * S : nullptr};
                // The head this thread runs next (static schedule: the next index), if any.
                const int64_t next = i * Hv + hh + 1;
                if (next < n * Hv) {
                    const DeltaNetOp& nop = ops[static_cast<size_t>(next / Hv)];
                    const int64_t nh = next % Hv;
                    g.next_out = raw(nop.state) + nh * S * S;
                    g.next_in = nop.state_in ? raw(nop.state_in) + nh * S * S : g.next_out;
                }
                gdn_head(g);
                // Gated RMSNorm of each token's head output, in place.
                const float* zp = raw(op.z);
                for (int64_t b = 0; b < op.B; ++b) {
                    float* oh = outp + b * VD + hh * S;
                    rmsnorm_row(oh, ssm_norm, normed.data(), S, op.eps);
                    silu_mul(zp + b * VD + hh * S, normed.data(), oh, S);
                }
            }
    }
}

}  // namespace

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

}  // namespace pulse::decoder
