// What the attempts at one answer spent and generated, across mid-stream resumes: each
// attempt's usage (what its backend reported, else counted from its deltas or its token ids),
// the totals carried over from earlier attempts, and the token record (delta->trail) that a
// token-exact resume continues from. ResponseBuilder keeps one per response.
#pragma once

#include <pulse/plugin.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pulse::gateway {

class AnswerLedger {
public:
    struct Usage {
        int64_t input = 0, cached = 0, output = 0, reasoning = 0;
        bool reported = false;  // a backend reported usage (else the input is unknown)
    };

    // One delta of output (text, reasoning, tool arguments) from the current attempt.
    void delta(bool reasoning) {
        ++attempt_deltas_;
        if (reasoning) ++reasoning_deltas_;
    }
    void usage(const pulse_usage_t& u);
    void trail(const int32_t* tokens, size_t n, std::string_view raw);
    void trail_lost(std::string_view why);
    // A stream that starts the answer afresh (not a continuation): the token record restarts.
    void restart_trail();
    // The current attempt failed and the next one continues the answer: its usage is carried
    // into the totals.
    void next_attempt();

    bool attempt_has_output() const { return attempt_deltas_ > 0; }
    // What the backends reported, over every attempt.
    Usage totals() const;
    // Output (and reasoning) tokens every attempt spent so far, this one counted from its
    // deltas when its backend has not reported usage.
    Usage spent() const;
    // The record of the whole answer so far, when every attempt reported one without a hole;
    // else nothing and, in `why_not`, why (empty: no backend reported one).
    std::optional<std::pair<std::vector<int32_t>, std::string>> record(std::string* why_not) const;

private:
    Usage attempt() const;  // the current attempt's: reported, else counted
    bool attempt_left_hole() const;

    Usage usage_;    // the current attempt's
    Usage carried_;  // earlier attempts'
    int64_t attempt_deltas_ = 0, reasoning_deltas_ = 0;
    std::vector<int32_t> trail_ids_;
    std::string trail_raw_;
    std::string trail_lost_;         // why the record has a hole ("" = whole)
    bool attempt_trailed_ = false;   // the current attempt reported a trail
    int64_t attempt_trail_ids_ = 0;  // ids the current attempt reported: its output tokens
};

}  // namespace pulse::gateway
