// The front door as a hostile client or a confused front proxy meets it: request framing that
// two parsers could read two ways, bodies sent slowly to hold memory, a trace path that is not
// a regular file, and the small things an operator reads (auth scheme, log lines). Each case
// failed before its fix. Real processes on loopback; every loop is bounded in count and time.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <future>
#include <regex>
#include <thread>

#include "support/gateway_harness.h"

using namespace pulse::test;
using namespace std::chrono;
namespace fs = std::filesystem;

namespace {

std::string model_toml(const std::string& url, const std::string& model_keys = "") {
    return "[models.m]\nprofile = \"qwen38\"\n" + model_keys + "[[models.m.endpoints]]\nname = \"ep0\"\nurl = \"" + url + "\"\n";
}

std::string request(bool stream = true) {
    return std::string(R"({"model":"m","stream":)") + (stream ? "true" : "false") + R"(,"store":false,"input":"hello"})";
}

// How many HTTP responses a byte stream from the server holds.
int responses_in(const std::string& wire) {
    int n = 0;
    for (size_t at = wire.find("HTTP/1.1 "); at != std::string::npos; at = wire.find("HTTP/1.1 ", at + 1)) ++n;
    return n;
}

int64_t metric(uint16_t port, const std::string& series) {
    std::string m = get(port, "/metrics");
    size_t at = m.find(series + " ");
    return at == std::string::npos ? 0 : std::stoll(m.substr(at + series.size() + 1));
}

}  // namespace

// A request whose body hides a second request: a server that reads the framing one way serves
// the hidden one, a proxy that reads it the other way never saw it (request smuggling).
TEST_CASE("framing a front proxy could read another way: 400, the connection closed, nothing hidden in the body served") {
    FakeBackend be(R"({"turns":[{"content":"never asked"}]})");
    Gateway gw(model_toml(be.url()));
    const std::string hidden = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    const std::string pre = "POST /v1/models HTTP/1.1\r\nHost: x\r\n";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"two Content-Lengths, the first 0", pre + "Content-Length: 0\r\nContent-Length: " + std::to_string(hidden.size()) + "\r\n\r\n" + hidden},
        {"space before the colon (Transfer-Encoding)", pre + "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + hidden},
        {"space before the colon (Content-Length)", pre + "Content-Length : " + std::to_string(hidden.size()) + "\r\n\r\n" + hidden},
        {"a signed Content-Length", pre + "Content-Length: +" + std::to_string(hidden.size()) + "\r\n\r\n" + hidden},
        {"chunked, then identity", pre + "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n" + hidden},
        {"obs-fold", pre + "X-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n" + hidden},
        {"NUL in a header", pre + std::string("X-Nul: a\0b\r\n\r\n", 14) + hidden},
        {"Transfer-Encoding and Content-Length", pre + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + hidden},
    };
    const int64_t refused_before = metric(gw.port, R"(pulse_http_refusals_total{reason="bad_request"})");
    for (const auto& entry : cases) {
        const std::string& name = entry.first;  // not a structured binding: Clang 14 refuses one in CAPTURE's lambda
        const std::string& bytes = entry.second;
        CAPTURE(name);
        Raw c(gw.port);
        REQUIRE(c.send(bytes));
        bool eof = false;
        std::string answer = c.read_all(5000, nullptr, &eof);
        CHECK(answer.rfind("HTTP/1.1 400 ", 0) == 0);
        CHECK(answer.find("Connection: close\r\n") != std::string::npos);
        CHECK(responses_in(answer) == 1);  // the hidden GET /health was never answered
        CHECK(eof);
    }
    CHECK(metric(gw.port, R"(pulse_http_refusals_total{reason="bad_request"})") - refused_before == static_cast<int64_t>(cases.size()));
    CHECK(be.requests().empty());
}

TEST_CASE("a request head with bare LF line ends is a 400 at once, not a 408 after header_timeout_s") {
    FakeBackend be(R"({"turns":[{"content":"x"}]})");
    Gateway gw(model_toml(be.url()));
    Raw c(gw.port);
    auto t0 = steady_clock::now();
    REQUIRE(c.send("GET /health HTTP/1.1\nHost: x\n\n"));
    std::string answer = c.read_all(3000);
    CHECK(duration<double>(steady_clock::now() - t0).count() < 2);
    CHECK(answer.rfind("HTTP/1.1 400 ", 0) == 0);
    CHECK(answer.find("CRLF") != std::string::npos);
}

TEST_CASE("pipelined and keep-alive requests still work under the strict parser") {
    FakeBackend be(R"({"turns":[{"content":"x"}]})");
    Gateway gw(model_toml(be.url()));
    Raw c(gw.port);
    REQUIRE(c.send("\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nhost: x\r\nConnection: close\r\n\r\n"));
    std::string answer = c.read_all(5000);
    CHECK(responses_in(answer) == 2);
    CHECK(answer.rfind("HTTP/1.1 200 ", 0) == 0);
    CHECK(answer.find("HTTP/1.1 200 ", 1) != std::string::npos);
}

// Eight senders declare 32 MiB bodies and trickle a byte at a time: with the declared length
// reserved up front they held the whole body budget, and a deadline that restarted with every
// byte let them hold it forever. Now they hold what they sent, and are cut by the rate rule.
TEST_CASE("slow bodies hold only what they sent and are cut by server.body_min_rate; real requests are served meanwhile") {
    FakeBackend be(R"({"turns":[{"content":"served"}]})");
    Gateway gw(model_toml(be.url()), "max_body_bytes = 33554432\nmax_body_memory_bytes = 67108864\n");  // body_min_rate: the default, 16 KiB/s
    std::vector<std::unique_ptr<Raw>> slow;
    for (int i = 0; i < 8; ++i) {
        slow.push_back(std::make_unique<Raw>(gw.port));
        REQUIRE(slow.back()->send("POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 33554432\r\n\r\n{"));
    }
    std::atomic<bool> stop{false};
    std::thread drip([&] {  // a byte every 0.5 s per sender, for at most 10 s
        for (int t = 0; t < 20 && !stop; ++t) {
            std::this_thread::sleep_for(milliseconds(500));
            for (auto& s : slow) s->send(" ");
        }
    });
    int served = 0;
    for (int i = 0; i < 5; ++i) {
        auto r = post(gw.port, "/v1/responses", request(false), {}, 10);
        CAPTURE(r.body);
        if (r.status == 200) ++served;
        std::this_thread::sleep_for(milliseconds(400));
    }
    CHECK(served == 5);
    // Past the 5 s grace, a byte every 0.5 s is far below 16 KiB/s: each sender gets a 408.
    auto t0 = steady_clock::now();
    std::string answer = slow[0]->read_all(8000);
    stop = true;
    drip.join();
    MESSAGE("first slow sender answered after " << duration<double>(steady_clock::now() - t0).count() << " s more");
    CHECK(answer.rfind("HTTP/1.1 408 ", 0) == 0);
    CHECK(answer.find("server.body_min_rate") != std::string::npos);
    CHECK(eventually([&] { return metric(gw.port, R"(pulse_http_refusals_total{reason="body_too_slow"})") == 8; }, 5000));
}

TEST_CASE("a body that keeps arriving is still cut at server.body_timeout_s from its head") {
    FakeBackend be(R"({"turns":[{"content":"x"}]})");
    Gateway gw(model_toml(be.url()), "body_timeout_s = 2\nbody_min_rate = 0\n");
    Raw c(gw.port);
    REQUIRE(c.send("POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"));
    auto t0 = steady_clock::now();
    std::string answer;
    for (int i = 0; i < 60 && answer.empty(); ++i) {  // 100 bytes every 100 ms: never a stall
        c.send(std::string(100, ' '));
        answer = c.read_all(100);
    }
    const double took = duration<double>(steady_clock::now() - t0).count();
    CHECK(answer.rfind("HTTP/1.1 408 ", 0) == 0);
    CHECK(answer.find("server.body_timeout_s") != std::string::npos);
    CHECK(took >= 1.8);
    CHECK(took < 4);
    CHECK(metric(gw.port, R"(pulse_http_refusals_total{reason="body_timeout"})") == 1);
}

TEST_CASE("trace file: a FIFO is refused without blocking requests or shutdown; a hard link is refused") {
    FakeBackend be(R"({"turns":[{"content":"traced"}]})");
    TempDir tmp;
    {
        auto fifo = tmp / "trace.fifo";
        REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
        Gateway gw(model_toml(be.url()), "trace_file = \"" + fifo.string() + "\"\ndrain_timeout_s = 2\n");
        auto t0 = steady_clock::now();
        auto r = post(gw.port, "/v1/responses", request(), {}, 15);
        CHECK(r.status == 200);
        CHECK(duration<double>(steady_clock::now() - t0).count() < 5);
        CHECK(gw.log().find("not writing the trace file " + fifo.string() + ": it is not a regular file") != std::string::npos);
        t0 = steady_clock::now();
        gw.child->signal(SIGTERM);
        CHECK(gw.child->wait(20).code == 0);
        CHECK(duration<double>(steady_clock::now() - t0).count() < 6);
    }
    auto real = tmp / "elsewhere.jsonl";
    { std::ofstream(real) << ""; }
    auto link = tmp / "trace.jsonl";
    fs::create_hard_link(real, link);
    Gateway gw(model_toml(be.url()), "trace_file = \"" + link.string() + "\"\n");
    CHECK(post(gw.port, "/v1/responses", request()).status == 200);
    CHECK(read_file(real).empty());
    CHECK(gw.log().find("not writing the trace file " + link.string() + ": it has another name (a hard link)") != std::string::npos);
}

TEST_CASE("the Authorization scheme is case-insensitive; the key is not") {
    FakeBackend be(R"({"turns":[{"content":"ok"}]})");
    Gateway gw(model_toml(be.url()), "api_key = \"k-123\"\n");
    CHECK(post(gw.port, "/v1/responses", request(), {{"Authorization", "bearer k-123"}}).status == 200);
    CHECK(post(gw.port, "/v1/responses", request(), {{"Authorization", "BEARER k-123"}}).status == 200);
    CHECK(post(gw.port, "/v1/responses", request(), {{"Authorization", "Bearer K-123"}}).status == 401);
    CHECK(post(gw.port, "/v1/responses", request(), {{"Authorization", "Bearerk-123"}}).status == 401);
    CHECK(post(gw.port, "/v1/responses", request(), {{"Authorization", "Basic k-123"}}).status == 401);
    // RFC 9110 §11.4: credentials = auth-scheme [ 1*SP token68 ]: one space or several.
    CHECK(post(gw.port, "/v1/responses", request(), {{"Authorization", "Bearer   k-123"}}).status == 200);
    CHECK(post(gw.port, "/v1/responses", request(), {{"Authorization", "Bearer  k-1234"}}).status == 401);
    CHECK(post(gw.port, "/v1/responses", request(), {{"Authorization", "Bearer "}}).status == 401);
    // A 401 names the scheme it wants (RFC 9110 §11.6.1).
    auto r = post(gw.port, "/v1/responses", request());
    CHECK(r.status == 401);
    CHECK(r.www_authenticate.rfind("Bearer", 0) == 0);
}

TEST_CASE("an HTTP reload says so in the log, not SIGHUP") {
    FakeBackend be(R"({"turns":[{"content":"ok"}]})");
    Gateway gw(model_toml(be.url()));
    CHECK(post(gw.port, "/admin/reload", "").status == 202);
    CHECK(eventually([&] { return gw.log().find("POST /admin/reload: reloading configuration") != std::string::npos; }));
    CHECK(gw.log().find("SIGHUP: reloading") == std::string::npos);
    gw.child->signal(SIGHUP);
    CHECK(eventually([&] { return gw.log().find("SIGHUP: reloading configuration") != std::string::npos; }));
}

TEST_CASE("the request log counts what a failed or cancelled stream sent, and says the input is unknown") {
    FakeBackend be(R"({"turns":[{"content":"a b c d e f g h i j k l m n o p q r s t u v w x y z","die_after":12,"die":"drop"}]})");
    Gateway gw(model_toml(be.url(), "resume = false\n"));
    auto st = check_stream(post(gw.port, "/v1/responses", request()).body);
    CHECK(st.terminal == "response.failed");
    std::smatch m;
    std::string log = gw.log();
    REQUIRE(std::regex_search(log, m, std::regex(R"(outcome=failed in=(\S+) cached=(\S+) out=(\d+))")));
    CHECK(m[1] == "-");
    CHECK(m[2] == "-");
    CHECK(std::stoi(m[3]) == 12);
}
