#include "cli/doctor.h"

#include <pulse/plugin.hpp>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>

#include "cli/codex_launcher.h"
#include "http/client.h"

namespace pulse::cli {

const char* kDoctorFooter =
    "Asks each endpoint of the config (or each URL given, e.g. http://127.0.0.1:8080/v1) what it\n"
    "is and what it can do for Codex, and says for each check PASS, WARN or FAIL with why and the\n"
    "fix: reachable; what the server is (llama-server: build, slots, per-slot context, template;\n"
    "vLLM: version, max_model_len, served names); the configured model is served; the context\n"
    "window against the config (Codex compacts at 90% of it) and a Codex first turn (~11k\n"
    "tokens); the template renders tools and a tool-call turn; a forced tool_choice is honoured;\n"
    "reasoning comes separated; the prefix cache hits on a repeated prompt; prefill speed, and from\n"
    "it the time to first token of an 11k-token first turn against upstream.head_timeout_s and\n"
    "the keepalive; speculative decoding; finally one Codex-shaped turn through the gateway itself\n"
    "(with a config, when it is running). It ends with the config lines to change.\n"
    "\n"
    "Each check sends at most a few short requests (a few thousand prompt tokens, a handful of\n"
    "output tokens). Exit 0 when no check failed, 1 when one did, 2 usage, 3 a config error or an\n"
    "unwritable catalog.\n";

namespace {

using Clock = std::chrono::steady_clock;

enum class Verdict { pass, warn, fail, info };
const char* name(Verdict v) {
    switch (v) {
        case Verdict::pass: return "PASS";
        case Verdict::warn: return "WARN";
        case Verdict::fail: return "FAIL";
        case Verdict::info: return "INFO";
    }
    return "?";
}

struct Check {
    std::string check;
    Verdict verdict;
    std::string why, fix;
};

// A Codex first turn: the system prompt, tools and AGENTS.md (measured on Codex 0.169).
constexpr int64_t kFirstTurnTokens = 11000;
constexpr int64_t kMinWindow = 16384;  // a first turn and room to answer
constexpr double kCodexIdleTimeout = 300;  // Codex's stream_idle_timeout_ms default

struct Reply {
    int status = 0;
    double seconds = 0;
    std::string body, error;
    rapidjson::Document json;
    bool ok() const { return status == 200 && json.IsObject(); }
};

const rapidjson::Value* member(const rapidjson::Value& v, const char* k) {
    return v.IsObject() && v.HasMember(k) ? &v[k] : nullptr;
}
int64_t int_at(const rapidjson::Value* v) { return v && v->IsInt64() ? v->GetInt64() : v && v->IsDouble() ? static_cast<int64_t>(v->GetDouble()) : 0; }
double num_at(const rapidjson::Value* v) { return v && v->IsNumber() ? v->GetDouble() : 0; }
std::string str_at(const rapidjson::Value* v) { return v && v->IsString() ? std::string(v->GetString(), v->GetStringLength()) : std::string(); }

// The server's error message from an error answer, else the body's start.
std::string message_of(const Reply& r) {
    if (r.status == 0) return r.error;
    if (const auto* e = member(r.json, "error")) {
        if (auto m = str_at(member(*e, "message")); !m.empty()) return "HTTP " + std::to_string(r.status) + ": " + m;
        if (e->IsString()) return "HTTP " + std::to_string(r.status) + ": " + e->GetString();
    }
    if (auto m = str_at(member(r.json, "message")); !m.empty()) return "HTTP " + std::to_string(r.status) + ": " + m;
    return "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 200);
}

// A refusal because the prompt does not fit (llama-server, vLLM wordings).
bool is_context_error(const std::string& m) {
    return m.find("context size") != std::string::npos || m.find("context length") != std::string::npos ||
           m.find("exceeds the available context") != std::string::npos;
}

// The probes' request bodies: each a fixed JSON shape, parsed, with what varies set through the
// DOM, then written out (never spliced together as text).
rapidjson::Document shape(const char* json) {
    rapidjson::Document d;
    d.Parse(json);
    if (d.HasParseError() || !d.IsObject()) throw std::logic_error(std::string("doctor: a probe's shape is not a JSON object: ") + json);
    return d;
}
// `shape` with the tools given (each a tool's JSON) as its "tools".
rapidjson::Document shape_with_tools(const char* json, std::initializer_list<const char*> tools) {
    rapidjson::Document d = shape(json);
    auto& a = d.GetAllocator();
    rapidjson::Value list(rapidjson::kArrayType);
    for (const char* t : tools) list.PushBack(rapidjson::Value(shape(t), a), a);
    d.AddMember("tools", list, a);
    return d;
}
std::string to_text(const rapidjson::Value& v) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    v.Accept(w);
    return {b.GetString(), b.GetSize()};
}

constexpr const char* kProbeTool =
    R"({"type":"function","function":{"name":"pulse_doctor_probe","description":"a check","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}})";
constexpr const char* kShellTool =
    R"({"type":"function","function":{"name":"shell","description":"run a command","parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]}}})";
// A tool-call turn as Codex sends it: two parallel calls and their results (tools added).
constexpr const char* kToolTurn =
    R"({"messages":[{"role":"user","content":"list the files"},)"
    R"({"role":"assistant","content":null,"tool_calls":[)"
    R"({"id":"call_1","type":"function","function":{"name":"shell","arguments":"{\"command\":[\"ls\"]}"}},)"
    R"({"id":"call_2","type":"function","function":{"name":"pulse_doctor_probe","arguments":"{\"path\":\"a.txt\"}"}}]},)"
    R"({"role":"tool","tool_call_id":"call_1","content":"a.txt"},{"role":"tool","tool_call_id":"call_2","content":"ok"}]})";
// A request that names the tool to call (the probe tool added).
constexpr const char* kForcedTurn =
    R"({"messages":[{"role":"user","content":"check a.txt"}],"tool_choice":{"type":"function","function":{"name":"pulse_doctor_probe"}},)"
    R"("chat_template_kwargs":{"enable_thinking":false}})";
constexpr const char* kThinkTurn = R"({"messages":[{"role":"user","content":"Think, then say hi."}]})";
// A long system prompt (its text set per run) and a short question.
constexpr const char* kLongPromptTurn = R"({"messages":[{"role":"system","content":""},{"role":"user","content":"ok?"}]})";

std::string fmt(const char* f, double v) {
    char b[64];
    std::snprintf(b, sizeof b, f, v);
    return b;
}

// The prompt tokens a server says it found in its prefix cache (vLLM: usage's details;
// llama-server: timings.cache_n); nothing when it does not say.
std::optional<int64_t> cached_of(const Reply& r) {
    if (const auto* u = member(r.json, "usage"))
        if (const auto* d = member(*u, "prompt_tokens_details"); d && member(*d, "cached_tokens")) return int_at(member(*d, "cached_tokens"));
    if (const auto* t = member(r.json, "timings"); t && member(*t, "cache_n")) return int_at(member(*t, "cache_n"));
    return std::nullopt;
}

// The prefill rate of a cold `prompt`-token answer (the server's own timing when it gives one,
// else the wall clock), and what it means for a Codex first turn against the gateway's timeouts.
Check prefill_speed(const Reply& cold, int64_t prompt, const DoctorSettings& s) {
    double rate = 0;
    if (const auto* t = member(cold.json, "timings")) rate = num_at(member(*t, "prompt_per_second"));
    if (rate <= 0 && cold.seconds > 0) rate = static_cast<double>(prompt) / cold.seconds;
    if (rate <= 0 || prompt <= 0) return {"prefill speed", Verdict::warn, "the server reported no prompt tokens: speed unknown", ""};
    const double ttft = static_cast<double>(kFirstTurnTokens) / rate;
    const std::string said = fmt("%.0f", rate) + " tokens/s on a " + std::to_string(prompt) + "-token prompt: an " +
                             std::to_string(kFirstTurnTokens) + "-token Codex first turn waits ~" + fmt("%.1f s", ttft) + " for its first token";
    if (ttft > s.head_timeout_s)
        return {"prefill speed", Verdict::fail, said + ", longer than upstream.head_timeout_s (" + fmt("%g s", s.head_timeout_s) + ")",
                "raise [upstream] head_timeout_s above " + fmt("%.0f", ttft * 1.5)};
    if (ttft > kCodexIdleTimeout && s.keepalive_s <= 0)
        return {"prefill speed", Verdict::fail, said + ", longer than Codex's stream idle timeout (300 s) with keepalives off",
                "set [upstream] keepalive_s = 10"};
    return {"prefill speed", Verdict::pass,
            said + (s.keepalive_s > 0 ? " (the gateway keeps Codex's stream alive every " + fmt("%g s", s.keepalive_s) + " meanwhile)" : ""),
            ""};
}

// One endpoint, asked over HTTP. `url` is its OpenAI base (…/v1); the server's own routes
// (/props, /slots, /version, /metrics) live at its root.
class Examiner {
public:
    Examiner(const DoctorTarget& t, const DoctorSettings& s) : t_(t), s_(s) {
        const auto scheme = t.url.find("://");
        const auto slash = t.url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
        origin_ = slash == std::string::npos ? t.url : t.url.substr(0, slash);
        base_ = slash == std::string::npos ? "" : t.url.substr(slash);
        while (!base_.empty() && base_.back() == '/') base_.pop_back();
        root_ = base_.size() >= 3 && base_.compare(base_.size() - 3, 3, "/v1") == 0 ? base_.substr(0, base_.size() - 3) : base_;
    }

    std::vector<Check> checks;
    std::string server = "unknown";
    int64_t window = 0;  // per request (per slot on llama-server); 0 unknown
    std::map<std::string, std::string> config_changes;  // config line -> why

    void run() {
        if (!reachable()) return;
        identify();
        if (!served()) {
            add("other checks", Verdict::info, "skipped: every request for '" + model_ + "' would be refused until it is served");
            return;
        }
        context();
        tools();
        forced_tool_choice();
        reasoning();
        cache_and_prefill();
        speculative();
    }

private:
    Reply ask(const std::string& method, const std::string& path, const std::string& body = {}, double timeout_s = 10) {
        http::Request req;
        req.method = method;
        req.target = path;
        req.body = body;
        const auto t0 = Clock::now();
        http::Answer a = http::fetch(origin_, req, http::Timeouts{5, 30, timeout_s}, 4u << 20);
        Reply r;
        r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        r.status = a.status;
        r.body = std::move(a.body);
        r.error = std::move(a.error);
        r.json.Parse(r.body.c_str());
        if (r.json.HasParseError()) r.json.SetNull();
        return r;
    }
    // A Chat Completions request for this model, not streamed: `fields` and max_tokens.
    Reply chat(const rapidjson::Value& fields, int max_tokens, double timeout_s = 120) {
        rapidjson::Document body(rapidjson::kObjectType);
        auto& a = body.GetAllocator();
        body.AddMember("model", rapidjson::Value(model_.c_str(), static_cast<rapidjson::SizeType>(model_.size()), a), a);
        body.AddMember("stream", false, a);
        body.AddMember("max_tokens", max_tokens, a);
        for (const auto& m : fields.GetObject()) body.AddMember(rapidjson::Value(m.name, a), rapidjson::Value(m.value, a), a);
        return ask("POST", base_ + "/chat/completions", to_text(body), timeout_s);
    }
    void add(std::string check, Verdict v, std::string why, std::string fix = {}) {
        checks.push_back({std::move(check), v, std::move(why), std::move(fix)});
    }
    // A config line for this model's table ("[models.ID] key = value"; the id quoted unless
    // it is a bare TOML key).
    std::string model_line(const std::string& key_value) const {
        if (t_.model_id.empty()) return key_value;
        const bool bare = std::all_of(t_.model_id.begin(), t_.model_id.end(),
                                      [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
        return "[models." + (bare ? t_.model_id : json_quote(t_.model_id)) + "] " + key_value;
    }

    bool reachable() {
        models_ = ask("GET", base_ + "/models", {}, 5);
        if (models_.status == 0) {
            add("reachable", Verdict::fail, "GET " + base_ + "/models: " + models_.error,
                "start the server, or fix the endpoint's url (" + t_.url + ")");
            return false;
        }
        if (models_.status != 200) {
            add("reachable", Verdict::fail, "GET " + base_ + "/models answered " + message_of(models_),
                "the url must be the server's OpenAI base, e.g. http://host:port/v1");
            return false;
        }
        add("reachable", Verdict::pass, "GET " + base_ + "/models answered in " + fmt("%.0f ms", models_.seconds * 1000));
        if (const auto* d = member(models_.json, "data"); d && d->IsArray())
            for (const auto& m : d->GetArray()) {
                ids_.push_back(str_at(member(m, "id")));
                if (int64_t n = int_at(member(m, "max_model_len")); n > 0) max_model_len_[ids_.back()] = n;
            }
        model_ = !t_.upstream_model.empty() ? t_.upstream_model : !ids_.empty() ? ids_.front() : "default";
        return true;
    }

    void identify() {
        props_ = ask("GET", root_ + "/props");
        if (props_.ok() && member(props_.json, "default_generation_settings")) {
            kind_ = Kind::llama_server;
            slots_ = int_at(member(props_.json, "total_slots"));
            window = int_at(member(*member(props_.json, "default_generation_settings"), "n_ctx"));
            server = "llama-server " + str_at(member(props_.json, "build_info")) + ", " + std::to_string(slots_) + " slot" +
                     (slots_ == 1 ? "" : "s") + " of " + std::to_string(window) + " tokens, model " + str_at(member(props_.json, "model_path"));
        } else if (Reply v = ask("GET", root_ + "/version"); v.ok() && member(v.json, "version")) {
            kind_ = Kind::vllm;
            if (auto it = max_model_len_.find(model_); it != max_model_len_.end()) window = it->second;
            std::string names;
            for (const auto& i : ids_) names += (names.empty() ? "" : ", ") + i;
            server = "vLLM " + str_at(member(v.json, "version")) + ", serving " + (names.empty() ? "nothing" : names) +
                     (window ? ", max_model_len " + std::to_string(window) : "");
        } else {
            server = "an OpenAI-compatible server (neither llama-server's /props nor vLLM's /version answered)";
        }
        add("server", Verdict::info, server);
    }

    bool served() {
        const bool listed = std::find(ids_.begin(), ids_.end(), model_) != ids_.end();
        if (kind_ == Kind::llama_server) {
            add("model served", Verdict::pass, "llama-server answers any model name (it serves " + (ids_.empty() ? std::string("one model") : ids_.front()) + ")");
            return true;
        }
        if (listed) return add("model served", Verdict::pass, "the server lists '" + model_ + "'"), true;
        std::string names;
        for (const auto& i : ids_) names += (names.empty() ? "'" : ", '") + i + "'";
        add("model served", Verdict::fail,
            "the server does not list '" + model_ + "' (it serves " + (names.empty() ? std::string("nothing") : names) +
                "): every request for it would be answered 404",
            kind_ == Kind::vllm ? "start vLLM with --served-model-name " + model_ + ", or set upstream_model to the served name"
                                : "set upstream_model to the served name");
        if (!ids_.empty()) config_changes[model_line("upstream_model = " + json_quote(ids_.front()))] = "the name the server serves";
        return false;
    }

    void context() {
        if (window <= 0) {
            add("context window", Verdict::warn, "the server does not say its context window",
                t_.context_window ? "check by hand that it takes " + std::to_string(t_.context_window) + " tokens" : "");
            return;
        }
        const std::string per = kind_ == Kind::llama_server ? " per slot (-c divided by -np " + std::to_string(slots_) + ")" : "";
        if (window < kMinWindow) {
            add("context window", Verdict::fail,
                std::to_string(window) + " tokens" + per + ": a Codex first turn alone is ~" + std::to_string(kFirstTurnTokens) + " tokens",
                kind_ == Kind::llama_server ? "start llama-server with -c " + std::to_string(std::max<int64_t>(slots_, 1) * 65536) +
                                                  " (or fewer slots): at least 65536 tokens per slot"
                                            : "serve with a larger max_model_len (--max-model-len 65536 or more)");
            return;
        }
        if (t_.context_window > window) {
            add("context window", Verdict::fail,
                "the config says " + std::to_string(t_.context_window) + " but the server takes " + std::to_string(window) + per +
                    ": Codex would compact only at ~" + std::to_string(t_.context_window * 9 / 10) + " tokens, after the server refuses",
                "set context_window = " + std::to_string(window) + " (and write the Codex catalog again: --write-catalog)");
            config_changes[model_line("context_window = " + std::to_string(window))] = "the server's window";
            return;
        }
        if (t_.context_window > 0 && t_.context_window < window / 2) {
            add("context window", Verdict::warn,
                "the config says " + std::to_string(t_.context_window) + ", the server takes " + std::to_string(window) + per +
                    ": Codex compacts earlier than it needs to",
                "set context_window = " + std::to_string(window));
            config_changes[model_line("context_window = " + std::to_string(window))] = "the server's window";
            return;
        }
        add("context window", Verdict::pass,
            std::to_string(window) + " tokens" + per + (t_.context_window ? ", config " + std::to_string(t_.context_window) : std::string()));
    }

    void tools() {
        const rapidjson::Document turn = shape_with_tools(kToolTurn, {kShellTool, kProbeTool});
        if (kind_ == Kind::llama_server) {
            // The template's own verdict, then the rendering itself: a template that ignores
            // tools renders the request without them, silently.
            const auto* caps = member(props_.json, "chat_template_caps");
            Reply r = ask("POST", root_ + "/apply-template", to_text(turn));
            const std::string prompt = str_at(member(r.json, "prompt"));
            const bool rendered = prompt.find("pulse_doctor_probe") != std::string::npos;
            if (caps && (!member(*caps, "supports_tools") || !member(*caps, "supports_tools")->IsTrue() || !rendered)) {
                add("template renders tools", Verdict::fail,
                    "the chat template does not render tools" + std::string(rendered ? "" : " (the rendered prompt has no tool in it)") +
                        ": Codex's tools would be dropped without an error",
                    "start llama-server with --jinja and the model's own template (or --chat-template-file with one that renders tools)");
                return;
            }
            if (r.status == 200 && !rendered) {
                add("template renders tools", Verdict::fail, "the rendered prompt has no tool in it: Codex's tools would be dropped",
                    "start llama-server with --jinja and a template that renders tools");
                return;
            }
        }
        Reply r = chat(turn, 1);
        if (!r.ok() && is_context_error(message_of(r))) {
            add("template renders tools", Verdict::warn, "not checked: the tool-call turn does not fit the server's context (" + message_of(r) + ")",
                "give the server a context that holds a Codex turn (see the context window check)");
            return;
        }
        if (!r.ok()) {
            add("template renders tools", Verdict::fail, "a tool-call turn (two parallel calls and their results) was refused: " + message_of(r),
                kind_ == Kind::vllm ? "start vLLM with --enable-auto-tool-choice --tool-call-parser (the model's parser)"
                                    : "use a template that renders tool calls and tool results");
            return;
        }
        const auto* usage = member(r.json, "usage");
        add("template renders tools", Verdict::pass,
            "a tool-call turn with two parallel calls and their results renders (" +
                std::to_string(int_at(usage ? member(*usage, "prompt_tokens") : nullptr)) + " prompt tokens)");
    }

    void forced_tool_choice() {
        Reply r = chat(shape_with_tools(kForcedTurn, {kProbeTool}), 48);
        if (!r.ok()) {
            add("forced tool_choice", Verdict::warn, "a request naming the tool to call was refused: " + message_of(r),
                "set the profile option force_tool_choice = \"schema\" (Pulse forces the call with a JSON schema)");
            config_changes[model_line("profile_options.force_tool_choice = \"schema\"")] = "the server refuses a forced tool_choice";
            return;
        }
        const rapidjson::Value* choice = nullptr;
        if (const auto* c = member(r.json, "choices"); c && c->IsArray() && !c->Empty()) choice = &(*c)[0];
        const rapidjson::Value* msg = choice ? member(*choice, "message") : nullptr;
        const rapidjson::Value* calls = msg ? member(*msg, "tool_calls") : nullptr;
        const rapidjson::Value* fn = calls && calls->IsArray() && !calls->Empty() ? member((*calls)[0], "function") : nullptr;
        if (fn && str_at(member(*fn, "name")) == "pulse_doctor_probe") {
            add("forced tool_choice", Verdict::pass, "the named tool was called");
            return;
        }
        add("forced tool_choice", Verdict::warn,
            "asked to call pulse_doctor_probe, the server answered " +
                (choice && str_at(member(*choice, "finish_reason")) == "length" ? std::string("text until the token limit") : std::string("without the call")) +
                ": it does not force the call (Codex forces tools when it needs one)",
            "set the profile option force_tool_choice = \"schema\" (Pulse forces the call with a JSON schema)");
        config_changes[model_line("profile_options.force_tool_choice = \"schema\"")] = "the server ignores a forced tool_choice";
    }

    void reasoning() {
        Reply r = chat(shape(kThinkTurn), 24);
        if (!r.ok()) return add("reasoning separated", Verdict::warn, "the request was refused: " + message_of(r));
        const rapidjson::Value* msg = nullptr;
        if (const auto* c = member(r.json, "choices"); c && c->IsArray() && !c->Empty()) msg = member((*c)[0], "message");
        const std::string reasoning = msg ? str_at(member(*msg, "reasoning_content")) + str_at(member(*msg, "reasoning")) : "";
        const std::string content = msg ? str_at(member(*msg, "content")) : "";
        if (!reasoning.empty()) return add("reasoning separated", Verdict::pass, "reasoning arrives in its own field");
        if (content.find("<think>") != std::string::npos || content.find("</think>") != std::string::npos)
            return add("reasoning separated", Verdict::fail, "reasoning arrives inside the answer's text (<think> in content): Codex would show it as the answer",
                       kind_ == Kind::vllm ? "start vLLM with --reasoning-parser (the model's parser)"
                                           : "start llama-server with --jinja (and --reasoning-format auto, the default)");
        add("reasoning separated", Verdict::info, "the model wrote no reasoning in 24 tokens: not checked");
    }

    // The same long prompt twice: the second must find the first in the prefix cache. The
    // first, cold, gives the prefill rate.
    void cache_and_prefill() {
        const size_t chars = window > 0 ? static_cast<size_t>(std::min<int64_t>(window / 3, 8000)) : 8000;
        std::string text = "Nonce " + std::to_string(Clock::now().time_since_epoch().count()) + ". ";
        for (int i = 0; text.size() < chars; ++i)
            text += "Line " + std::to_string(i) + ": the repository keeps its sources under src and its tests under tests. ";
        text.resize(chars);
        rapidjson::Document fields = shape(kLongPromptTurn);
        fields["messages"][0]["content"].SetString(text.c_str(), static_cast<rapidjson::SizeType>(text.size()), fields.GetAllocator());
        Reply cold = chat(fields, 1, s_.head_timeout_s);
        if (!cold.ok()) {
            add("prefix cache", Verdict::warn, "a " + std::to_string(chars) + "-character prompt was refused: " + message_of(cold));
            return;
        }
        Reply warm = chat(fields, 1, s_.head_timeout_s);
        const auto* usage = member(cold.json, "usage");
        const int64_t prompt = usage ? int_at(member(*usage, "prompt_tokens")) : 0;
        const auto cached = warm.ok() ? cached_of(warm) : std::nullopt;
        if (!cached) {
            add("prefix cache", Verdict::warn, "the server does not report cached prompt tokens: whether its prefix cache hits is unknown",
                kind_ == Kind::vllm ? "start vLLM with --enable-prefix-caching --enable-prompt-tokens-details" : "");
        } else if (*cached * 2 < prompt) {
            add("prefix cache", Verdict::fail,
                "the same " + std::to_string(prompt) + "-token prompt sent twice found " + std::to_string(*cached) +
                    " tokens cached: every Codex turn would be prefilled from the start",
                kind_ == Kind::vllm ? "start vLLM with --enable-prefix-caching" : "do not disable the prompt cache (cache_prompt, --cache-reuse)");
        } else {
            add("prefix cache", Verdict::pass, std::to_string(*cached) + " of " + std::to_string(prompt) + " prompt tokens cached on the repeat");
        }
        checks.push_back(prefill_speed(cold, prompt, s_));
    }

    void speculative() {
        if (kind_ == Kind::llama_server) {
            Reply r = ask("GET", root_ + "/slots");
            bool on = false;
            if (r.status == 200 && r.json.IsArray())
                for (const auto& sl : r.json.GetArray()) on = on || (member(sl, "speculative") && member(sl, "speculative")->IsTrue());
            add("speculative decoding", Verdict::info, r.status == 200 ? (on ? "on (a draft model or n-gram drafts)" : "off") : "unknown (/slots disabled)");
            return;
        }
        if (kind_ == Kind::vllm) {
            Reply r = ask("GET", root_ + "/metrics");
            auto total = [&](const std::string& metric) {
                double sum = 0;
                bool seen = false;
                for (size_t at = 0; (at = r.body.find(metric, at)) != std::string::npos; at += metric.size()) {
                    if (at > 0 && r.body[at - 1] != '\n') continue;
                    const size_t sp = r.body.find(' ', at), nl = r.body.find('\n', at);
                    if (sp == std::string::npos || sp > nl) continue;
                    sum += std::atof(r.body.c_str() + sp + 1);
                    seen = true;
                }
                return seen ? sum : -1.0;
            };
            const double accepted = total("vllm:spec_decode_num_accepted_tokens_total"), drafted = total("vllm:spec_decode_num_draft_tokens_total");
            if (accepted < 0) return add("speculative decoding", Verdict::info, "off (no spec_decode metrics)");
            add("speculative decoding", Verdict::info,
                "on" + (drafted > 0 ? ", " + fmt("%.0f%%", 100 * accepted / drafted) + " of drafted tokens accepted so far" : std::string(", nothing drafted yet")));
        }
    }

    enum class Kind { unknown, llama_server, vllm };
    const DoctorTarget& t_;
    const DoctorSettings& s_;
    std::string origin_, base_, root_, model_;
    Kind kind_ = Kind::unknown;
    int64_t slots_ = 0;
    Reply models_, props_;
    std::vector<std::string> ids_;
    std::map<std::string, int64_t> max_model_len_;
};

// One Codex-shaped turn through the gateway: tools as Codex sends them (a function and the
// custom apply_patch), not streamed, a few output tokens.
Check through_gateway(const DoctorSettings& s, const std::string& model) {
    rapidjson::Document body = shape(
        R"({"stream":false,"store":false,"max_output_tokens":16,"instructions":"You are a coding agent.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Say hi."}]}],"tools":[{"type":"function","name":"shell","description":"run a command","strict":false,"parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]}},{"type":"custom","name":"apply_patch","description":"edit files","format":{"type":"grammar","syntax":"lark","definition":"start: /.+/"}}],"tool_choice":"auto","parallel_tool_calls":true,"reasoning":{"effort":"low"}})");
    body.AddMember("model", rapidjson::Value(model.c_str(), static_cast<rapidjson::SizeType>(model.size()), body.GetAllocator()), body.GetAllocator());
    const std::string text = to_text(body);  // the request views it
    http::Request req;
    req.method = "POST";
    req.target = "/v1/responses";
    req.body = text;
    if (!s.api_key.empty()) req.fields.emplace_back("Authorization", "Bearer " + s.api_key);
    http::Answer a = http::fetch(s.gateway_url, req, http::Timeouts{3, 30, s.head_timeout_s + 30}, 4u << 20);
    const std::string what = "one Codex-shaped turn of '" + model + "' through " + s.gateway_url;
    if (a.status == 0) return {"turn through Pulse", Verdict::warn, "the gateway is not running at " + s.gateway_url + " (" + a.error + ")", "start it: pulse serve"};
    rapidjson::Document d;
    d.Parse(a.body.c_str());
    const std::string status = !d.HasParseError() && d.IsObject() ? str_at(member(d, "status")) : "";
    if (a.status == 200 && (status == "completed" || status == "incomplete")) return {"turn through Pulse", Verdict::pass, what + ": " + status, ""};
    std::string msg = a.body.substr(0, 400);
    if (!d.HasParseError() && d.IsObject())
        if (const auto* e = member(d, "error")) msg = str_at(member(*e, "message"));
    return {"turn through Pulse", Verdict::fail, what + ": HTTP " + std::to_string(a.status) + " " + msg, ""};
}

void write_check_json(rapidjson::Writer<rapidjson::StringBuffer>& w, const Check& c) {
    w.StartObject();
    w.Key("check");
    w.String(c.check.c_str());
    w.Key("verdict");
    std::string v = name(c.verdict);
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    w.String(v.c_str());
    w.Key("why");
    w.String(c.why.c_str());
    if (!c.fix.empty()) {
        w.Key("fix");
        w.String(c.fix.c_str());
    }
    w.EndObject();
}

// What every check found: per endpoint, the turns through the gateway, the config changes.
struct Findings {
    struct Report {
        const DoctorTarget* target;
        std::unique_ptr<Examiner> ex;
    };
    std::vector<Report> reports;
    std::vector<std::pair<std::string, Check>> turns;  // model, its turn through the gateway
    std::map<std::string, std::string> changes;
    int failures = 0, warnings = 0;
    std::string catalog_note;

    void count(const Check& c) { failures += c.verdict == Verdict::fail, warnings += c.verdict == Verdict::warn; }
};

Findings examine(const DoctorSettings& s) {
    Findings f;
    for (const auto& t : s.targets) {
        auto ex = std::make_unique<Examiner>(t, s);
        ex->run();
        for (const auto& c : ex->checks) f.count(c);
        f.changes.insert(ex->config_changes.begin(), ex->config_changes.end());
        f.reports.push_back({&t, std::move(ex)});
    }
    // The turn through the gateway, once per model.
    if (!s.gateway_url.empty()) {
        std::vector<std::string> models;
        for (const auto& t : s.targets)
            if (!t.model_id.empty() && std::find(models.begin(), models.end(), t.model_id) == models.end()) models.push_back(t.model_id);
        for (const auto& m : models) {
            f.turns.emplace_back(m, through_gateway(s, m));
            f.count(f.turns.back().second);
        }
    }
    return f;
}

// --write-catalog: the model's window is the smallest its endpoints take. False when it could
// not be written (f.catalog_note says why).
bool write_catalog(const DoctorSettings& s, Findings& f) {
    std::string model = s.targets.empty() ? "" : s.targets.front().model_id;
    int64_t window = 0;
    for (const auto& r : f.reports)
        if (r.target->model_id == model && r.ex->window > 0) window = window ? std::min(window, r.ex->window) : r.ex->window;
    if (model.empty() && !f.reports.empty()) model = s.targets.front().upstream_model;
    if (window <= 0 || model.empty()) {
        f.catalog_note = "not written: no server said its context window";
        return false;
    }
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path file = s.write_catalog, backup = s.write_catalog + ".bak";
    if (fs::exists(file, ec)) fs::copy_file(file, backup, fs::copy_options::overwrite_existing, ec);
    std::ofstream out(file, std::ios::trunc);
    out << catalog_json(model, window) << '\n';
    out.close();
    if (ec || !out) {
        f.catalog_note = "could not write " + file.string() + (ec ? ": " + ec.message() : std::string());
        return false;
    }
    f.catalog_note = "wrote " + file.string() + " for '" + model + "' with context_window " + std::to_string(window) +
                     (fs::exists(backup) ? " (the previous one is " + backup.string() + ": mv it back to undo)" : "");
    return true;
}

void print_json(const Findings& f) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.StartObject();
    w.Key("endpoints");
    w.StartArray();
    for (const auto& r : f.reports) {
        w.StartObject();
        w.Key("model");
        w.String(r.target->model_id.c_str());
        w.Key("endpoint");
        w.String(r.target->endpoint.c_str());
        w.Key("url");
        w.String(r.target->url.c_str());
        w.Key("server");
        w.String(r.ex->server.c_str());
        w.Key("context_window");
        w.Int64(r.ex->window);
        w.Key("checks");
        w.StartArray();
        for (const auto& c : r.ex->checks) write_check_json(w, c);
        w.EndArray();
        w.EndObject();
    }
    w.EndArray();
    w.Key("gateway");
    w.StartArray();
    for (const auto& [m, c] : f.turns) write_check_json(w, c);
    w.EndArray();
    w.Key("config_changes");
    w.StartArray();
    for (const auto& [line, why] : f.changes) w.String(line.c_str());
    w.EndArray();
    if (!f.catalog_note.empty()) {
        w.Key("catalog");
        w.String(f.catalog_note.c_str());
    }
    w.Key("failures");
    w.Int(f.failures);
    w.Key("warnings");
    w.Int(f.warnings);
    w.EndObject();
    std::printf("%s\n", b.GetString());
}

void print_text(const DoctorSettings& s, const Findings& f) {
    for (const auto& r : f.reports) {
        std::printf("%s%s (%s)\n", r.target->model_id.empty() ? "" : ("model " + r.target->model_id + ", endpoint ").c_str(), r.target->endpoint.c_str(),
                    r.target->url.c_str());
        for (const auto& c : r.ex->checks) {
            std::printf("  %s  %-22s %s\n", name(c.verdict), c.check.c_str(), c.why.c_str());
            if (!c.fix.empty() && (c.verdict == Verdict::fail || c.verdict == Verdict::warn)) std::printf("        %-22s fix: %s\n", "", c.fix.c_str());
        }
    }
    for (const auto& [m, c] : f.turns) {
        std::printf("gateway (%s)\n  %s  %-22s %s\n", s.gateway_url.c_str(), name(c.verdict), c.check.c_str(), c.why.c_str());
        if (!c.fix.empty() && c.verdict != Verdict::pass) std::printf("        %-22s fix: %s\n", "", c.fix.c_str());
    }
    if (!f.changes.empty()) {
        std::printf("\nconfig lines to change%s:\n", s.config_path.empty() ? "" : (" in " + s.config_path).c_str());
        for (const auto& [line, why] : f.changes) std::printf("  %-56s # %s\n", line.c_str(), why.c_str());
    }
    if (!f.catalog_note.empty()) std::printf("\ncatalog: %s\n", f.catalog_note.c_str());
    std::printf("\n%d failure%s, %d warning%s\n", f.failures, f.failures == 1 ? "" : "s", f.warnings, f.warnings == 1 ? "" : "s");
}

}  // namespace

int run_doctor(const DoctorSettings& s) {
    Findings f = examine(s);
    int rc = f.failures ? 1 : 0;
    if (!s.write_catalog.empty() && !write_catalog(s, f)) rc = 3;
    if (s.json) print_json(f);
    else print_text(s, f);
    return rc;
}

}  // namespace pulse::cli
