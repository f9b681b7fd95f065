// What the decoder's test files share: the includes, the synthetic-model helpers, the reference
// runs several folders' tests compare against. Each file tests one folder of plugins/decoder.
#pragma once

#include <doctest/doctest.h>

#include <set>

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <regex>

#include <rapidjson/document.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "device/cpu/kernels.h"
#include "format/blocks.h"
#include "format/gguf.h"
#include "format/hadamard.h"
#include "format/quants.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "speculation/speculate.h"
#include "support/forwarding_device.h"
#include "support/temp_dir.h"
#include "tools/distill.h"
#include "tools/synthetic.h"

using namespace pulse::decoder;
using pulse::test::TempDir;

namespace fs = std::filesystem;

// The source tree: where the build saw it, or PULSE_SOURCE_ROOT when the binary runs elsewhere
// (tools/gpu-check carries it to a GPU machine).
inline fs::path source_root() {
    const char* env = std::getenv("PULSE_SOURCE_ROOT");
    return env && *env ? fs::path(env) : fs::path(PULSE_SOURCE_ROOT);
}


inline std::vector<uint8_t> tiny_bytes() {
    static std::vector<uint8_t> bytes = [] {
        TempDir d;
        write_synthetic(d / "t.gguf", tiny_shape(), kF32, 7);
        std::ifstream in(d / "t.gguf", std::ios::binary);
        return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
    }();
    return bytes;
}

inline std::string parse_error(const std::vector<uint8_t>& b) {
    try {
        GgufFile::parse(b.data(), b.size(), "x.gguf");
    } catch (const GgufError& e) {
        return e.what();
    }
    return "";
}

// A hand-made file: header, the given KV bytes and tensor infos, aligned data.
struct Builder {
    std::vector<uint8_t> b;
    template <class T>
    void put(T v) {
        auto* p = reinterpret_cast<uint8_t*>(&v);
        b.insert(b.end(), p, p + sizeof v);
    }
    void str(const std::string& s) {
        put<uint64_t>(s.size());
        b.insert(b.end(), s.begin(), s.end());
    }
    void header(uint64_t nt, uint64_t nkv, uint32_t version = 3) {
        put<uint32_t>(0x46554747u);
        put<uint32_t>(version);
        put<uint64_t>(nt);
        put<uint64_t>(nkv);
    }
    void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t off) {
        str(name);
        put<uint32_t>(static_cast<uint32_t>(ne.size()));
        for (auto x : ne) put<uint64_t>(x);
        put<uint32_t>(type);
        put<uint64_t>(off);
    }
    void pad_data(size_t data_bytes) {
        b.resize((b.size() + 31) / 32 * 32, 0);
        b.resize(b.size() + data_bytes, 0);
    }
};


// A small model whose widths are multiples of PQ2_0's group of 128: E 128, n_ff 256, value
// and attention widths 128; tied output.
inline SynthShape small_foldable() {
    SynthShape s = tiny_shape();
    s.n_embd = 128;
    s.n_ff = 256;
    s.head_dim = 64;
    s.rope_dim = 16;
    s.ssm_state = 64;
    return s;
}

// A golden entry llama.cpp recorded on a quantized file itself (not on its F32 twin).
inline bool direct_quantized(const std::string& golden) {
    return golden.find(".f32twin") == std::string::npos && golden.find("-f32") == std::string::npos;
}

inline std::vector<int> greedy_run(const Model& model, Sequence& seq, std::vector<float> last, size_t steps) {
    std::vector<int> out;
    for (size_t i = 0; i < steps; ++i) {
        int best = static_cast<int>(std::max_element(last.begin(), last.end()) - last.begin());
        out.push_back(best);
        last = model.forward(seq, {best});
    }
    return out;
}

inline std::vector<int> golden_greedy(const rapidjson::Value& r) {
    std::vector<int> want;
    for (const auto& t : r["greedy"].GetArray()) want.push_back(t.GetInt());
    return want;
}

// A tensor of the file as floats.
inline std::vector<float> tensor_values(const GgufFile& f, const std::string& name) {
    const TensorInfo& t = f.get_tensor(name);
    int64_t n = 1;
    for (auto x : t.ne) n *= static_cast<int64_t>(x);
    std::vector<float> v(static_cast<size_t>(n));
    dequantize_row(t.type, t.data, v.data(), n);
    return v;
}
inline std::vector<float> rms(const std::vector<float>& x, const std::vector<float>& w) {
    double ss = 0;
    for (float e : x) ss += static_cast<double>(e) * e;
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + 1e-6);
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i] * s * w[i]);
    return y;
}
// y = W·x for a GGUF [n_in, n_out] weight (rows of n_in).
inline std::vector<float> mul(const std::vector<float>& W, const std::vector<float>& x) {
    const size_t n_in = x.size(), n_out = W.size() / n_in;
    std::vector<float> y(n_out);
    for (size_t o = 0; o < n_out; ++o) {
        double a = 0;
        for (size_t i = 0; i < n_in; ++i) a += static_cast<double>(W[o * n_in + i]) * x[i];
        y[o] = static_cast<float>(a);
    }
    return y;
}
inline SynthShape mtp_shape(bool own_tables = false) {
    SynthShape s = tiny_shape();
    s.mtp = true;
    s.mtp_own_tables = own_tables;
    return s;
}
// For speculation: the tiny shape with its own output matrix. With the tied one, greedy text
// of every seed is one token repeated, which any drafter predicts; this one's varies.
inline SynthShape spec_shape() {
    SynthShape s = mtp_shape();
    s.tied_output = false;
    return s;
}
// The untied tiny F32 model with an MTP block, on the exact path (the reference arithmetic).
inline std::shared_ptr<Model> exact_mtp_model(const TempDir& d, uint64_t seed) {
    write_synthetic(d / "mtp.gguf", spec_shape(), kF32, seed);
    auto m = Model::load(GgufFile::open(d / "mtp.gguf"));
    m->exact = true;
    return m;
}

// Plain greedy decoding: the first token from the prompt's logits, then one token per step;
// also each step's logits (the reference for the state after speculation).
inline std::vector<int32_t> plain_greedy(const Model& m, const std::vector<int32_t>& prompt, size_t n, std::vector<std::vector<float>>* logits = nullptr) {
    auto seq = m.new_sequence();
    std::vector<float> l = m.forward(*seq, prompt);
    std::vector<int32_t> out;
    for (size_t i = 0; i < n; ++i) {
        if (logits) logits->push_back(l);
        out.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
        l = m.forward(*seq, {out.back()});
    }
    return out;
}
// A draft model: the untied tiny model of `seed` cut to its first layer.
inline void write_first_layer(const fs::path& path, uint64_t seed) {
    SynthShape one_layer = spec_shape();
    one_layer.n_layer = 1;
    write_synthetic(path, one_layer, kF32, seed);
}
const std::vector<int32_t> kSpecPrompt = {297, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};
// The first `n` tokens a fresh speculator decodes greedily after kSpecPrompt, step by step.
inline std::vector<int32_t> speculative_greedy(Speculator& spec, size_t n) {
    auto l = spec.prefill(kSpecPrompt);
    std::vector<int32_t> out{static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin())};
    for (int guard = 0; out.size() < n && guard < 200; ++guard) {
        auto got = spec.step(out.back());
        out.insert(out.end(), got.begin(), got.end());
    }
    out.resize(std::min(out.size(), n));
    return out;
}
