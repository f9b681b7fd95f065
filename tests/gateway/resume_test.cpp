// Mid-stream resume (models.X.resume): a backend that fails after output reached the client,
// and the same response continuing on another endpoint. Real processes on loopback (the fake
// backend follows vLLM's and llama-server's continuation rules); every wait is bounded.
#include <doctest/doctest.h>

#include <regex>

#include "support/gateway_harness.h"

using namespace pulse::test;

namespace {

const char* kUpstream = "keepalive_s = 0.3\nconnect_timeout_s = 1\nhealth_interval_s = 0.2\nretry_window_s = 10\nidle_timeout_s = 1\n";

std::string model_toml(const std::vector<std::string>& urls, const std::string& profile = "qwen38", const std::string& extra = "") {
    std::string t = "[models.m]\nprofile = \"" + profile + "\"\n" + extra;
    for (size_t i = 0; i < urls.size(); ++i)
        t += "[[models.m.endpoints]]\nname = \"" + std::string(1, static_cast<char>('a' + i)) + "\"\nurl = \"" + urls[i] + "\"\n";
    return t;
}

const std::string kRequest = R"({"model":"m","stream":true,"store":false,"input":[{"role":"user","content":"tell me"}]})";
const std::string kAnswer = "The quick brown fox jumps over the lazy dog and runs far away.";

// A script whose one turn says `turn` (JSON members), failing mid-stream as `die` says.
std::string script(const std::string& turn, const std::string& top = "") {
    return R"({"turns":[{)" + turn + "}]" + (top.empty() ? "" : "," + top) + "}";
}

std::string item_type(const Stream& st, size_t i) { return st.item(i)["type"].GetString(); }
std::string message_text(const Stream& st, size_t i) { return st.item(i)["content"][0]["text"].GetString(); }
std::string reasoning_summary(const Stream& st, size_t i) { return st.item(i)["summary"][0]["text"].GetString(); }

// The last message of the request a backend received `n`-th (0-based).
rapidjson::Document last_message(const FakeBackend& b, size_t n) {
    auto reqs = b.requests();
    REQUIRE(reqs.size() > n);
    rapidjson::Document d;
    d.Parse(reqs[n].c_str());
    rapidjson::Document m;
    const auto& ms = d["messages"];
    m.CopyFrom(ms[ms.Size() - 1], m.GetAllocator());
    if (d.HasMember("continue_final_message")) m.AddMember("_continue", rapidjson::Value(d["continue_final_message"].IsTrue()), m.GetAllocator());
    if (d.HasMember("add_generation_prompt"))
        m.AddMember("_add_generation_prompt", rapidjson::Value(d["add_generation_prompt"].IsTrue()), m.GetAllocator());
    return m;
}

int64_t metric(const std::string& metrics, const std::string& series) {
    std::smatch m;
    if (!std::regex_search(metrics, m, std::regex(std::regex_replace(series, std::regex(R"([{}"])"), R"(\$&)") + R"( (\d+))"))) return 0;
    return std::stoll(m[1]);
}

}  // namespace

TEST_CASE("a backend that fails mid-answer: the same response continues on the next endpoint, nothing lost or repeated") {
    // Every way an endpoint fails once output began: the connection drops, the server is
    // killed (kill -9), the engine reports an error event, the stream stalls past the idle timeout.
    for (const char* how : {"drop", "kill", "error", "stall"}) {
        CAPTURE(how);
        std::string die = std::string(R"("die_after":4,"die":")") + how + R"(","stall_ms":3000,)";
        FakeBackend a(script(die + R"("content":")" + kAnswer + "\"")), b(script(R"("content":")" + kAnswer + "\""));
        Gateway gw(model_toml({a.url(), b.url()}), "", kUpstream, "[warmup]\nenabled = false\n");
        auto r = post(gw.port, "/v1/responses", kRequest);
        REQUIRE(r.status == 200);
        Stream st = check_stream(r.body);  // one response: sequence numbers continuous, deltas == done text
        CHECK(st.terminal == "response.completed");
        REQUIRE(st.items.size() == 1);
        CHECK(item_type(st, 0) == "message");
        CHECK(message_text(st, 0) == kAnswer);
        // b was asked to continue exactly what the client had: the first four words.
        auto m = last_message(b, 0);
        CHECK(std::string(m["role"].GetString()) == "assistant");
        CHECK(std::string(m["content"].GetString()) == "The quick brown fox ");
        CHECK(m["_continue"].IsTrue());
        CHECK(m["_add_generation_prompt"].IsFalse());
        // Usage: b's request (prompt + the partial answer re-read) and a's four streamed tokens.
        const auto& u = (*st.response)["usage"];
        CHECK(u["output_tokens"].GetInt64() == 4 + 9);  // a: 4 words, b: the 9 that follow
        std::string metrics = get(gw.port, "/metrics");
        CHECK(metric(metrics, R"(pulse_resumed_streams_total{model="m",endpoint="a"})") == 1);
        CHECK(metric(metrics, R"(pulse_requests_total{model="m",endpoint="b",outcome="completed"})") == 1);
        CHECK(gw.log().find("failed mid-stream") != std::string::npos);
        CHECK(gw.log().find("resumed=1") != std::string::npos);
    }
}

// The client's max_output_tokens covers every attempt together. A continuation used to ask for
// the whole limit again: seven kills of a real llama-server gave 410-715 tokens for a limit of 400.
TEST_CASE("a resumed answer stays within max_output_tokens and ends incomplete at the limit, as an uninterrupted one does") {
    const std::string limited = R"({"model":"m","stream":true,"store":false,"max_output_tokens":8,"input":[{"role":"user","content":"tell me"}]})";
    {
        FakeBackend a(script(R"("die_after":3,"content":")" + kAnswer + "\"")), b(script(R"("content":")" + kAnswer + "\""));
        Gateway gw(model_toml({a.url(), b.url()}), "", kUpstream, "[warmup]\nenabled = false\n");
        Stream st = check_stream(post(gw.port, "/v1/responses", limited).body);
        CHECK(st.terminal == "response.incomplete");
        CHECK(std::string((*st.response)["incomplete_details"]["reason"].GetString()) == "max_output_tokens");
        CHECK(message_text(st, 0) == "The quick brown fox jumps over the lazy ");  // the first 8 words, as from one server
        rapidjson::Document up;
        up.Parse(b.requests().at(0).c_str());
        CHECK(up["max_tokens"].GetInt64() == 8 - 3);  // only what is left
        CHECK((*st.response)["usage"]["output_tokens"].GetInt64() == 8);
    }
    {
        // Killed right after its 8th token: nothing is left to ask for; no continuation is sent.
        FakeBackend a(script(R"("die_after":8,"die":"kill","content":")" + kAnswer + "\"")), b(script(R"("content":")" + kAnswer + "\""));
        Gateway gw(model_toml({a.url(), b.url()}), "", kUpstream, "[warmup]\nenabled = false\n");
        Stream st = check_stream(post(gw.port, "/v1/responses", limited).body);
        CHECK(st.terminal == "response.incomplete");
        CHECK(std::string((*st.response)["incomplete_details"]["reason"].GetString()) == "max_output_tokens");
        CHECK(message_text(st, 0) == "The quick brown fox jumps over the lazy ");
        CHECK(b.requests().empty());
        CHECK((*st.response)["usage"]["output_tokens"].GetInt64() == 8);
    }
}

TEST_CASE("resume without a second endpoint: the same endpoint continues the response once it is back") {
    FakeBackend a(script(R"("die_after":3,"content":")" + kAnswer + "\""));
    Gateway gw(model_toml({a.url()}), "", kUpstream, "[warmup]\nenabled = false\n");
    auto r = post(gw.port, "/v1/responses", kRequest);
    Stream st = check_stream(r.body);
    CHECK(st.terminal == "response.completed");
    REQUIRE(st.items.size() == 1);
    CHECK(message_text(st, 0) == kAnswer);
    CHECK(std::string(last_message(a, 1)["content"].GetString()) == "The quick brown ");
}

TEST_CASE("a stream:false response is resumed too: the client gets the whole answer") {
    FakeBackend a(script(R"("die_after":5,"content":")" + kAnswer + "\"")), b(script(R"("content":")" + kAnswer + "\""));
    Gateway gw(model_toml({a.url(), b.url()}), "", kUpstream, "[warmup]\nenabled = false\n");
    std::string body = std::regex_replace(kRequest, std::regex(R"("stream":true)"), R"("stream":false)");
    auto r = post(gw.port, "/v1/responses", body);
    REQUIRE(r.status == 200);
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    CHECK(std::string(d["status"].GetString()) == "completed");
    REQUIRE(d["output"].Size() == 1);
    CHECK(std::string(d["output"][0]["content"][0]["text"].GetString()) == kAnswer);
}

TEST_CASE("inside the reasoning: llama-server continues the same reasoning item; vLLM's template closes it and the answer follows") {
    const std::string thinking = "First I look at the file then I decide what to change.";
    const std::string turn = R"("die_after":3,"reasoning":")" + thinking + R"(","content":"Done.")";
    SUBCASE("llamacpp") {
        FakeBackend a(script(turn), "llamacpp"), b(script(R"("reasoning":")" + thinking + R"(","content":"Done.")"), "llamacpp");
        Gateway gw(model_toml({a.url(), b.url()}, "llamacpp"), "", kUpstream, "[warmup]\nenabled = false\n");
        Stream st = check_stream(post(gw.port, "/v1/responses", kRequest).body);
        CHECK(st.terminal == "response.completed");
        REQUIRE(st.items.size() == 2);
        CHECK(item_type(st, 0) == "reasoning");
        CHECK(reasoning_summary(st, 0) == thinking);  // one reasoning item, continued where it broke
        CHECK(message_text(st, 1) == "Done.");
        auto m = last_message(b, 0);
        CHECK(std::string(m["reasoning_content"].GetString()) == "First I look ");
        CHECK(std::string(m["content"].GetString()).empty());
    }
    SUBCASE("qwen38 (vLLM)") {
        FakeBackend a(script(turn)), b(script(R"("reasoning":")" + thinking + R"(","content":"Done.")"));
        Gateway gw(model_toml({a.url(), b.url()}), "", kUpstream, "[warmup]\nenabled = false\n");
        Stream st = check_stream(post(gw.port, "/v1/responses", kRequest).body);
        CHECK(st.terminal == "response.completed");
        REQUIRE(st.items.size() == 2);
        CHECK(reasoning_summary(st, 0) == "First I look ");  // what the model thought before the failure
        CHECK(message_text(st, 1) == "Done.");
        CHECK(std::string(last_message(b, 0)["reasoning_content"].GetString()) == "First I look ");
    }
}

TEST_CASE("a llama-server that repeats the prefill (built before continue_final_message): the repeat never reaches the client") {
    FakeBackend a(script(R"("die_after":4,"content":")" + kAnswer + "\"", R"("legacy_prefill":true)"), "llamacpp"),
        b(script(R"("content":")" + kAnswer + "\"", R"("legacy_prefill":true)"), "llamacpp");
    Gateway gw(model_toml({a.url(), b.url()}, "llamacpp"), "", kUpstream, "[warmup]\nenabled = false\n");
    Stream st = check_stream(post(gw.port, "/v1/responses", kRequest).body);
    CHECK(st.terminal == "response.completed");
    REQUIRE(st.items.size() == 1);
    CHECK(message_text(st, 0) == kAnswer);
    // b does repeat a prefill, as such a server does:
    auto direct = post(b.port, "/v1/chat/completions",
                       R"({"model":"m","stream":true,"continue_final_message":true,"add_generation_prompt":false,)"
                       R"("messages":[{"role":"user","content":"tell me"},{"role":"assistant","content":"The quick brown fox "}]})");
    CHECK(direct.body.find(R"("content":"The quick brown fox jumps ")") != std::string::npos);
}

TEST_CASE("a failure inside a tool call's arguments: the call, never shown, arrives whole from the next endpoint") {
    // 4 words, then the call's name delta and two 8-byte argument fragments; it dies in the third.
    const std::string turn = R"("content":"I will run it.","tool_calls":[{"name":"exec_command","arguments":{"cmd":"ls -la /tmp"}}])";
    FakeBackend a(script(R"("die_after":7,)" + turn)), b(script(turn));
    Gateway gw(model_toml({a.url(), b.url()}), "", kUpstream, "[warmup]\nenabled = false\n");
    std::string req = R"({"model":"m","stream":true,"store":false,"input":[{"role":"user","content":"list"}],)"
                      R"("tools":[{"type":"function","name":"exec_command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}]})";
    Stream st = check_stream(post(gw.port, "/v1/responses", req).body);
    CHECK(st.terminal == "response.completed");
    REQUIRE(st.items.size() == 2);
    CHECK(message_text(st, 0) == "I will run it.");
    CHECK(item_type(st, 1) == "function_call");
    CHECK(std::string(st.item(1)["arguments"].GetString()) == R"({"cmd":"ls -la /tmp"})");
    int added = 0;
    for (const auto& e : st.events)
        if (e.type == "response.output_item.added") ++added;
    CHECK(added == 2);  // the call was announced once
    CHECK(std::string(last_message(b, 0)["content"].GetString()) == "I will run it.");
}

TEST_CASE("resume = false: a mid-stream failure ends the response as failed, and nothing is resent") {
    FakeBackend a(script(R"("die_after":4,"content":")" + kAnswer + "\"")), b(script(R"("content":")" + kAnswer + "\""));
    Gateway gw(model_toml({a.url(), b.url()}, "qwen38", "resume = false\n"), "", kUpstream, "[warmup]\nenabled = false\n");
    Stream st = check_stream(post(gw.port, "/v1/responses", kRequest).body);
    CHECK(st.terminal == "response.failed");
    CHECK(b.requests().empty());
    CHECK(metric(get(gw.port, "/metrics"), R"(pulse_resumed_streams_total{model="m",endpoint="a"})") == 0);
}

TEST_CASE("a profile built against SDK 1.0 (no resume) still loads and serves; its mid-stream failures fail as in 1.0") {
    FakeBackend a(script(R"("die_after":4,"content":")" + kAnswer + "\"")), b(script(R"("content":")" + kAnswer + "\""));
    std::string models = model_toml({a.url(), b.url()}, "reloadable") + "[models.ok]\nprofile = \"reloadable\"\n" +
                         "[[models.ok.endpoints]]\nurl = \"" + b.url() + "\"\n";
    Gateway gw(models, "", kUpstream, "[warmup]\nenabled = false\n", {{"reloadable_v10", "reloadable"}});
    std::string ok_req = std::regex_replace(kRequest, std::regex(R"("model":"m")"), R"("model":"ok")");
    Stream ok = check_stream(post(gw.port, "/v1/responses", ok_req).body);
    CHECK(ok.terminal == "response.completed");
    REQUIRE(ok.items.size() == 1);
    CHECK(message_text(ok, 0) == "[v10] " + kAnswer);
    Stream broken = check_stream(post(gw.port, "/v1/responses", kRequest).body);
    CHECK(broken.terminal == "response.failed");
    CHECK(b.requests().size() == 1);  // only the "ok" request: nothing was resent
    CHECK(gw.log().find("failed mid-stream") == std::string::npos);
}

TEST_CASE("resume is bounded by the retry window: an endpoint that fails every continuation too ends the response as failed") {
    std::string longer;
    for (int i = 0; i < 10; ++i) longer += kAnswer + " ";  // 130 words: more than a 2 s window of one-word continuations
    FakeBackend a(script(R"("die_after":1,"die_on_continuation":true,"content":")" + longer + "\""));
    std::string upstream = std::regex_replace(kUpstream, std::regex("retry_window_s = 10"), "retry_window_s = 2");
    Gateway gw(model_toml({a.url()}), "", upstream, "[warmup]\nenabled = false\n");
    auto t0 = std::chrono::steady_clock::now();
    Stream st = check_stream(post(gw.port, "/v1/responses", kRequest).body);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(st.terminal == "response.failed");
    CHECK(took < 8);  // the 2 s window, a last round at its end, and the slack of a loaded machine
    // It did keep trying within the window: each continuation got one word further.
    CHECK(a.requests().size() >= 3);
    REQUIRE(st.items.empty());  // the message was never completed: no output_item.done for it
    CHECK(metric(get(gw.port, "/metrics"), R"(pulse_resumed_streams_total{model="m",endpoint="a"})") >= 2);
}

TEST_CASE("a profile whose resume fails: the response ends failed, never completed with half an answer") {
    // The engine error event is the case that matters: the stream goes on to [DONE] after it.
    for (const char* how : {"drop", "error"}) {
        CAPTURE(how);
        FakeBackend a(script(std::string(R"("die_after":4,"die":")") + how + R"(","content":")" + kAnswer + "\"")),
            b(script(R"("content":")" + kAnswer + "\""));
        Gateway gw(model_toml({a.url(), b.url()}, "reloadable"), "", kUpstream, "[warmup]\nenabled = false\n",
                   {{"reloadable_resume_fails", "reloadable"}});
        Stream st = check_stream(post(gw.port, "/v1/responses", kRequest).body);
        CHECK(st.terminal == "response.failed");
        CHECK(b.requests().empty());
        CHECK(gw.log().find("the response cannot be resumed: ") != std::string::npos);
        CHECK(gw.log().find("resume refused on purpose") != std::string::npos);
    }
}

// profile_options.resume = "tokens" (llamacpp): the request goes out as a raw completion of the
// prompt llama-server renders (/apply-template, asked first at the server's root), the stream's
// token ids are kept, and a resume sends the rendered prompt followed by exactly those ids. The
// fake checks that the ids it is given are the ones it generated (else it answers 400).
namespace {
rapidjson::Document request_json(const FakeBackend& b, size_t n) {
    auto reqs = b.requests();
    REQUIRE(reqs.size() > n);
    rapidjson::Document d;
    d.Parse(reqs[n].c_str());
    return d;
}
}  // namespace

TEST_CASE("resume = \"tokens\": the continuation is the rendered prompt and the very ids generated, in text and in reasoning") {
    const std::string thinking = "First I look at the file then I decide what to change.";
    const std::string tokens_toml = "profile_options = { resume = \"tokens\" }\n";
    SUBCASE("in the text") {
        FakeBackend a(script(R"("die_after":4,"content":")" + kAnswer + "\""), "llamacpp"), b(script(R"("content":")" + kAnswer + "\""), "llamacpp");
        Gateway gw(model_toml({a.url(), b.url()}, "llamacpp", tokens_toml), "", kUpstream, "[warmup]\nenabled = false\n");
        std::string body = std::regex_replace(kRequest, std::regex(R"("store":false)"), R"("store":false,"reasoning":{"effort":"none"})");
        Stream st = check_stream(post(gw.port, "/v1/responses", body).body);
        CHECK(st.terminal == "response.completed");
        REQUIRE(st.items.size() == 1);
        CHECK(message_text(st, 0) == kAnswer);
        // a: the template call, then the raw completion of what it rendered.
        auto prep = request_json(a, 0);
        CHECK(prep.HasMember("messages"));
        auto first = request_json(a, 1);
        REQUIRE(first["prompt"].IsString());
        CHECK(std::string(first["prompt"].GetString()).find("<|im_start|>assistant\n<think>\n\n</think>\n\n") != std::string::npos);
        CHECK(first["verbose"].IsTrue());
        // b: no template call (the rendered prompt is reused), the prompt and a's four ids.
        auto cont = request_json(b, 0);
        REQUIRE(cont["prompt"].IsArray());
        REQUIRE(cont["prompt"].Size() == 5);
        CHECK(std::string(cont["prompt"][0].GetString()) == first["prompt"].GetString());
        for (rapidjson::SizeType i = 1; i < 5; ++i) CHECK(cont["prompt"][i].GetInt() == static_cast<int>(999 + i));
        CHECK((*st.response)["usage"]["output_tokens"].GetInt64() == 13);  // 4 from a, 9 from b
        CHECK(gw.log().find("by tokens (4 generated ids") != std::string::npos);
    }
    SUBCASE("in the reasoning, and past its end") {
        const std::string turn = R"("reasoning":")" + thinking + R"(","content":"Done.")";
        FakeBackend a(script(R"("die_after":3,)" + turn), "llamacpp"), b(script(turn), "llamacpp");
        Gateway gw(model_toml({a.url(), b.url()}, "llamacpp", tokens_toml), "", kUpstream, "[warmup]\nenabled = false\n");
        Stream st = check_stream(post(gw.port, "/v1/responses", kRequest).body);
        CHECK(st.terminal == "response.completed");
        REQUIRE(st.items.size() == 2);
        CHECK(reasoning_summary(st, 0) == thinking);
        CHECK(message_text(st, 1) == "Done.");
        const auto& u = (*st.response)["usage"];
        CHECK(u["output_tokens"].GetInt64() == 13 + 1);                               // 12 words, the end of the block, "Done."
        CHECK(u["output_tokens_details"]["reasoning_tokens"].GetInt64() == 12 + 1);  // counted token by token
    }
    SUBCASE("a token sent without its id (a character split across tokens): the resume goes by text, and says why") {
        FakeBackend a(script(R"("die_after":6,"hole_at":2,"content":")" + kAnswer + "\""), "llamacpp"),
            b(script(R"("content":")" + kAnswer + "\""), "llamacpp");
        Gateway gw(model_toml({a.url(), b.url()}, "llamacpp", tokens_toml), "", kUpstream, "[warmup]\nenabled = false\n");
        std::string body = std::regex_replace(kRequest, std::regex(R"("store":false)"), R"("store":false,"reasoning":{"effort":"none"})");
        Stream st = check_stream(post(gw.port, "/v1/responses", body).body);
        CHECK(st.terminal == "response.completed");
        REQUIRE(st.items.size() == 1);
        CHECK(message_text(st, 0) == kAnswer);
        auto cont = request_json(b, 0);
        CHECK(cont.HasMember("messages"));  // a chat continuation of the text
        CHECK(cont["continue_final_message"].IsTrue());
        CHECK(gw.log().find("by text (the backend generated 4 tokens and reported the ids of 3)") != std::string::npos);
    }
    SUBCASE("a request that needs the server's chat handling (a forced tool) is a chat request, resumed by text") {
        FakeBackend a(script(R"("die_after":2,"content":")" + kAnswer + "\""), "llamacpp"), b(script(R"("content":")" + kAnswer + "\""), "llamacpp");
        Gateway gw(model_toml({a.url(), b.url()}, "llamacpp", tokens_toml), "", kUpstream, "[warmup]\nenabled = false\n");
        auto first = [&] {
            std::string body = R"({"model":"m","stream":true,"store":false,"input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":"required"})";
            post(gw.port, "/v1/responses", body);
            return request_json(a, 0);
        }();
        CHECK(first.HasMember("messages"));  // no template call first
        CHECK(!first.HasMember("prompt"));
    }
}

TEST_CASE("resume = \"tokens\" on vLLM (qwen38): the prompt's ids from /tokenize, each chunk's token_ids, the continuation all ids") {
    // vLLM's own fields, from its OpenAI entrypoints (vllm/entrypoints/openai): the route
    // POST /tokenize at the server's root; protocol: TokenizeChatRequest {model, messages, tools,
    // add_generation_prompt (default true), chat_template_kwargs, add_special_tokens (default
    // false, as the chat endpoint)} -> TokenizeResponse {count, max_model_len, tokens};
    // CompletionRequest.prompt may be a list of ids; CompletionRequest.return_token_ids: "in
    // streaming mode, prompt_token_ids is included only in the first chunk, and token_ids contains
    // the delta tokens for each chunk" (serving_completion: CompletionResponseStreamChoice.token_ids).
    const std::string thinking = "First I look at the file then I decide what to change.";
    const std::string turn = R"("reasoning":")" + thinking + R"(","content":")" + kAnswer + "\"";
    FakeBackend a(script(R"("die_after":16,)" + turn)), b(script(turn));
    Gateway gw(model_toml({a.url(), b.url()}, "qwen38", "profile_options = { resume = \"tokens\" }\n"), "", kUpstream,
               "[warmup]\nenabled = false\n");
    Stream st = check_stream(post(gw.port, "/v1/responses", kRequest).body);
    CHECK(st.terminal == "response.completed");
    REQUIRE(st.items.size() == 2);
    CHECK(reasoning_summary(st, 0) == thinking);
    CHECK(message_text(st, 1) == kAnswer);  // killed 3 words into the answer, past the reasoning's end
    auto prep = request_json(a, 0);
    CHECK(prep.HasMember("messages"));
    CHECK(prep["add_generation_prompt"].IsTrue());
    CHECK(!prep.HasMember("stream"));      // only what the template reads
    CHECK(!prep.HasMember("max_tokens"));
    auto first = request_json(a, 1);
    REQUIRE(first["prompt"].IsArray());
    CHECK(first["return_token_ids"].IsTrue());
    const rapidjson::SizeType prompt_ids = first["prompt"].Size();
    auto cont = request_json(b, 0);
    REQUIRE(cont["prompt"].Size() == prompt_ids + 16);
    for (rapidjson::SizeType i = 0; i < 16; ++i) CHECK(cont["prompt"][prompt_ids + i].GetInt() == static_cast<int>(1000 + i));
    const auto& u = (*st.response)["usage"];
    CHECK(u["output_tokens"].GetInt64() == 12 + 1 + 13);
    CHECK(u["output_tokens_details"]["reasoning_tokens"].GetInt64() == 12 + 1);
    CHECK(gw.log().find("by tokens (16 generated ids") != std::string::npos);
}

TEST_CASE("resume = \"tokens\": a server that cannot render the prompt fails over like any failed request") {
    // b answers the template call with a 404 (an older llama-server, or another server behind
    // the URL): the request is served by a, which renders it.
    FakeBackend a(script(R"("content":")" + kAnswer + "\""), "llamacpp"), b(script(R"("content":")" + kAnswer + "\""));  // b: vLLM flavor, no /apply-template
    Gateway gw(model_toml({b.url(), a.url()}, "llamacpp", "profile_options = { resume = \"tokens\" }\n"), "", kUpstream,
               "[warmup]\nenabled = false\n");
    Stream st = check_stream(post(gw.port, "/v1/responses", kRequest).body);
    CHECK(st.terminal == "response.completed");
    REQUIRE(st.items.size() == 1);
    CHECK(message_text(st, 0) == kAnswer);
    CHECK(request_json(a, 1)["prompt"].IsString());
    CHECK(gw.log().find("endpoint a refused the request") != std::string::npos);
}
