// The metrics registry's two renderings: Prometheus text and the JSON form (/metrics with
// Accept: application/json), each from the same series.
#include <doctest/doctest.h>
#include <rapidjson/document.h>

#include <string>

#include "common/metrics.h"

using namespace pulse::metrics;

TEST_CASE("JSON: every family with its type, help and series; label values escaped; +Inf as a string") {
    Registry r;
    r.counter("pulse_requests_total", "requests \"by\" outcome", {{"outcome", "ok"}}).add(3);
    r.counter("pulse_requests_total", "requests \"by\" outcome", {{"outcome", "a \"quoted\"\nline\\"}}).add();
    r.gauge("pulse_streams", "streams open").set(-2);
    Histogram& h = r.histogram("pulse_ttft_seconds", "time to first token", {}, {0.1, 1});
    h.observe(0.05);
    h.observe(0.5);
    h.observe(7);
    rapidjson::Document d;
    const std::string text = r.json();
    d.Parse(text.c_str());
    REQUIRE_MESSAGE(d.IsObject(), text);
    const auto& req = d["pulse_requests_total"];
    CHECK(std::string(req["type"].GetString()) == "counter");
    CHECK(std::string(req["help"].GetString()) == "requests \"by\" outcome");
    REQUIRE(req["series"].Size() == 2);
    bool quoted = false;
    for (const auto& s : req["series"].GetArray())
        if (std::string(s["labels"]["outcome"].GetString()) == "a \"quoted\"\nline\\") quoted = s["value"].GetUint64() == 1;
    CHECK(quoted);
    CHECK(d["pulse_streams"]["series"][0]["value"].GetInt64() == -2);
    const auto& t = d["pulse_ttft_seconds"]["series"][0];
    CHECK(t["count"].GetUint64() == 3);
    CHECK(t["sum"].GetDouble() == doctest::Approx(7.55));
    REQUIRE(t["buckets"].Size() == 3);
    CHECK(t["buckets"][0]["le"].GetDouble() == 0.1);
    CHECK(t["buckets"][0]["count"].GetUint64() == 1);
    CHECK(t["buckets"][1]["count"].GetUint64() == 2);
    CHECK(std::string(t["buckets"][2]["le"].GetString()) == "+Inf");
    CHECK(t["buckets"][2]["count"].GetUint64() == 3);
}

TEST_CASE("Prometheus text: label values escaped, cumulative buckets, sum and count") {
    Registry r;
    r.counter("c_total", "a counter", {{"k", "a \"b\"\nc\\"}}).add(2);
    Histogram& h = r.histogram("h_seconds", "a histogram", {}, {1});
    h.observe(0.5);
    h.observe(2);
    const std::string text = r.prometheus();
    CHECK(text.find("c_total{k=\"a \\\"b\\\"\\nc\\\\\"} 2\n") != std::string::npos);
    CHECK(text.find("h_seconds_bucket{le=\"1\"} 1\n") != std::string::npos);
    CHECK(text.find("h_seconds_bucket{le=\"+Inf\"} 2\n") != std::string::npos);
    CHECK(text.find("h_seconds_sum 2.5\n") != std::string::npos);
    CHECK(text.find("h_seconds_count 2\n") != std::string::npos);
}
