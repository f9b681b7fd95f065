// Results of `pulse bench`: JSON with full conditions, a table on the terminal, an SVG chart
// (gnuplot), and progress lines for long runs.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <rapidjson/document.h>

#include "pulse-bench/client.h"
#include "pulse-bench/stats.h"

namespace pulse::bench {

std::string now_iso();
std::string git_revision();  // of the pulse build ("unknown" outside a git checkout)

// {"name","base","model","backend":{version, max_model_len, owned_by, root, props}}
rapidjson::Value endpoint_json(const Endpoint& ep, const BackendInfo& info, rapidjson::Document::AllocatorType& a);
rapidjson::Value summary_json(const Summary& s, rapidjson::Document::AllocatorType& a);

// One bar chart: a group per category, a bar per series, optional error bars (stdev).
struct Chart {
    std::string title, ylabel;
    std::vector<std::string> categories;
    struct Series {
        std::string name;
        std::vector<double> values, errors;  // errors empty = none
    };
    std::vector<Series> series;
};

// Writes DIR/STEM.json (pretty) and, when `chart` has data, DIR/STEM.svg through gnuplot
// (its script DIR/STEM.gp and data DIR/STEM.dat stay beside it). Returns what it wrote, one
// line each; a missing gnuplot is said, not fatal.
std::vector<std::string> write_outputs(const std::filesystem::path& dir, const std::string& stem, const rapidjson::Document& doc,
                                       const Chart* chart);

// An aligned text table.
std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
std::string num(double v, int decimals = 1);

// "[3/12] code_edit rep 2, 14 s elapsed, ETA 42 s" on stderr; silent when quiet.
class Progress {
public:
    Progress(size_t total, bool quiet) : total_(total), quiet_(quiet) {}
    void step(const std::string& what);

private:
    size_t total_, done_ = 0;
    bool quiet_;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace pulse::bench
