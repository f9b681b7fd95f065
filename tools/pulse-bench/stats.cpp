#include "pulse-bench/stats.h"

#include <algorithm>
#include <cmath>

namespace pulse::bench {

namespace {
double median_of(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}
}  // namespace

Summary summarize(const std::vector<double>& xs) {
    Summary s;
    s.n = xs.size();
    if (xs.empty()) return s;
    double sum = 0;
    for (double x : xs) sum += x;
    s.mean = sum / static_cast<double>(xs.size());
    double sq = 0;
    for (double x : xs) sq += (x - s.mean) * (x - s.mean);
    s.stdev = xs.size() > 1 ? std::sqrt(sq / static_cast<double>(xs.size() - 1)) : 0;  // sample stdev
    s.min = *std::min_element(xs.begin(), xs.end());
    s.max = *std::max_element(xs.begin(), xs.end());
    s.median = median_of(xs);
    std::vector<double> dev;
    for (double x : xs) dev.push_back(std::fabs(x - s.median));
    double mad = 1.4826 * median_of(dev);  // consistent with stdev for normal data
    if (xs.size() >= 3 && mad > 0)
        for (size_t i = 0; i < xs.size(); ++i)
            if (std::fabs(xs[i] - s.median) > 3 * mad) s.outliers.push_back(i);
    return s;
}

double pass_at_k(int n, int c, int k) {
    if (k <= 0 || k > n || c < 0 || c > n) return -1;
    if (n - c < k) return 1.0;
    double prod = 1.0;
    for (int i = n - c + 1; i <= n; ++i) prod *= 1.0 - static_cast<double>(k) / i;
    return 1.0 - prod;
}

}  // namespace pulse::bench
