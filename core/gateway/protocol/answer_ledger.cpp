#include "gateway/protocol/answer_ledger.h"

#include <algorithm>

namespace pulse::gateway {

namespace {
constexpr const char* kNoRecord = "an attempt reported no token record";
}

void AnswerLedger::usage(const pulse_usage_t& u) {
    auto nz = [](int64_t v) { return v < 0 ? int64_t(0) : v; };
    usage_.input = nz(u.input_tokens);
    usage_.cached = std::min(nz(u.cached_tokens), usage_.input);
    usage_.output = nz(u.output_tokens);
    // A backend that does not count reasoning tokens (llama-server) streams one token per
    // delta: the deltas are the count.
    usage_.reasoning = std::min(u.reasoning_tokens >= 0 ? u.reasoning_tokens : reasoning_deltas_, usage_.output);
    usage_.reported = true;
}

// An attempt that showed output and reported no record, after one that did: the record has a
// hole there that no later report can fill.
bool AnswerLedger::attempt_left_hole() const { return attempt_deltas_ > 0 && !attempt_trailed_ && !trail_ids_.empty(); }

void AnswerLedger::trail(const int32_t* tokens, size_t n, std::string_view raw) {
    attempt_trailed_ = true;
    attempt_trail_ids_ += static_cast<int64_t>(n);
    trail_ids_.insert(trail_ids_.end(), tokens, tokens + n);
    trail_raw_.append(raw);
}

void AnswerLedger::trail_lost(std::string_view why) {
    if (trail_lost_.empty()) trail_lost_ = why.empty() ? std::string("the backend's token record has a hole") : std::string(why);
}

void AnswerLedger::restart_trail() {
    trail_ids_.clear();
    trail_raw_.clear();
    trail_lost_.clear();
    attempt_trailed_ = false;
    attempt_trail_ids_ = 0;
}

std::optional<std::pair<std::vector<int32_t>, std::string>> AnswerLedger::record(std::string* why_not) const {
    if (!trail_lost_.empty()) *why_not = trail_lost_;
    else if (attempt_left_hole()) *why_not = kNoRecord;
    else if (!trail_ids_.empty()) return std::make_pair(trail_ids_, trail_raw_);
    return std::nullopt;
}

void AnswerLedger::next_attempt() {
    if (attempt_left_hole() && trail_lost_.empty()) trail_lost_ = kNoRecord;
    attempt_trailed_ = false;
    Usage spent = attempt();
    carried_.input += spent.input;
    carried_.cached += spent.cached;
    carried_.output += spent.output;
    carried_.reasoning += spent.reasoning;
    carried_.reported = true;
    usage_ = Usage{};
    attempt_deltas_ = 0;
    attempt_trail_ids_ = 0;
    reasoning_deltas_ = 0;
}

AnswerLedger::Usage AnswerLedger::attempt() const {
    // A backend that reported no usage (it failed, or the client left, before its last chunk):
    // its output deltas stand for its output tokens, the input is unknown.
    // A token record counts its tokens exactly (deltas miss the tokens that make none).
    if (usage_.reported) return usage_;
    const int64_t out = attempt_trail_ids_ > 0 ? attempt_trail_ids_ : attempt_deltas_;
    return Usage{0, 0, out, std::min(reasoning_deltas_, out), false};
}

AnswerLedger::Usage AnswerLedger::spent() const {
    Usage u = attempt();
    u.output += carried_.output;
    u.reasoning += carried_.reasoning;
    return u;
}

AnswerLedger::Usage AnswerLedger::totals() const {
    Usage u = usage_;
    u.input += carried_.input;
    u.cached += carried_.cached;
    u.output += carried_.output;
    u.reasoning += carried_.reasoning;
    u.reported = usage_.reported || carried_.reported;
    return u;
}

}  // namespace pulse::gateway
