// Fault drills: each one asserts that no request is lost. Real processes on loopback; every
// wait is bounded.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/StreamSocket.h>

#include <future>
#include <sstream>
#include <thread>

#include "support/gateway_harness.h"

using namespace pulse::test;
namespace fs = std::filesystem;

namespace {

std::string str(const rapidjson::Value& v, const char* k) { return v.HasMember(k) && v[k].IsString() ? v[k].GetString() : ""; }

std::string model_toml(const std::vector<std::string>& urls, const std::string& model = "m", const std::string& profile = "qwen38") {
    std::string t = "[models." + model + "]\nprofile = \"" + profile + "\"\n";
    for (size_t i = 0; i < urls.size(); ++i)
        t += "[[models." + model + ".endpoints]]\nname = \"ep" + std::to_string(i) + "\"\nurl = \"" + urls[i] + "\"\n";
    return t;
}

std::string request(const std::string& input = "\"hello\"", const std::string& model = "m", const std::string& extra = "") {
    return R"({"model":")" + model + R"(","stream":true,"store":false,"input":)" + input + extra + "}";
}

const char* kFast = "keepalive_s = 0.3\nconnect_timeout_s = 5\nhealth_interval_s = 0.2\n";

}  // namespace

TEST_CASE("retry window: a backend answering 503 recovers inside the window and the turn completes") {
    FakeBackend be(R"({"fail_first":3,"turns":[{"content":"back again"}]})");
    Gateway gw(model_toml({be.url()}), "", std::string(kFast) + "retry_window_s = 20\n");
    auto st = check_stream(post(gw.port, "/v1/responses", request()).body);
    CHECK(st.terminal == "response.completed");
    CHECK(str(st.item(0)["content"][0], "text") == "back again");
    CHECK(get(gw.port, "/metrics").find("pulse_retries_total{model=\"m\"} 3") != std::string::npos);
    // The request that proved the endpoint back is no reason to replay its own conversation
    // there afterwards (the warmer used to when its thread ran late, seen under the sanitizers).
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    CHECK(be.requests().size() == 4);  // three 503s, then served; no warm replay after it
}

TEST_CASE("down longer than the window: response.failed after keepalives (SSE already open)") {
    FakeBackend be(R"({"turns":[{"status":503}]})");
    Gateway gw(model_toml({be.url()}), "", std::string(kFast) + "retry_window_s = 1.5\n");
    auto r = post(gw.port, "/v1/responses", request());
    CHECK(r.status == 200);
    auto st = check_stream(r.body);
    CHECK(st.terminal == "response.failed");
    CHECK(st.keepalives >= 1);
    CHECK(str((*st.response)["error"], "message").find("no backend could take the request within 1 s") != std::string::npos);
    CHECK(be.requests().size() >= 2);
}

TEST_CASE("health: probes take a dead endpoint out of the rotation and bring it back") {
    DeadPort dead;
    uint16_t port_a = dead.port;
    FakeBackend b(R"({"turns":[{"content":"from B"}]})");
    std::string url_a = "http://127.0.0.1:" + std::to_string(port_a) + "/v1";
    Gateway gw(model_toml({url_a, b.url()}), "", std::string(kFast) + "retry_window_s = 0\n");
    int status = 0;
    REQUIRE(eventually([&] { return get(gw.port, "/health", &status).find(R"("state":"down")") != std::string::npos; }));
    CHECK(status == 200);  // the model still has a healthy endpoint
    auto st = check_stream(post(gw.port, "/v1/responses", request()).body);
    CHECK(str(st.item(0)["content"][0], "text") == "from B");
    CHECK(gw.log().find("endpoint ep0 failed") == std::string::npos);  // the dead one was not even tried first

    // A comes up on its port: the probe notices and config order applies again.
    TempDir tmp;
    auto script = tmp.write("a.json", R"({"turns":[{"content":"from A"}]})");
    dead.release();
    Child a({env_or_fail("PULSE_FAKE_VLLM"), "--script", script.string(), "--port", std::to_string(port_a)});
    REQUIRE_MESSAGE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") == std::string::npos; }),
                    get(gw.port, "/health") << "\n" << a.stdout_so_far() << a.stderr_so_far() << gw.log());
    CHECK(gw.log().find("endpoint ep0 (" + url_a + ") is healthy again") != std::string::npos);
    st = check_stream(post(gw.port, "/v1/responses", request()).body);
    CHECK(str(st.item(0)["content"][0], "text") == "from A");
}

TEST_CASE("a llama-server that is still loading is 'loading', and a request waits for it inside the window") {
    // Loading lasts long enough for a slow (sanitizer) gateway start to see it.
    FakeBackend be(R"({"loading_ms":4000,"flavor":"llamacpp","turns":[{"content":"loaded now"}]})", "llamacpp");
    Gateway gw(model_toml({be.url()}, "m", "llamacpp"), "", std::string(kFast) + "retry_window_s = 20\n");
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"loading")") != std::string::npos; }, 8000));
    auto st = check_stream(post(gw.port, "/v1/responses", request()).body);
    CHECK(st.terminal == "response.completed");
    CHECK(str(st.item(0)["content"][0], "text") == "loaded now");
    CHECK(gw.log().find("is loading: the backend is still loading its model") != std::string::npos);
}

TEST_CASE("health: degraded (503) when a model has no healthy endpoint") {
    DeadPort dead;
    Gateway gw(model_toml({"http://127.0.0.1:" + std::to_string(dead.port) + "/v1"}), "", kFast);
    int status = 0;
    REQUIRE(eventually([&] {
        get(gw.port, "/health", &status);
        return status == 503;
    }));
    CHECK(get(gw.port, "/health").find(R"("status":"degraded")") != std::string::npos);
}

TEST_CASE("backend dies mid-stream with resume = false: response.failed, and no retry elsewhere after output") {
    // (With resume on, the default, the response continues elsewhere: gateway/resume_test.cpp.)
    FakeBackend dying(R"({"turns":[{"content":"partial answer that","truncate":true}]})");
    FakeBackend spare(R"({"turns":[{"content":"should not be asked"}]})");
    std::string models = model_toml({dying.url(), spare.url()});
    models.insert(models.find("[[models"), "resume = false\n");
    Gateway gw(models, "", std::string(kFast) + "retry_window_s = 10\n");
    auto st = check_stream(post(gw.port, "/v1/responses", request()).body);
    CHECK(st.terminal == "response.failed");
    CHECK(spare.requests().empty());
}

TEST_CASE("warmup: an endpoint that comes back gets the recorded prefixes replayed, and the next turn hits the cache") {
    for (bool warm : {true, false}) {
        CAPTURE(warm);
        uint16_t port = free_port();
        TempDir tmp;
        auto script = tmp.write("s.json", R"({"prefix_cache":true,"turns":[{"content":"ok"}]})");
        auto state = tmp / "warmup-state.json";
        std::string url = "http://127.0.0.1:" + std::to_string(port) + "/v1";
        auto start_backend = [&] {
            auto c = std::make_unique<Child>(
                std::vector<std::string>{env_or_fail("PULSE_FAKE_VLLM"), "--script", script.string(), "--port", std::to_string(port),
                                         "--record", (tmp / "requests.jsonl").string()});
            wait_for([&] { return c->stdout_so_far(); }, std::regex("listening on (127)"));
            return c;
        };
        auto backend = start_backend();
        Gateway gw(model_toml({url}), "", std::string(kFast) + "retry_window_s = 5\n",
                   "[warmup]\nenabled = " + std::string(warm ? "true" : "false") + "\nstate_file = \"" + state.string() + "\"\n");
        std::string history = R"([{"role":"developer","content":")" + std::string(2000, 'x') + R"("},{"role":"user","content":"turn one"}])";
        auto r1 = check_stream(post(gw.port, "/v1/responses", request(history, "m", R"(,"prompt_cache_key":"thread-1")")).body);
        CHECK(r1.terminal == "response.completed");
        CHECK((*r1.response)["usage"]["input_tokens_details"]["cached_tokens"].GetInt() == 0);  // cold backend

        // The backend restarts (its cache is gone); the gateway sees it down, then back.
        backend.reset();
        REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") != std::string::npos; }));
        backend = start_backend();
        REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") == std::string::npos; }));
        if (warm) {
            REQUIRE(eventually([&] { return gw.log().find("1 warm requests completed") != std::string::npos; }));
            CHECK(get(gw.port, "/metrics").find(R"(pulse_warmup_requests_total{model="m",endpoint="ep0",outcome="ok"} 1)") != std::string::npos);
            // The state file holds prompts: owner-only.
            struct stat sb {};
            REQUIRE(eventually([&] { return ::stat(state.c_str(), &sb) == 0; }));
            CHECK((sb.st_mode & 0777) == 0600);
            CHECK(read_file(state).find("thread-1") != std::string::npos);
        }
        // The next turn of the same conversation.
        std::string history2 = history.substr(0, history.size() - 1) +
                               R"(,{"role":"assistant","content":[{"type":"output_text","text":"ok"}]},{"role":"user","content":"turn two"}])";
        auto r2 = check_stream(post(gw.port, "/v1/responses", request(history2, "m", R"(,"prompt_cache_key":"thread-1")")).body);
        CHECK(r2.terminal == "response.completed");
        int cached = (*r2.response)["usage"]["input_tokens_details"]["cached_tokens"].GetInt();
        if (warm) CHECK(cached > 400);  // the 2,000-character system prompt and more
        else CHECK(cached == 0);
    }
}

TEST_CASE("warmup yields to real traffic: a real request preempts the warm request in flight") {
    uint16_t port = free_port();
    TempDir tmp;
    // Slow answers, so a warm request is still running when the real one arrives.
    auto script = tmp.write("s.json", R"({"turns":[{"content":"one two three four five six","delay_ms":400}]})");
    std::string url = "http://127.0.0.1:" + std::to_string(port) + "/v1";
    auto start_backend = [&] {
        auto c = std::make_unique<Child>(std::vector<std::string>{env_or_fail("PULSE_FAKE_VLLM"), "--script", script.string(), "--port",
                                                                  std::to_string(port), "--record", (tmp / "r.jsonl").string()});
        wait_for([&] { return c->stdout_so_far(); }, std::regex("listening on (127)"));
        return c;
    };
    auto backend = start_backend();
    // No quiet period (warmup.quiet_s): the replays start the moment the backend is back.
    Gateway gw(model_toml({url}), "", std::string(kFast) + "retry_window_s = 10\n", "[warmup]\nquiet_s = 0\n");
    for (int i = 0; i < 3; ++i)  // three conversations to replay
        check_stream(post(gw.port, "/v1/responses", request("\"conversation " + std::to_string(i) + "\"", "m",
                                                            R"(,"prompt_cache_key":"c)" + std::to_string(i) + "\"")).body);
    backend.reset();
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") != std::string::npos; }));
    backend = start_backend();
    REQUIRE(eventually([&] { return gw.log().find("replaying 3 prompt prefixes") != std::string::npos; }));
    // A warm request is running (each takes ~3 s); the real request must not wait for it.
    auto real = check_stream(post(gw.port, "/v1/responses", request("\"real work\"")).body);
    CHECK(real.terminal == "response.completed");
    CHECK(eventually([&] { return get(gw.port, "/metrics").find(R"(outcome="preempted"} 1)") != std::string::npos; }));
}

TEST_CASE("warmup waits for warmup.quiet_s without real traffic: a request right after the recovery goes first") {
    uint16_t port = free_port();
    TempDir tmp;
    auto script = tmp.write("s.json", R"({"turns":[{"content":"ok"}]})");
    auto rec = tmp / "r.jsonl";
    std::string url = "http://127.0.0.1:" + std::to_string(port) + "/v1";
    auto start_backend = [&] {
        auto c = std::make_unique<Child>(std::vector<std::string>{env_or_fail("PULSE_FAKE_VLLM"), "--script", script.string(), "--port",
                                                                  std::to_string(port), "--record", rec.string()});
        wait_for([&] { return c->stdout_so_far(); }, std::regex("listening on (127)"));
        return c;
    };
    auto backend = start_backend();
    Gateway gw(model_toml({url}), "", std::string(kFast) + "retry_window_s = 10\n", "[warmup]\nquiet_s = 1\n");
    check_stream(post(gw.port, "/v1/responses", request("\"the long one\"", "m", R"(,"prompt_cache_key":"a")")).body);
    backend.reset();
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") != std::string::npos; }));
    std::filesystem::remove(rec);
    backend = start_backend();
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") == std::string::npos; }));
    // Three real requests, 0.3 s apart: each restarts the quiet period.
    for (int i = 0; i < 3; ++i) {
        CHECK(check_stream(post(gw.port, "/v1/responses", request("\"real\"", "m", R"(,"prompt_cache_key":"b")")).body).terminal ==
              "response.completed");
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    REQUIRE(eventually([&] { return gw.log().find("1 warm requests completed") != std::string::npos; }));
    // The backend saw the three real requests first, then the replay (max_tokens 1).
    std::vector<std::string> bodies;
    std::istringstream lines(read_file(rec));
    for (std::string line; std::getline(lines, line);)
        if (line.find("\"messages\"") != std::string::npos) bodies.push_back(line);
    REQUIRE(bodies.size() == 4);
    for (int i = 0; i < 3; ++i) CHECK(bodies[i].find("\"max_tokens\":1,") == std::string::npos);
    CHECK(bodies[3].find("\"max_tokens\":1") != std::string::npos);
    CHECK(bodies[3].find("the long one") != std::string::npos);
}

TEST_CASE("warmup state persists across a gateway restart") {
    FakeBackend be(R"({"turns":[{"content":"ok"}]})");
    TempDir tmp;
    auto state = tmp / "state.json";
    std::string warm = "[warmup]\nstate_file = \"" + state.string() + "\"\n";
    {
        Gateway gw(model_toml({be.url()}), "", kFast, warm);
        check_stream(post(gw.port, "/v1/responses", request("\"hi\"", "m", R"(,"prompt_cache_key":"t1")")).body);
        REQUIRE(eventually([&] { return fs::exists(state); }));
        gw.child->signal(SIGTERM);
        CHECK(gw.child->wait(20).code == 0);
    }
    Gateway again(model_toml({be.url()}), "", kFast, warm);
    CHECK(eventually([&] { return again.log().find("loaded 1 prompt prefixes from " + state.string()) != std::string::npos; }));
}

TEST_CASE("warmup state written by an older Pulse (version 1: bodies only) is still replayed") {
    DeadPort dead;
    const uint16_t port = dead.port;
    TempDir tmp;
    auto state = tmp.write("state.json", R"({"version":1,"models":{"m":[{"key":"t-old","body":)"
                                         R"("{\"model\":\"m\",\"stream\":true,\"max_tokens\":500,\"messages\":[{\"role\":\"user\",\"content\":\"kept from before\"}]}"}]}})");
    Gateway gw(model_toml({"http://127.0.0.1:" + std::to_string(port) + "/v1"}), "", std::string(kFast),
               "[warmup]\nquiet_s = 0\nstate_file = \"" + state.string() + "\"\n");
    REQUIRE(eventually([&] { return gw.log().find("loaded 1 prompt prefixes") != std::string::npos; }));
    dead.release();
    FakeBackend be(R"({"turns":[{"content":"ok"}]})", "vllm", port);  // the endpoint comes up: a recovery
    REQUIRE_MESSAGE(eventually([&] { return gw.log().find("1 warm requests completed") != std::string::npos; }), gw.log());
    auto got = be.requests();
    REQUIRE(got.size() == 1);
    CHECK(got[0].find("kept from before") != std::string::npos);
    CHECK(got[0].find("\"max_tokens\":1") != std::string::npos);
}

TEST_CASE("a profile built before SDK 1.4 (no warm_request, no probe_answer): no replays, said once; a probe is read by its status alone") {
    // The host itself knows no server's dialect: llama-server's 503 "Loading model" is "loading"
    // only through a profile that says so (llamacpp does: the test above), not through this one.
    {
        FakeBackend be(R"({"loading_ms":60000,"flavor":"llamacpp","turns":[{"content":"x"}]})", "llamacpp");
        Gateway gw(model_toml({be.url()}, "m", "reloadable"), "", kFast, "", {{"reloadable_v1", "reloadable"}});
        REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") != std::string::npos; }, 8000));
        CHECK(get(gw.port, "/health").find(R"("state":"loading")") == std::string::npos);
        CHECK(gw.log().find("probe GET /v1/models answered HTTP 503") != std::string::npos);
    }
    uint16_t port = free_port();
    auto backend = std::make_unique<FakeBackend>(R"({"turns":[{"content":"ok"}]})", "vllm", port);
    Gateway gw(model_toml({backend->url()}, "m", "reloadable"), "", std::string(kFast) + "retry_window_s = 5\n", "[warmup]\nquiet_s = 0\n",
               {{"reloadable_v1", "reloadable"}});
    CHECK(check_stream(post(gw.port, "/v1/responses", request("\"hello\"", "m", R"(,"prompt_cache_key":"t1")")).body).terminal ==
          "response.completed");
    backend.reset();
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("state":"down")") != std::string::npos; }));
    backend = std::make_unique<FakeBackend>(R"({"turns":[{"content":"ok"}]})", "vllm", port);
    REQUIRE(eventually([&] { return gw.log().find("has no warm_request (SDK < 1.4): no prompts are replayed") != std::string::npos; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(backend->requests().empty());  // nothing replayed
}

TEST_CASE("hot reload of a translation profile with 20 streams in flight") {
    Gateway gw("[models.r]\nprofile = \"reloadable\"\n[[models.r.endpoints]]\nurl = \"plugin://example-echo\"\n"
               "options = { delay_ms = 400 }\n",
               "", kFast, "", {{"reloadable_v1", "reloadable"}});
    fs::path installed = gw.dir / "plugins" / "reloadable.so";
    auto body = [](int i) { return R"({"model":"r","stream":true,"input":"stream number )" + std::to_string(i) + R"("})"; };

    std::vector<std::future<HttpResult>> inflight;
    for (int i = 0; i < 20; ++i) inflight.push_back(std::async(std::launch::async, [&, i] { return post(gw.port, "/v1/responses", body(i)); }));
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("active_requests":20)") != std::string::npos; }));

    // Replace the file in place with v2 (the dangerous way: same path, same inode). The
    // directory watcher triggers the reload; streams keep the generation they started with.
    fs::copy_file(env_or_fail("PULSE_TEST_PLUGIN_DIR") + "/reloadable_v2.so", installed, fs::copy_options::overwrite_existing);
    REQUIRE(eventually([&] { return gw.log().find("reloaded test.reloadable v1 -> generation") != std::string::npos; }));
    auto fresh = check_stream(post(gw.port, "/v1/responses", body(99)).body);
    CHECK(str(fresh.item(0)["content"][0], "text").rfind("[v2] ", 0) == 0);

    int completed_v1 = 0;
    for (auto& f : inflight) {
        auto st = check_stream(f.get().body);
        if (st.terminal == "response.completed" && str(st.item(0)["content"][0], "text").rfind("[v1] echo: stream number", 0) == 0)
            ++completed_v1;
    }
    CHECK(completed_v1 == 20);
    // The old generation is finalised exactly once, after its last stream.
    REQUIRE(eventually([&] { return gw.log().find("reloadable v1: deinit") != std::string::npos; }));
    auto log = gw.log();
    CHECK(log.find("reloadable v1: deinit") == log.rfind("reloadable v1: deinit"));

    // A broken new version is refused and v2 keeps serving.
    fs::copy_file(env_or_fail("PULSE_TEST_PLUGIN_DIR") + "/reloadable_broken.so", installed, fs::copy_options::overwrite_existing);
    REQUIRE(eventually([&] { return gw.log().find("new version not loaded, the old one keeps serving") != std::string::npos; }));
    auto still = check_stream(post(gw.port, "/v1/responses", body(100)).body);
    CHECK(str(still.item(0)["content"][0], "text").rfind("[v2] ", 0) == 0);
    CHECK(get(gw.port, "/metrics").find("pulse_plugin_reload_failures_total 1") != std::string::npos);
    // /health shows the refusal next to the version that keeps serving.
    rapidjson::Document health;
    health.Parse(get(gw.port, "/health").c_str());
    REQUIRE(health.IsObject());
    bool seen = false;
    for (const auto& p : health["plugins"].GetArray()) {
        if (str(p, "id") != "test.reloadable") continue;
        seen = true;
        CHECK(str(p, "state") == "loaded");
        CHECK(str(p, "version") == "v2");
        CHECK(str(p, "reload_refused").find("new version not loaded, the old one keeps serving") != std::string::npos);
    }
    CHECK(seen);
}

TEST_CASE("SIGHUP reloads the configuration: new endpoints for new requests") {
    FakeBackend one(R"({"turns":[{"content":"from one"}]})");
    FakeBackend two(R"({"turns":[{"content":"from two"}]})");
    Gateway gw(model_toml({one.url()}), "", kFast);
    CHECK(str(check_stream(post(gw.port, "/v1/responses", request()).body).item(0)["content"][0], "text") == "from one");
    std::string text = read_file(gw.config);
    text.replace(text.find(one.url()), one.url().size(), two.url());
    std::ofstream(gw.config) << text;
    gw.child->signal(SIGHUP);
    REQUIRE(eventually([&] { return gw.log().find("configuration generation 2 is serving") != std::string::npos; }));
    CHECK(str(check_stream(post(gw.port, "/v1/responses", request()).body).item(0)["content"][0], "text") == "from two");

    // A broken config is refused; the running one keeps serving.
    std::ofstream(gw.config) << text << "\nnonsense = 1\n";
    gw.child->signal(SIGHUP);
    REQUIRE(eventually([&] { return gw.log().find("configuration not reloaded, the previous one keeps serving") != std::string::npos; }));
    CHECK(str(check_stream(post(gw.port, "/v1/responses", request()).body).item(0)["content"][0], "text") == "from two");
}

TEST_CASE("endpoint fragments: POST /admin/reload adds the endpoint `pulse model up` published") {
    DeadPort dead;
    FakeBackend node(R"({"turns":[{"content":"from the node"}]})");
    TempDir frags;
    Gateway gw(model_toml({"http://127.0.0.1:" + std::to_string(dead.port) + "/v1"}), "",
               std::string(kFast) + "retry_window_s = 0\nendpoint_fragments = \"" + frags.path().string() + "\"\n");
    CHECK(post(gw.port, "/v1/responses", request()).status == 503);
    frags.write("spark1.toml", "[[endpoints]]\nupstream_model = \"m\"\nname = \"spark1\"\nurl = \"" + node.url() + "\"\n");
    frags.write("other.toml", "[[endpoints]]\nupstream_model = \"not-served\"\nname = \"x\"\nurl = \"http://127.0.0.1:9/v1\"\n");
    frags.write("notes.txt", "not a fragment");
    CHECK(post(gw.port, "/admin/reload", "").status == 202);
    REQUIRE(eventually([&] { return gw.log().find("configuration generation 2 is serving") != std::string::npos; }));
    CHECK(gw.log().find("which no configured model serves; ignored") != std::string::npos);
    CHECK(str(check_stream(post(gw.port, "/v1/responses", request()).body).item(0)["content"][0], "text") == "from the node");
    std::string health = get(gw.port, "/health");
    CHECK(health.find(R"("name":"ep0")") < health.find(R"("name":"spark1")"));  // after the configured ones

    // Only POST; a malformed fragment is refused and the running config keeps serving.
    int status = 0;
    get(gw.port, "/admin/reload", &status);
    CHECK(status == 405);
    frags.write("bad.toml", "[[endpoints]]\nname = 1\n");
    CHECK(post(gw.port, "/admin/reload", "").status == 202);
    REQUIRE(eventually([&] { return gw.log().find("configuration not reloaded, the previous one keeps serving") != std::string::npos; }));
    CHECK(gw.log().find("bad.toml") != std::string::npos);
    CHECK(str(check_stream(post(gw.port, "/v1/responses", request()).body).item(0)["content"][0], "text") == "from the node");
}

TEST_CASE("SIGTERM drains: streams in flight complete, new work is refused") {
    FakeBackend be(R"({"turns":[{"content":"a slow but complete answer","delay_ms":200}]})");
    Gateway gw(model_toml({be.url()}), "drain_timeout_s = 20\n", kFast);
    std::vector<std::future<HttpResult>> inflight;
    for (int i = 0; i < 3; ++i) inflight.push_back(std::async(std::launch::async, [&] { return post(gw.port, "/v1/responses", request()); }));
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("active_requests":3)") != std::string::npos; }));
    gw.child->signal(SIGTERM);
    REQUIRE(eventually([&] { return gw.log().find("draining") != std::string::npos; }));
    for (auto& f : inflight) CHECK(check_stream(f.get().body).terminal == "response.completed");
    auto r = gw.child->wait(20);
    CHECK(r.code == 0);
    CHECK_THROWS(post(gw.port, "/v1/responses", request()));  // the listener is gone
}

TEST_CASE("capacity: past max_streams a request gets 503 + Retry-After, not a closed socket") {
    FakeBackend be(R"({"turns":[{"content":"one two three four five","delay_ms":300}]})");
    Gateway gw(model_toml({be.url()}), "max_streams = 2\n", kFast);
    std::vector<std::future<HttpResult>> busy;
    for (int i = 0; i < 2; ++i) busy.push_back(std::async(std::launch::async, [&] { return post(gw.port, "/v1/responses", request()); }));
    REQUIRE(eventually([&] { return get(gw.port, "/health").find(R"("active_requests":2)") != std::string::npos; }));
    auto r = post(gw.port, "/v1/responses", request());
    CHECK(r.status == 503);
    CHECK(r.retry_after == "1");
    CHECK(r.body.find("at_capacity") != std::string::npos);
    for (auto& f : busy) CHECK(check_stream(f.get().body).terminal == "response.completed");
}

TEST_CASE("slow-loris clients and a client that stops reading do not pin the gateway") {
    // 8,000 words of 1,000 characters: far more output than the socket buffers hold, in few
    // enough events that even a sanitizer build fills them quickly.
    std::string words;
    for (int i = 0; i < 8000; ++i) words += "w" + std::to_string(i) + std::string(1000, 'x') + " ";
    FakeBackend big(R"({"turns":[{"content":")" + words + R"(","delay_ms":1}]})");
    Gateway gw(model_toml({big.url()}), "send_timeout_s = 1\n", kFast);

    // Slow loris: connections that send half a request and then nothing.
    std::vector<std::unique_ptr<Poco::Net::StreamSocket>> loris;
    for (int i = 0; i < 8; ++i) {
        auto s = std::make_unique<Poco::Net::StreamSocket>(Poco::Net::SocketAddress("127.0.0.1", gw.port));
        std::string partial = "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"mo";
        s->sendBytes(partial.data(), static_cast<int>(partial.size()));
        loris.push_back(std::move(s));
    }
    // A client that starts a stream and never reads it.
    Poco::Net::StreamSocket stuck(Poco::Net::SocketAddress("127.0.0.1", gw.port));
    int small = 4096;
    stuck.setReceiveBufferSize(small);
    std::string body = request();
    std::string head = "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body;
    stuck.sendBytes(head.data(), static_cast<int>(head.size()));

    // The stuck stream is given up after the send timeout and the backend is cancelled.
    CHECK(eventually([&] { return gw.log().find("outcome=cancelled") != std::string::npos; }, 30000));
    CHECK(eventually([&] { return big.log().find(R"("client_gone":true)") != std::string::npos; }, 30000));
    // The slow-loris connections get a 4xx once the server stops waiting for the rest of the
    // body, and are closed.
    for (auto& s : loris) {
        s->setReceiveTimeout(Poco::Timespan(10, 0));
        std::string got;
        char buf[4096];
        bool closed = false;
        try {
            for (int n; (n = s->receiveBytes(buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
            closed = true;
        } catch (const Poco::TimeoutException&) {
            closed = false;
        } catch (...) {
            closed = true;  // a reset is closed too
        }
        CHECK(closed);
        CHECK_MESSAGE((got.empty() || got.rfind("HTTP/1.1 4", 0) == 0), got.substr(0, 200));
    }
    // And the gateway still answers.
    int status = 0;
    get(gw.port, "/health", &status);
    CHECK(status == 200);
    CHECK(get(gw.port, "/v1/models").find(R"("id":"m")") != std::string::npos);
}
