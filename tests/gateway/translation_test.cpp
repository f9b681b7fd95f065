// The qwen38 profile, loaded as the real plugin, driven through the host tables:
//  - request direction, table-driven from real Codex CLI captures (tests/fixtures/codex);
//  - response direction, from vLLM-shaped chunk sequences, through the host's ResponseBuilder.
#include <doctest/doctest.h>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <functional>
#include <set>
#include <map>

#include "gateway/protocol/response_builder.h"
#include "plugin/plugin_manager.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace pulse;
using rapidjson::Value;

namespace {

// The qwen38 plugin, loaded once for the whole file.
struct Profile {
    test::TempDir dir;
    std::unique_ptr<plugin::PluginManager> pm;
    plugin::ComponentLease lease;
    void* instance = nullptr;
    rapidjson::Document model;

    explicit Profile(const std::string& options_json = "null", const std::string& name = "qwen38") {
        auto so = dir / (name + ".so");
        fs::copy_file(fs::path(std::getenv("PULSE_PLUGIN_BUILD_DIR")) / (name + ".so"), so);
        fs::permissions(so, fs::perms(0755));
        plugin::Options o;
        o.dirs = {dir.path()};
        pm = std::make_unique<plugin::PluginManager>(o);
        pm->load_all();
        lease = pm->translation(name);
        REQUIRE(lease);
        rapidjson::Document opts;
        opts.Parse(options_json.c_str());
        pulse_call call;
        REQUIRE_MESSAGE(vt().create(lease->registration.user, &call, opts.IsNull() ? nullptr : host::view(&opts), &instance) == PULSE_OK,
                        call.message);
        model.Parse(R"({"id":"qwen3.8-flash-next","upstream_model":"served-name","context_window":524288,
                        "sampling":{"temperature":0.6,"top_p":0.95,"top_k":20}})");
    }
    ~Profile() { vt().destroy(instance); }
    const pulse_translation_vt_t& vt() const { return lease->registration.translation; }

    // Runs build_request; returns the upstream body as a document (or the error).
    rapidjson::Document build(const Value& request, pulse_status_t* rc_out = nullptr, std::string* err = nullptr) {
        pulse_call call;
        pulse_upstream_req out;
        pulse_status_t rc = vt().build_request(instance, &call, host::view(&request), host::view(&model), &out);
        if (rc_out) *rc_out = rc;
        if (err) *err = call.message;
        rapidjson::Document d;
        if (rc == PULSE_OK) {
            CHECK(out.path == "/chat/completions");
            d.Parse(out.body.text().data(), out.body.text().size());
            REQUIRE(!d.HasParseError());
        } else {
            REQUIRE_MESSAGE(rc_out, "build_request failed: " << call.message);
        }
        return d;
    }

    // Feeds chunk payloads and the end; returns the events the builder emitted.
    struct Run {
        std::vector<std::pair<std::string, std::shared_ptr<rapidjson::Document>>> events;
        std::string terminal;
        std::shared_ptr<rapidjson::Document> response;
        bool has(const std::string& type) const {
            for (const auto& e : events)
                if (e.first == type) return true;
            return false;
        }
        std::vector<const Value*> done_items() const {
            std::vector<const Value*> out;
            for (const auto& e : events)
                if (e.first == "response.output_item.done") out.push_back(&(*e.second)["item"]);
            return out;
        }
    };
    Run stream(const Value& request, const std::vector<std::string>& chunks, pulse_stream_end_t how = PULSE_STREAM_CLEAN,
               gateway::ReasoningOutput mode = gateway::ReasoningOutput::summary) {
        Run run;
        gateway::ResponseBuilder b("resp_test0000", "m", mode, [&](std::string_view type, std::string_view json) {
            auto d = std::make_shared<rapidjson::Document>();
            d->Parse(json.data(), json.size());
            run.events.emplace_back(std::string(type), d);
        });
        pulse_call call;
        void* st = nullptr;
        REQUIRE(vt().stream_open(instance, &call, host::view(&request), &st) == PULSE_OK);
        b.start();
        for (const auto& c : chunks) {
            pulse_status_t rc = vt().stream_feed(st, &call, {c.data(), c.size()}, &b);
            if (rc < 0) {
                b.fail(rc, call.message);
                break;
            }
        }
        if (!b.ended()) {
            pulse_status_t rc = vt().stream_finish(st, &call, how, &b);
            if (rc < 0) b.fail(rc, call.message);
            else b.end(how);
        }
        vt().stream_close(st);
        run.terminal = run.events.back().first;
        run.response = run.events.back().second;
        return run;
    }
};

// Runs the profile's map_error on an upstream HTTP error; the message goes to *msg.
pulse_status_t map_error(Profile& p, int status, const std::string& body, std::string* msg = nullptr) {
    pulse_call call;
    pulse_status_t s = p.vt().map_error(p.instance, &call, status, {body.data(), body.size()});
    if (msg) *msg = call.message;
    return s;
}

rapidjson::Document load_capture(const std::string& name) {
    std::string text = test::read_file(fs::path(PULSE_SOURCE_ROOT) / "tests/fixtures/codex" / name);
    rapidjson::Document cap;
    cap.Parse(text.c_str());
    REQUIRE(!cap.HasParseError());
    rapidjson::Document body;
    body.CopyFrom(cap["body"], body.GetAllocator());
    return body;
}

rapidjson::Document json(const std::string& text) {
    rapidjson::Document d;
    d.Parse(text.c_str());
    REQUIRE_MESSAGE(!d.HasParseError(), text);
    return d;
}

std::string dump(const Value& v) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    v.Accept(w);
    return b.GetString();
}

std::string str(const Value& v, const char* k) { return v.HasMember(k) && v[k].IsString() ? v[k].GetString() : ""; }

std::vector<std::string> tool_names(const Value& body) {
    std::vector<std::string> out;
    if (body.HasMember("tools"))
        for (const auto& t : body["tools"].GetArray()) out.push_back(t["function"]["name"].GetString());
    return out;
}

bool contains(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// vLLM chunk helpers
std::string chunk(const std::string& delta, const std::string& finish = "null") {
    return R"({"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":)" + delta +
           R"(,"finish_reason":)" + finish + "}]}";
}
std::string usage_chunk(int prompt, int completion, int cached = 0, int reasoning = 0) {
    return R"({"id":"c","choices":[],"usage":{"prompt_tokens":)" + std::to_string(prompt) + R"(,"completion_tokens":)" +
           std::to_string(completion) + R"(,"total_tokens":)" + std::to_string(prompt + completion) +
           R"(,"prompt_tokens_details":{"cached_tokens":)" + std::to_string(cached) +
           R"(},"completion_tokens_details":{"reasoning_tokens":)" + std::to_string(reasoning) + "}}}";
}
std::string tool_start(int index, const std::string& name) {
    return chunk(R"({"tool_calls":[{"index":)" + std::to_string(index) + R"(,"id":"chatcmpl-tool-)" + std::to_string(index) +
                 R"(","type":"function","function":{"name":")" + name + R"(","arguments":""}}]})");
}
std::string tool_frag(int index, const std::string& json_escaped_fragment) {
    return chunk(R"({"tool_calls":[{"index":)" + std::to_string(index) + R"(,"function":{"arguments":")" +
                 json_escaped_fragment + R"("}}]})");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Request direction: every capture
// ---------------------------------------------------------------------------------------------

TEST_CASE("every Codex capture translates to a Chat Completions body vLLM accepts") {
    Profile p;
    struct Case {
        const char* file;
        std::function<void(const Value& in, const Value& out)> check;
    };
    const std::vector<Case> cases = {
        {"02_plain_turn_with_catalog.request.json",
         [](const Value& in, const Value& out) {
             const auto& msgs = out["messages"];
             // Leading developer messages merge into ONE first system message.
             CHECK(str(msgs[0], "role") == "system");
             int systems = 0;
             for (const auto& m : msgs.GetArray()) systems += str(m, "role") == "system";
             CHECK(systems == 1);
             CHECK(str(msgs[0], "content").find("You are Codex running on a local model") == 0);
             CHECK(str(msgs[0], "content").find("<skills_instructions>") != std::string::npos);
             CHECK(str(msgs[msgs.Size() - 1], "role") == "user");
             auto names = tool_names(out);
             CHECK(contains(names, "exec_command"));
             CHECK(contains(names, "apply_patch"));                      // custom -> function
             CHECK(contains(names, "multi_agent_v1__close_agent"));      // namespace flattened
             CHECK(contains(names, "multi_agent_v1__spawn_agent"));
             CHECK(names.size() == 13);  // 7 functions + apply_patch + 5 namespace members; web_search dropped
             for (const auto& t : out["tools"].GetArray())
                 if (std::string(t["function"]["name"].GetString()) == "apply_patch") {
                     CHECK(dump(t["function"]["parameters"]["required"]) == R"(["input"])");
                     CHECK(std::string(t["function"]["description"].GetString()).find("lark grammar") != std::string::npos);
                 }
             CHECK(str(out, "tool_choice") == "auto");
             CHECK(out["parallel_tool_calls"].IsTrue());
             CHECK(out["stream"].IsTrue());
             CHECK(out["stream_options"]["include_usage"].IsTrue());
             CHECK(str(out, "model") == "served-name");
             CHECK(out["temperature"].GetDouble() == doctest::Approx(0.6));
             CHECK(out["top_k"].GetInt() == 20);
             CHECK_FALSE(out.HasMember("max_tokens"));
             CHECK(out["chat_template_kwargs"]["enable_thinking"].IsTrue());  // effort: medium
             CHECK_FALSE(out.HasMember("store"));
             CHECK_FALSE(out.HasMember("include"));
             (void)in;
         }},
        {"03b_function_call.request2_with_output.json",
         [](const Value&, const Value& out) {
             const auto& msgs = out["messages"];
             const Value* call_msg = nullptr;
             const Value* tool_msg = nullptr;
             for (const auto& m : msgs.GetArray()) {
                 if (m.HasMember("tool_calls")) call_msg = &m;
                 if (str(m, "role") == "tool") tool_msg = &m;
             }
             REQUIRE(call_msg);
             REQUIRE(tool_msg);
             const auto& tc = (*call_msg)["tool_calls"][0];
             CHECK(str(tc, "type") == "function");
             CHECK(str(tc["function"], "name") == "exec_command");
             CHECK(json(tc["function"]["arguments"].GetString()).IsObject());  // a JSON string vLLM can json.loads
             CHECK(str(*tool_msg, "tool_call_id") == str(tc, "id"));
             CHECK(str(*tool_msg, "content").find("pulse-tool-ok") != std::string::npos);
         }},
        {"04_custom_tool_apply_patch.request2_with_output.json",
         [](const Value& in, const Value& out) {
             std::string patch;
             for (const auto& it : in["input"].GetArray())
                 if (str(it, "type") == "custom_tool_call") patch = str(it, "input");
             REQUIRE(!patch.empty());
             bool found = false;
             for (const auto& m : out["messages"].GetArray())
                 if (m.HasMember("tool_calls"))
                     for (const auto& tc : m["tool_calls"].GetArray())
                         if (str(tc["function"], "name") == "apply_patch") {
                             auto args = json(tc["function"]["arguments"].GetString());
                             CHECK(str(args, "input") == patch);  // raw patch survives as {"input": ...}
                             found = true;
                         }
             CHECK(found);
         }},
        {"05_reasoning_item_echo.request2.json",
         [](const Value&, const Value& out) {
             bool found = false;
             for (const auto& m : out["messages"].GetArray())
                 if (m.HasMember("tool_calls")) {
                     CHECK(str(m, "reasoning_content") == "raw thinking: user wants echo.");
                     found = true;
                 }
             CHECK(found);
         }},
        {"06_parallel_function_calls.request2.json",
         [](const Value&, const Value& out) {
             // Both calls on one assistant message, then both tool results.
             const auto& msgs = out["messages"];
             for (rapidjson::SizeType i = 0; i < msgs.Size(); ++i)
                 if (msgs[i].HasMember("tool_calls")) {
                     CHECK(msgs[i]["tool_calls"].Size() == 2);
                     REQUIRE(i + 2 < msgs.Size());
                     CHECK(str(msgs[i + 1], "role") == "tool");
                     CHECK(str(msgs[i + 2], "role") == "tool");
                     CHECK(str(msgs[i + 1], "tool_call_id") == str(msgs[i]["tool_calls"][0], "id"));
                     CHECK(str(msgs[i + 2], "tool_call_id") == str(msgs[i]["tool_calls"][1], "id"));
                     return;
                 }
             FAIL("no assistant message with tool_calls");
         }},
        {"07_output_schema_image_effort_verbosity.request.json",
         [](const Value&, const Value& out) {
             CHECK(str(out["response_format"], "type") == "json_schema");
             CHECK(str(out["response_format"]["json_schema"], "name") == "codex_output_schema");
             CHECK(out["response_format"]["json_schema"]["schema"]["required"][0] == "answer");
             bool image = false;
             for (const auto& m : out["messages"].GetArray())
                 if (str(m, "role") == "user" && m["content"].IsArray())
                     for (const auto& part : m["content"].GetArray())
                         if (str(part, "type") == "image_url")
                             image = std::string(part["image_url"]["url"].GetString()).rfind("data:image/", 0) == 0;
             CHECK(image);
             CHECK(out["chat_template_kwargs"]["enable_thinking"].IsTrue());  // effort: high
         }},
        {"08a_local_compaction.request.json",
         [](const Value& in, const Value& out) {
             CHECK(in["tools"].Empty());
             CHECK_FALSE(out.HasMember("tools"));        // no tools: no tool_choice either
             CHECK_FALSE(out.HasMember("tool_choice"));
             CHECK_FALSE(out.HasMember("parallel_tool_calls"));
             bool history_calls = false;
             for (const auto& m : out["messages"].GetArray()) history_calls |= m.HasMember("tool_calls");
             CHECK(history_calls);  // the tool-call history is kept
             CHECK(str(out["messages"][out["messages"].Size() - 1], "content").find("CONTEXT CHECKPOINT COMPACTION") !=
                   std::string::npos);
         }},
        {"10_function_output_is_content_array.request2.json",
         [](const Value&, const Value& out) {
             const auto& msgs = out["messages"];
             for (rapidjson::SizeType i = 0; i < msgs.Size(); ++i)
                 if (str(msgs[i], "role") == "tool") {
                     CHECK(msgs[i]["content"].IsString());  // tool messages stay text
                     REQUIRE(i + 1 < msgs.Size());
                     const auto& next = msgs[i + 1];     // the image follows as a user message
                     CHECK(str(next, "role") == "user");
                     REQUIRE(next["content"].IsArray());
                     CHECK(str(next["content"][1], "type") == "image_url");
                     return;
                 }
             FAIL("no tool message");
         }},
        {"11_namespace_tool_call.request2.json",
         [](const Value&, const Value& out) {
             bool found = false;
             for (const auto& m : out["messages"].GetArray())
                 if (m.HasMember("tool_calls"))
                     found = str(m["tool_calls"][0]["function"], "name") == "multi_agent_v1__close_agent";
             CHECK(found);
         }},
        {"13_lean_toolset.request.json",
         [](const Value&, const Value& out) {
             auto names = tool_names(out);
             CHECK(names.size() == 4);
             CHECK(contains(names, "apply_patch"));
         }},
    };
    for (const auto& c : cases) {
        CAPTURE(c.file);
        auto in = load_capture(c.file);
        auto out = p.build(in);
        c.check(in, out);
    }
}

TEST_CASE("tool_choice: none, required and named, and bad values") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}},
                       {"type":"custom","name":"apply_patch","description":"patch"}],"tool_choice":"none"})");
    CHECK(str(p.build(req), "tool_choice") == "none");

    // required: vLLM may accept it without applying it, so the schema enforces it.
    req["tool_choice"].SetString("required");
    auto out = p.build(req);
    CHECK(str(out, "tool_choice") == "none");
    const auto& any = out["response_format"]["json_schema"]["schema"]["anyOf"];
    REQUIRE(any.Size() == 2);
    CHECK(str(any[0]["properties"]["name"], "const") == "f");
    CHECK(any[0]["properties"]["arguments"]["properties"].HasMember("x"));
    CHECK(str(any[1]["properties"]["name"], "const") == "apply_patch");

    auto named = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"},{"type":"function","name":"g"}],
                          "tool_choice":{"type":"function","name":"g"}})");
    out = p.build(named);
    REQUIRE(out["response_format"]["json_schema"]["schema"]["anyOf"].Size() == 1);
    CHECK(str(out["response_format"]["json_schema"]["schema"]["anyOf"][0]["properties"]["name"], "const") == "g");

    pulse_status_t rc;
    std::string err;
    auto bad = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"zzz"}})");
    p.build(bad, &rc, &err);
    CHECK(rc == PULSE_E_INVALID_ARGUMENT);
    CHECK(err == "tool_choice names tool 'zzz', which is not in tools");

    auto no_tools = json(R"({"model":"m","input":"hi","tools":[{"type":"web_search"}],"tool_choice":"required"})");
    p.build(no_tools, &rc, &err);
    CHECK(rc == PULSE_E_INVALID_ARGUMENT);
    CHECK(err.find("no tool the backend can run") != std::string::npos);

    auto weird = json(R"({"model":"m","input":"hi","tool_choice":"sometimes"})");
    p.build(weird, &rc, &err);
    CHECK(rc == PULSE_E_INVALID_ARGUMENT);
}

TEST_CASE("native tool_choice passes through when configured") {
    Profile p(R"({"force_tool_choice":"native"})");
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"}})");
    auto out = p.build(req);
    CHECK(str(out["tool_choice"]["function"], "name") == "f");
    CHECK_FALSE(out.HasMember("response_format"));
}

TEST_CASE("reasoning effort switches thinking; max_output_tokens and request sampling win") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","reasoning":{"effort":"minimal"},"max_output_tokens":77,"temperature":0.1})");
    auto out = p.build(req);
    CHECK(out["chat_template_kwargs"]["enable_thinking"].IsFalse());
    CHECK(out["max_tokens"].GetInt() == 77);
    CHECK(out["temperature"].GetDouble() == doctest::Approx(0.1));
    CHECK(out["top_p"].GetDouble() == doctest::Approx(0.95));

    Profile off(R"({"thinking":"off","chat_template_kwargs":{"preserve_thinking":true}})");
    auto req2 = json(R"({"model":"m","input":"hi","reasoning":{"effort":"high"}})");
    out = off.build(req2);
    CHECK(out["chat_template_kwargs"]["enable_thinking"].IsFalse());
    CHECK(out["chat_template_kwargs"]["preserve_thinking"].IsTrue());

    // Every scalar kind keeps its value; regression: a number that is not an integer was
    // written with six decimals (0.125 as 0.125000, 1e-9 as 0.000000).
    Profile typed(R"({"chat_template_kwargs":{"name":"a \"b\"","n":3,"x":0.125,"tiny":1e-9,"on":false}})");
    out = typed.build(req2);
    const auto& kw = out["chat_template_kwargs"];
    CHECK(std::string(kw["name"].GetString()) == "a \"b\"");
    CHECK(kw["n"].GetInt64() == 3);
    CHECK(kw["x"].GetDouble() == 0.125);
    CHECK(kw["tiny"].GetDouble() == 1e-9);
    CHECK(kw["on"].IsFalse());
    CHECK(kw.MemberCount() == 6);  // and enable_thinking, once
}

TEST_CASE("instructions, mid-history developer messages, and broken history arguments") {
    Profile p;
    auto req = json(R"({"model":"m","instructions":"be brief","input":[
        {"type":"message","role":"developer","content":[{"type":"input_text","text":"dev one"}]},
        {"type":"message","role":"user","content":"hello"},
        {"type":"message","role":"developer","content":"late instruction"},
        {"type":"function_call","name":"f","arguments":"{not json","call_id":"c1"},
        {"type":"function_call_output","call_id":"c1","output":"ok"}]})");
    auto out = p.build(req);
    const auto& m = out["messages"];
    CHECK(str(m[0], "role") == "system");
    CHECK(str(m[0], "content") == "be brief\n\ndev one");
    CHECK(str(m[1], "role") == "user");
    CHECK(str(m[2], "role") == "user");  // a system message that is not first would break Qwen templates
    CHECK(str(m[2], "content").find("late instruction") != std::string::npos);
    CHECK(str(m[3]["tool_calls"][0]["function"], "arguments") == "{}");  // never sent through broken
}

TEST_CASE("unknown profile options are rejected naming the key") {
    test::TempDir dir;
    auto so = dir / "qwen38.so";
    fs::copy_file(fs::path(std::getenv("PULSE_PLUGIN_BUILD_DIR")) / "qwen38.so", so);
    fs::permissions(so, fs::perms(0755));
    plugin::Options o;
    o.dirs = {dir.path()};
    plugin::PluginManager pm(o);
    pm.load_all();
    auto lease = pm.translation("qwen38");
    REQUIRE(lease);
    for (auto [opts, expect] : std::vector<std::pair<std::string, std::string>>{
             {R"({"thinkng":"on"})", "unknown profile option 'thinkng'"},
             {R"({"thinking":"maybe"})", "profile_options.thinking: expected \"effort\", \"on\" or \"off\""},
             {R"({"slots":4})", "llama-server options"},
             {R"({"resume":"always"})", "profile_options.resume: expected \"tokens\" or \"text\""},
             // The thinking switch is the profile option's (and the request's effort), not a kwarg:
             // the body would carry enable_thinking twice.
             {R"({"chat_template_kwargs":{"enable_thinking":true}})", "profile_options.chat_template_kwargs.enable_thinking: expected nothing"}}) {
        rapidjson::Document d;
        d.Parse(opts.c_str());
        pulse_call call;
        void* inst = nullptr;
        CHECK(lease->registration.translation.create(lease->registration.user, &call, host::view(&d), &inst) == PULSE_E_INVALID_ARGUMENT);
        CHECK_MESSAGE(call.message.find(expect) != std::string::npos, call.message);
    }
}

// ---------------------------------------------------------------------------------------------
// Response direction
// ---------------------------------------------------------------------------------------------

TEST_CASE("text with reasoning (vLLM `reasoning` field) and usage") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi"})");
    auto run = p.stream(req, {chunk(R"({"role":"assistant","content":""})"), chunk(R"({"reasoning":"Let me "})"),
                              chunk(R"({"reasoning":"think."})"), chunk(R"({"content":"Hello"})"), chunk(R"({"content":" there"})"),
                              chunk("{}", "\"stop\""), usage_chunk(812, 40, 768, 22)});
    CHECK(run.terminal == "response.completed");
    auto items = run.done_items();
    REQUIRE(items.size() == 2);
    CHECK(str(*items[0], "type") == "reasoning");
    CHECK(str((*items[0])["summary"][0], "text") == "Let me think.");
    CHECK((*items[0])["content"].Empty());  // summary mode: no raw events
    CHECK(run.has("response.reasoning_summary_text.delta"));
    CHECK_FALSE(run.has("response.reasoning_text.delta"));
    CHECK(str((*items[1])["content"][0], "text") == "Hello there");
    const auto& u = (*run.response)["response"]["usage"];
    CHECK(u["input_tokens"].GetInt() == 812);
    CHECK(u["input_tokens_details"]["cached_tokens"].GetInt() == 768);
    CHECK(u["output_tokens"].GetInt() == 40);
    CHECK(u["output_tokens_details"]["reasoning_tokens"].GetInt() == 22);
    CHECK(u["total_tokens"].GetInt() == 852);
}

TEST_CASE("older vLLM `reasoning_content`, raw reasoning mode") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi"})");
    auto run = p.stream(req, {chunk(R"({"reasoning_content":"raw thoughts"})"), chunk(R"({"content":"ok"})"), chunk("{}", "\"stop\"")},
                        PULSE_STREAM_CLEAN, gateway::ReasoningOutput::raw);
    auto items = run.done_items();
    REQUIRE(items.size() == 2);
    CHECK((*items[0])["summary"].Empty());
    CHECK(str((*items[0])["content"][0], "text") == "raw thoughts");
    CHECK(run.has("response.reasoning_text.delta"));
    // Usage is always present, always integers, even when the backend sent none.
    CHECK((*run.response)["response"]["usage"]["total_tokens"].GetInt() == 0);
}

// A raw completion chunk as llama-server's /v1/completions sends it with "verbose": one token.
std::string raw_chunk(const std::string& text, int id, int predicted, const std::string& finish = "null") {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.String(text.c_str(), static_cast<rapidjson::SizeType>(text.size()));
    return R"({"object":"text_completion","choices":[{"text":)" + std::string(b.GetString()) + R"(,"index":0,"finish_reason":)" + finish +
           R"(}],"__verbose":{"tokens":[)" + std::to_string(id) + R"(],"tokens_predicted":)" + std::to_string(predicted) + "}}";
}

TEST_CASE("a raw completion (resume = \"tokens\") is parsed by Pulse: reasoning, text, a Qwen XML call typed by its schema, tokens counted") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"exec_command","parameters":{"type":"object",
        "properties":{"cmd":{"type":"array"},"timeout":{"type":"integer"},"note":{"type":"string"}}}},
        {"type":"namespace","name":"multi_agent_v1","tools":[{"type":"function","name":"close_agent"}]}]})");
    const std::string call = "\n<tool_call>\n<function=exec_command>\n<parameter=cmd>\n[\"ls\"]\n</parameter>\n<parameter=timeout>\n5\n"
                             "</parameter>\n<parameter=note>\n42\n</parameter>\n</function>\n</tool_call>";
    auto run = p.stream(req, {raw_chunk("Let me", 11, 1), raw_chunk(" think.", 12, 2), raw_chunk("\n</think>\n\n", 13, 3),
                              raw_chunk("Hello", 14, 4), raw_chunk(call, 15, 5),
                              raw_chunk("\n<tool_call>\n<function=multi_agent_v1__close_agent>\n<parameter=id>\na1\n</parameter>\n</function>\n</tool_call>", 16, 6),
                              R"({"object":"text_completion","choices":[{"text":"","index":0,"finish_reason":"stop"}],)"
                              R"("usage":{"prompt_tokens":30,"completion_tokens":6,"total_tokens":36,"prompt_tokens_details":{"cached_tokens":10}}})"});
    CHECK(run.terminal == "response.completed");
    auto items = run.done_items();
    REQUIRE(items.size() == 4);
    CHECK(str((*items[0])["summary"][0], "text") == "Let me think.");
    CHECK(str((*items[1])["content"][0], "text") == "Hello");
    CHECK(str(*items[2], "name") == "exec_command");
    auto args = json(str(*items[2], "arguments"));
    CHECK(args["cmd"][0] == "ls");    // typed by the schema: an array
    CHECK(args["timeout"].GetInt() == 5);
    CHECK(args["note"] == "42");      // a string stays a string
    CHECK(str(*items[3], "name") == "close_agent");
    CHECK(str(*items[3], "namespace") == "multi_agent_v1");
    const auto& u = (*run.response)["response"]["usage"];
    CHECK(u["output_tokens"].GetInt() == 6);
    CHECK(u["input_tokens_details"]["cached_tokens"].GetInt() == 10);
    CHECK(u["output_tokens_details"]["reasoning_tokens"].GetInt() == 3);  // the thinking's tokens and its end
}

TEST_CASE("tool calls: split arguments, parallel calls, namespace split back, unique call ids") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"exec_command"},
        {"type":"namespace","name":"multi_agent_v1","tools":[{"type":"function","name":"close_agent"}]}]})");
    auto run = p.stream(req, {chunk(R"({"role":"assistant","content":""})"), tool_start(0, "exec_command"),
                              tool_frag(0, R"({\"cmd\": [\"ls)"), tool_frag(0, R"(\", \"-la\"]})"),
                              tool_start(1, "multi_agent_v1__close_agent"), tool_frag(1, R"({\"id\":\"a1\"})"),
                              chunk("{}", "\"tool_calls\""), usage_chunk(10, 5)});
    CHECK(run.terminal == "response.completed");
    auto items = run.done_items();
    REQUIRE(items.size() == 2);
    CHECK(str(*items[0], "type") == "function_call");
    CHECK(str(*items[0], "name") == "exec_command");
    CHECK(json(str(*items[0], "arguments"))["cmd"][1] == "-la");
    CHECK_FALSE(items[0]->HasMember("namespace"));
    CHECK(str(*items[1], "name") == "close_agent");
    CHECK(str(*items[1], "namespace") == "multi_agent_v1");
    CHECK(str(*items[0], "call_id").rfind("call_", 0) == 0);
    CHECK(str(*items[0], "call_id") != str(*items[1], "call_id"));
}

TEST_CASE("apply_patch comes back as a custom_tool_call with the patch repaired") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"custom","name":"apply_patch"}]})");
    std::string args = R"({\"input\": \"*** Add File: hello.txt\\n+hello\\n\"})";
    auto run = p.stream(req, {tool_start(0, "apply_patch"), tool_frag(0, args.substr(0, 11)), tool_frag(0, args.substr(11)),
                              chunk("{}", "\"tool_calls\"")});
    auto items = run.done_items();
    REQUIRE(items.size() == 1);
    CHECK(str(*items[0], "type") == "custom_tool_call");
    CHECK(str(*items[0], "input") == "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n");
    CHECK(run.has("response.custom_tool_call_input.delta"));
    CHECK(run.has("response.custom_tool_call_input.done"));
    CHECK_FALSE(run.has("response.function_call_arguments.delta"));
}

TEST_CASE("invalid tool arguments fail the response instead of passing a broken call") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"}]})");
    auto run = p.stream(req, {tool_start(0, "f"), tool_frag(0, R"({\"a\": )"), chunk("{}", "\"tool_calls\"")});
    CHECK(run.terminal == "response.failed");
    CHECK(run.done_items().empty());
    CHECK(std::string((*run.response)["response"]["error"]["message"].GetString()).find("not valid JSON") != std::string::npos);
}

TEST_CASE("forced tool_choice: schema output becomes a call; no call is an error") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"}],"tool_choice":"required"})");
    auto run = p.stream(req, {chunk(R"({"content":"{\"name\": \"f\", "})"), chunk(R"({"content":"\"arguments\": {\"x\": [1, {\"y\": \"}\"}]}}"})"),
                              chunk("{}", "\"stop\"")});
    CHECK(run.terminal == "response.completed");
    auto items = run.done_items();
    REQUIRE(items.size() == 1);
    CHECK(str(*items[0], "name") == "f");
    CHECK(str(*items[0], "arguments") == R"({"x":[1,{"y":"}"}]})");

    auto text_only = p.stream(req, {chunk(R"({"content":"I refuse"})"), chunk("{}", "\"stop\"")});
    CHECK(text_only.terminal == "response.failed");
    CHECK(text_only.done_items().empty());

    auto nothing = p.stream(req, {chunk("{}", "\"stop\"")});
    CHECK(nothing.terminal == "response.failed");
    CHECK(std::string((*nothing.response)["response"]["error"]["message"].GetString()) ==
          "tool_choice required a tool call, but the model answered without one");
}

TEST_CASE("finish_reason length becomes response.incomplete") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi"})");
    auto run = p.stream(req, {chunk(R"({"content":"partial"})"), chunk("{}", "\"length\""), usage_chunk(5, 100)});
    CHECK(run.terminal == "response.incomplete");
    CHECK(str((*run.response)["response"]["incomplete_details"], "reason") == "max_output_tokens");
    CHECK((*run.response)["response"]["usage"]["output_tokens"].GetInt() == 100);
}

TEST_CASE("in-stream errors and truncation become response.failed; nothing uncertain is done") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"}]})");
    auto err = p.stream(req, {chunk(R"({"content":"a"})"),
                              R"({"error":{"message":"This model's maximum context length is 8192 tokens","type":"BadRequestError","code":400}})"});
    CHECK(err.terminal == "response.failed");
    CHECK(str((*err.response)["response"]["error"], "code") == "context_length_exceeded");
    CHECK(err.done_items().empty());

    auto cut = p.stream(req, {chunk(R"({"content":"a"})"), tool_start(0, "f"), tool_frag(0, "{")}, PULSE_STREAM_TRUNCATED);
    CHECK(cut.terminal == "response.failed");
    CHECK(cut.done_items().empty());  // neither the partial message nor the partial call
    CHECK(str((*cut.response)["response"]["error"], "code") == "server_error");

    auto junk = p.stream(req, {"this is not json"});
    CHECK(junk.terminal == "response.failed");
}

TEST_CASE("map_error classifies backend HTTP errors") {
    Profile p;
    auto map = [&](int status, const std::string& body, std::string* msg = nullptr) { return map_error(p, status, body, msg); };
    std::string msg;
    CHECK(map(400, R"({"error":{"message":"This model's maximum context length is 262144 tokens. However, you requested 300000 tokens","type":"BadRequestError","param":null,"code":400}})", &msg) ==
          PULSE_E_CONTEXT_LENGTH);
    CHECK(msg.find("too long") != std::string::npos);
    CHECK(map(400, R"({"object":"error","message":"bad things","type":"BadRequestError"})", &msg) == PULSE_E_INVALID_ARGUMENT);
    CHECK(msg == "the backend rejected the request: bad things");
    CHECK(map(503, "Service Unavailable") == PULSE_E_UNAVAILABLE);
    CHECK(map(500, R"({"error":{"message":"boom"}})") == PULSE_E_UNAVAILABLE);
    CHECK(map(429, "{}") == PULSE_E_RESOURCE_EXHAUSTED);
    CHECK(map(404, R"({"error":{"message":"The model `x` does not exist."}})") == PULSE_E_UNAVAILABLE);
}

// ---------------------------------------------------------------------------------------------
// llamacpp: llama-server's dialect
// ---------------------------------------------------------------------------------------------

TEST_CASE("llamacpp: cache_prompt, a stable id_slot per conversation, reasoning_content history") {
    Profile p(R"({"slots":4})", "llamacpp");
    auto req = [](const std::string& key) {
        return json(R"({"model":"m","prompt_cache_key":")" + key + R"(","input":[
            {"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"thought"}]},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]},
            {"type":"message","role":"user","content":"next"}]})");
    };
    auto a1 = p.build(req("thread-a"));
    auto a2 = p.build(req("thread-a"));
    CHECK(a1["cache_prompt"].IsTrue());
    REQUIRE(a1.HasMember("id_slot"));
    CHECK(a1["id_slot"].GetInt() == a2["id_slot"].GetInt());  // same conversation, same slot
    CHECK(a1["id_slot"].GetInt() >= 0);
    CHECK(a1["id_slot"].GetInt() < 4);
    std::set<int> slots;
    for (int i = 0; i < 32; ++i) slots.insert(p.build(req("thread-" + std::to_string(i)))["id_slot"].GetInt());
    CHECK(slots.size() > 1);  // conversations spread over the slots
    CHECK(str(a1["messages"][0], "reasoning_content") == "thought");

    Profile no_slots("null", "llamacpp");
    CHECK_FALSE(no_slots.build(req("x")).HasMember("id_slot"));
    CHECK(no_slots.build(req("x"))["cache_prompt"].IsTrue());
    Profile off(R"({"cache_prompt":false})", "llamacpp");
    CHECK_FALSE(off.build(req("x")).HasMember("cache_prompt"));
}

TEST_CASE("llamacpp: a named tool_choice is enforced with a schema (llama-server would ignore it)") {
    Profile p("null", "llamacpp");
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"},{"type":"function","name":"g"}],
                        "tool_choice":{"type":"function","name":"g"}})");
    auto out = p.build(req);
    CHECK(str(out, "tool_choice") == "none");
    CHECK(str(out["response_format"]["json_schema"]["schema"]["anyOf"][0]["properties"]["name"], "const") == "g");
}

TEST_CASE("llamacpp: a recorded llama-server stream, usage rebuilt from timings") {
    Profile p("null", "llamacpp");
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"exec_command"}]})");
    // The shape llama-server streams (reasoning_content, tool call id/name first, argument
    // fragments, finish chunk, then a choices:[] chunk with timings and no usage).
    auto run = p.stream(req, {
        R"({"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"})",
        R"({"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":"Need to list"}}],"object":"chat.completion.chunk"})",
        R"({"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":" files."}}],"object":"chat.completion.chunk"})",
        R"({"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"Xk2","type":"function","function":{"name":"exec_command","arguments":"{\"cmd\":"}}]}}],"object":"chat.completion.chunk"})",
        R"({"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"ls\"}"}}]}}],"object":"chat.completion.chunk"})",
        R"({"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}],"object":"chat.completion.chunk"})",
        R"({"choices":[],"object":"chat.completion.chunk","timings":{"cache_n":120,"prompt_n":30,"prompt_ms":12.5,"predicted_n":9,"predicted_ms":80.1}})",
    });
    CHECK(run.terminal == "response.completed");
    auto items = run.done_items();
    REQUIRE(items.size() == 2);
    CHECK(str((*items[0])["summary"][0], "text") == "Need to list files.");
    CHECK(str(*items[1], "name") == "exec_command");
    CHECK(str(*items[1], "arguments") == R"({"cmd":"ls"})");
    const auto& u = (*run.response)["response"]["usage"];
    CHECK(u["input_tokens"].GetInt() == 150);  // prompt_n + cache_n
    CHECK(u["input_tokens_details"]["cached_tokens"].GetInt() == 120);
    CHECK(u["output_tokens"].GetInt() == 9);
    CHECK(u["total_tokens"].GetInt() == 159);
}

TEST_CASE("llamacpp: llama-server error shapes become clear errors") {
    Profile p("null", "llamacpp");
    auto map = [&](int status, const std::string& body, std::string* msg = nullptr) { return map_error(p, status, body, msg); };
    std::string msg;
    CHECK(map(400, R"({"error":{"code":400,"message":"request (13392 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":13392,"n_ctx":8192}})", &msg) ==
          PULSE_E_CONTEXT_LENGTH);
    CHECK(msg.find("too long for the model") != std::string::npos);
    CHECK(map(500, R"({"error":{"code":500,"message":"Failed to parse tool call arguments as JSON: [json.exception.parse_error.101]","type":"server_error"}})", &msg) ==
          PULSE_E_INVALID_ARGUMENT);  // not retryable as it is
    CHECK(msg.find("could not parse tool-call arguments") != std::string::npos);
    CHECK(map(503, R"({"error":{"code":503,"message":"Loading model","type":"unavailable_error"}})") == PULSE_E_UNAVAILABLE);
}

TEST_CASE("consecutive assistant messages (capture 09: Codex's retry after truncated streams) become one") {
    for (const char* profile : {"qwen38", "llamacpp"}) {
        CAPTURE(profile);
        Profile p("null", profile);
        auto out = p.build(load_capture("09_retry_after_truncated_stream.request3.json"));
        const auto& msgs = out["messages"].GetArray();
        REQUIRE(msgs.Size() >= 2);
        // llama-server: "Cannot have 2 or more assistant messages at the end of the list".
        for (rapidjson::SizeType i = 1; i < msgs.Size(); ++i)
            CHECK_FALSE((str(msgs[i], "role") == "assistant" && str(msgs[i - 1], "role") == "assistant"));
        CHECK(str(msgs[msgs.Size() - 1], "role") == "assistant");
        CHECK(str(msgs[msgs.Size() - 1], "content") == "hi from pulse capture");  // the repeat is dropped
    }
    Profile p;
    auto merged = p.build(json(R"({"model":"m","input":[
        {"type":"message","role":"user","content":"go"},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Partial"}]},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Partial answer, longer"}]},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Other"}]}]})"));
    REQUIRE(merged["messages"].Size() == 2);
    CHECK(str(merged["messages"][1], "content") == "Partial answer, longer\n\nOther");
}

TEST_CASE("cut off by max_output_tokens: the cut item is incomplete, a cut tool call ends the response incomplete, not 'invalid JSON'") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"},{"type":"custom","name":"apply_patch"}]})");
    auto text = p.stream(req, {chunk(R"({"content":"partial"})"), chunk("{}", "\"length\""), usage_chunk(5, 100)});
    REQUIRE(text.terminal == "response.incomplete");
    REQUIRE(text.done_items().size() == 1);
    CHECK(str(*text.done_items()[0], "status") == "incomplete");
    CHECK(str((*text.response)["response"]["output"][0], "status") == "incomplete");

    auto call = p.stream(req, {chunk(R"({"content":"Patching."})"), tool_start(0, "apply_patch"), tool_frag(0, "{\\\"input\\\":\\\"*** Begin"),
                               chunk("{}", "\"length\""), usage_chunk(5, 100)});
    CHECK(call.terminal == "response.incomplete");
    CHECK(str((*call.response)["response"]["incomplete_details"], "reason") == "max_output_tokens");
    CHECK(dump((*call.response)["response"]).find("not valid JSON") == std::string::npos);
    for (const auto* item : call.done_items()) CHECK(str(*item, "type") == "message");  // no broken call is handed out
}

TEST_CASE("tool arguments with a number too large for a double are valid JSON, passed through as written") {
    Profile p;
    auto req = json(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f"}]})");
    auto run = p.stream(req, {tool_start(0, "f"), tool_frag(0, "{\\\"x\\\":3226e380}"), chunk("{}", "\"tool_calls\""), usage_chunk(5, 10)});
    REQUIRE_MESSAGE(run.terminal == "response.completed", dump((*run.response)["response"]));
    REQUIRE(run.done_items().size() == 1);
    CHECK(str(*run.done_items()[0], "arguments") == "{\"x\":3226e380}");
}

TEST_CASE("llama-server reports no reasoning token count: the reasoning deltas are counted") {
    Profile p("null", "llamacpp");
    auto req = json(R"({"model":"m","input":"hi"})");
    const std::string no_reasoning_count = R"({"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}})";
    auto run = p.stream(req, {chunk(R"({"reasoning_content":"one"})"), chunk(R"({"reasoning_content":" two"})"),
                              chunk(R"({"reasoning_content":" three"})"), chunk(R"({"content":"done"})"), chunk("{}", "\"stop\""),
                              no_reasoning_count});
    REQUIRE(run.terminal == "response.completed");
    CHECK((*run.response)["response"]["usage"]["output_tokens_details"]["reasoning_tokens"].GetInt() == 3);
}

TEST_CASE("llamacpp: reasoning tokens are counted from llama-server's per-token timings, silent tokens included") {
    Profile p("null", "llamacpp");
    auto req = json(R"({"model":"m","input":"hi","reasoning":{"effort":"high"}})");
    CHECK(p.build(req)["timings_per_token"].GetBool());
    // What llama-server streams with timings_per_token: every chunk says how many tokens are
    // generated so far; tokens that make no delta (here 3 and 4: the end of the thinking block,
    // and one its parser held) are counted there and nowhere else.
    auto timed = [](const std::string& delta, int n, const char* finish = "null") {
        return R"({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":)" + delta + R"(,"finish_reason":)" + finish +
               R"(}],"timings":{"cache_n":0,"prompt_n":12,"predicted_n":)" + std::to_string(n) + "}}";
    };
    const std::string final_usage = R"({"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19},)"
                                    R"("timings":{"cache_n":0,"prompt_n":12,"predicted_n":7}})";
    auto run = p.stream(req, {timed(R"({"reasoning_content":"one"})", 1), timed(R"({"reasoning_content":" two"})", 2),
                              timed(R"({"content":"done"})", 5), timed(R"({"content":" now"})", 6), timed("{}", 7, "\"stop\""), final_usage});
    REQUIRE(run.terminal == "response.completed");
    const auto& u = (*run.response)["response"]["usage"];
    CHECK(u["output_tokens"].GetInt() == 7);
    CHECK(u["output_tokens_details"]["reasoning_tokens"].GetInt() == 4);  // 2 deltas, 4 tokens before the answer began

    // Cut off by the limit while still thinking: every token was thinking (deltas said 2 of 5).
    auto cut = p.stream(req, {timed(R"({"reasoning_content":"one"})", 1), timed(R"({"reasoning_content":" two"})", 3), timed("{}", 5, "\"length\""),
                              R"({"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}})"});
    CHECK((*cut.response)["response"]["usage"]["output_tokens_details"]["reasoning_tokens"].GetInt() == 5);

    // Thinking off: nothing counts as reasoning, whatever made no delta.
    auto off = p.stream(json(R"({"model":"m","input":"hi","reasoning":{"effort":"none"}})"),
                        {timed(R"({"content":"done"})", 3), timed("{}", 3, "\"stop\""),
                         R"({"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}})"});
    CHECK((*off.response)["response"]["usage"]["output_tokens_details"]["reasoning_tokens"].GetInt() == 0);
}

// ---------------------------------------------------------------------------------------------
// SDK 1.4: what warmup and health need from the server, answered by the profile
// ---------------------------------------------------------------------------------------------

TEST_CASE("warm_request: the served request again with one output token; llama-server also asked for progress chunks") {
    for (std::string name : {"llamacpp", "qwen38"}) {
        CAPTURE(name);
        Profile p("null", name);
        REQUIRE(static_cast<bool>(p.vt().warm_request));
        auto warm = [&](const std::string& sent, pulse_upstream_req& out) {
            auto doc = json(sent);
            pulse_call call;
            out.body.call = &call;
            REQUIRE_MESSAGE(p.vt().warm_request(p.instance, &call, host::view(&doc), &out) == PULSE_OK, call.message);
            out.body.call = nullptr;
        };
        pulse_upstream_req chat;
        warm(R"({"path":"/chat/completions","root_path":false,"body":{"model":"m","messages":[{"role":"user","content":"hi"}],)"
             R"("stream":true,"max_tokens":4096,"max_completion_tokens":9,"return_progress":false}})", chat);
        CHECK(chat.path_set);
        CHECK(chat.path == "/chat/completions");
        CHECK_FALSE(chat.root_path);
        CHECK(chat.method == "POST");
        rapidjson::Document b;
        b.Parse(chat.body.text().data(), chat.body.text().size());
        REQUIRE(b.IsObject());
        CHECK(b["max_tokens"].GetInt() == 1);
        CHECK_FALSE(b.HasMember("max_completion_tokens"));
        CHECK(b["messages"][0]["content"] == "hi");  // the same prompt
        CHECK(b["stream"].IsTrue());
        CHECK(b.HasMember("return_progress") == (name == "llamacpp"));
        if (name == "llamacpp") CHECK(b["return_progress"].IsTrue());

        pulse_upstream_req raw;  // a raw completion at the server's root stays there
        warm(R"({"path":"/completions","root_path":true,"body":{"prompt":"<|im_start|>user","max_tokens":100}})", raw);
        CHECK(raw.path == "/completions");
        CHECK(raw.root_path);

        pulse_upstream_req none;  // nothing usable: not replayed
        warm(R"({"path":"/chat/completions","root_path":false})", none);
        CHECK_FALSE(none.path_set);
    }
}

TEST_CASE("cache persistence: llama-server's slots (count, save, restore); vLLM has none") {
    Profile p("null", "llamacpp");
    auto request = [&](pulse_cache_op_t op, int slot, std::string_view file, pulse_upstream_req& out) {
        pulse_call call;
        out.body.call = &call;
        pulse_status_t rc = p.vt().cache_request(p.instance, &call, op, slot, {file.data(), file.size()}, &out);
        out.body.call = nullptr;
        return rc;
    };
    pulse_upstream_req count;
    REQUIRE(request(PULSE_CACHE_COUNT, 0, "", count) == PULSE_OK);
    CHECK(count.method == "GET");
    CHECK(count.path == "/props");
    CHECK(count.root_path);
    pulse_upstream_req save;
    REQUIRE(request(PULSE_CACHE_SAVE, 2, "pulse-ep0-slot2.bin", save) == PULSE_OK);
    CHECK(save.method == "POST");
    CHECK(save.path == "/slots/2?action=save");
    CHECK(save.root_path);
    CHECK(save.body.text() == R"({"filename":"pulse-ep0-slot2.bin"})");
    pulse_upstream_req restore;
    REQUIRE(request(PULSE_CACHE_RESTORE, 0, "pulse-ep0-slot0.bin", restore) == PULSE_OK);
    CHECK(restore.path == "/slots/0?action=restore");

    auto answer = [&](pulse_cache_op_t op, int status, std::string_view body, int32_t* n, std::string* msg) {
        pulse_call call;
        pulse_status_t rc = p.vt().cache_answer(p.instance, &call, op, status, {body.data(), body.size()}, n);
        *msg = call.message;
        return rc;
    };
    int32_t n = 0;
    std::string msg;
    CHECK(answer(PULSE_CACHE_COUNT, 200, R"({"total_slots":3,"model_path":"x.gguf"})", &n, &msg) == PULSE_OK);
    CHECK(n == 3);
    CHECK(answer(PULSE_CACHE_COUNT, 404, "", &n, &msg) == PULSE_E_UNSUPPORTED);
    CHECK(answer(PULSE_CACHE_COUNT, 200, "{}", &n, &msg) == PULSE_E_UNSUPPORTED);
    CHECK(answer(PULSE_CACHE_SAVE, 200, R"({"id_slot":0,"n_saved":12})", &n, &msg) == PULSE_OK);
    // What llama-server answers when it was started without --slot-save-path.
    CHECK(answer(PULSE_CACHE_SAVE, 501, R"({"error":{"code":501,"message":"This server does not support slots action."}})", &n, &msg) ==
          PULSE_E_UNSUPPORTED);
    CHECK(msg.find("--slot-save-path") != std::string::npos);
    CHECK(answer(PULSE_CACHE_RESTORE, 400, R"({"error":{"message":"failed to load"}})", &n, &msg) == PULSE_E_UNAVAILABLE);
    CHECK(msg.find("HTTP 400") != std::string::npos);

    Profile vllm("null", "qwen38");
    pulse_upstream_req out;
    pulse_call call;
    CHECK(vllm.vt().cache_request(vllm.instance, &call, PULSE_CACHE_COUNT, 0, {"", 0}, &out) == PULSE_E_UNSUPPORTED);
    CHECK_FALSE(out.path_set);
}

TEST_CASE("probe_answer: llama-server loading its model is starting, not down; vLLM's answers are ready or down") {
    auto probe = [](Profile& p, int status, std::string_view body, std::string* msg = nullptr) {
        pulse_call call;
        pulse_status_t rc = p.vt().probe_answer(p.instance, &call, status, {body.data(), body.size()});
        if (msg) *msg = call.message;
        return rc;
    };
    const std::string loading = R"({"error":{"code":503,"message":"Loading model","type":"unavailable_error"}})";
    Profile llama("null", "llamacpp");
    std::string msg;
    CHECK(probe(llama, 200, R"({"data":[]})") == PULSE_OK);
    CHECK(probe(llama, 503, loading, &msg) == PULSE_NOT_READY);
    CHECK(msg.find("loading") != std::string::npos);
    CHECK(probe(llama, 503, "busy") < 0);
    CHECK(probe(llama, 500, loading) < 0);
    Profile vllm("null", "qwen38");
    CHECK(probe(vllm, 200, "{}") == PULSE_OK);
    CHECK(probe(vllm, 503, loading) < 0);  // not vLLM's way of saying it is starting
}
