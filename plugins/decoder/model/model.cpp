#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>
#include <utility>

#include "format/quants.h"

namespace pulse::decoder {

namespace {

std::string k(const std::string& arch, const char* key) { return arch + "." + key; }

}  // namespace

std::shared_ptr<Model> Model::load(std::shared_ptr<GgufFile> file, const std::string& device) {
    std::string note;
    auto dev = make_device(device, &note);
    auto m = load(std::move(file), std::move(dev));
    m->device_note_ = note;
    return m;
}

std::shared_ptr<Model> Model::load(std::shared_ptr<GgufFile> file, std::unique_ptr<Device> device) {
    auto m = std::shared_ptr<Model>(new Model);
    m->file_ = file;
    m->dev_ = std::move(device);
    const GgufFile& f = *file;
    const std::string arch = f.get_string("general.architecture");
    if (arch != "qwen35")
        throw GgufError(f.name() + ": general.architecture is '" + arch + "'; this decoder runs 'qwen35' (Qwen3.5 hybrid) models");
    HParams& hp = m->hp_;
    hp.n_embd = static_cast<int64_t>(f.get_uint(k(arch, "embedding_length")));
    const uint64_t blocks = f.get_uint(k(arch, "block_count")), nextn = f.opt_uint(k(arch, "nextn_predict_layers")).value_or(0);
    const uint64_t layers = blocks > nextn ? blocks - nextn : 0;
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
    // Every layer has at least 11 tensors (two norms, three FFN matrices, and the 6 of attention
    // or the 9 of Gated DeltaNet): a count no file of this many tensors backs fails here, before
    // anything walks it.
    if (layers > f.tensors().size() / 11)
        bad("block_count " + std::to_string(blocks) + " asks for " + std::to_string(layers) + " layers of at least 11 tensors each; the file has " +
            std::to_string(f.tensors().size()) + " tensors");
    hp.n_layer = static_cast<int64_t>(layers);
    if (hp.n_embd <= 0 || hp.n_layer <= 0 || hp.n_ff <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.head_dim <= 0)
        bad("qwen35 sizes must be positive (embedding_length, block_count, feed_forward_length, head counts, key_length)");
    // Bounded before anything loops over them or multiplies them: a corrupt file claiming 10^9
    // layers or heads fails here, at once, not after a walk of that length or a wrapped product
    // that happens to match some tensor's shape.
    constexpr int64_t kMaxSize = int64_t{1} << 24;
    for (auto [key, v] : {std::pair<const char*, int64_t>{"embedding_length", hp.n_embd}, {"feed_forward_length", hp.n_ff}, {"attention.head_count", hp.n_head},
                          {"attention.head_count_kv", hp.n_head_kv}, {"attention.key_length", hp.head_dim}, {"ssm.conv_kernel", hp.conv_kernel},
                          {"ssm.group_count", hp.ssm_groups}, {"ssm.time_step_rank", hp.ssm_heads}})
        if (v > kMaxSize) bad(std::string(key) + " is " + std::to_string(v) + ", above the 16777216 this decoder supports");
    if (hp.n_head % hp.n_head_kv) bad("attention.head_count " + std::to_string(hp.n_head) + " is not a multiple of head_count_kv " + std::to_string(hp.n_head_kv));
    if (vlen != hp.head_dim) bad("attention.value_length must equal key_length");
    if (hp.rope_dim <= 0 || hp.rope_dim > hp.head_dim || hp.rope_dim % 2) bad("rope.dimension_count must be even and at most key_length");
    if (hp.ssm_groups <= 0 || hp.ssm_heads <= 0 || hp.ssm_heads % hp.ssm_groups || hp.ssm_state <= 0 || hp.conv_kernel < 1)
        bad("ssm sizes: time_step_rank must be a positive multiple of group_count; state_size and conv_kernel positive");
    if (hp.ssm_state > 512)
        bad("ssm.state_size " + std::to_string(hp.ssm_state) + " is not supported (the Gated DeltaNet kernel takes up to 512; Qwen3.5 uses 128)");
    if (sections.items.size() != 4) bad("rope.dimension_sections must have 4 entries");
    if (interval <= 0) bad("full_attention_interval must be positive");
    // IMROPE with text positions (p, p, p, 0): a pair whose section is not t/h/w would use
    // position 0. Those layouts are not supported; the Qwen3.5 sections cover every pair.
    {
        int64_t sec[4];
        // Clamped to [-1, rope_dim]: a section longer than the rotary pairs covers the same pairs
        // as one of rope_dim, and the sums and products below cannot overflow.
        for (int i = 0; i < 4; ++i) {
            const Value& v = sections.items[static_cast<size_t>(i)];
            sec[i] = !v.is_integer() ? -1 : v.type == ValueType::u64 || v.type == ValueType::u32 || v.type == ValueType::u16 || v.type == ValueType::u8
                                                ? static_cast<int64_t>(std::min<uint64_t>(v.u, static_cast<uint64_t>(hp.rope_dim)))
                                                : std::clamp<int64_t>(v.i, -1, hp.rope_dim);
        }
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
    Device& dev = *m->dev_;
    auto vec = [&](const std::string& name, int64_t n) {
        const TensorInfo& t = f.get_tensor(name);
        shape(t, {static_cast<uint64_t>(n)});
        std::vector<float> v(static_cast<size_t>(n));
        dequantize_row(t.type, t.data, v.data(), n);
        return dev.upload(v);
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
    // grouped_heads: the input is the Gated DeltaNet output (ssm_out), computed in tiled head order.
    auto mat = [&](const std::string& name, int64_t n_in, int64_t n_out, bool grouped_heads = false) {
        const TensorInfo& t = f.get_tensor(name + ".weight");
        shape(t, {static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)});
        Matrix mx{&t, n_in, n_out, 1, nullptr, nullptr};
        if (const TensorInfo* s = f.tensor(name + ".scale")) {
            float sc;
            dequantize_row(s->type, s->data, &sc, 1);
            mx.scale = sc;
        }
        if (m->fold_ && m->fold_->folded.count(t.name)) {
            mx.rot = rotation(t.name, n_in, false, grouped_heads && m->fold_->gdn_v_grouped);
            folded_bound.insert(t.name);
        }
        return mx;
    };
    const int64_t E = hp.n_embd;
    const TensorInfo* tok_embd = &f.get_tensor("token_embd.weight");
    if (tok_embd->ne.size() < 2 || static_cast<int64_t>(tok_embd->ne[0]) != E)
        bad("tensor 'token_embd.weight' must be [" + std::to_string(E) + ", n_vocab]");
    hp.n_vocab = static_cast<int64_t>(tok_embd->ne[1]);
    m->embd_ = Matrix{tok_embd, E, hp.n_vocab, 1, nullptr, nullptr};
    m->output_norm_ = vec("output_norm.weight", E);
    if (m->fold_ && m->fold_->inverse.count("token_embd.weight")) m->embd_rot_ = rotation("token_embd.weight", E, true, false);
    if (f.tensor("output.weight")) {
        m->output_ = mat("output", E, hp.n_vocab);
    } else {
        m->output_ = m->embd_;  // tied
        // Rows stored as e' with e = s ⊙ (H·e'): e·x = e'·(H·(s ⊙ x)), the forward rotation.
        if (m->embd_rot_) m->output_.rot = rotation("token_embd.weight", E, false, false);
    }
    const int64_t H = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim, K = hp.conv_kernel;
    // The norms, FFN and (for attention layers) attention tensors of block `p` ("blk.N.").
    auto common = [&](Layer& L, const std::string& p) {
        L.attn_norm = vec(p + "attn_norm.weight", E);
        L.post_norm = vec(p + "post_attention_norm.weight", E);
        L.ffn_gate = mat(p + "ffn_gate", E, hp.n_ff);
        L.ffn_up = mat(p + "ffn_up", E, hp.n_ff);
        L.ffn_down = mat(p + "ffn_down", hp.n_ff, E);
        if (L.recurrent) return;
        L.q = mat(p + "attn_q", E, 2 * H * D);
        L.k = mat(p + "attn_k", E, Hkv * D);
        L.v = mat(p + "attn_v", E, Hkv * D);
        L.o = mat(p + "attn_output", H * D, E);
        L.q_norm = vec(p + "attn_q_norm.weight", D);
        L.k_norm = vec(p + "attn_k_norm.weight", D);
    };
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        Layer L;
        L.recurrent = hp.recurrent[static_cast<size_t>(il)];
        common(L, p);
        if (L.recurrent) {
            L.qkv = mat(p + "attn_qkv", E, hp.conv_dim());
            L.gate = mat(p + "attn_gate", E, hp.value_dim());
            L.beta = mat(p + "ssm_beta", E, hp.ssm_heads);
            L.alpha = mat(p + "ssm_alpha", E, hp.ssm_heads);
            L.out = mat(p + "ssm_out", hp.value_dim(), E, true);
            const TensorInfo& conv = f.get_tensor(p + "ssm_conv1d.weight");
            shape(conv, {static_cast<uint64_t>(K), static_cast<uint64_t>(hp.conv_dim())});
            std::vector<float> cv(static_cast<size_t>(K * hp.conv_dim()));
            dequantize_row(conv.type, conv.data, cv.data(), K * hp.conv_dim());
            L.conv = dev.upload(cv);
            L.dt_bias = vec(p + "ssm_dt.bias", hp.ssm_heads);
            L.ssm_a = vec(p + "ssm_a", hp.ssm_heads);
            L.ssm_norm = vec(p + "ssm_norm.weight", hp.ssm_state);
        }
        m->layers_.push_back(std::move(L));
    }
    // The MTP block: layer n_layer, a full-attention layer plus the nextn tensors. llama.cpp runs
    // one for qwen35; a file with more gets its first (the others are not bound).
    hp.n_nextn = static_cast<int64_t>(nextn);
    if (nextn) {
        const std::string p = "blk." + std::to_string(hp.n_layer) + ".";
        try {
            MtpBlock b;
            common(b.block, p);
            b.eh_proj = mat(p + "nextn.eh_proj", 2 * E, E);
            b.enorm = vec(p + "nextn.enorm.weight", E);
            b.hnorm = vec(p + "nextn.hnorm.weight", E);
            if (f.tensor(p + "nextn.shared_head_norm.weight")) b.head_norm = vec(p + "nextn.shared_head_norm.weight", E);
            b.head = f.tensor(p + "nextn.shared_head_head.weight") ? mat(p + "nextn.shared_head_head", E, hp.n_vocab) : m->output_;
            b.embd = m->embd_;
            b.embd_rot = m->embd_rot_;
            if (const TensorInfo* t = f.tensor(p + "nextn.embed_tokens.weight")) {
                shape(*t, {static_cast<uint64_t>(E), static_cast<uint64_t>(hp.n_vocab)});
                b.embd = Matrix{t, E, hp.n_vocab, 1, nullptr, nullptr};
                b.embd_rot = m->fold_ && m->fold_->inverse.count(t->name) ? rotation(t->name, E, true, false) : nullptr;
            }
            m->mtp_ = std::move(b);
        } catch (const GgufError& e) {
            throw GgufError(std::string(e.what()) + " (in the multi-token-prediction block, " + p + "*, that " + arch +
                            ".nextn_predict_layers = " + std::to_string(nextn) + " announces)");
        }
    }
    if (m->fold_)
        for (const auto& name : m->fold_->folded)
            if (!folded_bound.count(name))
                bad("metadata prism.hadamard.weight_names lists '" + name + "', which is not a weight this model multiplies" +
                    (f.tensor(name) ? "" : " (no such tensor)"));
    // Every weight registered with the device once; a tied output (the embedding table used as
    // the head) once for both uses, one copy.
    const bool tied = m->output_.t == m->embd_.t;
    std::vector<Matrix*> weights{&m->embd_}, tables{&m->embd_};
    if (!tied) weights.push_back(&m->output_);
    auto layer_weights = [&](Layer& L) {
        for (Matrix* w : {&L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.q, &L.k, &L.v, &L.o, &L.qkv, &L.gate, &L.beta, &L.alpha, &L.out})
            if (w->t) weights.push_back(w);
    };
    for (auto& L : m->layers_) layer_weights(L);
    if (m->mtp_) {
        layer_weights(m->mtp_->block);
        weights.push_back(&m->mtp_->eh_proj);
        // The shared embedding and head are registered once, as the main model's.
        if (m->mtp_->head.t != m->output_.t) weights.push_back(&m->mtp_->head);
        if (m->mtp_->embd.t != m->embd_.t) weights.push_back(&m->mtp_->embd), tables.push_back(&m->mtp_->embd);
    }
    for (Matrix* w : weights)
        w->prepared = dev.prepare(*w, tied && w == &m->embd_                            ? Device::Use::both
                                      : std::count(tables.begin(), tables.end(), w) ? Device::Use::embedding
                                                                                    : Device::Use::matmul);
    if (tied) m->output_.prepared = m->embd_.prepared;
    if (m->mtp_) {
        if (m->mtp_->head.t == m->output_.t) m->mtp_->head.prepared = m->output_.prepared;
        if (m->mtp_->embd.t == m->embd_.t) m->mtp_->embd.prepared = m->embd_.prepared;
    }
    if (dev.copies_weights())  // the device holds them now: the mapped pages may go
        for (Matrix* w : weights) f.release_pages(w->t->data, w->t->nbytes);
    return m;
}

std::unique_ptr<Sequence> Model::new_sequence() const {
    auto s = std::make_unique<Sequence>(dev_.get());
    s->kv_values = hp_.n_head_kv * hp_.head_dim;
    for (const auto& L : layers_) {
        if (L.recurrent) {
            s->conv.push_back(dev_->alloc(static_cast<size_t>((hp_.conv_kernel - 1) * hp_.conv_dim())));
            s->state.push_back(dev_->alloc(static_cast<size_t>(hp_.ssm_heads * hp_.ssm_state * hp_.ssm_state)));
        } else {
            s->kv.emplace_back();
        }
    }
    return s;
}

Sequence& Sequence::operator=(const Sequence& o) {
    if (this == &o) return *this;
    if (o.tentative.rows) throw std::logic_error("a sequence is copied with a tentative step not yet settled (Model::keep_tentative)");
    dev_ = o.dev_;
    n_past = o.n_past;
    mtp_n_past = o.mtp_n_past;
    kv_values = o.kv_values;
    auto clone = [&](const Buffer& b, size_t used) {
        Buffer c = dev_->alloc(b.size());
        if (used) dev_->copy(b.ptr(), c.ptr(), used);
        return c;
    };
    // A checkpoint holds what is cached, not the spare capacity.
    auto clone_cache = [&](const KvCache& c, int64_t used) {
        KvCache n;
        n.capacity = used;
        if (used) {
            const auto values = static_cast<size_t>(used * kv_values);
            n.k = HalfBuffer(*dev_, values);
            n.v = HalfBuffer(*dev_, values);
            c.k.copy_to(n.k, values);
            c.v.copy_to(n.v, values);
        }
        return n;
    };
    kv.clear();
    for (const auto& c : o.kv) kv.push_back(clone_cache(c, n_past));
    mtp = clone_cache(o.mtp, mtp_n_past);
    conv.clear();
    state.clear();
    for (const auto& b : o.conv) conv.push_back(clone(b, b.size()));
    for (const auto& b : o.state) state.push_back(clone(b, b.size()));
    return *this;
}

void Sequence::grow(KvCache& c, int64_t positions, int64_t used) {
    if (c.capacity >= positions) return;
    const int64_t cap = std::max<int64_t>({positions, 2 * c.capacity, 64});
    for (HalfBuffer* b : {&c.k, &c.v}) {
        HalfBuffer grown(*dev_, static_cast<size_t>(cap * kv_values));
        b->copy_to(grown, static_cast<size_t>(used * kv_values));
        *b = std::move(grown);
    }
    c.capacity = cap;
}

void Sequence::save_recurrent(RecurrentCheckpoint& to) const {
    auto save = [&](const std::vector<Buffer>& from, std::vector<Buffer>& into) {
        if (into.size() != from.size()) {
            into.clear();
            for (const auto& b : from) into.push_back(dev_->alloc(b.size()));
        }
        for (size_t i = 0; i < from.size(); ++i) dev_->copy(from[i].ptr(), into[i].ptr(), from[i].size());
    };
    save(conv, to.conv);
    save(state, to.state);
}

void Sequence::restore_recurrent(const RecurrentCheckpoint& from) {
    if (from.conv.size() != conv.size() || from.state.size() != state.size())
        throw std::logic_error("a recurrent checkpoint of another model's sequence");
    for (size_t i = 0; i < conv.size(); ++i) dev_->copy(from.conv[i].ptr(), conv[i].ptr(), conv[i].size());
    for (size_t i = 0; i < state.size(); ++i) dev_->copy(from.state[i].ptr(), state[i].ptr(), state[i].size());
}

void Sequence::reserve(int64_t positions) {
    for (auto& c : kv) grow(c, positions, n_past);
}

void Sequence::reserve_mtp(int64_t positions) { grow(mtp, positions, mtp_n_past); }

size_t Sequence::bytes() const {
    size_t n = 0;
    for (const auto* group : {&conv, &state, &tentative.conv, &tentative.state, &tentative.qkv, &tentative.beta, &tentative.alpha})
        for (const auto& b : *group) n += b.size();
    n += tentative.gate.size() + tentative.out.size();
    const size_t kv_slots = 2 * (kv.size() * HalfBuffer::slots(static_cast<size_t>(n_past * kv_values)) +
                                 HalfBuffer::slots(static_cast<size_t>(mtp_n_past * kv_values)));
    return (n + kv_slots) * sizeof(float);
}

// One step's device buffers, for up to `rows` rows and `out_rows` rows of logits.
struct Model::Work {
    Buffer x, h, tmp, g, u, qg, k, v, o, qkv, z, beta, alpha, rot, logits;
    Buffer cat;  // the MTP block's [2E] input rows (models with one)
    int64_t rows = 0, out_rows = 0;
};

size_t Model::work_bytes() const {
    std::lock_guard lock(work_mu_);
    if (!work_) return 0;
    size_t n = 0;
    for (const Buffer* b : {&work_->x, &work_->h, &work_->tmp, &work_->g, &work_->u, &work_->qg, &work_->k, &work_->v, &work_->o, &work_->qkv,
                            &work_->z, &work_->beta, &work_->alpha, &work_->rot, &work_->logits, &work_->cat})
        n += b->size();
    return n * sizeof(float);
}

std::vector<float> Model::forward(Sequence& seq, const std::vector<int32_t>& tokens, bool all_logits) const {
    const size_t V = static_cast<size_t>(hp_.n_vocab);
    std::vector<float> logits(V * (all_logits ? tokens.size() : 1));
    // Steps of up to kMaxStepRows tokens: every weight row is read once per step (prefill), and
    // the recurrent and attention state still advance token by token inside it.
    const size_t chunk = static_cast<size_t>(kMaxStepRows);
    for (size_t i = 0; i < tokens.size(); i += chunk) {
        const size_t n = std::min(chunk, tokens.size() - i);
        const bool last = i + n == tokens.size();
        float* out = all_logits ? logits.data() + i * V : (last ? logits.data() : nullptr);
        step({Segment{&seq, tokens.data() + i, static_cast<int64_t>(n), out, all_logits}});
    }
    return logits;
}

std::pair<int64_t, int64_t> Model::check(const std::vector<Segment>& segs) const {
    int64_t B = 0, out_rows = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
        const Segment& s = segs[i];
        if (!s.seq || s.n <= 0 || !s.tokens) throw std::invalid_argument("a step segment needs a sequence and at least one token");
        for (size_t j = 0; j < i; ++j)
            if (segs[j].seq == s.seq) throw std::invalid_argument("a sequence may take part in a step once");
        for (int64_t t = 0; t < s.n; ++t)
            if (s.tokens[t] < 0 || s.tokens[t] >= hp_.n_vocab)
                throw std::out_of_range("token id " + std::to_string(s.tokens[t]) + " is outside the vocabulary (" + std::to_string(hp_.n_vocab) + ")");
        B += s.n;
        if (s.logits) out_rows += s.all_logits ? s.n : 1;
    }
    if (B > kMaxStepRows) throw std::invalid_argument("a step takes at most " + std::to_string(kMaxStepRows) + " rows, not " + std::to_string(B));
    return {B, out_rows};
}

Model::Work& Model::work(int64_t B, int64_t out_rows, std::unique_lock<std::mutex>& reuse, std::unique_ptr<Work>& own) const {
    const int64_t E = hp_.n_embd, F = hp_.n_ff, H = hp_.n_head, Hkv = hp_.n_head_kv, D = hp_.head_dim;
    const int64_t C = hp_.conv_dim(), VD = hp_.value_dim(), Hv = hp_.ssm_heads, V = hp_.n_vocab;
    reuse = std::unique_lock(work_mu_, std::try_to_lock);
    if (!reuse.owns_lock() || !work_) (reuse.owns_lock() ? work_ : own) = std::make_unique<Work>();
    Work& w = reuse.owns_lock() ? *work_ : *own;
    if (w.rows < B) {  // grown by doubling up to a full step; a step writes every row it reads
        const int64_t R = std::max(B, std::min<int64_t>(2 * w.rows, kMaxStepRows));
        auto buf = [&](int64_t per_token) { return dev_->alloc(static_cast<size_t>(R * per_token)); };
        w.x = buf(E), w.h = buf(E), w.tmp = buf(E), w.g = buf(F), w.u = buf(F);
        w.qg = buf(2 * H * D), w.k = buf(Hkv * D), w.v = buf(Hkv * D), w.o = buf(std::max(H * D, VD));
        w.qkv = buf(C), w.z = buf(VD), w.beta = buf(Hv), w.alpha = buf(Hv);
        if (!rotations_.empty()) w.rot = buf(std::max({E, F, VD, H * D, mtp_ ? 2 * E : 0}));
        if (mtp_) w.cat = buf(2 * E);
        w.rows = R;
    }
    if (w.out_rows < out_rows) {
        w.logits = dev_->alloc(static_cast<size_t>(out_rows * V));
        w.out_rows = out_rows;
    }
    return w;
}

void Model::embed(const Matrix& table, const Rotation* rot, const std::vector<int32_t>& tokens, Work& w, DevPtr out) const {
    const auto B = static_cast<int64_t>(tokens.size());
    if (!rot) return dev_->embed(table, tokens.data(), B, out);
    dev_->embed(table, tokens.data(), B, w.tmp.ptr());
    dev_->rotate(*rot, w.tmp.ptr(), out, B);
}

void Model::step(const std::vector<Segment>& segs) const {
    const auto [B, out_rows] = check(segs);
    for (const auto& s : segs)
        if (s.seq->tentative.rows)
            throw std::logic_error("a sequence's tentative step of " + std::to_string(s.seq->tentative.rows) +
                                   " rows is not settled (Model::keep_tentative) before its next step");
    if (B == 0) return;
    std::unique_lock<std::mutex> reuse;
    std::unique_ptr<Work> own;
    Work& w = work(B, out_rows, reuse, own);
    std::vector<int32_t> tokens;
    tokens.reserve(static_cast<size_t>(B));
    for (const auto& s : segs) {
        s.seq->reserve(s.seq->n_past + s.n);
        if (s.tentative) prepare_tentative(*s.seq, s.n);
        tokens.insert(tokens.end(), s.tokens, s.tokens + s.n);
    }
    embed(embd_, embd_rot_, tokens, w, w.x.ptr());
    size_t ai = 0, gi = 0;
    for (const auto& L : layers_) layer(L, segs, L.recurrent ? gi++ : ai++, w, B);
    for (const auto& s : segs) {
        s.seq->n_past += s.n;
        if (s.tentative) s.seq->tentative.rows = s.n;
    }
    finish(segs, output_norm_.ptr(), output_, w, B, out_rows);
}

void Model::mtp_step(const std::vector<Segment>& segs) const {
    if (!mtp_) throw std::logic_error("this model has no MTP block (" + file_->name() + ": no nextn_predict_layers)");
    const auto [B, out_rows] = check(segs);
    for (const auto& s : segs)
        if (!s.hidden_in) throw std::invalid_argument("an MTP step segment needs the hidden state paired with each token (hidden_in)");
    if (B == 0) return;
    const MtpBlock& m = *mtp_;
    const int64_t E = hp_.n_embd;
    std::unique_lock<std::mutex> reuse;
    std::unique_ptr<Work> own;
    Work& w = work(B, out_rows, reuse, own);
    std::vector<int32_t> tokens;
    tokens.reserve(static_cast<size_t>(B));
    int64_t r0 = 0;
    for (const auto& s : segs) {
        s.seq->reserve_mtp(s.seq->mtp_n_past + s.n);
        tokens.insert(tokens.end(), s.tokens, s.tokens + s.n);
        dev_->upload(s.hidden_in, w.h.ptr() + r0 * E, static_cast<size_t>(s.n * E));
        r0 += s.n;
    }
    // Each row: concat(RMSNorm(embedding, enorm), RMSNorm(hidden, hnorm)) -> eh_proj, the
    // block's input (and first residual).
    const DevPtr x = w.x.ptr(), h = w.h.ptr(), tmp = w.tmp.ptr(), cat = w.cat.ptr();
    embed(m.embd, m.embd_rot, tokens, w, x);
    dev_->rmsnorm(x, m.enorm.ptr(), tmp, B, E, hp_.rms_eps);
    dev_->rmsnorm(h, m.hnorm.ptr(), x, B, E, hp_.rms_eps);
    for (int64_t r = 0; r < B; ++r) {
        dev_->copy(tmp + r * E, cat + r * 2 * E, static_cast<size_t>(E));
        dev_->copy(x + r * E, cat + r * 2 * E + E, static_cast<size_t>(E));
    }
    matmul(m.eh_proj, cat, B, x, w);
    layer(m.block, segs, kMtpCache, w, B);
    for (const auto& s : segs) s.seq->mtp_n_past += s.n;
    finish(segs, (m.head_norm.size() ? m.head_norm : output_norm_).ptr(), m.vocab.empty() ? m.head : m.draft_head, w, B, out_rows);
}

void Model::set_draft_vocab(const std::vector<int32_t>& ids) {
    if (!mtp_) throw std::logic_error("a draft vocabulary needs the model's MTP block (" + file_->name() + " has none)");
    MtpBlock& m = *mtp_;
    // Once: devices key what they prepared by the tensor's address, which a second list could reuse.
    if (!m.vocab.empty()) throw std::logic_error("the draft vocabulary is set once, before the model runs");
    if (ids.empty()) throw std::invalid_argument("draft vocabulary: no token listed");
    std::vector<bool> seen(static_cast<size_t>(hp_.n_vocab));
    for (const int32_t id : ids) {
        if (id < 0 || id >= hp_.n_vocab)
            throw std::invalid_argument("draft vocabulary: token " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(hp_.n_vocab - 1) + ")");
        if (seen[static_cast<size_t>(id)]) throw std::invalid_argument("draft vocabulary: token " + std::to_string(id) + " is listed twice");
        seen[static_cast<size_t>(id)] = true;
    }
    // A head row is n_embd values, whole quantization blocks: the rows gather as bytes.
    const TensorInfo& full = *m.head.t;
    const uint64_t row = full.row_bytes();
    std::vector<uint8_t> rows(row * ids.size());
    for (size_t i = 0; i < ids.size(); ++i) std::memcpy(rows.data() + i * row, full.data + static_cast<uint64_t>(ids[i]) * row, row);
    auto info = std::make_unique<TensorInfo>(full);
    info->ne = {full.ne[0], ids.size()};
    info->nbytes = rows.size();
    info->data = rows.data();
    Matrix head{info.get(), m.head.n_in, static_cast<int64_t>(ids.size()), m.head.scale, m.head.rot, nullptr};
    head.prepared = dev_->prepare(head, Device::Use::matmul);
    if (dev_->copies_weights()) {  // the device holds them now (a CPU may read rows in place)
        rows = {};
        info->data = nullptr;
    }
    m.vocab = ids, m.draft_head = head, m.draft_rows = std::move(rows), m.draft_info = std::move(info);
}

void Model::layer(const Layer& L, const std::vector<Segment>& segs, size_t index, Work& w, int64_t B) const {
    const int64_t E = hp_.n_embd, F = hp_.n_ff;
    const DevPtr x = w.x.ptr(), h = w.h.ptr(), tmp = w.tmp.ptr();
    dev_->rmsnorm(x, L.attn_norm.ptr(), h, B, E, hp_.rms_eps);
    if (L.recurrent) deltanet(L, segs, index, w, h, tmp, B);
    else attention(L, segs, index, w, h, tmp, B);
    dev_->add(x, tmp, B * E);
    dev_->rmsnorm(x, L.post_norm.ptr(), h, B, E, hp_.rms_eps);
    matmuls({{&L.ffn_gate, w.g.ptr()}, {&L.ffn_up, w.u.ptr()}}, h, B, w);
    dev_->swiglu(w.g.ptr(), w.u.ptr(), B * F);
    matmul(L.ffn_down, w.g.ptr(), B, tmp, w);
    dev_->add(x, tmp, B * E);
}

void Model::finish(const std::vector<Segment>& segs, DevPtr norm, const Matrix& head, Work& w, int64_t B, int64_t out_rows) const {
    const int64_t E = hp_.n_embd, V = head.n_out;
    const DevPtr x = w.x.ptr(), h = w.h.ptr(), tmp = w.tmp.ptr();
    if (std::any_of(segs.begin(), segs.end(), [](const Segment& s) { return s.hidden; })) {
        dev_->rmsnorm(x, norm, tmp, B, E, hp_.rms_eps);
        int64_t r0 = 0;
        for (const auto& s : segs) {
            if (s.hidden) dev_->download(tmp + r0 * E, s.hidden, static_cast<size_t>(s.n * E));
            r0 += s.n;
        }
    }
    if (!out_rows) return;
    // The rows that give logits, gathered into h: one output matmul for all of them.
    int64_t r0 = 0, j = 0;
    for (const auto& s : segs) {
        if (s.logits) {
            const int64_t first = s.all_logits ? r0 : r0 + s.n - 1, rows = s.all_logits ? s.n : 1;
            dev_->rmsnorm(x + first * E, norm, h + j * E, rows, E, hp_.rms_eps);
            j += rows;
        }
        r0 += s.n;
    }
    matmul(head, h, out_rows, w.logits.ptr(), w);
    j = 0;
    for (const auto& s : segs) {
        if (!s.logits) continue;
        const int64_t rows = s.all_logits ? s.n : 1;
        dev_->download(w.logits.ptr() + j * V, s.logits, static_cast<size_t>(rows * V));
        j += rows;
    }
}

void Model::matmuls(std::initializer_list<Product> products, DevPtr x, int64_t B, Work& w) const {
    if (products.size() > kMaxProducts) throw std::logic_error("Model::matmuls takes at most " + std::to_string(kMaxProducts) + " products");
    const Matrix* ms[kMaxProducts];
    DevPtr ys[kMaxProducts];
    size_t n = 0;
    const Rotation* rot = products.begin()->m->rot;
    for (const Product& p : products) {
        if (p.m->rot != rot) {  // rotations of their own: each rotates x into w.rot in turn
            for (const Product& q : products) matmuls({q}, x, B, w);
            return;
        }
        ms[n] = p.m, ys[n] = p.y, ++n;
    }
    if (rot) {
        dev_->rotate(*rot, x, w.rot.ptr(), B);
        x = w.rot.ptr();
    }
    if (n == 1) dev_->matmul(*ms[0], x, B, ys[0], !exact);
    else dev_->matmuls(ms, ys, n, x, B, !exact);
}

void Model::attention(const Layer& L, const std::vector<Segment>& segs, size_t ai, Work& w, DevPtr h, DevPtr out, int64_t B) const {
    const int64_t H = hp_.n_head, Hkv = hp_.n_head_kv, D = hp_.head_dim;
    matmuls({{&L.q, w.qg.ptr()}, {&L.k, w.k.ptr()}, {&L.v, w.v.ptr()}}, h, B, w);
    const double scale = hp_.attn_scale > 0 ? hp_.attn_scale : 1.0 / std::sqrt(static_cast<double>(D));
    std::vector<AttentionOp> ops;
    int64_t r0 = 0;
    for (const auto& s : segs) {
        Sequence& seq = *s.seq;
        const Sequence::KvCache& cache = ai == kMtpCache ? seq.mtp : seq.kv[ai];
        const int64_t pos0 = ai == kMtpCache ? seq.mtp_n_past : seq.n_past;
        ops.push_back(AttentionOp{w.qg.ptr() + r0 * 2 * H * D, w.k.ptr() + r0 * Hkv * D, w.v.ptr() + r0 * Hkv * D, s.n, pos0, H, Hkv, D,
                                  hp_.rope_dim, hp_.rope_base, hp_.rms_eps, scale, L.q_norm.ptr(), L.k_norm.ptr(), cache.k.ptr(),
                                  cache.v.ptr(), w.o.ptr() + r0 * H * D});
        r0 += s.n;
    }
    dev_->attention(ops.data(), ops.size());
    matmul(L.o, w.o.ptr(), B, out, w);
}

void Model::deltanet(const Layer& L, const std::vector<Segment>& segs, size_t gi, Work& w, DevPtr h, DevPtr out, int64_t B) const {
    const int64_t C = hp_.conv_dim(), Hv = hp_.ssm_heads, VD = hp_.value_dim();
    matmuls({{&L.qkv, w.qkv.ptr()}, {&L.gate, w.z.ptr()}, {&L.beta, w.beta.ptr()}, {&L.alpha, w.alpha.ptr()}}, h, B, w);
    std::vector<DeltaNetOp> ops;
    int64_t r0 = 0;
    for (const auto& s : segs) {
        Sequence& seq = *s.seq;
        // A tentative segment reads the states before the step and writes the step's beside them.
        Sequence::TentativeStep& t = seq.tentative;
        DeltaNetOp op{w.qkv.ptr() + r0 * C, w.z.ptr() + r0 * VD, w.beta.ptr() + r0 * Hv, w.alpha.ptr() + r0 * Hv, s.n, hp_.conv_kernel, C,
                      hp_.ssm_state, hp_.ssm_groups, Hv, hp_.rms_eps, L.conv.ptr(), L.dt_bias.ptr(), L.ssm_a.ptr(), L.ssm_norm.ptr(),
                      (s.tentative ? t.conv : seq.conv)[gi].ptr(), (s.tentative ? t.state : seq.state)[gi].ptr(), w.o.ptr() + r0 * VD};
        if (s.tentative) op.conv_state_in = seq.conv[gi].ptr(), op.state_in = seq.state[gi].ptr();
        ops.push_back(op);
        r0 += s.n;
    }
    keep_tentative_inputs(segs, gi, w);  // before the op: it may work in place on them
    dev_->deltanet(ops.data(), ops.size());
    matmul(L.out, w.o.ptr(), B, out, w);
}

void Model::prepare_tentative(Sequence& seq, int64_t rows) const {
    auto& t = seq.tentative;
    const int64_t C = hp_.conv_dim(), Hv = hp_.ssm_heads;
    if (t.conv.size() != seq.conv.size())
        for (size_t i = 0; i < seq.conv.size(); ++i) {
            t.conv.push_back(dev_->alloc(seq.conv[i].size()));
            t.state.push_back(dev_->alloc(seq.state[i].size()));
        }
    if (t.capacity < rows || t.qkv.size() != seq.conv.size()) {
        t.qkv.clear(), t.beta.clear(), t.alpha.clear();
        for (size_t i = 0; i < seq.conv.size(); ++i) {
            t.qkv.push_back(dev_->alloc(static_cast<size_t>(rows * C)));
            t.beta.push_back(dev_->alloc(static_cast<size_t>(rows * Hv)));
            t.alpha.push_back(dev_->alloc(static_cast<size_t>(rows * Hv)));
        }
        t.gate = dev_->alloc(static_cast<size_t>(rows * hp_.value_dim()));
        t.out = dev_->alloc(static_cast<size_t>(rows * hp_.value_dim()));
        t.capacity = rows;
    }
}

void Model::keep_tentative_inputs(const std::vector<Segment>& segs, size_t gi, Work& w) const {
    const int64_t C = hp_.conv_dim(), Hv = hp_.ssm_heads;
    int64_t r0 = 0;
    for (const auto& s : segs) {
        if (s.tentative) {
            auto& t = s.seq->tentative;
            dev_->copy(w.qkv.ptr() + r0 * C, t.qkv[gi].ptr(), static_cast<size_t>(s.n * C));
            dev_->copy(w.beta.ptr() + r0 * Hv, t.beta[gi].ptr(), static_cast<size_t>(s.n * Hv));
            dev_->copy(w.alpha.ptr() + r0 * Hv, t.alpha[gi].ptr(), static_cast<size_t>(s.n * Hv));
        }
        r0 += s.n;
    }
}

void Model::keep_tentative(Sequence& seq, int64_t n) const {
    auto& t = seq.tentative;
    if (!t.rows) throw std::logic_error("keep_tentative: the sequence has no tentative step to settle");
    if (n < 1 || n > t.rows) throw std::logic_error("keep_tentative: its tentative step ran " + std::to_string(t.rows) + " rows, not " + std::to_string(n));
    if (n == t.rows) {  // every row stands: the step's windows and states are the sequence's
        seq.conv.swap(t.conv);
        seq.state.swap(t.state);
        t.rows = 0;
        return;
    }
    const int64_t C = hp_.conv_dim(), Hv = hp_.ssm_heads;
    // From the states before the step, in place, over the kept rows. The outputs are not wanted:
    // they go to the scratch rows (whatever the gate rows hold, the states do not read them).
    // One call per layer: the ops of one call share its weights (device.h).
    size_t gi = 0;
    for (const Layer& L : layers_) {
        if (!L.recurrent) continue;
        const DeltaNetOp op{t.qkv[gi].ptr(), t.gate.ptr(), t.beta[gi].ptr(), t.alpha[gi].ptr(), n, hp_.conv_kernel, C, hp_.ssm_state, hp_.ssm_groups, Hv,
                            hp_.rms_eps, L.conv.ptr(), L.dt_bias.ptr(), L.ssm_a.ptr(), L.ssm_norm.ptr(), seq.conv[gi].ptr(), seq.state[gi].ptr(), t.out.ptr()};
        dev_->deltanet(&op, 1);
        ++gi;
    }
    seq.n_past -= t.rows - n;
    t.rows = 0;
}

}  // namespace pulse::decoder
