#include "tools/synthetic.h"

#include <cmath>
#include <cstring>
#include <random>

#include "format/gguf.h"
#include "format/hadamard.h"
#include "format/quants.h"
#include "model/tokenizer.h"

#include <algorithm>
#include <map>
#include <set>

namespace pulse::decoder {

namespace {

// GPT-2's byte -> printable code point table, UTF-8 encoded.
std::string byte_token(int b) {
    int cp;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) cp = b;
    else {
        int n = 0;
        for (int x = 0; x < b; ++x)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++n;
        cp = 0x100 + n;
    }
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

// Deterministic across platforms (std distributions are not): raw mt19937_64 draws.
struct Rng {
    std::mt19937_64 g;
    explicit Rng(uint64_t seed) : g(seed) {}
    int ternary() { return static_cast<int>(g() % 3) - 1; }
    double unit() { return static_cast<double>(g() >> 11) / 9007199254740992.0; }  // [0, 1)
};

// n ternary codes times `scale` in `type`, from an independent generator per chunk of 2^20,
// all chunks in parallel (SynthShape::fast_fill).
std::vector<uint8_t> fast_codes(uint32_t type, int64_t n, float scale, uint64_t seed) {
    constexpr int64_t kChunk = int64_t{1} << 20;
    const TypeTraits& tt = *type_traits(type);
    const int64_t chunks = (n + kChunk - 1) / kChunk, chunk_bytes = kChunk / tt.block * tt.bytes;
    std::vector<uint8_t> out(static_cast<size_t>(n / tt.block * tt.bytes));
#pragma omp parallel for schedule(dynamic)
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t len = std::min(kChunk, n - c * kChunk);
        uint64_t z = seed ^ (static_cast<uint64_t>(c) * 0x9e3779b97f4a7c15ull);
        std::vector<float> x(static_cast<size_t>(len));
        for (auto& e : x) {  // splitmix64
            z += 0x9e3779b97f4a7c15ull;
            uint64_t r = z;
            r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
            r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
            r ^= r >> 31;
            e = static_cast<float>(static_cast<int>(r % 3) - 1) * scale;
        }
        std::vector<uint8_t> q = quantize(type, x.data(), len);
        std::memcpy(out.data() + c * chunk_bytes, q.data(), q.size());
    }
    return out;
}

}  // namespace

namespace {
void add_specials(SynthVocab& v) {
    auto special = [&](const char* t, int type) {
        v.tokens.push_back(t);
        v.types.push_back(type);
        return static_cast<int32_t>(v.tokens.size() - 1);
    };
    v.endoftext = special("<|endoftext|>", 3);
    v.im_start = special("<|im_start|>", 3);
    v.im_end = special("<|im_end|>", 3);
    special("<think>", 4);
    special("</think>", 4);
    special("<tool_call>", 4);
    special("</tool_call>", 4);
    special("<tool_response>", 4);
    special("</tool_response>", 4);
}

const char* kCorpus =
    "The quick brown fox jumps over the lazy dog. You are a coding agent running in a terminal on the user's machine. "
    "Read the files in the repository, then make the change the user asked for, run the tests, and report what you did. "
    "When a command fails, read its output and fix the problem before you continue. Keep the answer short and precise. "
    "The function returns the number of items in the list, or an error when the input is not valid. "
    "Please create a new file with the following content and then show me the result of running it. "
    "def main(argv):\n    parser = argparse.ArgumentParser(description='process the input files')\n"
    "    parser.add_argument('--output', default=None, help='where to write the result')\n"
    "    args = parser.parse_args(argv)\n    for path in args.files:\n        with open(path) as f:\n"
    "            for line in f:\n                print(line.strip())\n    return 0\n\n"
    "if __name__ == '__main__':\n    sys.exit(main(sys.argv[1:]))\n"
    "#include <string>\n#include <vector>\n\nint main(int argc, char** argv) {\n    std::vector<std::string> args(argv, argv + argc);\n"
    "    for (const auto& a : args) std::printf(\"%s\\n\", a.c_str());\n    return 0;\n}\n"
    "{\"type\": \"function\", \"name\": \"shell\", \"description\": \"Runs a shell command and returns its output\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"command\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}, "
    "\"workdir\": {\"type\": \"string\", \"description\": \"The working directory to execute the command in\"}, "
    "\"timeout_ms\": {\"type\": \"number\", \"description\": \"The timeout for the command in milliseconds\"}}, "
    "\"required\": [\"command\"], \"additionalProperties\": false}}\n"
    "You can use the apply_patch tool to edit files: *** Begin Patch\n*** Update File: src/main.rs\n@@ fn main()\n-    println!(\"old\");\n"
    "+    println!(\"new\");\n*** End Patch\n"
    "Instructions for the agent: the user will ask questions about the code, about the project, and about the environment. "
    "Always explain what you are going to do before you do it, and summarize the changes when you are done. "
    "Use the tools that are available to you; do not guess the content of a file that you have not read. ";
}  // namespace

SynthVocab trained_vocab(int n_merges) {
    SynthVocab v;
    std::string table[256];
    for (int b = 0; b < 256; ++b) {
        table[b] = byte_token(b);
        v.tokens.push_back(table[b]);
        v.types.push_back(1);
    }
    // Words as symbol sequences with their counts.
    std::map<std::vector<std::string>, int> words;
    for (auto piece : pretokenize_qwen(kCorpus)) {
        std::vector<std::string> sym;
        for (unsigned char c : piece) sym.push_back(table[c]);
        ++words[sym];
    }
    std::set<std::string> known(v.tokens.begin(), v.tokens.end());
    for (int m = 0; m < n_merges; ++m) {
        std::map<std::pair<std::string, std::string>, int> pairs;
        for (const auto& [w, n] : words)
            for (size_t i = 0; i + 1 < w.size(); ++i) pairs[{w[i], w[i + 1]}] += n;
        if (pairs.empty()) break;
        auto best = pairs.begin();
        for (auto it = pairs.begin(); it != pairs.end(); ++it)
            if (it->second > best->second) best = it;  // ties: the first in order (deterministic)
        if (best->second < 2) break;
        auto [a, b] = best->first;
        std::map<std::vector<std::string>, int> next;
        for (const auto& [w, n] : words) {
            std::vector<std::string> out;
            for (size_t i = 0; i < w.size(); ++i) {
                if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
                    out.push_back(a + b);
                    ++i;
                } else {
                    out.push_back(w[i]);
                }
            }
            next[out] += n;
        }
        words.swap(next);
        v.merges.push_back(a + " " + b);
        if (known.insert(a + b).second) {
            v.tokens.push_back(a + b);
            v.types.push_back(1);
        }
    }
    add_specials(v);
    return v;
}

void write_demo_model(const std::filesystem::path& path, bool mtp) {
    static const SynthVocab vocab = trained_vocab(640);
    SynthShape demo;
    demo.name = "pulse-demo (RANDOM weights)";
    demo.n_layer = 2;
    demo.all_recurrent = true;
    demo.n_embd = 64;
    demo.n_ff = 128;
    demo.n_head = 1;
    demo.n_head_kv = 1;
    demo.head_dim = 16;
    demo.rope_dim = 8;
    demo.sections = {2, 1, 1, 0};
    demo.ssm_groups = 1;
    demo.ssm_heads = 2;
    demo.ssm_state = 32;
    demo.context = 65536;
    demo.vocab = &vocab;
    demo.end_bias = 0.35f;
    demo.mtp = mtp;
    if (mtp) demo.head_dim = 32;  // the block's attention rows are Q8_0 blocks of 32 (no main layer uses head_dim)
    write_synthetic(path, demo, kQ8_0, 20261129);
}

SynthVocab synthetic_vocab(int64_t size) {
    SynthVocab v;
    for (int b = 0; b < 256; ++b) {
        v.tokens.push_back(byte_token(b));
        v.types.push_back(1);  // byte-level BPE: byte tokens are normal tokens in Qwen vocabularies
    }
    const char* pairs[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "a"}, {"e", "r"}, {"o", "n"}, {"r", "e"},
                              {"a", "n"}, {"Ġ", "s"}, {"e", "s"}, {"Ġ", "c"}, {"o", "r"}, {"e", "n"}, {"Ġ", "w"}, {"i", "s"},
                              {"Ġ", "f"}, {"a", "t"}, {"i", "t"}, {"Ġ", "p"}, {"Ġ", "i"}, {"Ġ", "o"}, {"in", "g"}, {"Ġ", "d"},
                              {"Ġ", "b"}, {"Ġ", "m"}, {"e", "d"}, {"Ċ", "Ċ"}, {"Ġ", "Ġ"}, {"ĠĠ", "ĠĠ"}, {"Ġ", "="}, {"(", ")"},
                              {"d", "e"}, {"Ġ", "re"}, {"Ġ", "in"}, {"o", "u"}, {"Ġ", "h"}, {"l", "e"}, {"a", "l"}, {"Ġ", "n"}};
    for (auto& p : pairs) {
        v.merges.push_back(std::string(p[0]) + " " + p[1]);
        v.tokens.push_back(std::string(p[0]) + p[1]);
        v.types.push_back(1);
    }
    // Filler up to `size`: a real checkpoint's vocabulary is this large (Qwen3.5: 248,320), and
    // its output head is then most of an MTP draft's cost. No merge makes these tokens.
    for (int64_t i = static_cast<int64_t>(v.tokens.size()) + 9; i < size; ++i) {
        v.tokens.push_back("<filler" + std::to_string(i) + ">");
        v.types.push_back(1);
    }
    add_specials(v);
    return v;
}

namespace {

// The qwen35 and tokenizer metadata of a synthetic file.
void write_metadata(GgufWriter& w, const SynthShape& s, const SynthVocab& vocab) {
    const std::string a = "qwen35";
    w.set_string("general.architecture", a);
    w.set_string("general.name", s.name);
    w.set_u32("general.quantization_version", 2);
    w.set_u32(a + ".context_length", static_cast<uint32_t>(s.context));
    w.set_u32(a + ".embedding_length", static_cast<uint32_t>(s.n_embd));
    w.set_u32(a + ".block_count", static_cast<uint32_t>(s.n_layer + (s.mtp ? 1 : 0)));
    if (s.mtp) w.set_u32(a + ".nextn_predict_layers", 1);
    w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.n_ff));
    w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(s.n_head));
    w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
    w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim));
    w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim));
    w.set_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
    w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(s.rope_dim));
    w.set_i32s(a + ".rope.dimension_sections", s.sections);
    w.set_f32(a + ".rope.freq_base", 10000000.f);
    w.set_u32(a + ".ssm.conv_kernel", static_cast<uint32_t>(s.conv_kernel));
    w.set_u32(a + ".ssm.state_size", static_cast<uint32_t>(s.ssm_state));
    w.set_u32(a + ".ssm.group_count", static_cast<uint32_t>(s.ssm_groups));
    w.set_u32(a + ".ssm.time_step_rank", static_cast<uint32_t>(s.ssm_heads));
    w.set_u32(a + ".ssm.inner_size", static_cast<uint32_t>(s.ssm_heads * s.ssm_state));
    w.set_u32(a + ".full_attention_interval", 4);
    if (s.all_recurrent) {
        std::vector<int32_t> recurrent(static_cast<size_t>(s.n_layer), 1);
        if (s.mtp) recurrent.push_back(0);  // the MTP block is a full-attention layer
        w.set_i32s(a + ".attention.recurrent_layers", recurrent);
    }
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen35");
    w.set_strings("tokenizer.ggml.tokens", vocab.tokens);
    w.set_i32s("tokenizer.ggml.token_type", vocab.types);
    w.set_strings("tokenizer.ggml.merges", vocab.merges);
    w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(vocab.endoftext));
    w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab.im_end));
    w.set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(vocab.endoftext));
    w.set_bool("tokenizer.ggml.add_bos_token", false);
}

}  // namespace

void write_synthetic(const std::filesystem::path& path, const SynthShape& s, uint32_t type, uint64_t seed, bool twin) {
    SynthVocab vocab = s.vocab ? *s.vocab : synthetic_vocab();
    const int64_t V = static_cast<int64_t>(vocab.tokens.size());
    Rng rng(seed);
    GgufWriter w;
    write_metadata(w, s, vocab);

    const int64_t kd = s.ssm_groups * s.ssm_state, vd = s.ssm_heads * s.ssm_state, conv_dim = 2 * kd + vd;
    // The fold: the weights Bonsai folds (every projection but ssm_beta/ssm_alpha, and the
    // output), the embedding stored inverse-rotated, one sign vector per input width. The signs
    // come from their own generator, so a folded file stores the codes its unfolded sibling does.
    FoldSpec fold;
    std::map<int64_t, Rotation> rot_by_width;
    Rotation grouped_out;
    if (s.hadamard_block > 0) {
        Rng srng(seed ^ 0x9e3779b97f4a7c15ull);
        fold.block = s.hadamard_block;
        fold.gdn_v_grouped = true;
        for (int64_t width : {s.n_embd, s.n_ff, vd, s.n_head * s.head_dim}) {
            if (std::find(fold.widths.begin(), fold.widths.end(), width) != fold.widths.end()) continue;
            fold.widths.push_back(width);
            std::vector<float> sg(static_cast<size_t>(width));
            for (auto& x : sg) x = srng.g() % 2 ? 1.f : -1.f;
            fold.signs.push_back(std::move(sg));
        }
        for (size_t k = 0; k < fold.widths.size(); ++k)
            rot_by_width[fold.widths[k]] = Rotation{fold.widths[k], fold.block, fold.signs[k].data(), false, false, 0, 0, 0};
        grouped_out = rot_by_width[vd];
        grouped_out.grouped_heads = true;
        grouped_out.state = s.ssm_state;
        grouped_out.key_heads = s.ssm_groups;
        grouped_out.rep = s.ssm_heads / s.ssm_groups;
        fold.inverse = {"token_embd.weight"};
        if (!s.tied_output) fold.folded.push_back("output.weight");
        for (int64_t il = 0; il < s.n_layer; ++il) {
            const std::string p = "blk." + std::to_string(il) + ".";
            bool recurrent = s.all_recurrent || (il + 1) % 4 != 0;
            for (const char* n : recurrent ? std::vector<const char*>{"attn_qkv", "attn_gate", "ssm_out"} : std::vector<const char*>{"attn_q", "attn_k", "attn_v", "attn_output"})
                fold.folded.push_back(p + n + ".weight");
            for (const char* n : {"ffn_gate", "ffn_up", "ffn_down"}) fold.folded.push_back(p + n + ".weight");
        }
        if (!twin) write_hadamard_metadata(w, fold);
    }
    auto code = [&]() -> float {
        if (type == kQ2_0 || type == kPQ2_0) {  // ternary, and +2 one time in 16 (Bonsai: ~1 %)
            uint64_t r = rng.g();
            return (r & 15) == 0 ? 2.f : static_cast<float>(static_cast<int>((r >> 4) % 3) - 1);
        }
        if (type == kQ1_0) return rng.g() % 2 ? 1.f : -1.f;
        return static_cast<float>(rng.ternary());
    };
    // A matrix [n_in, n_out] of codes times `scale` (a power of two: exact in fp16).
    uint64_t tensor_index = 0;
    auto matrix = [&](const std::string& name, int64_t n_in, int64_t n_out, float scale) {
        ++tensor_index;
        if (s.fast_fill && !twin && type != kQ4_K && type != kQ6_K) {
            w.add_tensor(name, {static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)}, type,
                         fast_codes(type, n_in * n_out, scale, seed * 0x100000001b3ull + tensor_index));
            return;
        }
        std::vector<float> x(static_cast<size_t>(n_in * n_out));
        for (auto& e : x) e = code() * scale;
        uint32_t t = type;
        std::vector<uint8_t> bytes = quantize(t, x.data(), static_cast<int64_t>(x.size()));
        if (twin && t != kF32) {
            dequantize_row(t, bytes.data(), x.data(), static_cast<int64_t>(x.size()));
            bool folded = std::find(fold.folded.begin(), fold.folded.end(), name) != fold.folded.end();
            bool inverse = std::find(fold.inverse.begin(), fold.inverse.end(), name) != fold.inverse.end();
            if (folded || inverse) {
                Rotation r = name.find("ssm_out") != std::string::npos ? grouped_out : rot_by_width.at(n_in);
                r.inverse = inverse;
                std::vector<float> row(static_cast<size_t>(n_in));
                for (int64_t o = 0; o < n_out; ++o) {
                    unfold_row(r, x.data() + o * n_in, row.data());
                    std::copy(row.begin(), row.end(), x.begin() + o * n_in);
                }
            }
            bytes = quantize(kF32, x.data(), static_cast<int64_t>(x.size()));
            t = kF32;
        }
        w.add_tensor(name, {static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)}, t, std::move(bytes));
    };
    auto f32 = [&](const std::string& name, std::vector<uint64_t> ne, const std::vector<float>& v) {
        w.add_tensor(name, std::move(ne), kF32, quantize(kF32, v.data(), static_cast<int64_t>(v.size())));
    };
    auto around = [&](int64_t n, float centre, float spread) {
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& e : v) e = centre + spread * static_cast<float>(rng.unit() * 2 - 1);
        return v;
    };
    const int64_t E = s.n_embd;
    auto pow2 = [](int e) { return std::ldexp(1.0f, e); };
    // Tied output reuses the embedding: a smaller scale keeps its logits in the same range.
    if (s.end_bias > 0) {
        // v: a fixed unit direction; embeddings carry it, <|im_end|> reads it, specials avoid it.
        std::vector<float> v(static_cast<size_t>(E));
        for (auto& x : v) x = static_cast<float>(rng.ternary() == 0 ? 1 : -1) / std::sqrt(static_cast<float>(E));
        std::vector<float> emb(static_cast<size_t>(E * V)), out(static_cast<size_t>(E * V));
        for (int64_t t = 0; t < V; ++t)
            for (int64_t i = 0; i < E; ++i) {
                emb[static_cast<size_t>(t * E + i)] = static_cast<float>(rng.ternary()) * pow2(-1) + v[static_cast<size_t>(i)] * 2.0f;
                out[static_cast<size_t>(t * E + i)] = static_cast<float>(rng.ternary()) * pow2(-3);
            }
        for (int64_t i = 0; i < E; ++i) {
            out[static_cast<size_t>(vocab.im_end * E + i)] = v[static_cast<size_t>(i)] * s.end_bias;
            for (int64_t t = vocab.endoftext; t < V; ++t)
                if (t != vocab.im_end) out[static_cast<size_t>(t * E + i)] = -v[static_cast<size_t>(i)] * 4 * s.end_bias;
        }
        w.add_tensor("token_embd.weight", {static_cast<uint64_t>(E), static_cast<uint64_t>(V)}, type, quantize(type, emb.data(), E * V));
        f32("output_norm.weight", {static_cast<uint64_t>(E)}, around(E, 1, 0.1f));
        w.add_tensor("output.weight", {static_cast<uint64_t>(E), static_cast<uint64_t>(V)}, type, quantize(type, out.data(), E * V));
    } else {
        matrix("token_embd.weight", E, V, pow2(s.tied_output ? -3 : -1));
        f32("output_norm.weight", {static_cast<uint64_t>(E)}, around(E, 1, 0.1f));
        if (!s.tied_output) matrix("output.weight", E, V, pow2(-3));
    }
    for (int64_t il = 0; il < s.n_layer + (s.mtp ? 1 : 0); ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        const bool mtp = il == s.n_layer;
        bool recurrent = !mtp && (s.all_recurrent || (il + 1) % 4 != 0);
        if (mtp) {
            matrix(p + "nextn.eh_proj.weight", 2 * E, E, pow2(-4));
            f32(p + "nextn.enorm.weight", {static_cast<uint64_t>(E)}, around(E, 1, 0.1f));
            f32(p + "nextn.hnorm.weight", {static_cast<uint64_t>(E)}, around(E, 1, 0.1f));
            f32(p + "nextn.shared_head_norm.weight", {static_cast<uint64_t>(E)}, around(E, 1, 0.1f));
            if (s.mtp_own_tables) {
                matrix(p + "nextn.embed_tokens.weight", E, V, pow2(-1));
                matrix(p + "nextn.shared_head_head.weight", E, V, pow2(-3));
            }
        }
        f32(p + "attn_norm.weight", {static_cast<uint64_t>(E)}, around(E, 1, 0.1f));
        f32(p + "post_attention_norm.weight", {static_cast<uint64_t>(E)}, around(E, 1, 0.1f));
        if (recurrent) {
            matrix(p + "attn_qkv.weight", E, conv_dim, pow2(-4));
            matrix(p + "attn_gate.weight", E, vd, pow2(-4));
            matrix(p + "ssm_beta.weight", E, s.ssm_heads, pow2(-4));
            matrix(p + "ssm_alpha.weight", E, s.ssm_heads, pow2(-4));
            matrix(p + "ssm_out.weight", vd, E, pow2(-4));
            f32(p + "ssm_conv1d.weight", {static_cast<uint64_t>(s.conv_kernel), static_cast<uint64_t>(conv_dim)},
                around(s.conv_kernel * conv_dim, 0, 0.5f));
            f32(p + "ssm_dt.bias", {static_cast<uint64_t>(s.ssm_heads)}, around(s.ssm_heads, 0, 0.5f));
            std::vector<float> ssm_a = around(s.ssm_heads, 0, 0.5f);
            for (auto& x : ssm_a) x = -std::exp(x);  // the converter stores -exp(A_log)
            f32(p + "ssm_a", {static_cast<uint64_t>(s.ssm_heads)}, ssm_a);
            f32(p + "ssm_norm.weight", {static_cast<uint64_t>(s.ssm_state)}, around(s.ssm_state, 1, 0.1f));
        } else {
            matrix(p + "attn_q.weight", E, 2 * s.n_head * s.head_dim, pow2(-4));
            matrix(p + "attn_k.weight", E, s.n_head_kv * s.head_dim, pow2(-4));
            matrix(p + "attn_v.weight", E, s.n_head_kv * s.head_dim, pow2(-4));
            matrix(p + "attn_output.weight", s.n_head * s.head_dim, E, pow2(-4));
            f32(p + "attn_q_norm.weight", {static_cast<uint64_t>(s.head_dim)}, around(s.head_dim, 1, 0.1f));
            f32(p + "attn_k_norm.weight", {static_cast<uint64_t>(s.head_dim)}, around(s.head_dim, 1, 0.1f));
        }
        matrix(p + "ffn_gate.weight", E, s.n_ff, pow2(-4));
        matrix(p + "ffn_up.weight", E, s.n_ff, pow2(-4));
        matrix(p + "ffn_down.weight", s.n_ff, E, pow2(-4));
    }
    w.write(path);
}

void write_scripted_model(const std::filesystem::path& path, const ScriptedAnswers& a) {
    SynthVocab vocab = trained_vocab(640);
    auto find = [&](const std::string& text) -> int64_t {
        for (size_t t = 0; t < vocab.tokens.size(); ++t)
            if (vocab.tokens[t] == text) return static_cast<int64_t>(t);
        throw std::invalid_argument("scripted model: the marker '" + text + "' is not a token of the vocabulary");
    };
    const int64_t marker = find(a.marker);
    auto add = [&](const std::string& text) {  // a normal token: the text in byte-level form
        std::string t;
        for (unsigned char c : text) t += byte_token(c);
        vocab.tokens.push_back(t);
        vocab.types.push_back(1);
        return static_cast<int64_t>(vocab.tokens.size() - 1);
    };
    const int64_t first = add(a.first), then = add(a.then), end = vocab.im_end;
    const int64_t V = static_cast<int64_t>(vocab.tokens.size());
    SynthShape s;
    s.name = "pulse-scripted";
    s.n_layer = 4;  // three Gated DeltaNet layers (silent) and the attention layer that finds the marker
    s.n_embd = 16;
    s.n_ff = 16;
    s.n_head = 1;
    s.n_head_kv = 1;
    s.head_dim = 16;
    s.rope_dim = 8;
    s.sections = {2, 1, 1, 0};
    s.ssm_groups = 1;
    s.ssm_heads = 1;
    s.ssm_state = 16;
    s.context = a.context;
    const int64_t E = s.n_embd, D = s.head_dim;
    // Residual features: a constant, "this token is the marker", the flag the attention layer
    // writes, and "this token is answer 1 / 2". Query and key meet in a dimension RoPE leaves alone.
    enum : int64_t { kConst = 0, kMarker = 1, kFlag = 2, kFirst = 3, kThen = 4 };
    const int64_t kMeet = s.rope_dim;
    GgufWriter w;
    write_metadata(w, s, vocab);
    auto put = [&](const std::string& name, int64_t n_in, int64_t n_out, const std::vector<float>& v) {  // rows of n_in
        w.add_tensor(name, {static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)}, kF32, quantize(kF32, v.data(), n_in * n_out));
    };
    auto vec = [&](const std::string& name, int64_t n, float value) {
        std::vector<float> v(static_cast<size_t>(n), value);
        w.add_tensor(name, {static_cast<uint64_t>(n)}, kF32, quantize(kF32, v.data(), n));
    };
    auto zeros = [&](const std::string& name, int64_t n_in, int64_t n_out) { put(name, n_in, n_out, std::vector<float>(static_cast<size_t>(n_in * n_out))); };
    std::vector<float> emb(static_cast<size_t>(E * V)), out(static_cast<size_t>(E * V));
    for (int64_t t = 0; t < V; ++t) emb[static_cast<size_t>(t * E + kConst)] = 1;
    emb[static_cast<size_t>(marker * E + kMarker)] = 1;
    emb[static_cast<size_t>(first * E + kFirst)] = 1;
    emb[static_cast<size_t>(then * E + kThen)] = 1;
    // The head (after the final RMSNorm, which keeps these ratios): any other token is followed by
    // an answer, `first` without the flag and `then` with it; an answer is followed by the end.
    auto o = [&](int64_t token, int64_t feature) -> float& { return out[static_cast<size_t>(token * E + feature)]; };
    o(first, kConst) = 5, o(first, kFlag) = -10, o(first, kFirst) = -20, o(first, kThen) = -20;
    o(then, kFlag) = 10, o(then, kFirst) = -20, o(then, kThen) = -20;
    o(end, kFirst) = 30, o(end, kThen) = 30;
    put("token_embd.weight", E, V, emb);
    vec("output_norm.weight", E, 1);
    put("output.weight", E, V, out);
    const int64_t conv_dim = 3 * s.ssm_state;
    for (int64_t il = 0; il < s.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        vec(p + "attn_norm.weight", E, 1);
        vec(p + "post_attention_norm.weight", E, 1);
        if ((il + 1) % 4 != 0) {  // Gated DeltaNet, its output projection zero
            zeros(p + "attn_qkv.weight", E, conv_dim);
            zeros(p + "attn_gate.weight", E, s.ssm_state);
            zeros(p + "ssm_beta.weight", E, 1);
            zeros(p + "ssm_alpha.weight", E, 1);
            zeros(p + "ssm_out.weight", s.ssm_state, E);
            zeros(p + "ssm_conv1d.weight", s.conv_kernel, conv_dim);
            vec(p + "ssm_dt.bias", 1, 0);
            vec(p + "ssm_a", 1, -1);
            vec(p + "ssm_norm.weight", s.ssm_state, 1);
        } else {
            // q (the constant) meets k (the marker) in dimension kMeet: both RMS-normed per head to
            // 4 = √D there, times 3 each, the score is 36·D/√D/4 = 36 for the marker and 0 for
            // any other token, so the softmax puts ~all weight on the marker when there is one.
            // v carries the marker feature (≈ 1 after the input RMSNorm's ×√(E/2)); the gate is
            // held open by the constant; the output writes it to the flag.
            std::vector<float> q(static_cast<size_t>(E * 2 * D)), k(static_cast<size_t>(E * D)), v(k.size()), ow(static_cast<size_t>(D * E));
            q[static_cast<size_t>(kMeet * E + kConst)] = 1;
            for (int64_t d = 0; d < D; ++d) q[static_cast<size_t>((D + d) * E + kConst)] = 8;
            k[static_cast<size_t>(kMeet * E + kMarker)] = 1;
            v[static_cast<size_t>(0 * E + kMarker)] = 1 / std::sqrt(static_cast<float>(E) / 2);
            ow[static_cast<size_t>(kFlag * D + 0)] = 1;
            put(p + "attn_q.weight", E, 2 * D, q);
            put(p + "attn_k.weight", E, D, k);
            put(p + "attn_v.weight", E, D, v);
            put(p + "attn_output.weight", D, E, ow);
            std::vector<float> qn(static_cast<size_t>(D), 1), kn(static_cast<size_t>(D), 1);
            qn[static_cast<size_t>(kMeet)] = 3, kn[static_cast<size_t>(kMeet)] = 3;
            w.add_tensor(p + "attn_q_norm.weight", {static_cast<uint64_t>(D)}, kF32, quantize(kF32, qn.data(), D));
            w.add_tensor(p + "attn_k_norm.weight", {static_cast<uint64_t>(D)}, kF32, quantize(kF32, kn.data(), D));
        }
        zeros(p + "ffn_gate.weight", E, s.n_ff);
        zeros(p + "ffn_up.weight", E, s.n_ff);
        zeros(p + "ffn_down.weight", s.n_ff, E);
    }
    w.write(path);
}

std::vector<FixtureFile> fixture_set(uint64_t seed) {
    std::vector<FixtureFile> out;
    SynthShape shape;
    struct {
        const char* name;
        uint32_t type;
    } types[] = {{"f32", kF32},     {"f16", kF16},     {"bf16", kBF16}, {"q8_0", kQ8_0}, {"tq1_0", kTQ1_0},  {"tq2_0", kTQ2_0},
                 {"q4_k", kQ4_K},   {"q6_k", kQ6_K},   {"q2_0", kQ2_0}, {"q1_0", kQ1_0}, {"pq2_0", kPQ2_0}, {"ptq1_0", kPTQ1_0}};
    for (const auto& t : types) {
        out.push_back({std::string("synth-") + t.name + ".gguf", shape, t.type, seed, false});
        if (t.type != kF32) out.push_back({std::string("synth-") + t.name + ".f32twin.gguf", shape, t.type, seed, true});
    }
    // Bonsai's layout: PQ2_0 / PTQ1_0 with the Hadamard fold (blocks of 128: two or four per
    // input width here, as 1024 gives five to seventeen in the 27B).
    SynthShape folded = shape;
    folded.hadamard_block = 128;
    for (const auto& t : {std::pair{"pq2_0", kPQ2_0}, std::pair{"ptq1_0", kPTQ1_0}}) {
        out.push_back({std::string("synth-") + t.first + "-folded.gguf", folded, t.second, seed, false});
        out.push_back({std::string("synth-") + t.first + "-folded.f32twin.gguf", folded, t.second, seed, true});
    }
    SynthShape odd;
    odd.n_layer = 8;
    odd.n_head = 6;
    odd.n_head_kv = 1;
    odd.head_dim = 32;
    odd.rope_dim = 8;
    odd.sections = {2, 1, 1, 0};
    odd.ssm_groups = 1;
    odd.ssm_heads = 2;
    odd.ssm_state = 128;
    odd.n_ff = 768;
    odd.tied_output = true;
    out.push_back({"synth-tied-f32.gguf", odd, kF32, seed + 1, false});
    return out;
}

SynthShape gpu_shape(int64_t layers) {
    // Qwen3.5-27B's layer shapes (E 5120, FFN 17408, 24 query / 4 KV heads of 256, GDN 16 key /
    // 48 value heads of 128), `layers` of them (every 4th full attention): 6.1B parameters at 16.
    SynthShape g;
    g.name = "pulse-gpu-bench";
    g.n_layer = layers;
    g.n_embd = 5120;
    g.n_ff = 17408;
    g.n_head = 24;
    g.n_head_kv = 4;
    g.head_dim = 256;
    g.rope_dim = 64;
    g.sections = {11, 11, 10, 0};
    g.ssm_groups = 16;
    g.ssm_heads = 48;
    g.ssm_state = 128;
    g.fast_fill = true;
    return g;
}

SynthShape bench_shape() {
    // 332.7M parameters: 16 layers (12 GDN + 4 gated attention), E 1024, FFN 3584, 8 query / 2 KV
    // heads of 256, GDN 16 key / 16 value heads of 128 — Qwen3.5's proportions at 1/10 the size.
    SynthShape b;
    b.name = "pulse-bench-333m";
    b.n_layer = 16;
    b.n_embd = 1024;
    b.n_ff = 3584;
    b.n_head = 8;
    b.n_head_kv = 2;
    b.head_dim = 256;
    b.rope_dim = 64;
    b.sections = {11, 11, 10, 0};
    b.ssm_groups = 16;
    b.ssm_heads = 16;
    b.ssm_state = 128;
    return b;
}

SynthShape tiny_shape() {
    SynthShape tiny;
    tiny.n_embd = 32;
    tiny.n_ff = 64;
    tiny.n_head = 2;
    tiny.n_head_kv = 1;
    tiny.head_dim = 16;
    tiny.rope_dim = 8;
    tiny.sections = {2, 1, 1, 0};
    tiny.ssm_groups = 1;
    tiny.ssm_heads = 2;
    tiny.ssm_state = 16;
    tiny.tied_output = true;
    return tiny;
}

}  // namespace pulse::decoder
