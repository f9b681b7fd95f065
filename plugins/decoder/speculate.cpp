#include "speculate.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pulse::decoder {

namespace {
int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }
}  // namespace

std::vector<int32_t> accept_drafts(const float* logits, int64_t V, const std::vector<int32_t>& drafts, Sampler& sampler) {
    std::vector<int32_t> out;
    for (size_t i = 0; i <= drafts.size(); ++i) {
        const float* row = logits + static_cast<int64_t>(i) * V;
        if (sampler.greedy()) {
            out.push_back(argmax(row, V));
            if (i == drafts.size() || out.back() != drafts[i]) return out;
            continue;
        }
        Sampler::Distribution p = sampler.distribution(row, V);
        if (i == drafts.size()) {
            out.push_back(sampler.draw(p));
            return out;
        }
        if (sampler.uniform() < p.probability(drafts[i])) {
            out.push_back(drafts[i]);
            continue;
        }
        // Rejected: the residual max(0, p - q) with q all on the draft is p without it.
        for (size_t j = 0; j < p.ids.size(); ++j)
            if (p.ids[j] == drafts[i]) p.total -= p.weight[j], p.weight[j] = 0;
        out.push_back(sampler.draw(p));
        return out;
    }
    return out;
}

int drafts_worth(const std::vector<double>& kept_after, int k_max, double worth) {
    double all_kept = 1;
    int k = 0;
    while (k < k_max && k < static_cast<int>(kept_after.size())) {
        all_kept *= kept_after[static_cast<size_t>(k)];
        if (all_kept < worth) break;
        ++k;
    }
    return k;
}

namespace {
// Adaptive k: the running rates follow about the last 8 observations and start at 0.7 (three
// drafts at first: 0.7^3 >= 0.3); a step in 16 probes one draft when none is worth it.
constexpr double kRateWeight = 1.0 / 8, kFirstRate = 0.7;
constexpr int64_t kProbeEvery = 16;
}  // namespace

Speculator::Speculator(const Model& model, Sequence& seq, int k, SamplerParams sampling, bool adaptive)
    : model_(model), seq_(seq), k_(k), adaptive_(adaptive), kept_after_(static_cast<size_t>(k), kFirstRate), E_(model.hparams().n_embd),
      V_(model.hparams().n_vocab), sampler_(sampling) {
    if (k < 1 || k > kMaxDraft) throw std::invalid_argument("drafts per step must be 1 to " + std::to_string(kMaxDraft) + ", not " + std::to_string(k));
    if (seq.n_past || seq.mtp_n_past) throw std::invalid_argument("a speculator starts on a fresh sequence");
    pending_.assign(static_cast<size_t>(E_), 0.f);
    stats_.drafted_at.assign(kMaxDraft, 0);
    stats_.accepted_at.assign(kMaxDraft, 0);
}

void Speculator::run(const std::vector<int32_t>& tokens, std::vector<float>* logits) {
    const auto n = static_cast<int64_t>(tokens.size());
    hidden_.resize(static_cast<size_t>(n * E_));
    if (logits) logits->resize(static_cast<size_t>(n * V_));
    model_.step({Segment{&seq_, tokens.data(), n, logits ? logits->data() : nullptr, true, hidden_.data()}});
    if (model_.has_mtp()) catch_up(tokens);
    std::copy(hidden_.end() - E_, hidden_.end(), pending_.begin());
}

void Speculator::catch_up(const std::vector<int32_t>& tokens) {
    // Token p with the main hidden state of p-1: the carried row, then this step's rows shifted.
    const auto n = static_cast<int64_t>(tokens.size());
    std::vector<float> paired(static_cast<size_t>(n * E_));
    std::copy(pending_.begin(), pending_.end(), paired.begin());
    std::copy(hidden_.begin(), hidden_.end() - E_, paired.begin() + E_);
    model_.mtp_step({Segment{&seq_, tokens.data(), n, nullptr, false, nullptr, paired.data()}});
}

std::vector<float> Speculator::prefill(const std::vector<int32_t>& prompt) {
    if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
    std::vector<float> rows;
    for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(Model::kMaxStepRows)) {
        const size_t n = std::min(prompt.size() - i, static_cast<size_t>(Model::kMaxStepRows));
        run(std::vector<int32_t>(prompt.begin() + static_cast<long>(i), prompt.begin() + static_cast<long>(i + n)), &rows);
    }
    return std::vector<float>(rows.end() - V_, rows.end());
}

std::vector<int32_t> Speculator::draft(int32_t last, int k) {
    if (!model_.has_mtp()) throw std::logic_error("drafting needs the model's MTP block");
    if (seq_.mtp_n_past != seq_.n_past) throw std::logic_error("the MTP block's cache is not at the main model's position");
    std::vector<int32_t> out;
    std::vector<float> h = pending_, next_h(static_cast<size_t>(E_)), logits(static_cast<size_t>(V_));
    int32_t tok = last;
    for (int i = 0; i < k; ++i) {
        model_.mtp_step({Segment{&seq_, &tok, 1, logits.data(), false, next_h.data(), h.data()}});
        tok = argmax(logits.data(), V_);
        out.push_back(tok);
        h.swap(next_h);
    }
    seq_.mtp_n_past = seq_.n_past;  // the drafts' cache entries are dropped; catch_up rewrites them
    return out;
}

std::vector<int32_t> Speculator::verify(int32_t last, const std::vector<int32_t>& drafts) {
    const auto k = static_cast<int64_t>(drafts.size());
    if (k > kMaxDraft) throw std::invalid_argument("at most " + std::to_string(kMaxDraft) + " drafts per step");
    std::vector<int32_t> rows{last};
    rows.insert(rows.end(), drafts.begin(), drafts.end());
    const int64_t base = seq_.n_past;
    if (k) seq_.save_recurrent(checkpoint_);
    std::vector<float> all;
    // The main step alone: the MTP block catches up below, on the accepted rows only.
    hidden_.resize(static_cast<size_t>((k + 1) * E_));
    all.resize(static_cast<size_t>((k + 1) * V_));
    model_.step({Segment{&seq_, rows.data(), k + 1, all.data(), true, hidden_.data()}});
    const std::vector<int32_t> out = accept_drafts(all.data(), V_, drafts, sampler_);
    const auto m = static_cast<int64_t>(out.size()) - 1;
    logits_.assign(all.begin(), all.begin() + (m + 1) * V_);
    rows.resize(static_cast<size_t>(m + 1));
    if (m < k) {  // rejected drafts ran through the recurrent layers: undo, run the kept rows again
        seq_.restore_recurrent(checkpoint_);
        seq_.n_past = base;
        model_.step({Segment{&seq_, rows.data(), m + 1, nullptr, false, hidden_.data()}});
        stats_.recomputed_rows += m + 1;
    }
    hidden_.resize(static_cast<size_t>((m + 1) * E_));
    if (model_.has_mtp()) catch_up(rows);
    std::copy(hidden_.end() - E_, hidden_.end(), pending_.begin());
    ++stats_.steps;
    stats_.drafted += k;
    stats_.accepted += m;
    stats_.tokens += m + 1;
    if (!k) ++stats_.plain_steps;
    for (int64_t i = 0; i < k; ++i) {
        ++stats_.drafted_at[static_cast<size_t>(i)];
        if (i < m) ++stats_.accepted_at[static_cast<size_t>(i)];
        // Draft i was judged (kept or not) when all before it were kept.
        if (i <= m && i < static_cast<int64_t>(kept_after_.size())) {
            double& rate = kept_after_[static_cast<size_t>(i)];
            rate += kRateWeight * ((i < m ? 1.0 : 0.0) - rate);
        }
    }
    return out;
}

int Speculator::next_k() const {
    if (!adaptive_) return k_;
    const int k = drafts_worth(kept_after_, k_);
    // Not worth it: a plain step, but one draft now and then, to see whether it has become so.
    return k ? k : (stats_.steps % kProbeEvery == kProbeEvery - 1 ? 1 : 0);
}

std::vector<int32_t> Speculator::step(int32_t last) {
    const int k = next_k();
    return verify(last, k ? draft(last, k) : std::vector<int32_t>{});
}

}  // namespace pulse::decoder
