// The qwen35 hybrid model (docs/DECODER.md, "The model"): hyperparameters and tensors bound from a
// GGUF file, per-sequence state (KV cache for attention layers, conv window and delta-rule
// state for Gated DeltaNet layers) in device memory, and the forward pass as device ops.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "device/device.h"
#include "format/gguf.h"
#include "format/hadamard.h"

namespace pulse::decoder {

struct HParams {
    int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_ff = 0;
    int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
    int64_t rope_dim = 0;
    double rope_base = 10000, rms_eps = 1e-6, attn_scale = 0;
    int64_t conv_kernel = 0, ssm_state = 0, ssm_groups = 0, ssm_heads = 0;
    int64_t context_length = 0;
    int64_t n_nextn = 0;          // multi-token-prediction blocks in the file (nextn_predict_layers)
    std::vector<bool> recurrent;  // per layer: Gated DeltaNet (true) or full attention
    int64_t key_dim() const { return ssm_groups * ssm_state; }
    int64_t value_dim() const { return ssm_heads * ssm_state; }
    int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// Per-layer parameters; the vectors live in device memory (uploaded at load).
struct Layer {
    bool recurrent = false;
    Buffer attn_norm, post_norm;
    Matrix ffn_gate, ffn_up, ffn_down;
    // attention
    Matrix q, k, v, o;
    Buffer q_norm, k_norm;
    // Gated DeltaNet
    Matrix qkv, gate, beta, alpha, out;
    Buffer conv, dt_bias, ssm_a, ssm_norm;  // conv: [conv_dim][K]
};

// The multi-token-prediction (MTP, "nextn") block a Qwen3.5 checkpoint carries after its main
// layers (docs/DECODER.md, "The MTP block"): it reads a token and the main model's final hidden
// state of the position before it, and predicts the token after it. `block` is a full-attention
// layer with a KV cache of its own; the embedding, output norm and head are the main model's
// unless the file has nextn copies.
struct MtpBlock {
    Layer block;
    Matrix eh_proj;        // [2E -> E] over concat(RMSNorm(embedding, enorm), RMSNorm(hidden, hnorm))
    Buffer enorm, hnorm;
    Buffer head_norm;      // nextn.shared_head_norm, or empty: the main output norm
    Matrix embd, head;     // nextn.embed_tokens / shared_head_head, or copies of the main ones
    const Rotation* embd_rot = nullptr;
    // A draft vocabulary (Model::set_draft_vocab), or empty: `draft_head` has one row per
    // listed token, row i predicting token vocab[i], gathered from `head` into `draft_rows`.
    std::vector<int32_t> vocab;
    Matrix draft_head;
    std::vector<uint8_t> draft_rows;
    std::unique_ptr<TensorInfo> draft_info;
};

class Sequence;

// One sequence's part of a batched step (Model::step): `n` tokens run at positions
// seq->n_past..., and, where `logits` is set, the logits of its last token (n_vocab floats) or,
// with all_logits, of each of its tokens (n × n_vocab).
struct Segment {
    Sequence* seq = nullptr;
    const int32_t* tokens = nullptr;
    int64_t n = 0;
    float* logits = nullptr;
    bool all_logits = false;
    // Where set: the final hidden state of every token (n × n_embd), after the output norm: what
    // the MTP block reads (llama.cpp's h_nextn).
    float* hidden = nullptr;
    // Model::mtp_step only: the hidden state paired with each token (n × n_embd): for the token
    // at position p, the main model's `hidden` of position p-1 (or, drafting further, the MTP
    // block's own `hidden` of the token before).
    const float* hidden_in = nullptr;
    // Model::step only: the rows are a guess (a token and its drafts), of which Model::keep_tentative
    // keeps a prefix afterwards. The Gated DeltaNet windows and states before the step stay as
    // they are, the step's go beside them, and the layers' inputs of the rows are kept, so that
    // keeping fewer rows needs no copy of the states and no layer run again (keep_tentative).
    bool tentative = false;
};

class Model {
public:
    // Binds and checks every tensor (names, shapes, types), then registers the weights and
    // uploads the parameters to `device` (device.h: "" = the default); throws GgufError naming
    // the tensor, std::invalid_argument for a device this build does not have.
    static std::shared_ptr<Model> load(std::shared_ptr<GgufFile> file, const std::string& device = "");
    // The same on a device the caller made (another implementation of device.h).
    static std::shared_ptr<Model> load(std::shared_ptr<GgufFile> file, std::unique_ptr<Device> device);
    const Device& device() const { return *dev_; }
    // How the device was chosen ("device cpu (no NVIDIA driver ...)"); empty for a device the
    // caller made. The decoder plugin logs it at INFO; `pulse decode` reports it.
    const std::string& device_note() const { return device_note_; }

    const HParams& hparams() const { return hp_; }
    const GgufFile& file() const { return *file_; }
    std::unique_ptr<Sequence> new_sequence() const;

    // Runs `tokens` at positions seq.n_past... and returns the logits of the last one (n_vocab
    // values), or of every token when `all_logits` (n_tokens x n_vocab).
    std::vector<float> forward(Sequence& seq, const std::vector<int32_t>& tokens, bool all_logits = false) const;

    // Runs several sequences' tokens as one batch (continuous batching): every matmul once over
    // all their rows, so a weight is read once per step however many sequences take part;
    // attention and the delta rule per segment against its own sequence's state. Each sequence
    // at most once; at most kMaxStepRows rows in all. A segment's logits equal what forward()
    // gives for the same tokens (the same kernels per row).
    static constexpr int64_t kMaxStepRows = 64;
    void step(const std::vector<Segment>& segments) const;

    // Whether the file has an MTP block (hparams().n_nextn > 0); the decoder speculates only then.
    bool has_mtp() const { return mtp_.has_value(); }
    // Runs segments through the MTP block at positions seq->mtp_n_past...: each token with its
    // `hidden_in` row (required), into the sequence's MTP cache; `logits` (mtp_vocab() columns)
    // are the block's prediction of the token after each, `hidden` its own hidden state (the next draft's input).
    // Same limits as step(); throws std::logic_error on a model without the block.
    void mtp_step(const std::vector<Segment>& segments) const;
    // Restricts what the MTP block drafts to `ids` (a draft vocabulary: the tokens the model
    // writes most, docs/DECODER.md "Draft vocabulary"): its head keeps those rows only, so a
    // draft token reads len(ids) head rows instead of n_vocab — on a 248K-token vocabulary the
    // head is most of a draft's cost. Verification is untouched, so what is decoded does not
    // change; a token outside the list is just never drafted. Once, before the model runs.
    // Throws std::invalid_argument for an empty list or an id outside the vocabulary or listed
    // twice, std::logic_error without an MTP block or when already set.
    void set_draft_vocab(const std::vector<int32_t>& ids);
    // Columns of mtp_step's logits (n_vocab, or the draft vocabulary's size) and the token of
    // column c.
    int64_t mtp_vocab() const { return mtp_ && !mtp_->vocab.empty() ? static_cast<int64_t>(mtp_->vocab.size()) : hp_.n_vocab; }
    int32_t mtp_token(int64_t column) const {
        return mtp_ && !mtp_->vocab.empty() ? mtp_->vocab[static_cast<size_t>(column)] : static_cast<int32_t>(column);
    }
    // After a tentative step of `seq` (Segment::tentative) of R rows: its first `n` stand, the
    // rest are dropped. n = R: the step's windows and states become the sequence's (a swap);
    // n < R: the recurrences (conv windows and delta-rule states) run again from the states
    // before the step over the n rows' kept inputs (no matmul: a fraction of a step) and n_past
    // goes back to the step's start + n. Attention caches need nothing: positions past n_past
    // are written over. Until this is called the sequence takes no other step(). Throws
    // std::logic_error without a tentative step or for n outside 1..R.
    void keep_tentative(Sequence& seq, int64_t n) const;
    // Device memory of the step buffers kept for the next step (sized to the largest step so
    // far, up to kMaxStepRows rows): with each sequence's bytes(), what memory beyond the
    // weights holds.
    size_t work_bytes() const;

    int threads = 0;  // 0 = OpenMP's default
    // f32 activations in every matmul (the reference path the golden tests hold to llama.cpp's
    // F32 runs). Off by default: matmuls on Q8_0, TQ2_0 and the Q2_0 layouts take int8
    // activations, as llama.cpp does (docs/DECODER.md, "Exact and fast paths").
    bool exact = false;

private:
    struct Work;  // the step's device buffers
    // The token mixers over the step's rows: the projections once for all rows, then the
    // attention or delta rule per segment (rows r0..r0+n of the step are segment s's tokens).
    // `attn_index` picks the sequence's cache: a main attention layer's, or kMtpCache.
    static constexpr size_t kMtpCache = static_cast<size_t>(-1);
    void attention(const Layer& L, const std::vector<Segment>& segs, size_t attn_index, Work& w, DevPtr h, DevPtr out, int64_t B) const;
    // One decoder layer over the step's rows in w.x: norm, token mixer, residual, norm, FFN, residual.
    void layer(const Layer& L, const std::vector<Segment>& segs, size_t mixer_index, Work& w, int64_t B) const;
    // The step's rows after the last layer (in w.x): `norm`ed into each segment's `hidden`, and
    // `head`'s logits for the rows that give them.
    void finish(const std::vector<Segment>& segs, DevPtr norm, const Matrix& head, Work& w, int64_t B, int64_t out_rows) const;
    // Checks the segments (each sequence once, tokens in the vocabulary, at most kMaxStepRows
    // rows); returns {rows, logit rows}.
    std::pair<int64_t, int64_t> check(const std::vector<Segment>& segs) const;
    // The step buffers for B rows and `out_rows` logit rows: the kept ones, or (when another
    // step holds those) a set of the caller's own in `own`.
    Work& work(int64_t B, int64_t out_rows, std::unique_lock<std::mutex>& reuse, std::unique_ptr<Work>& own) const;
    // B token embeddings from `table` into `out` (rotated back where the file stores them folded).
    void embed(const Matrix& table, const Rotation* rot, const std::vector<int32_t>& tokens, Work& w, DevPtr out) const;
    void deltanet(const Layer& L, const std::vector<Segment>& segs, size_t gdn_index, Work& w, DevPtr h, DevPtr out, int64_t B) const;
    // Tentative segments (Segment::tentative): their buffers sized before the step; each GDN
    // layer's inputs of their rows kept.
    void prepare_tentative(Sequence& seq, int64_t rows) const;
    void keep_tentative_inputs(const std::vector<Segment>& segs, size_t gdn_index, Work& w) const;
    // y = W·x for each product, all reading x: one device pass (Device::matmuls). Folded
    // weights rotate x first (into w.rot): once where they share the rotation, else one by one.
    struct Product {
        const Matrix* m;
        DevPtr y;
    };
    static constexpr size_t kMaxProducts = 4;
    void matmuls(std::initializer_list<Product> products, DevPtr x, int64_t B, Work& w) const;
    void matmul(const Matrix& m, DevPtr x, int64_t B, DevPtr y, Work& w) const { matmuls({{&m, y}}, x, B, w); }

    std::shared_ptr<GgufFile> file_;
    std::unique_ptr<Device> dev_;
    std::string device_note_;
    HParams hp_;
    Matrix output_;
    Matrix embd_;  // token_embd as a table for Device::embed
    Buffer output_norm_;
    std::vector<Layer> layers_;
    std::optional<MtpBlock> mtp_;
    std::optional<HadamardFold> fold_;                // prism.hadamard.*, when the file is folded
    std::vector<std::unique_ptr<Rotation>> rotations_;  // what folded Matrix::rot point at
    const Rotation* embd_rot_ = nullptr;              // the stored embedding's inverse rotation
    // The last step's buffers, kept for the next (a step allocating its own would map, zero and
    // unmap megabytes per decoded token); a step that finds them in use makes its own.
    mutable std::mutex work_mu_;
    mutable std::unique_ptr<Work> work_;
};

// Per-sequence state in device memory. Copyable: a copy is a checkpoint (prefix reuse), made
// with device-to-device copies of what is in use.
class Sequence {
public:
    Sequence() = default;
    explicit Sequence(const Device* dev) : dev_(dev) {}
    Sequence(const Sequence& o) { *this = o; }
    Sequence& operator=(const Sequence& o);
    Sequence(Sequence&&) noexcept = default;
    Sequence& operator=(Sequence&&) noexcept = default;

    int64_t n_past = 0;
    struct KvCache {
        HalfBuffer k, v;       // [capacity][kv_values] each
        int64_t capacity = 0;  // positions
    };
    int64_t kv_values = 0;           // values per cached position and layer (Hkv*D)
    std::vector<KvCache> kv;         // per attention layer
    // The MTP block's cache (models with one): positions 0..mtp_n_past-1, each written from the
    // token there and the hidden state before it; it may trail n_past (drafts are discarded by
    // setting it back).
    KvCache mtp;
    int64_t mtp_n_past = 0;
    std::vector<Buffer> conv, state;  // per GDN layer: [(K-1)][conv_dim], [Hv][S key][S value]
    // A tentative step not yet settled (Segment::tentative, Model::keep_tentative): its rows
    // (0: none), the GDN windows and states after them, each GDN layer's projected qkv, beta
    // and alpha rows; and the replay's scratch rows (its output gate and output, which it
    // does not keep). Allocated by the first tentative step, kept for the next. Not part of a
    // copy: a sequence with a tentative step pending is not copied.
    struct TentativeStep {
        int64_t rows = 0, capacity = 0;
        std::vector<Buffer> conv, state;
        std::vector<Buffer> qkv, beta, alpha;
        Buffer gate, out;
    } tentative;
    size_t bytes() const;            // device memory in use (the caches up to n_past, the tentative step's buffers)

    // A copy of the Gated DeltaNet conv windows and states (not the KV caches): what a run of
    // several steps that may be undone must put back (a draft model's drafting).
    // save_recurrent allocates `to` on first use, then copies.
    struct RecurrentCheckpoint {
        std::vector<Buffer> conv, state;
    };
    void save_recurrent(RecurrentCheckpoint& to) const;
    void restore_recurrent(const RecurrentCheckpoint& from);

    // Room for `positions` in every main KV cache, or in the MTP one (grows by doubling,
    // keeping what is there).
    void reserve(int64_t positions);
    void reserve_mtp(int64_t positions);

private:
    void grow(KvCache& c, int64_t positions, int64_t used);
    const Device* dev_ = nullptr;
};

}  // namespace pulse::decoder
