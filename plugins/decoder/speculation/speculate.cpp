#include "speculation/speculate.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace pulse::decoder {

namespace {
int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }
using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
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

SyntheticAcceptance SyntheticAcceptance::for_length(double length, int k) {
    if (k < 1 || !(length >= 1.0 && length <= k + 1.0))
        throw std::invalid_argument("a synthetic acceptance length is 1 to k + 1 = " + std::to_string(k + 1) + " tokens per step");
    // p + p^2 + ... + p^k grows with p: bisect it to length - 1.
    double lo = 0, hi = 1;
    for (int it = 0; it < 60; ++it) {
        const double p = (lo + hi) / 2;
        double sum = 0, term = 1;
        for (int j = 0; j < k; ++j) sum += term *= p;
        (sum < length - 1.0 ? lo : hi) = p;
    }
    SyntheticAcceptance s;
    s.keep.assign(static_cast<size_t>(k), length == k + 1.0 ? 1.0 : (lo + hi) / 2);
    return s;
}

SpeculationStats SpeculationStats::zero() {
    SpeculationStats s;
    s.drafted_at.assign(Speculator::kMaxDraft, 0);
    s.accepted_at.assign(Speculator::kMaxDraft, 0);
    return s;
}

DraftSetting DraftSetting::parse(const std::string& text) {
    if (text == "off") return {};
    if (text == "mtp") return {mtp, ""};
    if (text.rfind("model:", 0) == 0 && text.size() > 6) return {model, text.substr(6)};
    throw std::invalid_argument("draft must be \"off\", \"mtp\" (the file's MTP block) or \"model:PATH\" (a draft model's GGUF file), not \"" +
                                text + "\"");
}

namespace {
// A whole string as a number; nullopt for anything else ("", "7x", "x").
std::optional<long long> whole_number(const std::string& s) {
    size_t used = 0;
    long long v = 0;
    try {
        v = std::stoll(s, &used);
    } catch (const std::exception&) {
        return std::nullopt;
    }
    if (used != s.size()) return std::nullopt;
    return v;
}
}  // namespace

std::vector<int32_t> read_draft_vocab(const std::string& spec, int64_t n_vocab) {
    if (spec.rfind("first:", 0) == 0) {
        const auto n = whole_number(spec.substr(6));
        if (!n || *n < 1 || *n > n_vocab)
            throw std::invalid_argument("draft vocabulary '" + spec + "': first:N takes N from 1 to the model's " + std::to_string(n_vocab) + " tokens");
        std::vector<int32_t> ids(static_cast<size_t>(*n));
        std::iota(ids.begin(), ids.end(), 0);
        return ids;
    }
    const std::string& path = spec;
    std::ifstream in(path);
    if (!in) throw std::invalid_argument("draft vocabulary: cannot read " + path);
    std::vector<int32_t> ids;
    std::unordered_map<int32_t, int> first_line;
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
        ++line_no;
        const std::string where = path + ":" + std::to_string(line_no) + ": ";
        std::istringstream fields(line.substr(0, line.find('#')));
        std::string id;
        if (!(fields >> id)) continue;
        const auto v = whole_number(id);
        if (!v) throw std::invalid_argument(where + "'" + id + "' is not a token id");
        if (*v < 0 || *v >= n_vocab)
            throw std::invalid_argument(where + "token " + id + " is outside the model's vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
        const auto [at, fresh] = first_line.emplace(static_cast<int32_t>(*v), line_no);
        if (!fresh) throw std::invalid_argument(where + "token " + id + " is listed twice (first on line " + std::to_string(at->second) + ")");
        ids.push_back(static_cast<int32_t>(*v));
    }
    if (in.bad()) throw std::invalid_argument("draft vocabulary: cannot read " + path);
    if (ids.empty()) throw std::invalid_argument("draft vocabulary: " + path + " lists no token");
    return ids;
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
// drafts at first: 0.7^3 >= 0.3); a step in 16 probes one draft when none is worth it, and
// while drafting, two steps in 16 take one draft fewer and one more than the rule says.
constexpr double kRateWeight = 1.0 / 8, kFirstRate = 0.7;
constexpr int64_t kProbeEvery = 16;
// DraftCosts: a step's weight fades by kKeep per later step (about the last 64 steps count), a
// fit needs kMinSteps of them and a spread of drafts (variance) of at least kMinSpread, and
// worth stays within [kMinWorth, kMaxWorth] (a noisy slope of zero or below must not make
// every draft look free; above 1 nothing is drafted either way).
constexpr double kKeep = 1.0 - 1.0 / 64, kMinSteps = 8, kMinSpread = 0.03, kMinWorth = 0.05, kMaxWorth = 1.0;
}  // namespace

void DraftCosts::observe(int64_t drafts, int64_t tokens, double seconds) {
    if (tokens < 1 || !(seconds > 0)) return;
    const double d = static_cast<double>(drafts);
    for (double* sum : {&n_, &sum_d_, &sum_dd_, &sum_t_, &sum_dt_, &sum_tokens_}) *sum *= kKeep;
    n_ += 1;
    sum_d_ += d;
    sum_dd_ += d * d;
    sum_t_ += seconds;
    sum_dt_ += d * seconds;
    sum_tokens_ += static_cast<double>(tokens);
    const double spread = n_ * sum_dd_ - sum_d_ * sum_d_;  // n² · the drafts' variance
    if (n_ < kMinSteps || spread < kMinSpread * n_ * n_) return;  // keep the last fit (or the prior)
    per_draft_ = std::max(0.0, (n_ * sum_dt_ - sum_d_ * sum_t_) / spread);
    worth_ = std::clamp(per_draft_ / seconds_per_token(), kMinWorth, kMaxWorth);
}

Speculator::Speculator(const Model& model, Sequence& seq, int k, SamplerParams sampling, bool adaptive, DraftSource source, const Carry* from)
    : model_(model), seq_(seq), k_(k), adaptive_(adaptive), source_(source), kept_after_(static_cast<size_t>(k), kFirstRate),
      E_(model.hparams().n_embd), V_(model.hparams().n_vocab), sampler_(sampling) {
    if (k < 1 || k > kMaxDraft) throw std::invalid_argument("drafts per step must be 1 to " + std::to_string(kMaxDraft) + ", not " + std::to_string(k));
    if (source_.model && source_.model->hparams().n_vocab != V_)
        throw std::invalid_argument("the draft model's vocabulary has " + std::to_string(source_.model->hparams().n_vocab) + " tokens, the model's " +
                                    std::to_string(V_) + ": drafts must use the same vocabulary");
    pending_.assign(static_cast<size_t>(E_), 0.f);
    stats_ = SpeculationStats::zero();
    if (from) {
        // (A copy made while a first draft was pending has its row cached too: dropped, as
        // drop_first does; the next catch-up writes it again.)
        if (uses_mtp() && (from->hidden.size() != pending_.size() || seq.mtp_n_past < seq.n_past || seq.mtp_n_past > seq.n_past + 1))
            throw std::invalid_argument("the checkpoint carries no MTP state for this sequence");
        if (uses_mtp()) seq.mtp_n_past = seq.n_past;
        if (!uses_mtp() && !from->draft_seq) throw std::invalid_argument("the checkpoint carries no draft-model state");
        if (uses_mtp()) pending_ = from->hidden;
        else draft_seq_ = std::make_unique<Sequence>(*from->draft_seq), draft_behind_ = from->draft_behind;
    } else if (seq.n_past || seq.mtp_n_past) {
        throw std::invalid_argument("a speculator starts on a fresh sequence");
    }
    if (!uses_mtp() && !draft_seq_) draft_seq_ = source_.model->new_sequence();
}

Speculator::Carry Speculator::carry() const {
    Carry c;
    if (uses_mtp()) c.hidden = pending_;
    else c.draft_seq = std::make_shared<Sequence>(*draft_seq_), c.draft_behind = draft_behind_;
    return c;
}

void Speculator::drop_first() {
    if (!first_ready_) return;
    first_ready_ = false;
    seq_.mtp_n_past = seq_.n_past;  // the extra row's cache entry is written again by the next catch-up
}

Segment Speculator::main_rows(const int32_t* tokens, int64_t n, int64_t drafts, bool logits) {
    if (drafts > kMaxDraft) throw std::invalid_argument("at most " + std::to_string(kMaxDraft) + " drafts per step");
    drop_first();
    rows_.assign(tokens, tokens + n);
    drafts_ = drafts;
    const bool hidden = uses_mtp() && model_.has_mtp();
    hidden_.resize(hidden ? static_cast<size_t>(n * E_) : 0);
    logits_.resize(logits ? static_cast<size_t>((drafts ? n : 1) * V_) : 0);
    Segment seg{&seq_, rows_.data(), n, logits ? logits_.data() : nullptr, drafts > 0, hidden ? hidden_.data() : nullptr};
    seg.tentative = drafts > 0;
    return seg;
}

void Speculator::set_synthetic(SyntheticAcceptance s) {
    if (static_cast<int>(s.keep.size()) < k_) throw std::invalid_argument("synthetic acceptance: a keep rate for each of the k drafts");
    synthetic_rng_.seed(s.seed);
    synthetic_ = std::move(s);
}

std::vector<int32_t> Speculator::judge() {
    const std::vector<int32_t> drafts(rows_.begin() + 1, rows_.end());
    std::vector<int32_t> out;
    if (!synthetic_) {
        out = accept_drafts(logits_.data(), V_, drafts, sampler_);
    } else {
        std::uniform_real_distribution<double> u(0, 1);
        const auto& never = synthetic_->never;
        for (size_t i = 0; i <= drafts.size(); ++i) {
            const bool kept = i < drafts.size() && u(synthetic_rng_) < synthetic_->keep[i] &&
                              std::find(never.begin(), never.end(), drafts[i]) == never.end();
            out.push_back(kept ? drafts[i] : sampler_.sample(logits_.data() + static_cast<int64_t>(i) * V_, V_));
            if (!kept) break;
        }
    }
    const auto k = drafts_, m = static_cast<int64_t>(out.size()) - 1;
    ++stats_.steps;
    stats_.drafted += k;
    stats_.accepted += m;
    stats_.tokens += m + 1;
    last_drafted_ = k;
    last_accepted_ = m;
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

void Speculator::keep(int64_t n) {
    if (n < 1 || n > static_cast<int64_t>(rows_.size())) throw std::logic_error("keep: 1 to " + std::to_string(rows_.size()) + " rows");
    if (drafts_) {
        // Rejected drafts ran through the recurrent layers: their recurrence runs again over
        // the kept rows only, from the states before the step (Model::keep_tentative).
        model_.keep_tentative(seq_, n);
        if (n < static_cast<int64_t>(rows_.size())) stats_.recomputed_rows += n;
    }
    rows_.resize(static_cast<size_t>(n));
}

std::optional<Segment> Speculator::catch_up(std::optional<int32_t> next) {
    if (!uses_mtp()) {
        draft_behind_.insert(draft_behind_.end(), rows_.begin(), rows_.end());
        // A prompt's rows run through the draft model a full step at a time as they come, not
        // all in the first draft: a long prompt would otherwise stall that step (and, in the
        // serving engine, every request in it) for the draft model's whole prefill.
        run_behind(Model::kMaxStepRows);
        return std::nullopt;
    }
    if (!model_.has_mtp()) return std::nullopt;
    // Token p with the main hidden state of p-1: the carried row, then this step's rows shifted;
    // `next` (at n_past) pairs with the last kept row's, as its first draft would.
    const auto n = static_cast<int64_t>(rows_.size()), rows = n + (next ? 1 : 0);
    paired_.resize(static_cast<size_t>(rows * E_));
    std::copy(pending_.begin(), pending_.end(), paired_.begin());
    std::copy(hidden_.begin(), hidden_.begin() + (rows - 1) * E_, paired_.begin() + E_);
    std::copy(hidden_.begin() + (n - 1) * E_, hidden_.begin() + n * E_, pending_.begin());
    first_ready_ = next.has_value();
    if (!next) return Segment{&seq_, rows_.data(), n, nullptr, false, nullptr, paired_.data()};
    rows_.push_back(*next);  // what the block runs (nothing reads the kept rows after this)
    first_after_ = *next;
    first_logits_.resize(static_cast<size_t>(model_.mtp_vocab()));
    first_hidden_.resize(static_cast<size_t>(rows * E_));
    return Segment{&seq_, rows_.data(), rows, first_logits_.data(), false, first_hidden_.data(), paired_.data()};
}

std::vector<float> Speculator::prefill(const std::vector<int32_t>& prompt) {
    if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
    for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(Model::kMaxStepRows)) {
        const auto n = static_cast<int64_t>(std::min(prompt.size() - i, static_cast<size_t>(Model::kMaxStepRows)));
        model_.step({main_rows(prompt.data() + i, n, 0, i + static_cast<size_t>(n) == prompt.size())});
        keep(n);
        if (auto s = catch_up()) model_.mtp_step({*s});
    }
    return logits_;
}

std::vector<int32_t> Speculator::draft(int32_t last, int k) { return draft_together({this}, {last}, {k})[0]; }

std::vector<std::vector<int32_t>> Speculator::draft_together(const std::vector<Speculator*>& specs, const std::vector<int32_t>& lasts,
                                                             const std::vector<int>& ks) {
    if (lasts.size() != specs.size() || ks.size() != specs.size()) throw std::invalid_argument("draft_together: one last token and k per speculator");
    std::vector<std::vector<int32_t>> out(specs.size());
    // A speculator drafting with the MTP block: the hidden state its next row pairs with, the
    // row's outputs, the token it feeds.
    struct Run {
        Speculator* s;
        size_t i;
        float *h, *next_h, *logits;  // the speculator's draft_h_, draft_next_h_, draft_logits_
        int64_t columns;
        int32_t tok;
    };
    std::vector<Run> runs;
    for (size_t i = 0; i < specs.size(); ++i) {
        Speculator& s = *specs[i];
        // A first draft from the last catch-up, for this very token: taken; else dropped.
        const bool first = s.first_ready_ && ks[i] > 0 && s.first_after_ == lasts[i];
        if (!first) s.drop_first();
        if (ks[i] <= 0) continue;
        if (!s.uses_mtp()) {
            out[i] = s.draft_model(lasts[i], ks[i]);
            continue;
        }
        if (!s.model_.has_mtp()) throw std::logic_error("drafting needs the model's MTP block");
        if (!runs.empty() && &s.model_ != &runs.front().s->model_) throw std::logic_error("draft_together: speculators of different models");
        if (s.seq_.mtp_n_past != s.seq_.n_past + (first ? 1 : 0)) throw std::logic_error("the MTP block's cache is not at the main model's position");
        const int64_t columns = s.model_.mtp_vocab();
        s.draft_h_.resize(static_cast<size_t>(s.E_));
        s.draft_next_h_.resize(static_cast<size_t>(s.E_));
        s.draft_logits_.resize(static_cast<size_t>(columns));
        std::copy(s.pending_.begin(), s.pending_.end(), s.draft_h_.begin());
        runs.push_back(Run{&s, i, s.draft_h_.data(), s.draft_next_h_.data(), s.draft_logits_.data(), columns, lasts[i]});
        if (first) {
            Run& r = runs.back();
            r.tok = s.model_.mtp_token(argmax(s.first_logits_.data(), columns));
            out[i].push_back(r.tok);
            std::copy(s.first_hidden_.end() - s.E_, s.first_hidden_.end(), r.h);
            s.first_ready_ = false;
        }
    }
    for (;;) {
        std::vector<Segment> segs;
        std::vector<Run*> in;
        for (Run& r : runs)
            if (static_cast<int>(out[r.i].size()) < ks[r.i]) {
                segs.push_back(Segment{&r.s->seq_, &r.tok, 1, r.logits, false, r.next_h, r.h});
                in.push_back(&r);
            }
        if (segs.empty()) break;
        runs.front().s->model_.mtp_step(segs);
        for (Run* r : in) {
            r->tok = r->s->model_.mtp_token(argmax(r->logits, r->columns));
            out[r->i].push_back(r->tok);
            std::swap(r->h, r->next_h);
        }
    }
    for (Run& r : runs) r.s->seq_.mtp_n_past = r.s->seq_.n_past;  // the drafts' cache entries are dropped; catch_up rewrites them
    return out;
}

void Speculator::run_behind(int64_t at_least) {
    size_t done = 0;
    while (done < draft_behind_.size() && draft_behind_.size() - done >= static_cast<size_t>(at_least)) {
        const size_t n = std::min(draft_behind_.size() - done, static_cast<size_t>(Model::kMaxStepRows));
        source_.model->step({Segment{draft_seq_.get(), draft_behind_.data() + done, static_cast<int64_t>(n), nullptr, false}});
        done += n;
    }
    draft_behind_.erase(draft_behind_.begin(), draft_behind_.begin() + static_cast<std::ptrdiff_t>(done));
}

std::vector<int32_t> Speculator::draft_model(int32_t last, int k) {
    const Model& dm = *source_.model;
    Sequence& ds = *draft_seq_;
    run_behind(1);  // the tokens kept since the last draft, for good
    // Then `last` and the drafts one by one, undone afterwards: verify decides what stays.
    if (ds.n_past + k >= dm.hparams().context_length) return {};
    const int64_t base = ds.n_past;
    ds.save_recurrent(draft_checkpoint_);
    std::vector<int32_t> out;
    draft_logits_.resize(static_cast<size_t>(V_));
    int32_t tok = last;
    for (int i = 0; i < k; ++i) {
        dm.step({Segment{&ds, &tok, 1, draft_logits_.data(), false}});
        tok = argmax(draft_logits_.data(), V_);
        out.push_back(tok);
    }
    ds.restore_recurrent(draft_checkpoint_);
    ds.n_past = base;
    return out;
}

std::vector<int32_t> Speculator::verify(int32_t last, const std::vector<int32_t>& drafts) {
    std::vector<int32_t> rows{last};
    rows.insert(rows.end(), drafts.begin(), drafts.end());
    const auto t0 = Clock::now();
    model_.step({main_rows(rows.data(), static_cast<int64_t>(rows.size()), static_cast<int64_t>(drafts.size()), true)});
    const auto t1 = Clock::now();
    const std::vector<int32_t> out = judge();
    keep(static_cast<int64_t>(out.size()));
    // The next step's first draft in the same block pass, when it will draft.
    if (auto s = catch_up(next_k() > 0 ? std::optional<int32_t>(out.back()) : std::nullopt)) model_.mtp_step({*s});
    stats_.verify_s += seconds(t1 - t0);
    stats_.settle_s += seconds(Clock::now() - t1);
    return out;
}

int Speculator::next_k() const {
    if (!adaptive_) return k_;
    const int k = drafts_worth(kept_after_, k_, worth_);
    // Not worth it: a plain step, but one draft now and then, to see whether it has become so.
    if (!k) return stats_.steps % kProbeEvery == kProbeEvery - 1 ? 1 : 0;
    // Now and then one draft fewer, and one more: steps of other lengths, for DraftCosts to
    // measure what a draft costs, and the rate of the position past the last one kept fresh.
    const int64_t phase = stats_.steps % kProbeEvery;
    if (phase == kProbeEvery / 2 - 1) return k - 1;
    if (phase == kProbeEvery - 1) return std::min(k + 1, k_);
    return k;
}

std::vector<int32_t> Speculator::step(int32_t last) {
    const int k = next_k();
    const auto t0 = Clock::now();
    const std::vector<int32_t> drafts = k ? draft(last, k) : std::vector<int32_t>{};
    stats_.draft_s += seconds(Clock::now() - t0);
    std::vector<int32_t> out = verify(last, drafts);
    if (adaptive_) {
        costs_.observe(static_cast<int64_t>(drafts.size()), static_cast<int64_t>(out.size()), seconds(Clock::now() - t0));
        worth_ = costs_.worth();
    }
    return out;
}

}  // namespace pulse::decoder
