#include "pulse-bench/prometheus.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace pulse::bench {

// Sums the spec-decode counters of a Prometheus text exposition over all label sets.
SpecCounters parse_spec_counters(const std::string& text) {
    SpecCounters c;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (line.empty() || line[0] == '#') continue;
        size_t brace = line.find('{'), space = line.rfind(' ');
        if (space == std::string::npos) continue;
        std::string name = line.substr(0, std::min(brace, line.find(' ')));
        double v = std::strtod(line.c_str() + space + 1, nullptr);
        for (const char* prefix : {"vllm:", "llamacpp:", "pulse_decoder_"}) {
            if (name.rfind(prefix, 0) != 0) continue;
            std::string n = name.substr(std::strlen(prefix));
            auto is = [&](const char* base) { return n == std::string(base) || n == std::string(base) + "_total"; };
            bool hit = true;
            if (is("spec_decode_num_drafts")) c.drafts += v;
            else if (is("spec_decode_num_draft_tokens")) c.draft_tokens += v;
            else if (is("spec_decode_num_accepted_tokens")) c.accepted += v;
            else if (is("spec_decode_num_accepted_tokens_per_pos")) {
                size_t p = line.find("position=\"");
                if (p != std::string::npos) c.per_pos[std::atoi(line.c_str() + p + 10)] += v;
            } else hit = false;
            if (hit) c.found = true, c.prefix = prefix;
        }
    }
    return c;
}

}  // namespace pulse::bench
