// The status page's data (/status.json) and its access rules, against the real gateway and the
// fake backend. The page itself is tested in a browser by tests/e2e/status_page.sh.
#include <doctest/doctest.h>

#include <csignal>
#include <fstream>
#include <future>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "support/gateway_harness.h"

using namespace pulse::test;

namespace {

const char* kFast = "keepalive_s = 0.3\nconnect_timeout_s = 5\nhealth_interval_s = 0.2\n";

std::string model_toml(const std::vector<std::string>& urls) {
    std::string t = "[models.m]\nprofile = \"qwen38\"\n";
    for (size_t i = 0; i < urls.size(); ++i)
        t += "[[models.m.endpoints]]\nname = \"ep" + std::to_string(i) + "\"\nurl = \"" + urls[i] + "\"\n";
    return t;
}

std::string request(const std::string& input) {
    return R"({"model":"m","stream":true,"store":false,"input":")" + input + R"("})";
}

rapidjson::Document status(uint16_t port) {
    int code = 0;
    std::string body = get(port, "/status.json", &code);
    REQUIRE(code == 200);
    rapidjson::Document d;
    d.Parse(body.c_str());
    REQUIRE_MESSAGE(d.IsObject(), body);
    return d;
}

// Polls /status.json (bounded: `ms`) until `pred` holds for it; returns the document.
template <class P>
rapidjson::Document status_until(uint16_t port, P pred, int ms = 5000) {
    for (int waited = 0;; waited += 20) {
        auto d = status(port);
        if (pred(d)) return d;
        if (waited >= ms) {
            rapidjson::StringBuffer b;
            rapidjson::Writer<rapidjson::StringBuffer> w(b);
            d.Accept(w);
            FAIL("condition not met within " << ms << " ms; last /status.json: " << b.GetString());
            return d;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

std::string phase_of_first(const rapidjson::Document& d) {
    const auto& r = d["requests"];
    return r.Size() ? r[0]["phase"].GetString() : "";
}

int64_t sum(const rapidjson::Value& a) {
    int64_t n = 0;
    for (const auto& v : a.GetArray()) n += v.GetInt64();
    return n;
}

}  // namespace

TEST_CASE("/status.json: a stream's phase and tokens while it runs, its accounting once it ended, rates; no prompt text") {
    FakeBackend be(R"({"turns":[{"first_delay_ms":900,"delay_ms":120,"content":"one two three four five six seven eight",
                      "usage":{"prompt_tokens":300,"completion_tokens":8,"cached_tokens":256}}]})");
    Gateway gw(model_toml({be.url()}), "", kFast);
    auto done = std::async(std::launch::async, [&] { return post(gw.port, "/v1/responses", request("TOP-SECRET-4411 what now")); });

    auto d = status_until(gw.port, [](const auto& d) { return phase_of_first(d) == "prefilling"; });
    CHECK(std::string(d["requests"][0]["endpoint"].GetString()) == "ep0");
    CHECK(std::string(d["requests"][0]["model"].GetString()) == "m");
    CHECK(d["requests"][0]["stream"].GetBool());
    CHECK(d["requests"][0]["output_tokens"].GetInt64() == 0);
    CHECK(d["models"][0]["in_flight"].GetInt() == 1);

    d = status_until(gw.port, [](const auto& d) { return phase_of_first(d) == "generating" && d["requests"][0]["output_tokens"].GetInt64() >= 2; });
    CHECK(d["requests"][0]["ttft_ms"].GetInt64() >= 800);
    CHECK(d["requests"][0].HasMember("tokens_per_s"));

    auto r = done.get();
    REQUIRE(r.status == 200);
    d = status_until(gw.port, [](const auto& d) { return d["requests"].Size() == 0 && d["recent"].Size() == 1; });
    const auto& rec = d["recent"][0];
    CHECK(std::string(rec["outcome"].GetString()) == "completed");
    CHECK(std::string(rec["endpoint"].GetString()) == "ep0");
    CHECK(rec["input_tokens"].GetInt64() == 300);
    CHECK(rec["cached_tokens"].GetInt64() == 256);
    CHECK(rec["output_tokens"].GetInt64() == 8);
    CHECK(rec["ttft_ms"].GetInt64() >= 800);
    CHECK(rec["resumes"].GetInt64() == 0);
    CHECK(rec["reasoning_budget"].IsNull());

    REQUIRE(d["rates"]["series"].Size() == 1);
    const auto& s = d["rates"]["series"][0];
    CHECK(std::string(s["endpoint"].GetString()) == "ep0");
    CHECK(s["tokens"].Size() == 120);
    CHECK(sum(s["tokens"]) == 8);
    CHECK(sum(s["requests"]) == 1);
    CHECK(sum(s["errors"]) == 0);

    const std::string raw = get(gw.port, "/status.json");
    CHECK(raw.find("TOP-SECRET-4411") == std::string::npos);
    CHECK(raw.find("what now") == std::string::npos);
}

TEST_CASE("/status.json: waiting for an endpoint, then failed over; a resume is one resume, not a failover too") {
    SUBCASE("waiting") {
        FakeBackend be(R"({"fail_first":4,"turns":[{"content":"back"}]})");
        Gateway gw(model_toml({be.url()}), "", std::string(kFast) + "retry_window_s = 20\n");
        auto done = std::async(std::launch::async, [&] { return post(gw.port, "/v1/responses", request("hi")); });
        status_until(gw.port, [](const auto& d) { return phase_of_first(d) == "waiting_endpoint"; });
        REQUIRE(done.get().status == 200);
        auto d = status_until(gw.port, [](const auto& d) { return d["recent"].Size() == 1; });
        CHECK(std::string(d["recent"][0]["outcome"].GetString()) == "completed");
        CHECK(d["recent"][0]["failovers"].GetInt64() == 4);  // four rounds started again
    }
    SUBCASE("resume") {
        const std::string script = R"({"turns":[{"reasoning":"thinking it over","content":"alpha beta gamma delta epsilon","die_after":3}]})";
        FakeBackend a(script), b(script);
        Gateway gw(model_toml({a.url(), b.url()}), "", kFast);
        REQUIRE(post(gw.port, "/v1/responses", request("go")).status == 200);
        auto d = status_until(gw.port, [](const auto& d) { return d["recent"].Size() == 1; });
        CHECK(std::string(d["recent"][0]["outcome"].GetString()) == "completed");
        CHECK(d["recent"][0]["resumes"].GetInt64() == 1);
        CHECK(d["recent"][0]["failovers"].GetInt64() == 0);
        CHECK(std::string(d["recent"][0]["endpoint"].GetString()) == "ep1");
        int64_t resumes = 0;
        for (const auto& s : d["rates"]["series"].GetArray()) resumes += sum(s["resumes"]);
        CHECK(resumes == 1);
    }
}

TEST_CASE("status page: served to anyone (it holds no data); /status.json follows /health's key rule") {
    FakeBackend be(R"({"turns":[{"content":"fine"}]})");
    SUBCASE("protect_status") {
        Gateway gw(model_toml({be.url()}), "api_key = \"k-9\"\nprotect_status = true\n", kFast);
        int code = 0;
        get(gw.port, "/status.json", &code);
        CHECK(code == 401);
        get(gw.port, "/health", &code);
        CHECK(code == 401);
        std::string page = get(gw.port, "/", &code);
        CHECK(code == 200);
        CHECK(page.find("<title>Pulse status</title>") != std::string::npos);
        CHECK(page.find("status.json") != std::string::npos);
        CHECK(get(gw.port, "/status", &code) == page);

        Poco::Net::HTTPClientSession s("127.0.0.1", gw.port);
        Poco::Net::HTTPRequest req("GET", "/status.json", Poco::Net::HTTPMessage::HTTP_1_1);
        req.set("Authorization", "Bearer k-9");
        s.sendRequest(req);
        Poco::Net::HTTPResponse resp;
        std::string body((std::istreambuf_iterator<char>(s.receiveResponse(resp))), {});
        CHECK(resp.getStatus() == 200);
        CHECK(body.find("\"models\"") != std::string::npos);
    }
    SUBCASE("default") {
        Gateway gw(model_toml({be.url()}), "api_key = \"k-9\"\n", kFast);
        int code = 0;
        get(gw.port, "/status.json", &code);
        CHECK(code == 200);  // like /health: the key guards /v1 unless protect_status
        Poco::Net::HTTPClientSession s("127.0.0.1", gw.port);
        Poco::Net::HTTPRequest req("GET", "/", Poco::Net::HTTPMessage::HTTP_1_1);
        s.sendRequest(req);
        Poco::Net::HTTPResponse resp;
        s.receiveResponse(resp);
        CHECK(resp.getStatus() == 200);
        CHECK(resp.getContentType().rfind("text/html", 0) == 0);
        const std::string csp = resp.get("Content-Security-Policy", "");
        CHECK(csp.find("default-src 'none'") != std::string::npos);
        CHECK(csp.find("connect-src 'self'") != std::string::npos);
    }
}

TEST_CASE("/status.json: the last reload's result (a refused config, then a good one)") {
    FakeBackend be(R"({"turns":[{"content":"fine"}]})");
    Gateway gw(model_toml({be.url()}), "", kFast);
    CHECK(status(gw.port)["last_reload"].IsNull());
    const std::string good = read_file(gw.config);
    {
        std::ofstream(gw.config) << good << "\n[models.m.nonsense]\nx = 1\n";
    }
    gw.child->signal(SIGHUP);
    auto d = status_until(gw.port, [](const auto& d) { return d["last_reload"].IsObject(); });
    CHECK_FALSE(d["last_reload"]["ok"].GetBool());
    CHECK(std::string(d["last_reload"]["message"].GetString()).find("configuration refused") != std::string::npos);
    {
        std::ofstream(gw.config) << good;
    }
    gw.child->signal(SIGHUP);
    d = status_until(gw.port, [](const auto& d) { return d["last_reload"]["ok"].GetBool(); });
    CHECK(d["config_generation"].GetUint64() == 2);
}

TEST_CASE("/metrics: endpoint state gauges, and the series alerts count exist at zero before the first event") {
    FakeBackend be(R"({"turns":[{"content":"fine"}]})");
    Gateway gw(model_toml({be.url(), "http://127.0.0.1:9/v1"}), "", kFast);
    // The probe of ep1 (nothing listens on port 9) has run within a few health intervals.
    std::string m;
    for (int i = 0; i < 100; ++i) {
        m = get(gw.port, "/metrics");
        if (m.find(R"(pulse_endpoint_up{model="m",endpoint="ep1"} 0)") != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(m.find(R"(pulse_endpoint_up{model="m",endpoint="ep0"} 1)") != std::string::npos);
    CHECK(m.find(R"(pulse_endpoint_up{model="m",endpoint="ep1"} 0)") != std::string::npos);
    CHECK(m.find(R"(pulse_endpoint_in_flight{model="m",endpoint="ep0"} 0)") != std::string::npos);
    for (const char* zero : {R"(pulse_requests_total{model="m",endpoint="-",outcome="unavailable"} 0)", R"(pulse_failovers_total{model="m"} 0)",
                             R"(pulse_retries_total{model="m"} 0)", R"(pulse_resumed_streams_total{model="m",endpoint="ep0"} 0)",
                             "pulse_capacity_rejections_total 0", "pulse_config_reload_failures_total 0", "pulse_plugin_reload_failures_total 0",
                             R"(pulse_ttft_seconds_count{model="m"} 0)"})
        CHECK_MESSAGE(m.find(zero) != std::string::npos, zero);
}

TEST_CASE("/status.json: the in-process decoder's engine report (queue, batch, state and checkpoint memory)") {
    TempDir d;
    Gateway gw("[models.demo]\nprofile = \"qwen38\"\n[[models.demo.endpoints]]\nname = \"local\"\nurl = \"decoder://" + (d / "demo.gguf").string() +
                   "\"\n[models.demo.endpoints.options]\nmake_demo = true\n[models.demo.profile_options]\nthinking = \"off\"\n",
               "", kFast);
    auto r = post(gw.port, "/v1/responses", R"({"model":"demo","stream":true,"store":false,"max_output_tokens":8,"input":"hello there"})");
    REQUIRE(r.status == 200);
    // Once the engine has finished its last step: nothing served, the prompt's state kept for
    // prefix reuse. (The client can see the end of its answer a moment before that step ends.)
    auto doc = status_until(gw.port, [](const auto& d) {
        const auto& e = d["models"][0]["endpoints"][0];
        return e.HasMember("backend") && e["backend"].HasMember("state_bytes") && e["backend"]["steps"].GetInt64() > 0 &&
               e["backend"]["state_bytes"].GetInt64() == 0 && e["backend"]["checkpoint_bytes"].GetInt64() > 0;
    });
    const auto& b = doc["models"][0]["endpoints"][0]["backend"];
    for (const char* k : {"queued", "active", "concurrency", "batch", "peak_batch", "state_bytes", "checkpoint_bytes"}) CHECK_MESSAGE(b.HasMember(k), k);
    CHECK(b["peak_batch"].GetInt64() >= 1);
}

// An in-process endpoint whose model file is not there cannot start; that is no reason to refuse
// to serve the rest (it used to stop `pulse serve` with exit 3). It shows as down with why, its
// model answers 503 at once naming it, and a reload once the file is in place starts it.
TEST_CASE("a decoder endpoint whose model file is missing fails to start: down with why, the other models served, a reload starts it") {
    TempDir d;
    FakeBackend be(R"({"turns":[{"content":"fine"}]})");
    const std::string model = (d / "later.gguf").string();
    Gateway gw("[models.local]\nprofile = \"qwen38\"\n[[models.local.endpoints]]\nname = \"engine\"\nurl = \"decoder://" + model +
                   "\"\n[models.local.profile_options]\nthinking = \"off\"\n[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nname = \"ep0\"\n"
                   "url = \"" + be.url() + "\"\n",
               "", std::string(kFast) + "retry_window_s = 30\n");
    CHECK(gw.log().find("model 'local', endpoint 'engine': failed to start: backend 'decoder': create failed: decoder: cannot open the model " + model +
                        " (No such file or directory)") != std::string::npos);
    auto ok = post(gw.port, "/v1/responses", R"({"model":"m","stream":false,"store":false,"input":"hi"})");
    CHECK(ok.status == 200);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = post(gw.port, "/v1/responses", R"({"model":"local","stream":false,"store":false,"input":"hi"})");
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 3);  // not after the 30 s window
    CHECK(r.status == 503);
    CHECK(r.body.find("engine: failed to start: backend 'decoder': create failed: decoder: cannot open the model") != std::string::npos);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // probes run: it stays down
    const std::string health = get(gw.port, "/health");
    CHECK(health.find("\"last_error\":\"failed to start: backend 'decoder'") != std::string::npos);
    // The file arrives; a reload starts the endpoint.
    auto demo = run({env_or_fail("PULSE_DECODER_EXE"), "gguf", "make-demo", model});
    REQUIRE(demo.code == 0);
    CHECK(post(gw.port, "/admin/reload", "").status == 202);
    CHECK(eventually([&] {
        return post(gw.port, "/v1/responses", R"({"model":"local","stream":false,"store":false,"max_output_tokens":4,"input":"hi"})").status == 200;
    }, 20000));
}
