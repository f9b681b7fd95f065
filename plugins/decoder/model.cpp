#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "quants.h"

namespace pulse::decoder {

namespace {

std::string k(const std::string& arch, const char* key) { return arch + "." + key; }

}  // namespace

std::shared_ptr<Model> Model::load(std::shared_ptr<GgufFile> file, const std::string& device) {
    auto m = std::shared_ptr<Model>(new Model);
    m->file_ = file;
    m->dev_ = make_device(device);
    const GgufFile& f = *file;
    const std::string arch = f.get_string("general.architecture");
    if (arch != "qwen35")
        throw GgufError(f.name() + ": general.architecture is '" + arch + "'; this decoder runs 'qwen35' (Qwen3.5 hybrid) models");
    HParams& hp = m->hp_;
    hp.n_embd = static_cast<int64_t>(f.get_uint(k(arch, "embedding_length")));
    int64_t blocks = static_cast<int64_t>(f.get_uint(k(arch, "block_count")));
    hp.n_layer = blocks - static_cast<int64_t>(f.opt_uint(k(arch, "nextn_predict_layers")).value_or(0));
    hp.n_ff = static_cast<int64_t>(f.get_uint(k(arch, "feed_forward_length")));
    hp.n_head = static_cast<int64_t>(f.get_uint(k(arch, "attention.head_count")));
    hp.n_head_kv = static_cast<int64_t>(f.opt_uint(k(arch, "attention.head_count_kv")).value_or(static_cast<uint64_t>(hp.n_head)));
    hp.head_dim = static_cast<int64_t>(f.opt_uint(k(arch, "attention.key_length")).value_or(static_cast<uint64_t>(hp.n_embd / std::max<int64_t>(hp.n_head, 1))));
    int64_t vlen = static_cast<int64_t>(f.opt_uint(k(arch, "attention.value_length")).value_or(static_cast<uint64_t>(hp.head_dim)));
    hp.rms_eps = f.get_float(k(arch, "attention.layer_norm_rms_epsilon"));
    hp.attn_scale = f.opt_float(k(arch, "attention.scale")).value_or(0);
    hp.rope_dim = static_cast<int64_t>(f.opt_uint(k(arch, "rope.dimension_count")).value_or(static_cast<uint64_t>(hp.head_dim)));
    hp.rope_base = f.opt_float(k(arch, "rope.freq_base")).value_or(10000);
    hp.conv_kernel = static_cast<int64_t>(f.get_uint(k(arch, "ssm.conv_kernel")));
    hp.ssm_state = static_cast<int64_t>(f.get_uint(k(arch, "ssm.state_size")));
    hp.ssm_groups = static_cast<int64_t>(f.get_uint(k(arch, "ssm.group_count")));
    hp.ssm_heads = static_cast<int64_t>(f.get_uint(k(arch, "ssm.time_step_rank")));
    hp.context_length = static_cast<int64_t>(f.opt_uint(k(arch, "context_length")).value_or(4096));
    int64_t interval = static_cast<int64_t>(f.opt_uint(k(arch, "full_attention_interval")).value_or(4));
    const Value& sections = f.get_array(k(arch, "rope.dimension_sections"));
    auto bad = [&](const std::string& what) { throw GgufError(f.name() + ": " + what); };
    if (hp.n_embd <= 0 || hp.n_layer <= 0 || hp.n_ff <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.head_dim <= 0)
        bad("qwen35 sizes must be positive (embedding_length, block_count, feed_forward_length, head counts, key_length)");
    if (hp.n_head % hp.n_head_kv) bad("attention.head_count " + std::to_string(hp.n_head) + " is not a multiple of head_count_kv " + std::to_string(hp.n_head_kv));
    if (vlen != hp.head_dim) bad("attention.value_length must equal key_length");
    if (hp.rope_dim <= 0 || hp.rope_dim > hp.head_dim || hp.rope_dim % 2) bad("rope.dimension_count must be even and at most key_length");
    if (hp.ssm_groups <= 0 || hp.ssm_heads <= 0 || hp.ssm_heads % hp.ssm_groups || hp.ssm_state <= 0 || hp.conv_kernel < 1)
        bad("ssm sizes: time_step_rank must be a positive multiple of group_count; state_size and conv_kernel positive");
    if (sections.items.size() != 4) bad("rope.dimension_sections must have 4 entries");
    if (interval <= 0) bad("full_attention_interval must be positive");
    // IMROPE with text positions (p, p, p, 0): a pair whose section is not t/h/w would use
    // position 0. Those layouts are not supported; the Qwen3.5 sections cover every pair.
    {
        int64_t sec[4];
        for (int i = 0; i < 4; ++i) sec[i] = sections.items[static_cast<size_t>(i)].is_integer() ? static_cast<int64_t>(sections.items[static_cast<size_t>(i)].i + static_cast<int64_t>(sections.items[static_cast<size_t>(i)].u)) : -1;
        int64_t sum = sec[0] + sec[1] + sec[2] + sec[3];
        if (sum <= 0) bad("rope.dimension_sections must sum to more than 0");
        for (int64_t i = 0; i < hp.rope_dim / 2; ++i) {
            int64_t s = i % sum;
            bool covered = (s % 3 == 0 && s < 3 * sec[0]) || (s % 3 == 1 && s < 3 * sec[1]) || (s % 3 == 2 && s < 3 * sec[2]);
            if (!covered) bad("rope.dimension_sections leave rotary pair " + std::to_string(i) + " without a text position (not supported)");
        }
    }
    hp.recurrent.resize(static_cast<size_t>(hp.n_layer));
    if (const Value* rl = f.find(k(arch, "attention.recurrent_layers"))) {
        if (rl->type != ValueType::array || rl->items.size() < static_cast<size_t>(hp.n_layer)) bad("attention.recurrent_layers must list every layer");
        for (int64_t il = 0; il < hp.n_layer; ++il) hp.recurrent[static_cast<size_t>(il)] = rl->items[static_cast<size_t>(il)].b || rl->items[static_cast<size_t>(il)].u || rl->items[static_cast<size_t>(il)].i;
    } else {
        for (int64_t il = 0; il < hp.n_layer; ++il) hp.recurrent[static_cast<size_t>(il)] = (il + 1) % interval != 0;
    }

    auto shape = [&](const TensorInfo& t, std::vector<uint64_t> want) {
        std::vector<uint64_t> got = t.ne;
        while (got.size() > want.size() && got.back() == 1) got.pop_back();
        if (got != want) {
            auto fmt = [](const std::vector<uint64_t>& v) {
                std::string s = "[";
                for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
                return s + "]";
            };
            bad("tensor '" + t.name + "' has shape " + fmt(t.ne) + ", expected " + fmt(want));
        }
    };
    auto vec = [&](const std::string& name, int64_t n) {
        const TensorInfo& t = f.get_tensor(name);
        shape(t, {static_cast<uint64_t>(n)});
        std::vector<float> v(static_cast<size_t>(n));
        dequantize_row(t.type, t.data, v.data(), n);
        return v;
    };
    // Hadamard fold: the rotation each folded weight's input needs (hadamard.h).
    m->fold_ = read_hadamard(f);
    std::set<std::string> folded_bound;
    auto rotation = [&](const std::string& tensor, int64_t width, bool inverse, bool grouped) -> const Rotation* {
        auto it = m->fold_->signs.find(width);
        if (it == m->fold_->signs.end())
            bad("metadata prism.hadamard.sign_widths has no sign vector for width " + std::to_string(width) + ", the input width of folded tensor '" + tensor + "'");
        auto r = std::make_unique<Rotation>();
        r->width = width;
        r->block = m->fold_->block;
        r->signs = it->second.data();
        r->inverse = inverse;
        if (grouped) {
            r->grouped_heads = true;
            r->state = hp.ssm_state;
            r->key_heads = hp.ssm_groups;
            r->rep = hp.ssm_heads / hp.ssm_groups;
        }
        m->rotations_.push_back(std::move(r));
        return m->rotations_.back().get();
    };
    auto mat = [&](const std::string& name, int64_t n_in, int64_t n_out) {
        const TensorInfo& t = f.get_tensor(name + ".weight");
        shape(t, {static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)});
        Matrix mx{&t, n_in, n_out, 1, nullptr};
        if (const TensorInfo* s = f.tensor(name + ".scale")) {
            float sc;
            dequantize_row(s->type, s->data, &sc, 1);
            mx.scale = sc;
        }
        if (m->fold_ && m->fold_->folded.count(t.name)) {
            // ssm_out multiplies the Gated DeltaNet output, computed here in tiled head order.
            bool grouped = m->fold_->gdn_v_grouped && name.size() > 7 && name.compare(name.size() - 7, 7, "ssm_out") == 0;
            mx.rot = rotation(t.name, n_in, false, grouped);
            folded_bound.insert(t.name);
        }
        return mx;
    };
    const int64_t E = hp.n_embd;
    m->tok_embd_ = &f.get_tensor("token_embd.weight");
    if (m->tok_embd_->ne.size() < 2 || static_cast<int64_t>(m->tok_embd_->ne[0]) != E)
        bad("tensor 'token_embd.weight' must be [" + std::to_string(E) + ", n_vocab]");
    hp.n_vocab = static_cast<int64_t>(m->tok_embd_->ne[1]);
    m->output_norm_ = vec("output_norm.weight", E);
    if (m->fold_ && m->fold_->inverse.count("token_embd.weight")) m->embd_rot_ = rotation("token_embd.weight", E, true, false);
    if (f.tensor("output.weight")) {
        m->output_ = mat("output", E, hp.n_vocab);
    } else {
        m->output_ = Matrix{m->tok_embd_, E, hp.n_vocab, 1, nullptr};  // tied
        // Rows stored as e' with e = s ⊙ (H·e'): e·x = e'·(H·(s ⊙ x)), the forward rotation.
        if (m->embd_rot_) m->output_.rot = rotation("token_embd.weight", E, false, false);
    }
    const int64_t H = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim, K = hp.conv_kernel;
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        Layer L;
        L.recurrent = hp.recurrent[static_cast<size_t>(il)];
        L.attn_norm = vec(p + "attn_norm.weight", E);
        L.post_norm = vec(p + "post_attention_norm.weight", E);
        L.ffn_gate = mat(p + "ffn_gate", E, hp.n_ff);
        L.ffn_up = mat(p + "ffn_up", E, hp.n_ff);
        L.ffn_down = mat(p + "ffn_down", hp.n_ff, E);
        if (L.recurrent) {
            L.qkv = mat(p + "attn_qkv", E, hp.conv_dim());
            L.gate = mat(p + "attn_gate", E, hp.value_dim());
            L.beta = mat(p + "ssm_beta", E, hp.ssm_heads);
            L.alpha = mat(p + "ssm_alpha", E, hp.ssm_heads);
            L.out = mat(p + "ssm_out", hp.value_dim(), E);
            const TensorInfo& conv = f.get_tensor(p + "ssm_conv1d.weight");
            shape(conv, {static_cast<uint64_t>(K), static_cast<uint64_t>(hp.conv_dim())});
            L.conv.resize(static_cast<size_t>(K * hp.conv_dim()));
            dequantize_row(conv.type, conv.data, L.conv.data(), K * hp.conv_dim());
            L.dt_bias = vec(p + "ssm_dt.bias", hp.ssm_heads);
            L.ssm_a = vec(p + "ssm_a", hp.ssm_heads);
            L.ssm_norm = vec(p + "ssm_norm.weight", hp.ssm_state);
        } else {
            L.q = mat(p + "attn_q", E, 2 * H * D);
            L.k = mat(p + "attn_k", E, Hkv * D);
            L.v = mat(p + "attn_v", E, Hkv * D);
            L.o = mat(p + "attn_output", H * D, E);
            L.q_norm = vec(p + "attn_q_norm.weight", D);
            L.k_norm = vec(p + "attn_k_norm.weight", D);
        }
        m->layers_.push_back(std::move(L));
    }
    if (m->fold_)
        for (const auto& name : m->fold_->folded)
            if (!folded_bound.count(name))
                bad("metadata prism.hadamard.weight_names lists '" + name + "', which is not a weight this model multiplies" +
                    (f.tensor(name) ? "" : " (no such tensor)"));
    return m;
}

std::unique_ptr<Sequence> Model::new_sequence() const {
    auto s = std::make_unique<Sequence>();
    for (const auto& L : layers_) {
        if (L.recurrent) {
            s->conv.emplace_back(static_cast<size_t>((hp_.conv_kernel - 1) * hp_.conv_dim()), 0.f);
            s->state.emplace_back(static_cast<size_t>(hp_.ssm_heads * hp_.ssm_state * hp_.ssm_state), 0.f);
        } else {
            s->k_cache.emplace_back();
            s->v_cache.emplace_back();
        }
    }
    return s;
}

std::vector<float> Model::forward(Sequence& seq, const std::vector<int32_t>& tokens, bool all_logits) const {
    const size_t V = static_cast<size_t>(hp_.n_vocab);
    std::vector<float> logits(V * (all_logits ? tokens.size() : 1));
    // Batches of up to 64 tokens: every weight row is read once per batch (prefill), and the
    // recurrent and attention state still advance token by token inside the batch.
    constexpr size_t kBatch = 64;
    for (size_t i = 0; i < tokens.size(); i += kBatch) {
        size_t n = std::min(kBatch, tokens.size() - i);
        bool last = i + n == tokens.size();
        float* out = all_logits ? logits.data() + i * V : (last ? logits.data() : nullptr);
        batch_step(seq, tokens.data() + i, static_cast<int64_t>(n), out, all_logits);
    }
    return logits;
}

void Model::batch_step(Sequence& seq, const int32_t* tokens, int64_t B, float* logits, bool all_logits) const {
    const int64_t E = hp_.n_embd, F = hp_.n_ff;
    const size_t uE = static_cast<size_t>(E);
    std::vector<float> x(static_cast<size_t>(B) * uE), h(x.size()), tmp(x.size());
    for (int64_t b = 0; b < B; ++b) {
        int32_t token = tokens[b];
        if (token < 0 || token >= hp_.n_vocab)
            throw std::out_of_range("token id " + std::to_string(token) + " is outside the vocabulary (" + std::to_string(hp_.n_vocab) + ")");
        dequantize_row(tok_embd_->type, tok_embd_->data + static_cast<uint64_t>(token) * tok_embd_->row_bytes(), x.data() + b * E, E);
    }
    if (embd_rot_) {
        dev_->rotate(*embd_rot_, x.data(), tmp.data(), B);
        x.swap(tmp);
    }
    std::vector<float> g(static_cast<size_t>(B * F)), u(g.size());
    size_t ai = 0, gi = 0;
    for (const auto& L : layers_) {
        dev_->rmsnorm(x.data(), L.attn_norm.data(), h.data(), B, E, hp_.rms_eps);
        if (L.recurrent) deltanet(L, seq, gi++, h.data(), tmp.data(), B);
        else attention(L, seq, ai++, h.data(), tmp.data(), B);
        dev_->add(x.data(), tmp.data(), static_cast<int64_t>(x.size()));
        dev_->rmsnorm(x.data(), L.post_norm.data(), h.data(), B, E, hp_.rms_eps);
        matmul(L.ffn_gate, h.data(), B, g.data(), !exact);
        matmul(L.ffn_up, h.data(), B, u.data(), !exact);
        dev_->swiglu(g.data(), u.data(), static_cast<int64_t>(g.size()));
        matmul(L.ffn_down, g.data(), B, tmp.data(), !exact);
        dev_->add(x.data(), tmp.data(), static_cast<int64_t>(x.size()));
    }
    seq.n_past += B;
    if (!logits) return;
    if (all_logits) {
        dev_->rmsnorm(x.data(), output_norm_.data(), h.data(), B, E, hp_.rms_eps);
        matmul(output_, h.data(), B, logits, !exact);
    } else {
        dev_->rmsnorm(x.data() + (B - 1) * E, output_norm_.data(), h.data(), 1, E, hp_.rms_eps);
        matmul(output_, h.data(), 1, logits, !exact);
    }
}

void Model::matmul(const Matrix& w, const float* x, int64_t B, float* y, bool int8) const {
    if (!w.rot) return dev_->matmul(w, x, B, y, int8);
    std::vector<float> xr(static_cast<size_t>(B * w.n_in));
    dev_->rotate(*w.rot, x, xr.data(), B);
    dev_->matmul(w, xr.data(), B, y, int8);
}

void Model::attention(const Layer& L, Sequence& seq, size_t ai, const float* h, float* out, int64_t B) const {
    const int64_t H = hp_.n_head, Hkv = hp_.n_head_kv, D = hp_.head_dim;
    std::vector<float> qg(static_cast<size_t>(B * 2 * H * D)), k(static_cast<size_t>(B * Hkv * D)), v(k.size()), o(static_cast<size_t>(B * H * D));
    matmul(L.q, h, B, qg.data(), !exact);
    matmul(L.k, h, B, k.data(), !exact);
    matmul(L.v, h, B, v.data(), !exact);
    AttentionOp op{qg.data(), k.data(), v.data(), B, seq.n_past, H, Hkv, D, hp_.rope_dim, hp_.rope_base, hp_.rms_eps,
                   hp_.attn_scale > 0 ? hp_.attn_scale : 1.0 / std::sqrt(static_cast<double>(D)), L.q_norm.data(), L.k_norm.data(),
                   &seq.k_cache[ai], &seq.v_cache[ai], o.data()};
    dev_->attention(op);
    matmul(L.o, o.data(), B, out, !exact);
}

void Model::deltanet(const Layer& L, Sequence& seq, size_t gi, const float* h, float* out, int64_t B) const {
    const int64_t C = hp_.conv_dim(), Hv = hp_.ssm_heads, VD = hp_.value_dim();
    std::vector<float> qkv(static_cast<size_t>(B * C)), z(static_cast<size_t>(B * VD)), beta(static_cast<size_t>(B * Hv)), alpha(beta.size()),
        o(static_cast<size_t>(B * VD));
    matmul(L.qkv, h, B, qkv.data(), !exact);
    matmul(L.gate, h, B, z.data(), !exact);
    matmul(L.beta, h, B, beta.data(), !exact);
    matmul(L.alpha, h, B, alpha.data(), !exact);
    DeltaNetOp op{qkv.data(), z.data(), beta.data(), alpha.data(), B, hp_.conv_kernel, C, hp_.ssm_state, hp_.ssm_groups, Hv, hp_.rms_eps,
                  L.conv.data(), L.dt_bias.data(), L.ssm_a.data(), L.ssm_norm.data(), seq.conv[gi].data(), seq.state[gi].data(), o.data()};
    dev_->deltanet(op);
    matmul(L.out, o.data(), B, out, !exact);
}

}  // namespace pulse::decoder
