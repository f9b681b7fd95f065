// Memory read bandwidth with N threads (tools/bench/decoder's decode bound): each thread sums
// its slice of a 1 GiB buffer, many times larger than any cache; the best of 5 passes.
//   membw THREADS  ->  prints GB/s (10^9 bytes per second)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
    const size_t words = (size_t{1} << 30) / 8;
    std::vector<uint64_t> buf(words, 1);  // written once: the pages are real
    double best = 0;
    volatile uint64_t sink = 0;
    for (int pass = 0; pass < 5; ++pass) {
        std::vector<std::thread> ts;
        std::vector<uint64_t> sums(static_cast<size_t>(threads));
        auto t0 = std::chrono::steady_clock::now();
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] {
                const size_t lo = words / threads * t, hi = t + 1 == threads ? words : words / threads * (t + 1);
                uint64_t a = 0, b = 0, c = 0, d = 0;  // four chains: loads, not adds, are the limit
                for (size_t i = lo; i + 4 <= hi; i += 4) a += buf[i], b += buf[i + 1], c += buf[i + 2], d += buf[i + 3];
                sums[static_cast<size_t>(t)] = a + b + c + d;
            });
        for (auto& t : ts) t.join();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (auto x : sums) sink = sink + x;
        best = std::max(best, static_cast<double>(words * 8) / s / 1e9);
    }
    std::printf("%.1f\n", best);
    return 0;
}
