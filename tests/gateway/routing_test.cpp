// Routing policies (models.X.routing): which endpoint a conversation's requests start at.
// Real processes on loopback; every wait is bounded.
#include <doctest/doctest.h>

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/ServerSocket.h>

#include <map>
#include <set>
#include <thread>

#include "support/gateway_harness.h"

using namespace pulse::test;

namespace {

const char* kFast = "keepalive_s = 0.3\nconnect_timeout_s = 1\nhealth_interval_s = 0.2\nretry_window_s = 5\n";

std::string model_toml(const std::string& routing, const std::vector<std::pair<std::string, double>>& endpoints) {
    std::string t = "[models.m]\nprofile = \"qwen38\"\nrouting = \"" + routing + "\"\n";
    for (size_t i = 0; i < endpoints.size(); ++i)
        t += "[[models.m.endpoints]]\nname = \"ep" + std::to_string(i) + "\"\nurl = \"" + endpoints[i].first + "\"\nweight = " +
             std::to_string(endpoints[i].second) + "\n";
    return t;
}

// Turn `turn` (1-based) of conversation `c`: the history grows, the key stays.
std::string turn_body(int c, int turn, bool with_key = true) {
    std::string input = R"([{"role":"user","content":"conversation )" + std::to_string(c) + R"( starts"})";
    for (int t = 2; t <= turn; ++t)
        input += R"(,{"role":"assistant","content":[{"type":"output_text","text":"ok"}]},{"role":"user","content":"turn )" +
                 std::to_string(t) + R"("})";
    input += "]";
    std::string key = with_key ? R"(,"prompt_cache_key":"conv-)" + std::to_string(c) + "\"" : "";
    return R"({"model":"m","stream":false,"store":false,"input":)" + input + key + "}";
}

// How many requests of conversation `c` a record map holds (no insertion, unlike operator[]).
int seen(const std::map<int, int>& m, int c) {
    auto it = m.find(c);
    return it == m.end() ? 0 : it->second;
}

// Which conversations (by their first message) a backend's record holds, and how many times.
std::map<int, int> conversations_seen(const std::string& record) {
    std::map<int, int> out;
    std::smatch m;
    std::istringstream in(record);
    for (std::string line; std::getline(in, line);)
        if (line.find("\"max_tokens\":1,") == std::string::npos && line.find("\"max_tokens\":1}") == std::string::npos &&
            std::regex_search(line, m, std::regex(R"(conversation (\d+) starts)")))
            ++out[std::stoi(m[1])];
    return out;
}

// A fake backend on a fixed port that can be stopped and started again (its cache then empty).
struct Restartable {
    TempDir tmp;
    uint16_t port = free_port();
    std::filesystem::path script, record;
    std::unique_ptr<Child> child;
    explicit Restartable(const std::string& s) : script(tmp.write("s.json", s)), record(tmp / "requests.jsonl") { start(); }
    void start() {
        child = std::make_unique<Child>(std::vector<std::string>{env_or_fail("PULSE_FAKE_VLLM"), "--script", script.string(), "--port",
                                                                 std::to_string(port), "--record", record.string()});
        wait_for([&] { return child->stdout_so_far(); }, std::regex("listening on (127)"));
    }
    void stop() { child.reset(); }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port) + "/v1"; }
    std::string log() const { return read_file(record); }
};

}  // namespace

TEST_CASE("sticky: every turn of a conversation starts at one endpoint; endpoints share conversations by weight") {
    FakeBackend a(R"({"turns":[{"content":"ok"}]})"), b(R"({"turns":[{"content":"ok"}]})");
    Gateway gw(model_toml("sticky", {{a.url(), 3}, {b.url(), 1}}), "", kFast, "[warmup]\nenabled = false\n");
    const int n = 40;
    for (int turn = 1; turn <= 3; ++turn)
        for (int c = 0; c < n; ++c) REQUIRE(post(gw.port, "/v1/responses", turn_body(c, turn)).status == 200);
    auto on_a = conversations_seen(a.log()), on_b = conversations_seen(b.log());
    CAPTURE(on_a.size());
    CAPTURE(on_b.size());
    for (int c = 0; c < n; ++c) {
        CAPTURE(c);
        CHECK(on_a.count(c) + on_b.count(c) == 1);  // one endpoint per conversation, never both
        CHECK(seen(on_a, c) + seen(on_b, c) == 3);              // and every turn of it there
    }
    // Weight 3 : 1 -> about 30 of 40 (the hash is deterministic: this split is fixed, not random).
    CHECK(on_a.size() >= 24);
    CHECK(on_a.size() <= 36);
    CHECK(get(gw.port, "/metrics").find("pulse_sticky_moved_total") == std::string::npos);  // nobody moved
}

TEST_CASE("sticky without prompt_cache_key: the instructions and first user message keep a conversation together") {
    FakeBackend a(R"({"turns":[{"content":"ok"}]})"), b(R"({"turns":[{"content":"ok"}]})");
    Gateway gw(model_toml("sticky", {{a.url(), 1}, {b.url(), 1}}), "", kFast, "[warmup]\nenabled = false\n");
    for (int turn = 1; turn <= 3; ++turn)
        for (int c = 0; c < 16; ++c) REQUIRE(post(gw.port, "/v1/responses", turn_body(c, turn, false)).status == 200);
    auto on_a = conversations_seen(a.log()), on_b = conversations_seen(b.log());
    CHECK(!on_a.empty());
    CHECK(!on_b.empty());
    for (int c = 0; c < 16; ++c) {
        CAPTURE(c);
        CHECK(seen(on_a, c) + seen(on_b, c) == 3);
        CHECK((seen(on_a, c) == 0 || seen(on_b, c) == 0));
    }
}

TEST_CASE("sticky: only a down endpoint's conversations move, they come back when it returns, warmed by a replay of just theirs") {
    Restartable a(R"({"prefix_cache":true,"turns":[{"content":"ok"}]})"), b(R"({"prefix_cache":true,"turns":[{"content":"ok"}]})");
    Gateway gw(model_toml("sticky", {{a.url(), 1}, {b.url(), 1}}), "", kFast);
    const int n = 12;
    for (int c = 0; c < n; ++c) REQUIRE(post(gw.port, "/v1/responses", turn_body(c, 1)).status == 200);
    const auto home_a = conversations_seen(a.log()), home_b = conversations_seen(b.log());
    REQUIRE(home_a.size() >= 2);  // fixed by the hash; both endpoints have conversations
    REQUIRE(home_b.size() >= 2);
    REQUIRE(home_a.size() + home_b.size() == n);

    a.stop();
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") != std::string::npos; }));
    for (int c = 0; c < n; ++c) REQUIRE(post(gw.port, "/v1/responses", turn_body(c, 2)).status == 200);
    auto on_b = conversations_seen(b.log());
    for (int c = 0; c < n; ++c) CHECK(seen(on_b, c) == (home_b.count(c) ? 2 : 1));  // b's own stayed; a's came over
    CHECK(get(gw.port, "/metrics").find(R"(pulse_sticky_moved_total{model="m"} )" + std::to_string(home_a.size())) != std::string::npos);

    // a returns with an empty cache: the warmer replays a's conversations there, and only those.
    a.start();
    REQUIRE(eventually([&] { return gw.log().find("replaying " + std::to_string(home_a.size()) + " prompt prefixes") != std::string::npos; }));
    REQUIRE(eventually([&] { return gw.log().find(std::to_string(home_a.size()) + " warm requests completed") != std::string::npos; }));
    for (int c = 0; c < n; ++c) REQUIRE(post(gw.port, "/v1/responses", turn_body(c, 3)).status == 200);
    auto a_after = conversations_seen(a.log());
    for (int c = 0; c < n; ++c) {
        CAPTURE(c);
        if (home_a.count(c)) CHECK(seen(a_after, c) == 2);  // turn 1 and turn 3: back home
        else CHECK(a_after.count(c) == 0);
    }
}

TEST_CASE("round_robin: consecutive requests rotate over the healthy endpoints") {
    FakeBackend a(R"({"turns":[{"content":"ok"}]})"), b(R"({"turns":[{"content":"ok"}]})"), c(R"({"turns":[{"content":"ok"}]})");
    Gateway gw(model_toml("round_robin", {{a.url(), 1}, {b.url(), 1}, {c.url(), 1}}), "", kFast, "[warmup]\nenabled = false\n");
    for (int i = 0; i < 9; ++i) REQUIRE(post(gw.port, "/v1/responses", turn_body(i, 1)).status == 200);
    CHECK(a.requests().size() == 3);
    CHECK(b.requests().size() == 3);
    CHECK(c.requests().size() == 3);
}

TEST_CASE("last resort: serves only while every other endpoint is down or past the window, marked; servers take over again") {
    Restartable srv(R"({"turns":[{"content":"from the server"}]})");
    std::string models = "[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nname = \"server\"\nurl = \"" + srv.url() +
                         "\"\n[[models.m.endpoints]]\nname = \"local\"\nurl = \"plugin://example-echo\"\nlast_resort = true\n"
                         "options = { prefix = \"local: \" }\n";
    Gateway gw(models, "", std::string(kFast), "[warmup]\nenabled = false\n");
    auto ask = [&](bool stream) {
        return post(gw.port, "/v1/responses", R"({"model":"m","stream":)" + std::string(stream ? "true" : "false") + R"(,"input":"hi"})");
    };
    auto r = ask(false);
    CHECK(r.status == 200);
    CHECK(r.body.find("from the server") != std::string::npos);
    CHECK(r.fallback.empty());

    srv.stop();
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") != std::string::npos; }));
    for (bool stream : {false, true}) {
        CAPTURE(stream);
        auto t0 = std::chrono::steady_clock::now();
        r = ask(stream);
        CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 2);  // not after the 5 s window
        CHECK(r.status == 200);
        CHECK(r.body.find("local: hi") != std::string::npos);
        CHECK(r.fallback == "last-resort; endpoint=local");
    }
    CHECK(get(gw.port, "/metrics").find(R"(pulse_last_resort_requests_total{model="m",endpoint="local",reason="all_down"} 2)") != std::string::npos);
    CHECK(gw.log().find("served by the last-resort endpoint local: every other endpoint is down") != std::string::npos);

    srv.start();  // the server is back: it serves again
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") == std::string::npos; }));
    r = ask(false);
    CHECK(r.body.find("from the server") != std::string::npos);
    CHECK(r.fallback.empty());
}

TEST_CASE("last resort after the retry window: a server that answers its probe but fails every request") {
    FakeBackend sick(R"({"turns":[{"status":503}]})");
    std::string models = "[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nname = \"server\"\nurl = \"" + sick.url() +
                         "\"\n[[models.m.endpoints]]\nname = \"local\"\nurl = \"plugin://example-echo\"\nlast_resort = true\n";
    Gateway gw(models, "", "keepalive_s = 0.3\nconnect_timeout_s = 1\nhealth_interval_s = 0.2\nretry_window_s = 0.5\n",
               "[warmup]\nenabled = false\n");
    auto t0 = std::chrono::steady_clock::now();
    auto r = post(gw.port, "/v1/responses", R"({"model":"m","stream":false,"input":"still here"})");
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(took >= 0.45);  // the server had the whole window first (three rounds)
    CHECK(r.status == 200);
    CHECK(r.body.find("echo: still here") != std::string::npos);
    CHECK(r.fallback == "last-resort; endpoint=local");
    CHECK(get(gw.port, "/metrics").find(R"(reason="window_spent"} 1)") != std::string::npos);
    CHECK(sick.requests().size() >= 2);
}
