#include "format/hadamard.h"

#include <cmath>
#include <cstring>

#include "format/blocks.h"

namespace pulse::decoder {

namespace {

const char* kPrefix = "prism.hadamard.";

int64_t grouped_index(const Rotation& r, int64_t tiled) { return blocks::grouped_index(tiled, r.state, r.key_heads, r.rep); }

}  // namespace

void hadamard_blocks(float* x, int64_t n, int64_t block) {
    const float norm = 1.0f / std::sqrt(static_cast<float>(block));
    for (int64_t b = 0; b + block <= n; b += block) {
        float* v = x + b;
        for (int64_t len = 1; len < block; len <<= 1)
            for (int64_t i = 0; i < block; i += 2 * len)
                for (int64_t j = i; j < i + len; ++j) {
                    float a = v[j], c = v[j + len];
                    v[j] = a + c;
                    v[j + len] = a - c;
                }
        for (int64_t i = 0; i < block; ++i) v[i] *= norm;
    }
}

void rotate_row(const Rotation& r, const float* x, float* out) {
    if (r.inverse) {
        std::memcpy(out, x, static_cast<size_t>(r.width) * sizeof(float));
        hadamard_blocks(out, r.width, r.block);
        for (int64_t i = 0; i < r.width; ++i) out[i] *= r.signs[i];
        return;
    }
    if (r.grouped_heads)
        for (int64_t i = 0; i < r.width; ++i) out[grouped_index(r, i)] = x[i];
    else
        std::memcpy(out, x, static_cast<size_t>(r.width) * sizeof(float));
    for (int64_t i = 0; i < r.width; ++i) out[i] *= r.signs[i];
    hadamard_blocks(out, r.width, r.block);
}

void unfold_row(const Rotation& r, const float* folded, float* out) {
    // W = W'·R (forward) and e = s ⊙ (H·e') (inverse) give the same row formula: u = s ⊙ (H·w').
    std::vector<float> u(folded, folded + r.width);
    hadamard_blocks(u.data(), r.width, r.block);
    for (int64_t i = 0; i < r.width; ++i) u[static_cast<size_t>(i)] *= r.signs[i];
    for (int64_t i = 0; i < r.width; ++i) out[i] = u[static_cast<size_t>(r.grouped_heads && !r.inverse ? grouped_index(r, i) : i)];
}

std::optional<HadamardFold> read_hadamard(const GgufFile& f) {
    bool any = false;
    for (const auto& [key, v] : f.metadata())
        if (key.rfind(kPrefix, 0) == 0) any = true;
    if (!any) return std::nullopt;
    auto key = [](const char* k) { return std::string(kPrefix) + k; };
    auto bad = [&](const char* k, const std::string& why) -> GgufError {
        return GgufError(f.name() + ": metadata " + key(k) + (why[0] == '[' ? "" : " ") + why);
    };
    auto need = [&](const char* k) -> const Value& {
        const Value* v = f.find(key(k));
        if (!v) throw bad(k, "is missing (a file with any prism.hadamard.* key is Hadamard-folded and needs all of them: docs/DECODER.md)");
        return *v;
    };
    auto need_string = [&](const char* k, const char* want) {
        const Value& v = need(k);
        if (v.type != ValueType::string) throw bad(k, "must be a string");
        if (v.s != want) throw bad(k, "is '" + v.s + "'; this decoder reads only '" + want + "'");
    };
    auto need_strings = [&](const char* k) {
        const Value& v = need(k);
        if (v.type != ValueType::array || (v.elem != ValueType::string && !v.items.empty())) throw bad(k, "must be an array of strings");
        std::set<std::string> out;
        for (const auto& s : v.items)
            if (!out.insert(s.s).second) throw bad(k, "lists '" + s.s + "' twice");
        return out;
    };
    auto as_int = [](const Value& v) -> std::optional<int64_t> {
        if (!v.is_integer()) return std::nullopt;
        bool is_signed = v.type == ValueType::i8 || v.type == ValueType::i16 || v.type == ValueType::i32 || v.type == ValueType::i64;
        return is_signed ? v.i : static_cast<int64_t>(v.u);
    };

    HadamardFold h;
    {
        const Value& v = need("version");
        auto n = as_int(v);
        if (!n) throw bad("version", "must be an integer");
        if (*n != 1) throw bad("version", "is " + std::to_string(*n) + "; this decoder knows version 1");
    }
    need_string("transform", "normalized-sylvester-walsh-hadamard");
    need_string("axis", "input-last-dimension");
    need_string("sign_mode", "explicit");
    {
        auto n = as_int(need("block_size"));
        if (!n || *n < 2 || (*n & (*n - 1)) || *n > (1 << 20)) throw bad("block_size", "must be a power of two from 2 to 2^20");
        h.block = *n;
    }
    std::vector<int64_t> widths;
    {
        const Value& v = need("sign_widths");
        if (v.type != ValueType::array || v.items.empty()) throw bad("sign_widths", "must be a non-empty array of integers");
        for (const auto& w : v.items) {
            auto n = as_int(w);
            if (!n || *n <= 0) throw bad("sign_widths", "must hold positive integers");
            if (*n % h.block) throw bad("sign_widths", "holds " + std::to_string(*n) + ", not a multiple of block_size " + std::to_string(h.block));
            if (h.signs.count(*n)) throw bad("sign_widths", "lists width " + std::to_string(*n) + " twice");
            h.signs[*n];
            widths.push_back(*n);
        }
    }
    {
        const Value& v = need("sign_values");
        if (v.type != ValueType::array) throw bad("sign_values", "must be an array");
        size_t total = 0;
        for (int64_t w : widths) total += static_cast<size_t>(w);
        if (v.items.size() != total)
            throw bad("sign_values", "has " + std::to_string(v.items.size()) + " values; sign_widths add up to " + std::to_string(total));
        size_t at = 0;
        for (int64_t w : widths) {
            auto& s = h.signs[w];
            s.reserve(static_cast<size_t>(w));
            for (int64_t i = 0; i < w; ++i, ++at) {
                const Value& e = v.items[at];
                double x = e.is_float() ? e.f : as_int(e) ? static_cast<double>(*as_int(e)) : 0;
                if (x != 1 && x != -1) throw bad("sign_values", "[" + std::to_string(at) + "] is not +1 or -1");
                s.push_back(static_cast<float>(x));
            }
        }
    }
    h.folded = need_strings("weight_names");
    h.inverse = need_strings("inverse_weight_names");
    for (const auto& n : h.inverse)
        if (n != "token_embd.weight") throw bad("inverse_weight_names", "lists '" + n + "'; only token_embd.weight is stored inverse-rotated");
    {
        const Value& v = need("gdn_v_grouped");
        if (v.type != ValueType::boolean) throw bad("gdn_v_grouped", "must be a bool");
        h.gdn_v_grouped = v.b;
    }
    return h;
}

void write_hadamard_metadata(GgufWriter& w, const FoldSpec& spec) {
    w.set_u32("prism.hadamard.version", 1);
    w.set_string("prism.hadamard.transform", "normalized-sylvester-walsh-hadamard");
    w.set_string("prism.hadamard.axis", "input-last-dimension");
    w.set_string("prism.hadamard.sign_mode", "explicit");
    w.set_u32("prism.hadamard.block_size", static_cast<uint32_t>(spec.block));
    std::vector<int32_t> widths, values;
    for (size_t k = 0; k < spec.widths.size(); ++k) {
        widths.push_back(static_cast<int32_t>(spec.widths[k]));
        for (float s : spec.signs[k]) values.push_back(s > 0 ? 1 : -1);
    }
    w.set_i32s("prism.hadamard.sign_widths", widths);
    w.set_i32s("prism.hadamard.sign_values", values);
    w.set_strings("prism.hadamard.weight_names", spec.folded);
    w.set_strings("prism.hadamard.inverse_weight_names", spec.inverse);
    w.set_bool("prism.hadamard.gdn_v_grouped", spec.gdn_v_grouped);
}

}  // namespace pulse::decoder
