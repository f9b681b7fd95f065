// Self-distillation data (docs/DECODER.md, "Self-distillation"): the model's own continuations
// of a prompt set, with its final hidden state at every position — what an MTP head is trained
// on (token p and the hidden state of p-1 in, token p+1 out). Written as NumPy .npy files, so
// that a training script needs nothing but numpy to read them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model.h"
#include "sampler.h"
#include "tokenizer.h"

namespace pulse::decoder {

struct CollectOptions {
    int64_t max_new = 128;       // tokens generated per prompt (fewer at an end-of-generation token)
    SamplerParams sampling;      // greedy by default
};

struct CollectSummary {
    int64_t sequences = 0, tokens = 0, generated = 0;
};

// Runs each prompt and its continuation through `model` and writes into `dir` (created):
//   tokens.npy          int32 [N]      every position's token, the sequences one after another
//   hidden.npy          float32 [N, E] the hidden state at each position (Segment::hidden)
//   starts.npy          int64 [S + 1]  sequence s is rows starts[s] .. starts[s+1] - 1
//   generated_from.npy  int64 [S]      the first generated row of each sequence
//   meta.json           model, sizes, sampling, and this layout in words
// Rows are written as they are made: memory holds one sequence, the files grow.
CollectSummary collect_hidden(const Model& model, const std::string& model_name, const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<int32_t>& end_tokens, const CollectOptions& options, const std::filesystem::path& dir);

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
