// Request policies (SDK 1.1 policy kind, [models.X.policy]): the shipped static and http
// policies, a test policy's faults, and how a reasoning budget is reported. Real processes on
// loopback; every wait is bounded.
#include <doctest/doctest.h>

#include <atomic>

#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <regex>

#include "support/gateway_harness.h"

using namespace pulse::test;

namespace {

std::string model(const std::string& url, const std::string& policy, const std::string& profile = "qwen38",
                  const std::string& profile_options = "") {
    return "[models.m]\nprofile = \"" + profile + "\"\n" + profile_options + "[[models.m.endpoints]]\nurl = \"" + url + "\"\n" + policy;
}

std::string request(const std::string& extra = "", bool stream = true) {
    return std::string(R"({"model":"m","stream":)") + (stream ? "true" : "false") +
           R"(,"store":false,"input":[{"role":"user","content":"hi"}],"tools":[{"type":"function","name":"exec_command","parameters":{"type":"object"}}])" +
           extra + "}";
}

rapidjson::Document last_body(const FakeBackend& b) {
    auto reqs = b.requests();
    REQUIRE(!reqs.empty());
    rapidjson::Document d;
    d.Parse(reqs.back().c_str());
    REQUIRE(d.IsObject());
    return d;
}

int64_t metric(const std::string& metrics, const std::string& series) {
    std::smatch m;
    if (!std::regex_search(metrics, m, std::regex(std::regex_replace(series, std::regex(R"([{}"])"), R"(\$&)") + R"( (\d+))"))) return 0;
    return std::stoll(m[1]);
}

const char* kStatic = "[models.m.policy]\nname = \"static\"\n[models.m.policy.options]\nbudgets = { low = 1024, medium = 4096 }\n";

}  // namespace

TEST_CASE("static policy: a reasoning budget by effort, sent as vLLM's thinking_token_budget and reported in a header") {
    FakeBackend b(R"({"reasoning_config":true,"turns":[{"reasoning":"think","content":"ok"}]})");
    Gateway gw(model(b.url(), kStatic));
    auto r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"low"})"));
    REQUIRE(r.status == 200);
    CHECK(check_stream(r.body).terminal == "response.completed");
    CHECK(last_body(b)["thinking_token_budget"].GetInt64() == 1024);
    CHECK(r.budget == "1024; enforced by thinking_token_budget (vLLM with a reasoning parser or --reasoning-config)");
    // No effort: the default (medium). A whole (non-streamed) response has the header too.
    r = post(gw.port, "/v1/responses", request("", false));
    REQUIRE(r.status == 200);
    CHECK(last_body(b)["thinking_token_budget"].GetInt64() == 4096);
    CHECK(r.budget.rfind("4096; enforced by thinking_token_budget", 0) == 0);
    // An effort without a budget: the request is unchanged.
    r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"high"})"));
    CHECK_FALSE(last_body(b).HasMember("thinking_token_budget"));
    CHECK(r.budget.empty());
    std::string m = get(gw.port, "/metrics");
    CHECK(metric(m, R"(pulse_policy_decisions_total{model="m",policy="static",outcome="applied"})") == 2);
    CHECK(metric(m, R"(pulse_policy_decisions_total{model="m",policy="static",outcome="unchanged"})") == 1);
    CHECK(metric(m, R"(pulse_reasoning_budget_requests_total{model="m",enforced="yes"})") == 2);
    CHECK(metric(m, R"(pulse_reasoning_budget_tokens_total{model="m"})") == 1024 + 4096);
}

TEST_CASE("a vLLM with a reasoning config caps the reasoning at the budget; one that refuses the field gets the request again without it") {
    const std::string thinking = "one two three four five six seven eight nine ten";
    for (bool configured : {true, false}) {
        CAPTURE(configured);
        FakeBackend b(std::string(R"({"reasoning_config":)") + (configured ? "true" : "false") + R"(,"turns":[{"reasoning":")" + thinking +
                      R"(","content":"ok"}]})");
        Gateway gw(model(b.url(), "[models.m.policy]\nname = \"static\"\n[models.m.policy.options]\nbudgets = { low = 3 }\n"));
        auto r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"low"})", false));
        REQUIRE(r.status == 200);
        rapidjson::Document d;
        d.Parse(r.body.c_str());
        CHECK(std::string(d["status"].GetString()) == "completed");
        CHECK(d["usage"]["output_tokens_details"]["reasoning_tokens"].GetInt() == (configured ? 3 : 10));
        std::string m = get(gw.port, "/metrics");
        CHECK(metric(m, R"(pulse_budgeted_reasoning_tokens_total{model="m"})") == (configured ? 3 : 10));
        CHECK(metric(m, R"(pulse_reasoning_over_budget_total{model="m"})") == (configured ? 0 : 1));
        if (configured) {
            CHECK(r.budget == "3; enforced by thinking_token_budget (vLLM with a reasoning parser or --reasoning-config)");
        } else {
            // vLLM's 400, then the same request without the field: answered, and said so.
            CHECK(r.budget.rfind("3; not enforced: endpoint ep0 refused thinking_token_budget (", 0) == 0);
            CHECK(gw.log().find("reasoning budget 3 not enforced: endpoint ep0 refused thinking_token_budget") != std::string::npos);
            CHECK(metric(m, R"(pulse_reasoning_budget_refused_total{model="m",endpoint="ep0"})") == 1);
            auto reqs = b.requests();
            REQUIRE(reqs.size() == 2);
            CHECK(reqs[0].find("thinking_token_budget") != std::string::npos);
            CHECK(reqs[1].find("thinking_token_budget") == std::string::npos);
        }
    }
}

TEST_CASE("llama-server gets reasoning_budget_tokens; a backend without a per-request budget is reported as not enforcing it") {
    SUBCASE("llamacpp") {
        FakeBackend b(R"({"turns":[{"content":"ok"}]})", "llamacpp");
        Gateway gw(model(b.url(), kStatic, "llamacpp"));
        auto r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"low"})"));
        CHECK(last_body(b)["reasoning_budget_tokens"].GetInt64() == 1024);
        CHECK(r.budget == "1024; enforced by reasoning_budget_tokens");
    }
    SUBCASE("an in-process backend that does not list the field in budget_fields (ABI 1.2)") {
        // example-echo lists none: the profile wrote thinking_token_budget, which it ignores.
        Gateway gw(model("plugin://example-echo", kStatic));
        auto r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"low"})"));
        REQUIRE(r.status == 200);
        CHECK(r.budget == "1024; not enforced: backend 'example-echo' does not enforce thinking_token_budget");
        CHECK(gw.log().find("reasoning budget 1024 not enforced: backend 'example-echo'") != std::string::npos);
        CHECK(metric(get(gw.port, "/metrics"), R"(pulse_reasoning_budget_requests_total{model="m",enforced="no"})") == 1);
    }
    SUBCASE("budget_field = \"\"") {
        FakeBackend b(R"({"turns":[{"content":"ok"}]})");
        Gateway gw(model(b.url(), kStatic, "qwen38", "[models.m.profile_options]\nbudget_field = \"\"\n"));
        auto r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"low"})"));
        REQUIRE(r.status == 200);
        CHECK_FALSE(last_body(b).HasMember("thinking_token_budget"));
        CHECK(r.budget == "1024; not enforced: this backend has no per-request reasoning budget (profile option budget_field is empty)");
        CHECK(gw.log().find("reasoning budget 1024 not enforced") != std::string::npos);
        CHECK(metric(get(gw.port, "/metrics"), R"(pulse_reasoning_budget_requests_total{model="m",enforced="no"})") == 1);
    }
}

TEST_CASE("a policy's effort and sampling are applied; it sees the request's summary") {
    FakeBackend b(R"({"turns":[{"content":"ok"}]})");
    TempDir tmp;
    const auto record = tmp / "summaries.jsonl";
    std::string policy = "[models.m.policy]\nname = \"test-policy\"\n[models.m.policy.options]\nrecord = \"" + record.string() +
                         "\"\ndecision = { effort = \"none\", reasoning_budget = 5, sampling = { temperature = 0.25, max_output_tokens = 77, top_k = 20 } }\n";
    Gateway gw(model(b.url(), policy), "", Gateway::kUpstream, "", {{"faulty_policy", "faulty_policy"}});
    auto r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"high"},"temperature":1.0,"prompt_cache_key":"conv-7")"));
    REQUIRE(r.status == 200);
    auto body = last_body(b);
    CHECK(body["chat_template_kwargs"]["enable_thinking"].IsFalse());  // effort none
    CHECK(body["temperature"].GetDouble() == 0.25);
    CHECK(body["max_tokens"].GetInt64() == 77);
    CHECK(body["top_k"].GetInt64() == 20);
    CHECK_FALSE(body.HasMember("thinking_token_budget"));  // no thinking: nothing to cap
    CHECK(r.budget == "5; enforced: the model does not think for this request");
    rapidjson::Document s;
    s.Parse(read_file(record).c_str());
    REQUIRE(s.IsObject());
    CHECK(std::string(s["model"].GetString()) == "m");
    CHECK(std::string(s["effort"].GetString()) == "high");
    REQUIRE(s["tools"].Size() == 1);
    CHECK(std::string(s["tools"][0].GetString()) == "exec_command");
    CHECK(s["history_items"].GetInt() == 1);
    CHECK(std::string(s["conversation"].GetString()).find("conv-7") != std::string::npos);  // the routing key (opaque)
    CHECK(s["stream"].IsTrue());
    CHECK(s["input_chars"].GetInt() > 100);
    CHECK(gw.log().find("policy 'test-policy' decided effort=none reasoning_budget=5") != std::string::npos);
}

TEST_CASE("a policy that is slow, answers junk, fails or throws never fails the request: it goes on unchanged, logged and counted") {
    struct Case {
        const char* mode;
        const char* outcome;
        const char* why;
    };
    for (const Case& c : {Case{"sleep", "timeout", "no decision within 100 ms (policy timeout_ms)"},
                          Case{"junk", "invalid", "reasoning_budget must be an integer"},
                          Case{"unknown", "invalid", "unknown decision key 'color'"},
                          Case{"incomplete", "invalid", "the decision is not a complete JSON value"},
                          Case{"error", "error", "test-policy: the decision service is down"},
                          Case{"throw", "error", "test-policy: boom"}}) {
        CAPTURE(c.mode);
        FakeBackend b(R"({"turns":[{"content":"ok"}]})");
        std::string policy = std::string("[models.m.policy]\nname = \"test-policy\"\ntimeout_ms = 100\n[models.m.policy.options]\nmode = \"") +
                             c.mode + "\"\nsleep_ms = 5000\n";
        Gateway gw(model(b.url(), policy), "", Gateway::kUpstream, "", {{"faulty_policy", "faulty_policy"}});
        auto t0 = std::chrono::steady_clock::now();
        auto r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"low"})"));
        double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        REQUIRE(r.status == 200);
        CHECK(check_stream(r.body).terminal == "response.completed");
        CHECK(took < 4);  // it did not wait out a 5 s policy
        auto body = last_body(b);
        CHECK_FALSE(body.HasMember("thinking_token_budget"));
        CHECK(body["chat_template_kwargs"]["enable_thinking"].IsTrue());  // the client's effort (low) stands
        CHECK(r.budget.empty());
        CHECK(metric(get(gw.port, "/metrics"), std::string(R"(pulse_policy_decisions_total{model="m",policy="test-policy",outcome=")") + c.outcome +
                                                   "\"}") == 1);
        CHECK(gw.log().find(std::string("policy 'test-policy' ") + c.outcome + ": ") != std::string::npos);
        CHECK(gw.log().find(c.why) != std::string::npos);
        CHECK(gw.log().find("the request goes on unchanged") != std::string::npos);
    }
}

namespace {

// A decision service on loopback: records what it is sent, answers `answer`.
struct DecisionService {
    struct State {
        std::mutex m;
        std::vector<std::string> bodies, auth;
        std::string answer = R"({"reasoning_budget":2048})";
        int status = 200;
        int delay_ms = 0;  // before answering: a slow service
        std::atomic<int> busy{0};  // handlers running (a slow one outlives its client's timeout)
    };
    std::shared_ptr<State> state = std::make_shared<State>();
    std::unique_ptr<Poco::Net::HTTPServer> server;
    uint16_t port = 0;

    DecisionService() {
        struct Handler : Poco::Net::HTTPRequestHandler {
            std::shared_ptr<State> st;
            explicit Handler(std::shared_ptr<State> s) : st(std::move(s)) {}
            void handleRequest(Poco::Net::HTTPServerRequest& rq, Poco::Net::HTTPServerResponse& rs) override {
                struct Busy {
                    std::atomic<int>& n;
                    explicit Busy(std::atomic<int>& b) : n(b) { ++n; }
                    ~Busy() { --n; }
                } busy(st->busy);
                std::string body((std::istreambuf_iterator<char>(rq.stream())), {});
                std::string answer;
                int delay = 0;
                {
                    std::lock_guard lock(st->m);
                    delay = st->delay_ms;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(delay));
                {
                    std::lock_guard lock(st->m);
                    st->bodies.push_back(body);
                    st->auth.push_back(rq.get("Authorization", ""));
                    answer = st->answer;
                    rs.setStatus(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(st->status));
                }
                rs.setContentType("application/json");
                try {
                    rs.sendBuffer(answer.data(), answer.size());
                } catch (const std::exception&) {
                    // The client gave up (a slow answer): nothing to send, and nothing for POCO's
                    // error path to write after this object's test has ended.
                }
            }
        };
        struct Factory : Poco::Net::HTTPRequestHandlerFactory {
            std::shared_ptr<State> st;
            explicit Factory(std::shared_ptr<State> s) : st(std::move(s)) {}
            Poco::Net::HTTPRequestHandler* createRequestHandler(const Poco::Net::HTTPServerRequest&) override { return new Handler(st); }
        };
        Poco::Net::ServerSocket sock(Poco::Net::SocketAddress("127.0.0.1", 0));
        port = sock.address().port();
        server = std::make_unique<Poco::Net::HTTPServer>(new Factory(state), sock, new Poco::Net::HTTPServerParams);
        server->start();
    }
    ~DecisionService() {
        // A slow handler still sleeping must finish before the server and its state go (bounded).
        for (int i = 0; i < 200 && state->busy.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        server->stopAll(true);
    }
};

}  // namespace

// Threads of process `pid` named `name` (/proc/PID/task/*/comm).
int threads_named(pid_t pid, const std::string& name) {
    int n = 0;
    for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
        std::ifstream comm(t.path() / "comm");
        std::string c;
        std::getline(comm, c);
        n += c == name;
    }
    return n;
}

TEST_CASE("decisions run on a bounded pool of reused threads, not a thread per request") {
    FakeBackend b(R"({"turns":[{"content":"ok"}]})");
    {
        Gateway gw(model(b.url(), kStatic));
        for (int i = 0; i < 20; ++i) REQUIRE(post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"low"})")).status == 200);
        CHECK(threads_named(gw.child->pid(), "pulse-policy") == 1);  // one after another: one thread, kept
    }
    // A slow policy and 6 requests at once: as many threads as decisions overlap, kept for the next ones.
    const std::string policy = "[models.m.policy]\nname = \"test-policy\"\ntimeout_ms = 3000\n[models.m.policy.options]\nmode = \"sleep\"\nsleep_ms = 300\n";
    Gateway gw(model(b.url(), policy), "", Gateway::kUpstream, "", {{"faulty_policy", "faulty_policy"}});
    for (int round = 0; round < 2; ++round) {
        std::vector<std::future<HttpResult>> replies;
        for (int i = 0; i < 6; ++i) replies.push_back(std::async(std::launch::async, [&] { return post(gw.port, "/v1/responses", request()); }));
        for (auto& r : replies) CHECK(r.get().status == 200);
        const int n = threads_named(gw.child->pid(), "pulse-policy");
        CAPTURE(round);
        CHECK(n >= 2);
        CHECK(n <= 6);
    }
    CHECK(metric(get(gw.port, "/metrics"), R"(pulse_policy_decisions_total{model="m",policy="test-policy",outcome="unchanged"})") == 12);
}

TEST_CASE("http policy: the request summary is POSTed with the API key from the environment; a service that is down changes nothing") {
    DecisionService svc;
    ::setenv("PULSE_TEST_DECISION_KEY", "s3cret", 1);  // the gateway inherits it
    FakeBackend b(R"({"reasoning_config":true,"turns":[{"content":"ok"}]})");
    std::string policy = "[models.m.policy]\nname = \"http\"\ntimeout_ms = 2000\n[models.m.policy.options]\nurl = \"http://127.0.0.1:" +
                         std::to_string(svc.port) + "/decide\"\napi_key_env = \"PULSE_TEST_DECISION_KEY\"\n";
    Gateway gw(model(b.url(), policy));
    auto r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"medium"})"));
    REQUIRE(r.status == 200);
    CHECK(last_body(b)["thinking_token_budget"].GetInt64() == 2048);
    CHECK(r.budget.rfind("2048; enforced by thinking_token_budget", 0) == 0);
    {
        std::lock_guard lock(svc.state->m);
        REQUIRE(svc.state->bodies.size() == 1);
        CHECK(svc.state->auth[0] == "Bearer s3cret");
        rapidjson::Document s;
        s.Parse(svc.state->bodies[0].c_str());
        REQUIRE(s.IsObject());
        CHECK(std::string(s["effort"].GetString()) == "medium");
        CHECK(std::string(s["model"].GetString()) == "m");
        svc.state->status = 503;
        svc.state->answer = R"({"error":"overloaded"})";
    }
    r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"medium"})"));
    REQUIRE(r.status == 200);
    CHECK_FALSE(last_body(b).HasMember("thinking_token_budget"));
    CHECK(gw.log().find("the decision service answered HTTP 503") != std::string::npos);
    CHECK(metric(get(gw.port, "/metrics"), R"(pulse_policy_decisions_total{model="m",policy="http",outcome="error"})") == 1);
}

TEST_CASE("http policy: a slow decision service is counted as a timeout, whichever timeout fires first") {
    DecisionService svc;
    svc.state->delay_ms = 800;
    FakeBackend b(R"({"reasoning_config":true,"turns":[{"content":"ok"}]})");
    // The plugin's own timeout_ms (150) first, then the host's (300) first.
    for (const auto& entry : {std::pair{2000, 150}, std::pair{300, 5000}}) {
        const int host_ms = entry.first, plugin_ms = entry.second;  // not a structured binding: Clang 14 refuses one in CAPTURE's lambda
        CAPTURE(host_ms);
        std::string policy = "[models.m.policy]\nname = \"http\"\ntimeout_ms = " + std::to_string(host_ms) +
                             "\n[models.m.policy.options]\nurl = \"http://127.0.0.1:" + std::to_string(svc.port) +
                             "/decide\"\ntimeout_ms = " + std::to_string(plugin_ms) + "\n";
        Gateway gw(model(b.url(), policy));
        auto r = post(gw.port, "/v1/responses", request(R"(,"reasoning":{"effort":"medium"})"));
        REQUIRE(r.status == 200);
        CHECK_FALSE(last_body(b).HasMember("thinking_token_budget"));
        const std::string m = get(gw.port, "/metrics");
        CHECK(metric(m, R"(pulse_policy_decisions_total{model="m",policy="http",outcome="timeout"})") == 1);
        CHECK(metric(m, R"(pulse_policy_decisions_total{model="m",policy="http",outcome="error"})") == 0);
    }
}
