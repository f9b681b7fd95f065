#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "quants.h"

namespace pulse::decoder {

namespace {

std::string k(const std::string& arch, const char* key) { return arch + "." + key; }

float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
float silu(float x) { return x * sigmoid(x); }
float softplus(float x) { return x > 20 ? x : std::log1p(std::exp(x)); }

void rmsnorm(const float* x, const float* w, float* out, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
}

void l2norm(float* x, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    float r = static_cast<float>(1.0 / std::sqrt(ss + eps));
    for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

}  // namespace

void matvec(const Matrix& w, const float* x, float* y) {
    const TensorInfo& t = *w.t;
    const uint64_t rb = t.row_bytes();
#pragma omp parallel
    {
        std::vector<float> scratch(static_cast<size_t>(w.n_in));
#pragma omp for schedule(static)
        for (int64_t o = 0; o < w.n_out; ++o)
            y[o] = dot_row(t.type, t.data + static_cast<uint64_t>(o) * rb, x, w.n_in, scratch.data()) * w.scale;
    }
}

void matmat(const Matrix& w, const float* x, int64_t B, float* y, bool int8) {
    if (B == 1) return matvec(w, x, y);
    const TensorInfo& t = *w.t;
    const uint64_t rb = t.row_bytes();
    const int64_t n = w.n_in;
    // int8 activations: quantize every row of X once, then 8-bit dots four tokens at a time.
    const bool i8 = int8 && B >= 4 && n % 32 == 0 && has_i8_kernel(t.type);
    std::vector<int8_t> xq;
    std::vector<float> xd;
    if (i8) {
        xq.resize(static_cast<size_t>(B * n));
        xd.resize(static_cast<size_t>(B * (n / 32)));
        for (int64_t b = 0; b < B; ++b) quantize_act_q8(x + b * n, n, xq.data() + b * n, xd.data() + b * (n / 32));
    }
#pragma omp parallel
    {
        std::vector<float> scratch(static_cast<size_t>(n));
#pragma omp for schedule(static)
        for (int64_t o = 0; o < w.n_out; ++o) {
            const uint8_t* raw = t.data + static_cast<uint64_t>(o) * rb;
            int64_t b = 0;
            if (i8) {
                for (; b + 4 <= B; b += 4) {
                    float d[4];
                    dot4_row_i8(t.type, raw, xq.data() + b * n, xd.data() + b * (n / 32), n, d);
                    for (int k = 0; k < 4; ++k) y[(b + k) * w.n_out + o] = d[k] * w.scale;
                }
                for (; b < B; ++b) y[b * w.n_out + o] = dot_row(t.type, raw, x + b * n, n, scratch.data()) * w.scale;
                continue;
            }
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

std::shared_ptr<Model> Model::load(std::shared_ptr<GgufFile> file) {
    auto m = std::shared_ptr<Model>(new Model);
    m->file_ = file;
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
    auto mat = [&](const std::string& name, int64_t n_in, int64_t n_out) {
        const TensorInfo& t = f.get_tensor(name + ".weight");
        shape(t, {static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)});
        Matrix mx{&t, n_in, n_out, 1};
        if (const TensorInfo* s = f.tensor(name + ".scale")) {
            float sc;
            dequantize_row(s->type, s->data, &sc, 1);
            mx.scale = sc;
        }
        return mx;
    };
    const int64_t E = hp.n_embd;
    m->tok_embd_ = &f.get_tensor("token_embd.weight");
    if (m->tok_embd_->ne.size() < 2 || static_cast<int64_t>(m->tok_embd_->ne[0]) != E)
        bad("tensor 'token_embd.weight' must be [" + std::to_string(E) + ", n_vocab]");
    hp.n_vocab = static_cast<int64_t>(m->tok_embd_->ne[1]);
    m->output_norm_ = vec("output_norm.weight", E);
    if (f.tensor("output.weight")) m->output_ = mat("output", E, hp.n_vocab);
    else m->output_ = Matrix{m->tok_embd_, E, hp.n_vocab, 1};  // tied
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
    std::vector<float> g(static_cast<size_t>(B * F)), u(g.size());
    size_t ai = 0, gi = 0;
    for (const auto& L : layers_) {
        for (int64_t b = 0; b < B; ++b) rmsnorm(x.data() + b * E, L.attn_norm.data(), h.data() + b * E, E, hp_.rms_eps);
        if (L.recurrent) deltanet(L, seq, gi++, h.data(), tmp.data(), B);
        else attention(L, seq, ai++, h.data(), tmp.data(), B);
        for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
        for (int64_t b = 0; b < B; ++b) rmsnorm(x.data() + b * E, L.post_norm.data(), h.data() + b * E, E, hp_.rms_eps);
        matmat(L.ffn_gate, h.data(), B, g.data(), int8_prefill);
        matmat(L.ffn_up, h.data(), B, u.data(), int8_prefill);
        for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
        matmat(L.ffn_down, g.data(), B, tmp.data(), int8_prefill);
        for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    }
    seq.n_past += B;
    if (!logits) return;
    if (all_logits) {
        for (int64_t b = 0; b < B; ++b) rmsnorm(x.data() + b * E, output_norm_.data(), h.data() + b * E, E, hp_.rms_eps);
        matmat(output_, h.data(), B, logits, int8_prefill);
    } else {
        rmsnorm(x.data() + (B - 1) * E, output_norm_.data(), h.data(), E, hp_.rms_eps);
        matvec(output_, h.data(), logits);
    }
}

void Model::attention(const Layer& L, Sequence& seq, size_t ai, const float* h, float* out, int64_t B) const {
    const int64_t H = hp_.n_head, Hkv = hp_.n_head_kv, D = hp_.head_dim, R = hp_.rope_dim;
    std::vector<float> qg_all(static_cast<size_t>(B * 2 * H * D)), kx_all(static_cast<size_t>(B * Hkv * D)), vx_all(kx_all.size());
    matmat(L.q, h, B, qg_all.data(), int8_prefill);
    matmat(L.k, h, B, kx_all.data(), int8_prefill);
    matmat(L.v, h, B, vx_all.data(), int8_prefill);
    std::vector<float> o_all(static_cast<size_t>(B * H * D), 0.f);
    for (int64_t b = 0; b < B; ++b) {
        const float* qg = qg_all.data() + b * 2 * H * D;
        std::vector<float> kn(kx_all.begin() + b * Hkv * D, kx_all.begin() + (b + 1) * Hkv * D);
        std::vector<float> vx(vx_all.begin() + b * Hkv * D, vx_all.begin() + (b + 1) * Hkv * D);
        const int64_t p = seq.n_past + b;
        // NeoX partial RoPE: pairs (i, i + R/2) of the first R dims; frequency exponent over R.
        auto rope = [&](float* v) {
            for (int64_t i = 0; i < R / 2; ++i) {
                double theta = static_cast<double>(p) * std::pow(hp_.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(R));
                float c = static_cast<float>(std::cos(theta)), sn = static_cast<float>(std::sin(theta));
                float a = v[i], bb = v[i + R / 2];
                v[i] = a * c - bb * sn;
                v[i + R / 2] = a * sn + bb * c;
            }
        };
        std::vector<float> q(static_cast<size_t>(H * D)), gate(static_cast<size_t>(H * D));
        for (int64_t j = 0; j < H; ++j) {
            rmsnorm(qg + 2 * D * j, L.q_norm.data(), q.data() + D * j, D, hp_.rms_eps);
            std::memcpy(gate.data() + D * j, qg + 2 * D * j + D, static_cast<size_t>(D) * 4);
            rope(q.data() + D * j);
        }
        for (int64_t j = 0; j < Hkv; ++j) {
            std::vector<float> raw(kn.begin() + D * j, kn.begin() + D * (j + 1));
            rmsnorm(raw.data(), L.k_norm.data(), kn.data() + D * j, D, hp_.rms_eps);
            rope(kn.data() + D * j);
        }
        // The cache holds K and V at f16 precision, as llama.cpp's default F16 cache does.
        for (auto& xv : kn) xv = fp16_to_f32(f32_to_fp16(xv));
        for (auto& xv : vx) xv = fp16_to_f32(f32_to_fp16(xv));
        auto& kc = seq.k_cache[ai];
        auto& vc = seq.v_cache[ai];
        kc.insert(kc.end(), kn.begin(), kn.end());
        vc.insert(vc.end(), vx.begin(), vx.end());
        const int64_t n = static_cast<int64_t>(kc.size()) / (Hkv * D);
        const float scale = hp_.attn_scale > 0 ? static_cast<float>(hp_.attn_scale) : 1.f / std::sqrt(static_cast<float>(D));
        float* o = o_all.data() + b * H * D;
        const int64_t group = H / Hkv;
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < H; ++j) {
            const int64_t kvh = j / group;  // GQA: blocks of consecutive query heads share a KV head
            std::vector<float> w(static_cast<size_t>(n));
            float mx = -INFINITY;
            for (int64_t t = 0; t < n; ++t) {
                w[static_cast<size_t>(t)] = dot_f32(q.data() + j * D, kc.data() + (t * Hkv + kvh) * D, D) * scale;
                mx = std::max(mx, w[static_cast<size_t>(t)]);
            }
            double sum = 0;
            for (auto& xw : w) sum += (xw = std::exp(xw - mx));
            float* oj = o + j * D;
            for (int64_t t = 0; t < n; ++t) {
                const float* vt = vc.data() + (t * Hkv + kvh) * D;
                float a = static_cast<float>(w[static_cast<size_t>(t)] / sum);
                for (int64_t d = 0; d < D; ++d) oj[d] += a * vt[d];
            }
            for (int64_t d = 0; d < D; ++d) oj[d] *= sigmoid(gate[static_cast<size_t>(j * D + d)]);
        }
    }
    matmat(L.o, o_all.data(), B, out, int8_prefill);
}

void Model::deltanet(const Layer& L, Sequence& seq, size_t gi, const float* h, float* out, int64_t B) const {
    const int64_t K = hp_.conv_kernel, C = hp_.conv_dim(), S = hp_.ssm_state, Hk = hp_.ssm_groups, Hv = hp_.ssm_heads;
    const int64_t kd = hp_.key_dim(), VD = hp_.value_dim();
    std::vector<float> qkv_all(static_cast<size_t>(B * C)), z_all(static_cast<size_t>(B * VD)), beta_all(static_cast<size_t>(B * Hv)), alpha_all(beta_all.size());
    matmat(L.qkv, h, B, qkv_all.data(), int8_prefill);
    matmat(L.gate, h, B, z_all.data(), int8_prefill);
    matmat(L.beta, h, B, beta_all.data(), int8_prefill);
    matmat(L.alpha, h, B, alpha_all.data(), int8_prefill);
    std::vector<float> o_all(static_cast<size_t>(B * VD));
    auto& win = seq.conv[gi];
    auto& st = seq.state[gi];
    const float inv_sqrt_s = 1.f / std::sqrt(static_cast<float>(S));
    for (int64_t b = 0; b < B; ++b) {
        const float* qkv = qkv_all.data() + b * C;
        const float* z = z_all.data() + b * VD;
        const float* beta = beta_all.data() + b * Hv;
        const float* alpha = alpha_all.data() + b * Hv;
        // Causal depthwise conv over the last K inputs (window of K-1 previous + current), then SiLU.
        std::vector<float> y(static_cast<size_t>(C));
        for (int64_t c = 0; c < C; ++c) {
            float acc = 0;
            for (int64_t t = 0; t < K - 1; ++t) acc += L.conv[static_cast<size_t>(c * K + t)] * win[static_cast<size_t>(t * C + c)];
            acc += L.conv[static_cast<size_t>(c * K + K - 1)] * qkv[c];
            y[static_cast<size_t>(c)] = silu(acc);
        }
        if (K > 1) {
            std::memmove(win.data(), win.data() + C, static_cast<size_t>((K - 2) * C) * 4);
            std::memcpy(win.data() + (K - 2) * C, qkv, static_cast<size_t>(C) * 4);
        }
        float* q = y.data();
        float* kk = y.data() + kd;
        float* v = y.data() + 2 * kd;
        for (int64_t m = 0; m < Hk; ++m) {
            l2norm(q + m * S, S, hp_.rms_eps);
            l2norm(kk + m * S, S, hp_.rms_eps);
        }
        float* o = o_all.data() + b * VD;
#pragma omp parallel for schedule(static)
        for (int64_t hh = 0; hh < Hv; ++hh) {
            const int64_t m = hh % Hk;  // tiled key head for this value head
            const float bt = sigmoid(beta[hh]);
            const float decay = std::exp(softplus(alpha[hh] + L.dt_bias[static_cast<size_t>(hh)]) * L.ssm_a[static_cast<size_t>(hh)]);
            float* Sm = st.data() + hh * S * S;  // Sm[i * S + j]: i = key dim, j = value dim
            const float* km = kk + m * S;
            const float* qm = q + m * S;
            const float* vh = v + hh * S;
            std::vector<float> delta(static_cast<size_t>(S), 0.f), acc(static_cast<size_t>(S), 0.f);
            // S <- decay*S; delta = beta*(v - S^T k); S += k delta^T; o = S^T q / sqrt(S)
            for (int64_t i = 0; i < S; ++i) {
                float* row = Sm + i * S;
                const float ki = km[i];
                for (int64_t j = 0; j < S; ++j) {
                    row[j] *= decay;
                    acc[static_cast<size_t>(j)] += row[j] * ki;
                }
            }
            for (int64_t j = 0; j < S; ++j) delta[static_cast<size_t>(j)] = bt * (vh[j] - acc[static_cast<size_t>(j)]);
            std::fill(acc.begin(), acc.end(), 0.f);
            for (int64_t i = 0; i < S; ++i) {
                float* row = Sm + i * S;
                const float ki = km[i], qi = qm[i];
                for (int64_t j = 0; j < S; ++j) {
                    row[j] += ki * delta[static_cast<size_t>(j)];
                    acc[static_cast<size_t>(j)] += row[j] * qi;
                }
            }
            float* oh = o + hh * S;
            for (int64_t j = 0; j < S; ++j) oh[j] = acc[static_cast<size_t>(j)] * inv_sqrt_s;
            std::vector<float> normed(static_cast<size_t>(S));
            rmsnorm(oh, L.ssm_norm.data(), normed.data(), S, hp_.rms_eps);
            for (int64_t j = 0; j < S; ++j) oh[j] = normed[static_cast<size_t>(j)] * silu(z[hh * S + j]);
        }
    }
    matmat(L.out, o_all.data(), B, out, int8_prefill);
}

}  // namespace pulse::decoder
