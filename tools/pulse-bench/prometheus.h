// Speculative-decoding counters in a Prometheus text exposition (vLLM and llama-server names).
#pragma once

#include <map>
#include <string>

namespace pulse::bench {

struct SpecCounters {
    std::string prefix;  // "vllm:" or "llamacpp:"
    double drafts = 0, draft_tokens = 0, accepted = 0;
    std::map<int, double> per_pos;  // accepted tokens by draft position
    bool found = false;
};

// Sums spec_decode_num_{drafts,draft_tokens,accepted_tokens}[_total] and
// ..._accepted_tokens_per_pos{position="i"} over all label sets (engines, models).
SpecCounters parse_spec_counters(const std::string& text);

}  // namespace pulse::bench
