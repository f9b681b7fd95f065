// Self-speculative decoding with the model's MTP block (docs/DECODER.md, "Speculative decoding"):
// the block drafts k tokens one after another, the main model checks all of them in one batched
// step, and the drafts it accepts are kept, plus a token of the main model's own. Greedy: the
// longest prefix equal to the main model's argmax; sampling: the speculative-sampling rule
// (accept_drafts). Either way the output is what the main model alone would give (greedy) or is
// distributed as its samples; only the number of main-model steps falls.
//
// The hybrid model's Gated DeltaNet layers keep no per-position history: a step with drafts is
// tentative (Segment::tentative), writing its conv windows and states beside the ones before
// it; when drafts are rejected, the recurrence runs again from those over the accepted rows,
// from the inputs the step kept — the layers themselves do not run again, since a row's
// outputs do not depend on later rows (attention caches need no undo: positions past n_past
// are overwritten). A draft model (DraftSource) is
// undone the same way: its speculative rows are dropped and the tokens kept run in its next
// draft, as one batched step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/sampler.h"

namespace pulse::decoder {

// Which drafts a verification keeps, and the token after them, from the main model's logits at
// each row (`logits`: k + 1 rows of n_vocab; row i follows [last, drafts...][i]). A greedy sampler
// keeps drafts while each equals its row's argmax. Otherwise, for drafts proposed
// deterministically (the MTP block's argmax): draft i is kept with probability p_i(draft), and at
// the first rejection the token is drawn from p_i without the draft (renormalised); after k kept
// drafts, from p_k. The tokens returned are then distributed exactly as tokens sampled from the
// main model one at a time (p_i: the sampler's distribution, with its top-k/top-p/min-p).
std::vector<int32_t> accept_drafts(const float* logits, int64_t n_vocab, const std::vector<int32_t>& drafts, Sampler& sampler);

// Benchmarking only (llama.cpp's --spec-synth-len): drafts kept at random, whatever the main model
// says, draft i with probability keep[i] once drafts 0..i-1 were kept; a draft in `never` (end of
// generation) is never kept. At the first draft not kept the main model's own token follows, as
// after a real rejection. The text is then not the model's; the work is a real speculation's at
// that acceptance (drafting, verification, undo, catch-up), which is what a benchmark times.
struct SyntheticAcceptance {
    std::vector<double> keep;
    std::vector<int32_t> never;
    uint64_t seed = 1;
    // The same keep rate p at every position, chosen so that a step yields `length` tokens on
    // average (1 + p + p^2 + ... + p^k = length), as llama.cpp resolves it. Throws
    // std::invalid_argument outside [1, k + 1].
    static SyntheticAcceptance for_length(double length, int k);
};

// Adaptive k: how many drafts are worth proposing, from the running rate at which draft i is
// kept once drafts 0..i-1 were (`kept_after`). Draft i adds a token with the chance that all of
// 0..i are kept, and always costs a verified row and a block run: it is drafted while that
// chance is at least `worth`. 0 means drafting does not pay now (the speculator then probes one
// draft now and then to notice when it starts to).
int drafts_worth(const std::vector<double>& kept_after, int k_max, double worth = 0.3);

// What a draft costs on this machine, measured: adaptive k's `worth` for drafts_worth. A draft
// adds a verified row and a drafting pass to a step, and pays when the chance that it adds a
// token is at least its cost over the time a token takes now: worth = c / τ, with c the seconds
// one more draft adds to a step (the slope of step time against the step's drafts, least
// squares over the recent steps, the older ones fading) and τ the seconds per decoded token.
// Where decoding is bound by reading the weights an extra row is nearly free and drafts pay
// from a low chance; where the arithmetic bounds it (ternary weights on few cores) a row costs
// a good part of a step and only likely drafts pay. Until the steps seen vary enough in their
// drafts to fit c (the speculator varies k now and then for this), worth is kPriorWorth.
class DraftCosts {
public:
    static constexpr double kPriorWorth = 0.3;
    // One step: the drafts it verified (all sequences of a batched step together), the tokens
    // it decoded and its wall time (drafting, verifying, settling).
    void observe(int64_t drafts, int64_t tokens, double seconds);
    double worth() const { return worth_; }
    double seconds_per_draft() const { return per_draft_; }  // c, 0 until fitted
    double seconds_per_token() const { return sum_tokens_ > 0 ? sum_t_ / sum_tokens_ : 0; }

private:
    // Sums over the steps, each step's weight fading by kKeep per step after it.
    double n_ = 0, sum_d_ = 0, sum_dd_ = 0, sum_t_ = 0, sum_dt_ = 0, sum_tokens_ = 0;
    double per_draft_ = 0, worth_ = kPriorWorth;
};

struct SpeculationStats {
    int64_t steps = 0;                   // verification steps of the main model
    int64_t drafted = 0, accepted = 0;   // draft tokens proposed and kept
    std::vector<int64_t> drafted_at, accepted_at;  // the same by draft position (index 0 = first draft)
    int64_t tokens = 0;                  // tokens decoded by those steps (accepted + one each)
    int64_t recomputed_rows = 0;         // rows whose recurrence was replayed to restore the recurrent state
    int64_t plain_steps = 0;             // adaptive: steps run without drafts (counted in steps)
    // Wall time of step(): drafting, the main model's verification step, and the rest (judging,
    // keeping the accepted rows, the MTP block's catch-up). verify_s over the three is the share
    // of a step the verification takes: the share of the speedup the acceptance allows
    // (tokens per step ÷ a verification's cost) that speculation reaches. (The serving engine's
    // phases are timed by the engine, not here.)
    double draft_s = 0, verify_s = 0, settle_s = 0;
    static SpeculationStats zero();      // with the by-position counts sized
};

// Where drafts come from: the model's MTP block (the default), or a second, smaller model with
// the same vocabulary (classic draft-model speculation, llama.cpp's -md).
struct DraftSource {
    const Model* model = nullptr;  // null: the main model's MTP block
};

// A draft setting as configured (`pulse decode --draft`, the decoder backend's `draft` option):
// "off", "mtp", or "model:PATH". Throws std::invalid_argument naming what is accepted.
struct DraftSetting {
    enum Kind { off, mtp, model } kind = off;
    std::string path;  // model: the draft model's GGUF file
    static DraftSetting parse(const std::string& text);
};

// A draft vocabulary (Model::set_draft_vocab takes it). A file (`pulse distill vocab` writes
// one): one token id per line, most frequent first, anything after the id ignored, '#' starting
// a comment. Throws std::invalid_argument naming the file and line of an id that is not a
// number, is outside 0..n_vocab-1 or is listed twice, and for a file that lists none. Or
// "first:N": ids 0..N-1 — in a byte-level BPE vocabulary ids follow the merge order, roughly
// the tokenizer's own frequency ranking, so no file is needed (the special tokens, at the end
// of Qwen's vocabulary, are then never drafted).
std::vector<int32_t> read_draft_vocab(const std::string& spec, int64_t n_vocab);

class Speculator {
public:
    static constexpr int kMaxDraft = 16;
    // `seq` must be fresh (nothing run), or a checkpoint resumed with `from` (carry()). `k`:
    // drafts per step, 1..kMaxDraft. `adaptive`: k is at most the given k, chosen per step by
    // drafts_worth. With the MTP source the model needs the block for step(); verify() takes
    // drafts from anywhere.
    struct Carry;
    Speculator(const Model& model, Sequence& seq, int k, SamplerParams sampling = {}, bool adaptive = false, DraftSource source = {},
               const Carry* from = nullptr);

    // Runs the prompt through the main model (and the MTP block, or queues it for the draft
    // model); returns the logits of its last token (the first token is chosen from them: sample()).
    std::vector<float> prefill(const std::vector<int32_t>& prompt);
    int32_t sample(const std::vector<float>& logits) { return sampler_.sample(logits.data(), V_); }
    // One speculative step after `last` (the newest token, not yet run): draft, verify, keep.
    // Returns the tokens decoded (1..k+1): the accepted drafts, then the main model's next token.
    std::vector<int32_t> step(int32_t last);
    // The drafts the next step() proposes (k, or adaptive k).
    int next_k() const;
    // Adaptive k's threshold (DraftCosts::worth): step() measures its own steps; a caller that
    // runs the steps itself (the serving engine, several sequences a step) measures them and
    // sets it before each step.
    void set_worth(double worth) { worth_ = worth; }
    double worth() const { return worth_; }
    const DraftCosts& costs() const { return costs_; }  // step()'s measurements
    // Benchmarking only: judge drafts by `s` instead of by the main model (SyntheticAcceptance).
    void set_synthetic(SyntheticAcceptance s);
    // Greedy drafts after `last` (up to `k`); leaves the sequence as it was.
    std::vector<int32_t> draft(int32_t last, int k);
    // draft(lasts[i], ks[i]) of several speculators of one model at once (ks[i] <= 0: none):
    // their MTP rows of each draft position run in one Model::mtp_step, so that the block's
    // weights are read once per position for all of them; draft-model speculators draft one
    // after another. The drafts are each one's own draft() would give.
    static std::vector<std::vector<int32_t>> draft_together(const std::vector<Speculator*>& specs, const std::vector<int32_t>& lasts,
                                                            const std::vector<int>& ks);
    // Verifies `drafts` after `last` in one main-model step, as step() does with its own drafts.
    std::vector<int32_t> verify(int32_t last, const std::vector<int32_t>& drafts);

    // verify() and prefill() in phases, for a caller that runs several sequences' segments in
    // one batched step (the serving engine):
    //  1. main_rows: this sequence's segment of the main step: a prompt chunk (no drafts; the
    //     last row's logits when `logits`), or the newest token and its drafts (all logits).
    //  2. judge (after the step, drafts only): the tokens decoded, by the acceptance rule; the
    //     step's logits (step_logits) may be masked before it.
    //  3. keep(n): the first n rows stand (the caller may stop short of what judge returned);
    //     with drafts, Model::keep_tentative (when fewer than ran, the recurrences replayed
    //     over the kept rows from the states before the step: no layer runs again).
    //  4. catch_up: the MTP block's segment over the kept rows (for Model::mtp_step), or none.
    //     With `next` (the token the next step starts from, when it will draft): one row more,
    //     that token, whose logits are the next step's first draft — one block pass fewer per
    //     step. The next draft()/draft_together() takes it from there; a step that does not
    //     (main_rows first) drops it.
    Segment main_rows(const int32_t* tokens, int64_t n, int64_t drafts, bool logits);
    std::vector<int32_t> judge();
    std::vector<float>& step_logits() { return logits_; }
    void keep(int64_t n);
    std::optional<Segment> catch_up(std::optional<int32_t> next = std::nullopt);

    // The main model's logits for each token the last step()/verify() returned (rows of n_vocab).
    const std::vector<float>& logits() const { return logits_; }
    const SpeculationStats& stats() const { return stats_; }
    // What the last judge() did: drafts proposed and kept.
    int64_t last_drafted() const { return last_drafted_; }
    int64_t last_accepted() const { return last_accepted_; }

    // What a checkpoint of the sequence (a copy of it) needs beside it to draft on from there:
    // the main hidden state of its last position (MTP), or the draft model's own sequence and
    // the tokens it has not run yet.
    struct Carry {
        std::vector<float> hidden;
        std::shared_ptr<Sequence> draft_seq;
        std::vector<int32_t> draft_behind;
    };
    Carry carry() const;

private:
    std::vector<int32_t> draft_model(int32_t last, int k);
    // Draft model: runs the tokens behind through it, a step of up to kMaxStepRows at a time, while
    // at least `at_least` are left (1: all of them).
    void run_behind(int64_t at_least);
    bool uses_mtp() const { return !source_.model; }

    const Model& model_;
    Sequence& seq_;
    int k_;
    bool adaptive_;
    DraftSource source_;
    std::vector<double> kept_after_;  // adaptive: running rate of keeping draft i after 0..i-1
    double worth_ = DraftCosts::kPriorWorth;
    DraftCosts costs_;                // step()'s own steps
    int64_t E_, V_;
    std::vector<float> pending_;  // MTP: the main hidden state of the last position run (zeros at first)
    // The current step: its rows (token then drafts; with drafts a tentative step), their
    // hidden states and logits.
    std::vector<int32_t> rows_;
    int64_t drafts_ = 0;
    std::vector<float> hidden_, paired_;
    std::vector<float> logits_;
    // The catch-up's extra row (catch_up with `next`, appended to rows_): its token, the block's
    // logits and hidden states of the catch-up's rows (the last row's: the second draft's input);
    // the MTP cache then holds that token's position too (mtp_n_past = n_past + 1) until drafting.
    bool first_ready_ = false;
    int32_t first_after_ = -1;
    std::vector<float> first_logits_, first_hidden_;
    void drop_first();
    // Drafting's working rows (draft_together, draft_model), kept between steps: the block's
    // input and output hidden states and a draft's logits, up to a vocabulary wide each step.
    std::vector<float> draft_h_, draft_next_h_, draft_logits_;
    // Draft model: its sequence, the tokens decoded that it has not run yet, its undo copy.
    std::unique_ptr<Sequence> draft_seq_;
    std::vector<int32_t> draft_behind_;
    Sequence::RecurrentCheckpoint draft_checkpoint_;
    Sampler sampler_;
    std::optional<SyntheticAcceptance> synthetic_;
    std::mt19937_64 synthetic_rng_;
    SpeculationStats stats_;
    int64_t last_drafted_ = 0, last_accepted_ = 0;
};

}  // namespace pulse::decoder
