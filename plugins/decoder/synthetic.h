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
    std::string name = "pulse-synthetic";
};

// The vocabulary every synthetic file carries (tokens, types, merges, special ids).
struct SynthVocab {
    std::vector<std::string> tokens, merges;
    std::vector<int32_t> types;
    int32_t endoftext = 0, im_start = 0, im_end = 0;
};
SynthVocab synthetic_vocab();

// Writes `path` with every 2-D weight in `type` (1-D tensors, conv and SSM parameters in F32).
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
SynthShape tiny_shape();  // a few hundred KB: fuzz seed and quick tests

}  // namespace pulse::decoder
