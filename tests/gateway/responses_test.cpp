// /v1/responses over real HTTP: `pulse serve` and a fake vLLM as processes on loopback.
#include <doctest/doctest.h>

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/StreamSocket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "gateway/request/responses_api.h"
#include "support/gateway_harness.h"

using namespace pulse::test;

namespace {

std::string model_toml(const std::string& url, const std::string& extra_endpoints = "") {
    return "[models.\"qwen3.8-flash-next\"]\nprofile = \"qwen38\"\nupstream_model = \"served\"\n"
           "[[models.\"qwen3.8-flash-next\".endpoints]]\nname = \"first\"\nurl = \"" + url + "\"\n" + extra_endpoints +
           "[models.\"qwen3.8-flash-next\".sampling]\ntemperature = 0.6\n";
}

const std::string kTools = R"("tools":[{"type":"function","name":"exec_command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}},
  {"type":"custom","name":"apply_patch","description":"patch files"},{"type":"web_search","external_web_access":false}])";

std::string request(const std::string& input_json = R"("hello")", bool stream = true, const std::string& extra = "") {
    return R"({"model":"qwen3.8-flash-next","stream":)" + std::string(stream ? "true" : "false") + R"(,"input":)" + input_json +
           R"(,"store":false,"tool_choice":"auto","parallel_tool_calls":true,)" + kTools +
           R"(,"reasoning":{"effort":"medium","summary":"auto"},"include":["reasoning.encrypted_content"],"prompt_cache_key":"abc")" +
           extra + "}";
}

std::string str(const rapidjson::Value& v, const char* k) { return v.HasMember(k) && v[k].IsString() ? v[k].GetString() : ""; }

}  // namespace

TEST_CASE("a streamed turn with reasoning, an apply_patch call and an exec call") {
    FakeBackend be(R"({"turns":[{"reasoning":"I will create the file","tool_calls":[
        {"name":"apply_patch","arguments":{"input":"*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"}},
        {"name":"exec_command","arguments":{"cmd":"cat hello.txt"}}]}]})");
    Gateway gw(model_toml(be.url()));
    auto r = post(gw.port, "/v1/responses", request());
    REQUIRE(r.status == 200);
    CHECK(r.content_type == "text/event-stream");
    auto st = check_stream(r.body);
    CHECK(st.terminal == "response.completed");
    REQUIRE(st.items.size() == 3);
    CHECK(str(st.item(0), "type") == "reasoning");
    CHECK(str(st.item(1), "type") == "custom_tool_call");
    CHECK(str(st.item(1), "input") == "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n");
    CHECK(str(st.item(2), "type") == "function_call");
    CHECK(str(st.item(2), "arguments") == R"({"cmd":"cat hello.txt"})");

    // What vLLM received.
    auto reqs = be.requests();
    REQUIRE(reqs.size() == 1);
    rapidjson::Document up;
    up.Parse(reqs[0].c_str());
    CHECK(str(up, "model") == "served");
    CHECK(up["stream_options"]["include_usage"].IsTrue());
    CHECK(up["tools"].Size() == 2);  // web_search dropped
    CHECK(up["temperature"].GetDouble() == doctest::Approx(0.6));
    CHECK(gw.log().find("dropped tool of type 'web_search'") != std::string::npos);
}

TEST_CASE("stream:false returns the whole Response object") {
    FakeBackend be(R"({"turns":[{"content":"The answer is 42."}]})");
    Gateway gw(model_toml(be.url()));
    auto r = post(gw.port, "/v1/responses", request(R"("question")", false));
    REQUIRE(r.status == 200);
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    CHECK(str(d, "status") == "completed");
    CHECK(str(d, "object") == "response");
    CHECK(str(d["output"][0]["content"][0], "text") == "The answer is 42.");
    CHECK(d["usage"]["output_tokens"].GetInt() > 0);
}

TEST_CASE("failover: a refused first endpoint, then a 503 endpoint, then one that serves") {
    FakeBackend down(R"({"turns":[{"status":503}]})");
    FakeBackend up(R"({"turns":[{"content":"served by the third"}]})");
    // Port 1 on loopback refuses connections.
    Gateway gw(model_toml("http://127.0.0.1:1/v1",
                          "[[models.\"qwen3.8-flash-next\".endpoints]]\nname = \"second\"\nurl = \"" + down.url() +
                              "\"\n[[models.\"qwen3.8-flash-next\".endpoints]]\nname = \"third\"\nurl = \"" + up.url() + "\"\n"));
    auto r = post(gw.port, "/v1/responses", request());
    REQUIRE(r.status == 200);
    auto st = check_stream(r.body);
    CHECK(st.terminal == "response.completed");
    CHECK(str(st.item(0)["content"][0], "text") == "served by the third");
    CHECK(down.requests().size() == 1);
    CHECK(gw.log().find("endpoint=third outcome=completed") != std::string::npos);
}

TEST_CASE("every endpoint down, no retry window: 503 with Retry-After and an OpenAI-shaped error") {
    FakeBackend down(R"({"turns":[{"status":503}]})");
    Gateway gw(model_toml(down.url()));  // retry_window_s = 0
    auto r = post(gw.port, "/v1/responses", request());
    CHECK(r.status == 503);
    CHECK(r.retry_after == "1");
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    CHECK(str(d["error"], "type") == "server_error");
    CHECK(str(d["error"], "message").find("no backend could take the request within 0 s") != std::string::npos);
    CHECK(str(d["error"], "code") != "server_is_overloaded");  // that code makes Codex give up
}

TEST_CASE("a context-length 400 from the backend becomes a clear 400, with no failover") {
    FakeBackend be(R"({"turns":[{"status":400,"body":"{\"error\":{\"message\":\"This model's maximum context length is 262144 tokens. However, you requested 300000 tokens.\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}"}]})");
    FakeBackend second(R"({"turns":[{"content":"should not be asked"}]})");
    Gateway gw(model_toml(be.url(), "[[models.\"qwen3.8-flash-next\".endpoints]]\nurl = \"" + second.url() + "\"\n"));
    auto r = post(gw.port, "/v1/responses", request());
    CHECK(r.status == 400);
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    CHECK(str(d["error"], "code") == "context_length_exceeded");
    CHECK(second.requests().empty());
}

TEST_CASE("mid-stream failures: backend error event and a truncated stream") {
    {
        FakeBackend be(R"({"turns":[{"stream_error":"CUDA out of memory"}]})");
        Gateway gw(model_toml(be.url()));
        auto st = check_stream(post(gw.port, "/v1/responses", request()).body);
        CHECK(st.terminal == "response.failed");
        // The error came before any output: a failure of the endpoint (retried elsewhere; here
        // there is no other), whose message the client gets.
        CHECK(str((*st.response)["error"], "message").find("CUDA out of memory") != std::string::npos);
    }
    {
        FakeBackend be(R"({"turns":[{"content":"half an answer","truncate":true}]})");
        Gateway gw(model_toml(be.url()));
        auto st = check_stream(post(gw.port, "/v1/responses", request()).body);
        CHECK(st.terminal == "response.failed");
        CHECK(st.items.empty());
        CHECK(str((*st.response)["error"], "message").find("[DONE]") != std::string::npos);
    }
}

TEST_CASE("length finish: response.incomplete with the reason") {
    FakeBackend be(R"({"turns":[{"content":"cut off","finish_reason":"length"}]})");
    Gateway gw(model_toml(be.url()));
    auto st = check_stream(post(gw.port, "/v1/responses", request(R"("x")", true, R"(,"max_output_tokens":5)")).body);
    CHECK(st.terminal == "response.incomplete");
    CHECK(str((*st.response)["incomplete_details"], "reason") == "max_output_tokens");
    rapidjson::Document up;
    up.Parse(be.requests().at(0).c_str());
    CHECK(up["max_tokens"].GetInt() == 5);
}

TEST_CASE("keepalive: response.in_progress events while the backend prefills") {
    FakeBackend be(R"({"turns":[{"content":"slow start","first_delay_ms":1500}]})");
    Gateway gw(model_toml(be.url()));  // keepalive_s = 0.3 in the harness
    auto st = check_stream(post(gw.port, "/v1/responses", request()).body);
    CHECK(st.terminal == "response.completed");
    CHECK(st.keepalives >= 2);
}

TEST_CASE("one client connection carries several streamed turns (keep-alive)") {
    FakeBackend be(R"({"turns":[{"content":"alpha beta gamma"}]})");
    Gateway gw(model_toml(be.url()));
    Poco::Net::HTTPClientSession s("127.0.0.1", gw.port);
    s.setKeepAlive(true);
    s.setTimeout(Poco::Timespan(20, 0));
    for (int turn = 0; turn < 3; ++turn) {
        CAPTURE(turn);
        std::string body = request();
        Poco::Net::HTTPRequest req("POST", "/v1/responses", Poco::Net::HTTPMessage::HTTP_1_1);
        req.setKeepAlive(true);
        req.setContentLength(static_cast<std::streamsize>(body.size()));
        s.sendRequest(req) << body;
        Poco::Net::HTTPResponse resp;
        std::istream& in = s.receiveResponse(resp);
        REQUIRE(resp.getStatus() == Poco::Net::HTTPResponse::HTTP_OK);
        CHECK(resp.getContentType() == "text/event-stream");
        CHECK(resp.getChunkedTransferEncoding());
        std::string text(std::istreambuf_iterator<char>(in), {});
        auto st = check_stream(text);
        CHECK(st.terminal == "response.completed");
    }
    CHECK(be.requests().size() == 3);
}

TEST_CASE("a backend restarted between turns: the pooled connection is stale, the turn still completes") {
    const std::string script = R"({"turns":[{"content":"first answer"}]})";
    auto be = std::make_unique<FakeBackend>(script);
    const uint16_t port = be->port;
    Gateway gw(model_toml(be->url()));  // one endpoint, no retry window: a failure would be a 503
    auto r1 = post(gw.port, "/v1/responses", request());
    REQUIRE(r1.status == 200);
    CHECK(check_stream(r1.body).terminal == "response.completed");
    be.reset();  // the gateway still holds the idle keep-alive connection to it
    be = std::make_unique<FakeBackend>(script, "vllm", port);
    auto r2 = post(gw.port, "/v1/responses", request());
    REQUIRE(r2.status == 200);
    CHECK(check_stream(r2.body).terminal == "response.completed");
    CHECK(be->requests().size() == 1);  // the new backend served it once
    // The dead connection is seen in the pool (it reads EOF) and never sent on: no resend, no warning.
    CHECK(gw.log().find("had closed the pooled connection") == std::string::npos);
}

TEST_CASE("a backend connection is reused after a stream longer than the pool's idle limit") {
    // The idle limit (2 s) counts from the stream's end, not from the request's start: a long
    // turn must not cost the next one a new connection.
    FakeBackend be(R"({"turns":[{"content":"slow to start","first_delay_ms":2300}]})");
    Gateway gw(model_toml(be.url()));
    for (int turn = 0; turn < 2; ++turn) {
        CAPTURE(turn);
        auto r = post(gw.port, "/v1/responses", request());
        REQUIRE(r.status == 200);
        CHECK(check_stream(r.body).terminal == "response.completed");
    }
    auto conns = be.connections();
    REQUIRE(conns.size() == 2);
    CHECK(conns[0] == conns[1]);
}

TEST_CASE("a client that disconnects cancels the backend request") {
    FakeBackend be(R"({"turns":[{"content":"one two three four five six seven eight nine ten eleven twelve","delay_ms":200}]})");
    Gateway gw(model_toml(be.url()));
    {
        Poco::Net::HTTPClientSession s("127.0.0.1", gw.port);
        std::string body = request();
        Poco::Net::HTTPRequest req("POST", "/v1/responses", Poco::Net::HTTPMessage::HTTP_1_1);
        req.setContentLength(static_cast<std::streamsize>(body.size()));
        s.sendRequest(req) << body;
        Poco::Net::HTTPResponse resp;
        std::istream& in = s.receiveResponse(resp);
        std::string line;
        std::getline(in, line);  // the first event has arrived
        CHECK(line.rfind("event: response.created", 0) == 0);
        s.abort();
    }
    // The backend notices within a couple of chunks that nobody reads any more.
    std::regex gone(R"("client_gone":(true))");
    wait_for([&] { return be.log(); }, gone, 10000);
    CHECK(be.log().find(R"("chunks":15)") == std::string::npos);  // it did not stream all 15 chunks
    wait_for([&] { return gw.log(); }, std::regex("outcome=(cancelled)"), 5000);
}

TEST_CASE("a whole turn through the SDK's example backend plugin (plugin:// endpoint)") {
    Gateway gw("[models.echo]\nprofile = \"qwen38\"\n[[models.echo.endpoints]]\nname = \"inproc\"\nurl = \"plugin://example-echo\"\n"
               "options = { prefix = \"you said: \" }\n");
    auto r = post(gw.port, "/v1/responses", R"({"model":"echo","stream":true,"input":[{"role":"user","content":"ping pong"}]})");
    REQUIRE(r.status == 200);
    auto st = check_stream(r.body);
    CHECK(st.terminal == "response.completed");
    CHECK(str(st.item(0)["content"][0], "text") == "you said: ping pong");
    CHECK((*st.response)["usage"]["input_tokens"].GetInt() == 2);
}

TEST_CASE("bad input: clear 4xx, and the gateway keeps serving") {
    FakeBackend be(R"({"turns":[{"content":"fine"}]})");
    Gateway gw(model_toml(be.url()), "max_body_bytes = 100000\n");
    struct Bad {
        std::string body;
        int status;
        std::string needle;
    };
    std::string deep = std::string(200, '[') + std::string(200, ']');
    const std::vector<Bad> bad = {
        {"{not json", 400, "not valid JSON"},
        {std::string("{\"model\":\"qwen3.8-flash-next\",\"input\":\"\xff\xfe\"}"), 400, "not valid UTF-8"},
        {"{\"model\":\"qwen3.8-flash-next\",\"input\":" + deep + "}", 400, "nests deeper than 128"},
        {"[1,2]", 400, "must be a JSON object"},
        {R"({"input":"x"})", 400, "'model' is required"},
        {R"({"model":"qwen3.8-flash-next"})", 400, "'input' is required"},
        {R"({"model":7,"input":"x"})", 400, "'model' must be a string, found a number"},
        {R"({"model":"nope","input":"x"})", 400, "model 'nope' is not configured here"},
        {R"({"model":"qwen3.8-flash-next","input":"x","previous_response_id":"resp_1"})", 400, "previous_response_id"},
        {R"({"model":"qwen3.8-flash-next","input":"x","conversation":"c1"})", 400, "conversation"},
        {R"({"model":"qwen3.8-flash-next","input":"x","background":true})", 400, "background"},
        {R"({"model":"qwen3.8-flash-next","input":"x","store":true})", 400, "'store' is not supported"},
        {R"({"model":"qwen3.8-flash-next","input":[{"type":"item_reference","id":"x"}]})", 400, "input item type 'item_reference'"},
        {R"({"model":"qwen3.8-flash-next","input":[{"type":"function_call","name":"f"}]})", 400, "'input[0].arguments' is required"},
        {R"({"model":"qwen3.8-flash-next","input":"x","max_output_tokens":-3})", 400, "positive integer"},
        {R"({"model":"qwen3.8-flash-next","input":"x","tools":{}})", 400, "'tools' must be an array"},
        {R"({"model":"qwen3.8-flash-next","input":"x","temperature":-1})", 400, "Invalid 'temperature': decimal below minimum value. Expected a value >= 0, but got -1"},
        {R"({"model":"qwen3.8-flash-next","input":"x","temperature":2.5})", 400, "Invalid 'temperature': decimal above maximum value. Expected a value <= 2"},
        {R"({"model":"qwen3.8-flash-next","input":"x","top_p":2})", 400, "Invalid 'top_p': decimal above maximum value. Expected a value <= 1, but got 2"},
        {R"({"model":"qwen3.8-flash-next","input":"x","top_p":"0.5"})", 400, "'top_p' must be a number"},
        {"{\"model\":\"qwen3.8-flash-next\",\"input\":\"" + std::string(200000, 'a') + "\"}", 413, "over the limit"},
    };
    for (const auto& b : bad) {
        CAPTURE(b.needle);
        auto r = post(gw.port, "/v1/responses", b.body);
        CHECK(r.status == b.status);
        rapidjson::Document d;
        d.Parse(r.body.c_str());
        REQUIRE(d.IsObject());
        CHECK(str(d["error"], "message").find(b.needle) != std::string::npos);
        if (b.needle.rfind("Invalid '", 0) == 0) CHECK(str(d["error"], "param") == b.needle.substr(9, b.needle.find('\'', 9) - 9));
    }
    // A POST with neither Content-Length nor chunked encoding has an empty body (RFC 9112):
    // answered at once on a connection the client keeps open, not after it gives up.
    {
        Poco::Net::StreamSocket sock(Poco::Net::SocketAddress("127.0.0.1", gw.port));
        sock.setReceiveTimeout(Poco::Timespan(5, 0));
        std::string raw = "POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n";
        sock.sendBytes(raw.data(), static_cast<int>(raw.size()));
        char buf[4096];
        int n = sock.receiveBytes(buf, sizeof buf);
        REQUIRE(n > 0);
        std::string head(buf, static_cast<size_t>(n));
        CHECK(head.rfind("HTTP/1.1 400", 0) == 0);
    }
    CHECK(be.requests().empty());  // nothing reached the backend
    auto ok = post(gw.port, "/v1/responses", request());
    REQUIRE_MESSAGE(ok.status == 200, ok.body << "\n" << gw.log());
    CHECK(check_stream(ok.body).terminal == "response.completed");
}

TEST_CASE("GET /v1/models lists the configured models; API key protects /v1") {
    FakeBackend be(R"({"turns":[{"content":"fine"}]})");
    Gateway gw(model_toml(be.url()), "api_key = \"s3cret\"\n");
    auto r = post(gw.port, "/v1/responses", request());
    CHECK(r.status == 401);
    r = post(gw.port, "/v1/responses", request(), {{"Authorization", "Bearer wrong!"}});
    CHECK(r.status == 401);
    r = post(gw.port, "/v1/responses", request(), {{"Authorization", "Bearer s3cret"}});
    CHECK(r.status == 200);
    CHECK(post(gw.port, "/admin/reload", "").status == 401);  // the admin route needs the key too

    Poco::Net::HTTPClientSession s("127.0.0.1", gw.port);
    Poco::Net::HTTPRequest req("GET", "/v1/models", Poco::Net::HTTPMessage::HTTP_1_1);
    req.set("Authorization", "Bearer s3cret");
    s.sendRequest(req);
    Poco::Net::HTTPResponse resp;
    std::string body((std::istreambuf_iterator<char>(s.receiveResponse(resp))), {});
    CHECK(resp.getStatus() == 200);
    CHECK(body.find(R"("id":"qwen3.8-flash-next")") != std::string::npos);
}

TEST_CASE("/metrics: request, token and dropped-tool counters, Prometheus text and JSON") {
    FakeBackend be(R"({"turns":[{"content":"fine","usage":{"prompt_tokens":100,"completion_tokens":7,"cached_tokens":64}}]})");
    Gateway gw(model_toml(be.url()));
    REQUIRE(post(gw.port, "/v1/responses", request()).status == 200);
    REQUIRE(post(gw.port, "/v1/responses", "{oops").status == 400);

    auto get = [&](const std::string& accept) {
        Poco::Net::HTTPClientSession s("127.0.0.1", gw.port);
        Poco::Net::HTTPRequest req("GET", "/metrics", Poco::Net::HTTPMessage::HTTP_1_1);
        if (!accept.empty()) req.set("Accept", accept);
        s.sendRequest(req);
        Poco::Net::HTTPResponse resp;
        return std::string((std::istreambuf_iterator<char>(s.receiveResponse(resp))), {});
    };
    std::string text = get("");
    CAPTURE(text);
    CHECK(text.find(R"(pulse_requests_total{model="qwen3.8-flash-next",endpoint="first",outcome="completed"} 1)") != std::string::npos);
    CHECK(text.find(R"(pulse_tools_dropped_total{plugin="pulse.translation.qwen38",type="web_search"} 1)") != std::string::npos);
    CHECK(text.find(R"(pulse_input_tokens_total{model="qwen3.8-flash-next"} 100)") != std::string::npos);
    CHECK(text.find(R"(pulse_cached_tokens_total{model="qwen3.8-flash-next"} 64)") != std::string::npos);
    CHECK(text.find(R"(pulse_invalid_requests_total{code="invalid_json"} 1)") != std::string::npos);
    CHECK(text.find("# TYPE pulse_ttft_seconds histogram") != std::string::npos);
    CHECK(text.find(R"(pulse_ttft_seconds_count{model="qwen3.8-flash-next"} 1)") != std::string::npos);
    // Bounds in their shortest round-trip form, as Prometheus's own clients print them.
    CHECK(text.find(R"(pulse_ttft_seconds_bucket{model="qwen3.8-flash-next",le="0.0025"})") != std::string::npos);
    CHECK(text.find("0000000") == std::string::npos);

    // The exposition as Prometheus itself reads it: `promtool check metrics` (from Debian's
    // prometheus package; tools/dev provides it as $PULSE_PROMTOOL) parses the text and lints
    // names and help.
    const char* env_tool = std::getenv("PULSE_PROMTOOL");
    const std::string promtool = env_tool && *env_tool ? env_tool : "promtool";
    if (std::system(("command -v '" + promtool + "' >/dev/null 2>&1").c_str()) == 0) {
        TempDir tmp;
        auto file = tmp / "metrics.txt";
        {
            std::ofstream(file) << text;
        }
        auto out = tmp / "promtool.out";
        int rc = std::system(("'" + promtool + "' check metrics < " + file.string() + " > " + out.string() + " 2>&1").c_str());
        INFO(read_file(out));
        CHECK(rc == 0);
    } else if (std::getenv("PULSE_REQUIRE_E2E")) {
        FAIL("promtool not found (PULSE_PROMTOOL or PATH; tools/dev test provides it)");
    } else {
        MESSAGE("promtool not installed: the exposition was not checked by Prometheus's parser");
    }

    rapidjson::Document d;
    d.Parse(get("application/json").c_str());
    REQUIRE(d.IsObject());
    CHECK(str(d["pulse_requests_total"], "type") == "counter");
    // The completed request's series (the zero series alerts need exist beside it).
    int completed = -1;
    for (const auto& series : d["pulse_requests_total"]["series"].GetArray())
        if (str(series["labels"], "outcome") == "completed") completed = series["value"].GetInt();
    CHECK(completed == 1);
    CHECK(d["pulse_ttft_seconds"]["series"][0]["count"].GetInt() == 1);
}

TEST_CASE("trace file: whole requests and responses, one JSON line each, created 0600") {
    FakeBackend be(R"({"turns":[{"content":"traced answer"}]})");
    TempDir tmp;
    auto trace = tmp / "trace.jsonl";
    Gateway gw(model_toml(be.url()), "trace_file = \"" + trace.string() + "\"\n");
    REQUIRE(post(gw.port, "/v1/responses", request(R"("a secret prompt")")).status == 200);
    REQUIRE(post(gw.port, "/v1/responses", "{broken").status == 400);  // not traced: not JSON
    struct stat sb {};
    REQUIRE(::stat(trace.c_str(), &sb) == 0);
    CHECK((sb.st_mode & 0777) == 0600);
    std::istringstream in(read_file(trace));
    std::vector<std::string> whats;
    for (std::string line; std::getline(in, line);) {
        rapidjson::Document d;
        d.Parse(line.c_str());
        REQUIRE_MESSAGE(d.IsObject(), line);
        whats.push_back(str(d, "what"));
        if (str(d, "what") == "request") CHECK(str(d["body"], "input") == "a secret prompt");
        if (str(d, "what") == "response") CHECK(str(d["body"]["output"][0]["content"][0], "text") == "traced answer");
    }
    CHECK(whats == std::vector<std::string>{"request", "response"});
}

// The request parser the gateway runs (parse_body_in_place), called directly so that the body's
// allocation is exactly its size: under ASan a read past it is an error. A body ending in a UTF-8
// lead byte inside an unterminated string was read up to 3 bytes past its end (found by
// tests/fuzz/fuzz_request).
TEST_CASE("a body that ends in a UTF-8 lead byte is refused without reading past its end") {
    for (const char* text : {"\"|||||||||||||||||\xF2", "{\"model\":\"m\",\"input\":\"abcdefghij\xF0", "\"0123456789abcdefghij\xE2\x82"}) {
        CAPTURE(text);
        std::string body(text);
        body.shrink_to_fit();
        rapidjson::Document doc;
        auto e = pulse::gateway::parse_body_in_place(body, doc);
        REQUIRE(e);
        CHECK(e->http_status == 400);
        CHECK(e->code == "invalid_encoding");  // the lead byte without its continuation
    }
}
