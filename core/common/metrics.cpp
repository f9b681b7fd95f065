#include "common/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace pulse::metrics {
namespace {

std::string escape_label(const std::string& v) {
    std::string o;
    for (char c : v) {
        if (c == '\\' || c == '"') o += '\\';
        if (c == '\n') {
            o += "\\n";
            continue;
        }
        o += c;
    }
    return o;
}

std::string labels_text(const Labels& l, const std::string& extra = {}) {
    if (l.empty() && extra.empty()) return {};
    std::string o = "{";
    for (size_t i = 0; i < l.size(); ++i) o += (i ? "," : "") + l[i].first + "=\"" + escape_label(l[i].second) + "\"";
    if (!extra.empty()) o += (l.empty() ? "" : ",") + extra;
    return o + "}";
}

std::string num(double v) {
    if (std::isinf(v)) return "+Inf";
    if (std::isnan(v)) return "NaN";
    // The shortest text that reads back as the same double: 0.0025, not 0.0025000000000000001.
    char b[32];
    auto r = std::to_chars(b, b + sizeof b, v);
    return std::string(b, r.ptr);
}

std::string json_str(const std::string& s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
        else if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else o += static_cast<char>(c);
    }
    return o + "\"";
}

std::string labels_json(const Labels& l) {
    std::string o = "{";
    for (size_t i = 0; i < l.size(); ++i) o += (i ? "," : "") + json_str(l[i].first) + ":" + json_str(l[i].second);
    return o + "}";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
    for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i] = 0;
}

void Histogram::observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_micro_.fetch_add(static_cast<uint64_t>(std::llround(std::max(0.0, v) * 1e6)), std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulative() const {
    std::vector<uint64_t> out(bounds_.size() + 1);
    uint64_t acc = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) out[i] = acc += buckets_[i].load(std::memory_order_relaxed);
    return out;
}

double Histogram::sum() const { return static_cast<double>(sum_micro_.load(std::memory_order_relaxed)) / 1e6; }

std::vector<double> latency_bounds() {
    return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

Registry::Family& Registry::family(const std::string& name, Kind kind, const std::string& help) {
    auto [it, inserted] = families_.try_emplace(name);
    if (inserted) {
        it->second.kind = kind;
        it->second.help = help;
    } else if (it->second.kind != kind) {
        throw std::logic_error("metric " + name + " registered with two kinds");
    }
    return it->second;
}

Counter& Registry::counter(const std::string& name, const std::string& help, const Labels& labels) {
    std::lock_guard lock(mutex_);
    auto& slot = family(name, Kind::counter, help).counters[labels];
    if (!slot) slot = std::make_unique<Counter>();
    return *slot;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
    std::lock_guard lock(mutex_);
    auto& slot = family(name, Kind::gauge, help).gauges[labels];
    if (!slot) slot = std::make_unique<Gauge>();
    return *slot;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help, const Labels& labels,
                               const std::vector<double>& bounds) {
    std::lock_guard lock(mutex_);
    auto& slot = family(name, Kind::histogram, help).histograms[labels];
    if (!slot) slot = std::make_unique<Histogram>(bounds);
    return *slot;
}

std::string Registry::prometheus() const {
    std::lock_guard lock(mutex_);
    std::string o;
    for (const auto& [name, f] : families_) {
        static const char* kinds[] = {"counter", "gauge", "histogram"};
        o += "# HELP " + name + " " + f.help + "\n# TYPE " + name + " " + kinds[static_cast<int>(f.kind)] + "\n";
        for (const auto& [l, c] : f.counters) o += name + labels_text(l) + " " + std::to_string(c->value()) + "\n";
        for (const auto& [l, g] : f.gauges) o += name + labels_text(l) + " " + std::to_string(g->value()) + "\n";
        for (const auto& [l, h] : f.histograms) {
            auto cum = h->cumulative();
            for (size_t i = 0; i < cum.size(); ++i) {
                double le = i < h->bounds().size() ? h->bounds()[i] : INFINITY;
                o += name + "_bucket" + labels_text(l, "le=\"" + num(le) + "\"") + " " + std::to_string(cum[i]) + "\n";
            }
            o += name + "_sum" + labels_text(l) + " " + num(h->sum()) + "\n";
            o += name + "_count" + labels_text(l) + " " + std::to_string(h->count()) + "\n";
        }
    }
    return o;
}

std::string Registry::json() const {
    std::lock_guard lock(mutex_);
    std::string o = "{";
    bool first_family = true;
    for (const auto& [name, f] : families_) {
        static const char* kinds[] = {"counter", "gauge", "histogram"};
        o += (first_family ? "" : ",") + json_str(name) + ":{\"type\":\"" + kinds[static_cast<int>(f.kind)] + "\",\"help\":" +
             json_str(f.help) + ",\"series\":[";
        first_family = false;
        bool first = true;
        auto sep = [&] {
            std::string s = first ? "" : ",";
            first = false;
            return s;
        };
        for (const auto& [l, c] : f.counters) o += sep() + "{\"labels\":" + labels_json(l) + ",\"value\":" + std::to_string(c->value()) + "}";
        for (const auto& [l, g] : f.gauges) o += sep() + "{\"labels\":" + labels_json(l) + ",\"value\":" + std::to_string(g->value()) + "}";
        for (const auto& [l, h] : f.histograms) {
            auto cum = h->cumulative();
            o += sep() + "{\"labels\":" + labels_json(l) + ",\"count\":" + std::to_string(h->count()) + ",\"sum\":" + num(h->sum()) +
                 ",\"buckets\":[";
            for (size_t i = 0; i < cum.size(); ++i) {
                double le = i < h->bounds().size() ? h->bounds()[i] : INFINITY;
                o += (i ? "," : "") + std::string("{\"le\":") + (std::isinf(le) ? "\"+Inf\"" : num(le)) + ",\"count\":" + std::to_string(cum[i]) + "}";
            }
            o += "]}";
        }
        o += "]}";
    }
    return o + "}";
}

Registry& global() {
    static Registry* r = new Registry();  // never destroyed: threads may still count at exit
    return *r;
}

}  // namespace pulse::metrics
