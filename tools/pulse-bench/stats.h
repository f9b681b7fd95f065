// Summary statistics and estimators for `pulse bench`.
#pragma once

#include <cstddef>
#include <vector>

namespace pulse::bench {

struct Summary {
    size_t n = 0;
    double mean = 0, median = 0, stdev = 0, min = 0, max = 0;
    // Indexes of samples more than 3 scaled MADs from the median (robust to the outlier itself).
    std::vector<size_t> outliers;
};

Summary summarize(const std::vector<double>& xs);

// Unbiased pass@k for one problem with n samples of which c passed: 1 - C(n-c, k) / C(n, k),
// computed as a product (HumanEval's estimator). k > n is undefined: returns -1.
double pass_at_k(int n, int c, int k);

}  // namespace pulse::bench
