// Token sampling: greedy, or top-k, temperature, min-p and top-p over the softmax and a draw
// from a seeded RNG. Speculative decoding (speculate.h) reads the same distribution to decide
// which drafts to keep.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace pulse::decoder {

struct SamplerParams {
    double temperature = 0;  // <= 0: greedy
    int64_t top_k = 0;       // 0: off
    double top_p = 1, min_p = 0;
    uint64_t seed = 0;
};

// top-k, then temperature, min-p and top-p over the softmax, then a draw from a seeded RNG.
class Sampler {
public:
    explicit Sampler(SamplerParams p) : p_(p), rng_(p.seed) {}
    int32_t sample(const float* logits, int64_t n);

    // What sample() draws from (not greedy): the kept tokens, most likely first, with their
    // weights (proportional to the probabilities; `total` is their sum).
    struct Distribution {
        std::vector<int32_t> ids;
        std::vector<double> weight;
        double total = 0;
        double probability(int32_t id) const;
    };
    bool greedy() const { return p_.temperature <= 0; }
    Distribution distribution(const float* logits, int64_t n) const;
    int32_t draw(const Distribution& d);
    double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }

private:
    SamplerParams p_;
    std::mt19937_64 rng_;
};

}  // namespace pulse::decoder
