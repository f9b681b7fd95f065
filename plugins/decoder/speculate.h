// Self-speculative decoding with the model's MTP block (docs/DECODER.md, "Speculative decoding"):
// the block drafts k tokens one after another, the main model checks all of them in one batched
// step, and the drafts it accepts are kept, plus a token of the main model's own. Greedy: the
// longest prefix equal to the main model's argmax; sampling: the speculative-sampling rule
// (accept_drafts). Either way the output is what the main model alone would give (greedy) or is
// distributed as its samples; only the number of main-model steps falls.
//
// The hybrid model's Gated DeltaNet layers keep no per-position history: after a step that ran
// rejected drafts, their conv windows and states are put back from a copy taken before the step
// and the accepted rows are run again (attention caches need no undo: positions past n_past are
// overwritten). A step whose drafts are all kept runs once.
#pragma once

#include <cstdint>
#include <vector>

#include "model.h"
#include "sampler.h"

namespace pulse::decoder {

// Which drafts a verification keeps, and the token after them, from the main model's logits at
// each row (`logits`: k + 1 rows of n_vocab; row i follows [last, drafts...][i]). A greedy sampler
// keeps drafts while each equals its row's argmax. Otherwise, for drafts proposed
// deterministically (the MTP block's argmax): draft i is kept with probability p_i(draft), and at
// the first rejection the token is drawn from p_i without the draft (renormalised); after k kept
// drafts, from p_k. The tokens returned are then distributed exactly as tokens sampled from the
// main model one at a time (p_i: the sampler's distribution, with its top-k/top-p/min-p).
std::vector<int32_t> accept_drafts(const float* logits, int64_t n_vocab, const std::vector<int32_t>& drafts, Sampler& sampler);

// Adaptive k: how many drafts are worth proposing, from the running rate at which draft i is
// kept once drafts 0..i-1 were (`kept_after`). Draft i adds a token with the chance that all of
// 0..i are kept, and always costs a verified row and a block run: it is drafted while that
// chance is at least `worth`. 0 means drafting does not pay now (the speculator then probes one
// draft now and then to notice when it starts to).
int drafts_worth(const std::vector<double>& kept_after, int k_max, double worth = 0.3);

struct SpeculationStats {
    int64_t steps = 0;                   // verification steps of the main model
    int64_t drafted = 0, accepted = 0;   // draft tokens proposed and kept
    std::vector<int64_t> drafted_at, accepted_at;  // the same by draft position (index 0 = first draft)
    int64_t tokens = 0;                  // tokens decoded by those steps (accepted + one each)
    int64_t recomputed_rows = 0;         // rows run again to restore the recurrent state
    int64_t plain_steps = 0;             // adaptive: steps run without drafts (counted in steps)
};

class Speculator {
public:
    static constexpr int kMaxDraft = 16;
    // `seq` must be fresh (nothing run). `k`: drafts per step, 1..kMaxDraft. The model needs an
    // MTP block for step(); verify() takes drafts from anywhere.
    // `adaptive`: k is at most the given k, chosen per step by drafts_worth.
    Speculator(const Model& model, Sequence& seq, int k, SamplerParams sampling = {}, bool adaptive = false);

    // Runs the prompt through the main model and the MTP block; returns the logits of its last
    // token (the first token is chosen from them: sample()).
    std::vector<float> prefill(const std::vector<int32_t>& prompt);
    int32_t sample(const std::vector<float>& logits) { return sampler_.sample(logits.data(), V_); }
    // One speculative step after `last` (the newest token, not yet run): draft, verify, keep.
    // Returns the tokens decoded (1..k+1): the accepted drafts, then the main model's next token.
    std::vector<int32_t> step(int32_t last);
    // The drafts the next step() proposes (k, or adaptive k).
    int next_k() const;
    // The MTP block's greedy drafts after `last` (up to `k`); leaves the sequence as it was.
    std::vector<int32_t> draft(int32_t last, int k);
    // Verifies `drafts` after `last` in one main-model step, as step() does with its own drafts.
    std::vector<int32_t> verify(int32_t last, const std::vector<int32_t>& drafts);
    // The main model's logits for each token the last step()/verify() returned (rows of n_vocab).
    const std::vector<float>& logits() const { return logits_; }
    const SpeculationStats& stats() const { return stats_; }

private:
    // The main model's step over `tokens` with every row's hidden state into hidden_ (and all
    // logits into `logits` when set), then the MTP block over the same tokens paired with the
    // hidden state one row earlier.
    void run(const std::vector<int32_t>& tokens, std::vector<float>* logits);
    void catch_up(const std::vector<int32_t>& tokens);

    const Model& model_;
    Sequence& seq_;
    int k_;
    bool adaptive_;
    std::vector<double> kept_after_;  // adaptive: running rate of keeping draft i after 0..i-1
    int64_t E_, V_;
    std::vector<float> pending_;  // the main hidden state of the last position run (zeros at first)
    std::vector<float> hidden_;   // the last main step's hidden rows
    std::vector<float> logits_;
    Sequence::RecurrentCheckpoint checkpoint_;
    Sampler sampler_;
    SpeculationStats stats_;
};

}  // namespace pulse::decoder
