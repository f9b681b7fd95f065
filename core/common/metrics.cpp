#include "common/metrics.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

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
    rapidjson::StringBuffer buf;
    rapidjson::Writer<rapidjson::StringBuffer> w(buf);
    auto str = [&](const std::string& v) { w.String(v.c_str(), static_cast<rapidjson::SizeType>(v.size())); };
    auto number = [&](double v) { std::isfinite(v) ? w.Double(v) : w.Null(); };  // JSON has no NaN or infinity
    auto labels = [&](const Labels& l) {
        w.Key("labels");
        w.StartObject();
        for (const auto& [k, v] : l) {
            w.Key(k.c_str(), static_cast<rapidjson::SizeType>(k.size()));
            str(v);
        }
        w.EndObject();
    };
    static const char* kinds[] = {"counter", "gauge", "histogram"};
    w.StartObject();
    for (const auto& [name, f] : families_) {
        w.Key(name.c_str(), static_cast<rapidjson::SizeType>(name.size()));
        w.StartObject();
        w.Key("type");
        w.String(kinds[static_cast<int>(f.kind)]);
        w.Key("help");
        str(f.help);
        w.Key("series");
        w.StartArray();
        for (const auto& [l, c] : f.counters) {
            w.StartObject();
            labels(l);
            w.Key("value");
            w.Uint64(c->value());
            w.EndObject();
        }
        for (const auto& [l, g] : f.gauges) {
            w.StartObject();
            labels(l);
            w.Key("value");
            w.Int64(g->value());
            w.EndObject();
        }
        for (const auto& [l, h] : f.histograms) {
            w.StartObject();
            labels(l);
            w.Key("count");
            w.Uint64(h->count());
            w.Key("sum");
            number(h->sum());
            w.Key("buckets");
            w.StartArray();
            const auto cum = h->cumulative();
            for (size_t i = 0; i < cum.size(); ++i) {
                w.StartObject();
                w.Key("le");
                if (i < h->bounds().size()) number(h->bounds()[i]);
                else w.String("+Inf");
                w.Key("count");
                w.Uint64(cum[i]);
                w.EndObject();
            }
            w.EndArray();
            w.EndObject();
        }
        w.EndArray();
        w.EndObject();
    }
    w.EndObject();
    return {buf.GetString(), buf.GetSize()};
}

Registry& global() {
    static Registry* r = new Registry();  // never destroyed: threads may still count at exit
    return *r;
}

}  // namespace pulse::metrics
