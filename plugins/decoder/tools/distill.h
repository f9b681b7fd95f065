// Self-distillation data (docs/DECODER.md, "Self-distillation"): the model's own continuations
// of a prompt set, with its final hidden state at every position — what an MTP head is trained
// on (token p and the hidden state of p-1 in, token p+1 out). Written as NumPy .npy files, so
// that a training script needs nothing but numpy to read them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/sampler.h"

namespace pulse::decoder {

struct CollectOptions {
    int64_t max_new = 128;       // tokens generated per prompt (fewer at an end-of-generation token)
    SamplerParams sampling;      // greedy by default
    int samples = 1;             // continuations per prompt (> 1 wants temperature > 0)
    int64_t batch = 8;           // sequences run together: their prompts packed into full steps, then one row each per step
};

struct CollectSummary {
    int64_t sequences = 0, tokens = 0, generated = 0;
    int64_t prompt_steps = 0, generation_steps = 0;  // model steps run for the prompts and for the continuations
};

// Runs each prompt and its continuation through `model` and writes into `dir` (created):
//   tokens.npy          int32 [N]      every position's token, the sequences one after another
//   hidden.npy          float32 [N, E] the hidden state at each position (Segment::hidden)
//   starts.npy          int64 [S + 1]  sequence s is rows starts[s] .. starts[s+1] - 1
//   generated_from.npy  int64 [S]      the first generated row of each sequence
//   meta.json           model, sizes, sampling, and this layout in words
// Sequences are written as each batch ends: memory holds one batch, the files grow. With
// sampling, the draws depend on the batch (one sampler, the batch's sequences in turn).
CollectSummary collect_hidden(const Model& model, const std::string& model_name, const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<int32_t>& end_tokens, const CollectOptions& options, const std::filesystem::path& dir);

// The MTP block for training (docs/DECODER.md, "Self-distillation"). export_head writes into `dir`:
//   head.json       the block's hyperparameters, and each tensor's GGUF name, type and shape
//   NAME.npy        every tensor of the block (blk.L.*, L = the main layer count), f32, shaped
//                   [ne1, ne0] (a torch Linear's [out, in]) or [ne0]
//   embed.npy, head.npy, head_norm.npy   the tables the block reads but a trainer keeps (its
//                   nextn copies where the file has them, else the main model's)
//   check_tokens.npy, check_hidden_in.npy, check_logits.npy   a short sequence, the hidden state
//                   paired with each token, and the decoder's MTP logits for it (exact path): a
//                   trainer proves it computes the same block before it trains it
// Throws GgufError for a file without a block, or with Hadamard-folded weights.
// Runs the check on the exact path: it sets model.exact for the check (and puts it back), so no
// other thread may step `model` meanwhile.
void export_head(Model& model, const std::filesystem::path& dir);
// Writes `out`: the file with every block tensor that `dir` has as NAME.npy (a trained head, f32,
// the shape export_head gave) replaced, quantized to the tensor's own type; all else copied.
// Returns the number replaced; throws naming a tensor whose shape differs or a file it cannot read.
// Streams the copy: memory holds the trained tensors only, the rest is read from `file`'s mapping.
int import_head(const GgufFile& file, const std::filesystem::path& dir, const std::filesystem::path& out);

// A draft vocabulary (Model::set_draft_vocab) from what the model writes: count_generated adds
// the generated tokens of a collect_hidden directory to `counts` (n_vocab entries); rank_tokens
// lists the tokens counted at least once, most frequent first (ties by id), at most `top` of
// them (0: all). Throws naming a file that is not a collect directory's or a token outside counts.
void count_generated(const std::filesystem::path& dir, std::vector<int64_t>& counts);
std::vector<int32_t> rank_tokens(const std::vector<int64_t>& counts, int64_t top);

// A little-endian f32 .npy file (C order) read whole; `shape` receives its dimensions.
std::vector<float> read_npy_f32(const std::filesystem::path& path, std::vector<int64_t>& shape);

// A .npy file of `shape` with little-endian elements of `descr` ("<i4", "<i8", "<f4"), written
// as data arrives; close() writes the final shape into the header.
class NpyWriter {
public:
    NpyWriter(const std::filesystem::path& path, std::string descr, int64_t row_width);  // row_width 0: one-dimensional
    void append(const void* data, int64_t rows, size_t element_bytes);
    void close();
    ~NpyWriter();

private:
    void header();
    std::FILE* f_ = nullptr;
    std::filesystem::path path_;
    std::string descr_;
    int64_t width_ = 0, rows_ = 0;
};

}  // namespace pulse::decoder
