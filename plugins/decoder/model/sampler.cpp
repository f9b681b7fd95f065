#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pulse::decoder {

int32_t Sampler::sample(const float* logits, int64_t n) {
    if (greedy()) return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
    return draw(distribution(logits, n));
}

Sampler::Distribution Sampler::distribution(const float* logits, int64_t n) const {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    size_t keep = p_.top_k > 0 ? std::min<size_t>(idx.size(), static_cast<size_t>(p_.top_k)) : idx.size();
    std::vector<double> prob(keep);
    double mx = logits[idx[0]], sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) / p_.temperature);
    for (auto& p : prob) p /= sum;
    if (p_.min_p > 0) {
        size_t k = 1;
        while (k < keep && prob[k] >= p_.min_p * prob[0]) ++k;
        keep = k;
    }
    if (p_.top_p < 1) {
        double acc = 0;
        size_t k = 0;
        while (k < keep) {
            acc += prob[k++];
            if (acc >= p_.top_p) break;
        }
        keep = k;
    }
    Distribution d;
    d.ids.assign(idx.begin(), idx.begin() + static_cast<long>(keep));
    d.weight.assign(prob.begin(), prob.begin() + static_cast<long>(keep));
    for (double w : d.weight) d.total += w;
    return d;
}

double Sampler::Distribution::probability(int32_t id) const {
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] == id) return total > 0 ? weight[i] / total : 0;
    return 0;
}

int32_t Sampler::draw(const Distribution& d) {
    double r = std::uniform_real_distribution<double>(0, d.total)(rng_);
    for (size_t i = 0; i < d.ids.size(); ++i) {
        r -= d.weight[i];
        if (r <= 0) return d.ids[i];
    }
    // Rounding left a little: the last token with weight (a removed draft has none).
    for (size_t i = d.ids.size(); i-- > 0;)
        if (d.weight[i] > 0) return d.ids[i];
    return d.ids.back();
}

}  // namespace pulse::decoder
