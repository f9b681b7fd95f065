// Seeded synthetic qwen35 GGUF files: the test fixtures (checked against llama.cpp) and the
// demo model. Weights are ternary times a power-of-two scale per matrix, so every supported type
// except Q4_K/Q6_K (and Q8_0 within fp16 rounding) stores exactly the same numbers; the vocab is
// a small byte-level BPE (256 byte tokens, merges, Qwen's special tokens, pre-tokenizer qwen35).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace pulse::decoder {

struct SynthShape {
    int64_t n_layer = 4;       // full attention every 4th layer: 3 GDN + 1 attention
    int64_t n_embd = 256, n_ff = 512;
    int64_t n_head = 4, n_head_kv = 2, head_dim = 64, rope_dim = 16;
    std::vector<int32_t> sections = {3, 3, 2, 0};
    int64_t ssm_groups = 2, ssm_heads = 4, ssm_state = 64, conv_kernel = 4;
    bool tied_output = false;
    bool all_recurrent = false;  // every layer Gated DeltaNet (attention.recurrent_layers)
    // An MTP block after the main layers (nextn_predict_layers = 1), as Qwen3.5 checkpoints carry:
    // a full-attention layer plus nextn.{eh_proj, enorm, hnorm, shared_head_norm}; with
    // mtp_own_tables also nextn.{embed_tokens, shared_head_head} (else the main ones are shared).
    bool mtp = false, mtp_own_tables = false;
    int64_t context = 4096;
    // Demo only: every embedding row gets a shared direction v and the output row of
    // <|im_end|> points along it (so answers end after a few dozen tokens), while the other
    // special tokens point away from it (so random text does not open tool calls).
    float end_bias = 0;
    // Hadamard-fold every weight PrismML's Bonsai files fold, in blocks of this size (0: none):
    // the file stores the weights' codes as drawn and prism.hadamard.* metadata; its F32 twin
    // holds the unfolded equivalent (hadamard.h), a plain qwen35 file llama.cpp can run.
    int64_t hadamard_block = 0;
    // Weight codes from an independent generator per chunk, filled and quantized in parallel
    // (GPU-sized files in seconds); the codes differ from the sequential ones, so never for the
    // golden fixtures. Not for Q4_K/Q6_K or twins.
    bool fast_fill = false;
    std::string name = "pulse-synthetic";
    const struct SynthVocab* vocab = nullptr;  // default: synthetic_vocab()
};

// The vocabulary every synthetic file carries (tokens, types, merges, special ids).
struct SynthVocab {
    std::vector<std::string> tokens, merges;
    std::vector<int32_t> types;
    int32_t endoftext = 0, im_start = 0, im_end = 0;
};
// `size` > its own ~300 tokens: padded with filler tokens to that many (a real vocabulary's
// size, for the output head's cost).
SynthVocab synthetic_vocab(int64_t size = 0);
// A byte-level BPE vocab with `merges` merges learned from a built-in English + code sample
// (so ordinary text takes ~3 bytes per token instead of 1), plus the same special tokens.
SynthVocab trained_vocab(int merges);

// The demo model (`pulse gguf make-demo`, the decoder backend's make_demo option): RANDOM
// weights, two Gated DeltaNet layers, a trained ~900-token vocab, 65,536 tokens of context,
// Q8_0 — small enough to prefill a whole Codex prompt in seconds on a laptop CPU.
// With `mtp`, also an MTP block (random too: its drafts are random).
void write_demo_model(const std::filesystem::path& path, bool mtp = false);

// A model whose answers are fixed — weights set by hand, not trained and not random — so that a
// real server (llama-server) produces exactly the text a test needs: greedy decoding writes
// `first` while the prompt holds no `marker` token, and `then` once it holds one, each followed
// by <|im_end|>. A coding agent's turn, for instance: a tool call first; after the tool's result
// comes back (a <tool_response> in the prompt), the answer. Each answer is one vocabulary token
// of its own; the vocab is trained_vocab(640) plus those two. How it works: every layer's output
// projections are zero except one attention layer whose key and value read only the marker's
// embedding, so its output is a flag ≈ 1 when the marker is anywhere in the context and 0 when it
// is not; the output head reads that flag and the current token (docs/DECODER.md, "The scripted
// model").
struct ScriptedAnswers {
    std::string first, then;
    std::string marker = "<tool_response>";
    int64_t context = 131072;
};
void write_scripted_model(const std::filesystem::path& path, const ScriptedAnswers& answers);

// Writes `path` with every 2-D weight in `type` (1-D tensors, conv and SSM parameters in F32).
// Weight codes: ternary; {-1, 0, 1, 2} for the Q2_0 layouts (all four codes); ±1 for Q1_0.
// When `dequantized_twin` is set, writes instead the F32 file holding exactly the values the
// `type` file decodes to (the reference for quantized formats).
void write_synthetic(const std::filesystem::path& path, const SynthShape& shape, uint32_t type, uint64_t seed,
                     bool dequantized_twin = false);

// The fixture set checked against llama.cpp (tools/decoder/golden.mjs records its goldens):
// synth-TYPE.gguf for every supported type, synth-TYPE.f32twin.gguf (the F32 reference of each
// quantized file), and synth-tied-f32.gguf (tied output, GQA 6:1, 8 layers, S = 128).
struct FixtureFile {
    std::string name;
    SynthShape shape;
    uint32_t type;
    uint64_t seed;
    bool twin;
};
std::vector<FixtureFile> fixture_set(uint64_t seed = 1);
SynthShape tiny_shape();   // a few hundred KB: fuzz seed and quick tests
SynthShape bench_shape();  // 332.7M parameters (16 layers, E 1024): tools/bench/decoder
// Qwen3.5-27B's layer shapes with `layers` layers (6.1B parameters at 16: 6.5 GB in Q8_0, 1.6 GB
// in TQ2_0), so that decode on a GPU is bound by memory bandwidth: tools/gpu-check.
SynthShape gpu_shape(int64_t layers = 16);

}  // namespace pulse::decoder
