// Process-wide metrics: counters, gauges and histograms with label sets, exported as
// Prometheus text (GET /metrics) or JSON (Accept: application/json).
//
// Cheap on the hot path: a metric is looked up once (by name + labels) and then updated with
// atomics; the registry lock is taken only to create a series or to render.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace pulse::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
public:
    void add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
    uint64_t value() const { return v_.load(std::memory_order_relaxed); }

private:
    std::atomic<uint64_t> v_{0};
};

class Gauge {
public:
    void add(int64_t n) { v_.fetch_add(n, std::memory_order_relaxed); }
    void set(int64_t n) { v_.store(n, std::memory_order_relaxed); }
    int64_t value() const { return v_.load(std::memory_order_relaxed); }

private:
    std::atomic<int64_t> v_{0};
};

class Histogram {
public:
    explicit Histogram(std::vector<double> bounds);
    void observe(double v);
    const std::vector<double>& bounds() const { return bounds_; }
    // Cumulative counts per bound (+Inf last), sum, count.
    std::vector<uint64_t> cumulative() const;
    double sum() const;
    uint64_t count() const { return count_.load(std::memory_order_relaxed); }

private:
    std::vector<double> bounds_;
    std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bound, plus +Inf
    std::atomic<uint64_t> count_{0};
    std::atomic<uint64_t> sum_micro_{0};  // sum in millionths, to stay lock-free
};

// Bounds in seconds for latency histograms (1 ms .. 10 min).
std::vector<double> latency_bounds();

class Registry {
public:
    Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
    Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
    Histogram& histogram(const std::string& name, const std::string& help, const Labels& labels = {},
                         const std::vector<double>& bounds = latency_bounds());

    std::string prometheus() const;
    std::string json() const;

private:
    enum class Kind { counter, gauge, histogram };
    struct Family {
        Kind kind;
        std::string help;
        std::map<Labels, std::unique_ptr<Counter>> counters;
        std::map<Labels, std::unique_ptr<Gauge>> gauges;
        std::map<Labels, std::unique_ptr<Histogram>> histograms;
    };
    Family& family(const std::string& name, Kind kind, const std::string& help);

    mutable std::mutex mutex_;
    std::map<std::string, Family> families_;
};

// The process registry.
Registry& global();

}  // namespace pulse::metrics
