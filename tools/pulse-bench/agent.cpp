#include "pulse-bench/agent.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <stdexcept>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace pulse::bench::agent {
namespace {

using Value = rapidjson::Value;

std::string dump(const Value& v) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    v.Accept(w);
    return {b.GetString(), b.GetSize()};
}

std::string str(const Value& o, const char* k) {
    if (!o.IsObject()) return {};
    auto it = o.FindMember(k);
    return it != o.MemberEnd() && it->value.IsString() ? std::string(it->value.GetString(), it->value.GetStringLength()) : std::string();
}

Check parse_check(const Value& v, const std::string& where) {
    if (!v.IsObject() || v.MemberCount() != 1) throw std::runtime_error(where + ": a check is an object with one operator");
    const auto& m = *v.MemberBegin();
    Check c{m.name.GetString(), dump(m.value)};
    static const char* const ops[] = {"equals", "contains", "regex", "one_of", "present", "between", "not_contains"};
    if (std::find_if(std::begin(ops), std::end(ops), [&](const char* o) { return c.op == o; }) == std::end(ops))
        throw std::runtime_error(where + ": unknown check '" + c.op + "' (equals, contains, not_contains, regex, one_of, present, between)");
    if (c.op == "regex") try {
            std::regex re(str(rapidjson::Document().Parse(("{\"r\":" + c.text + "}").c_str()), "r"));
        } catch (const std::regex_error&) {
            throw std::runtime_error(where + ": regex " + c.text + " does not compile");
        }
    return c;
}

// Whether `v` (absent when null) passes `c`. Text checks look at a string's text, else at the
// value's JSON.
bool passes(const Check& c, const Value* v) {
    if (c.op == "present") return v != nullptr;
    if (c.op == "not_contains") {
        rapidjson::Document o;
        o.Parse(c.text.c_str());
        std::string text = !v ? "" : v->IsString() ? v->GetString() : dump(*v);
        return o.IsString() && text.find(o.GetString()) == std::string::npos;
    }
    if (!v) return false;
    rapidjson::Document o;
    o.Parse(c.text.c_str());
    const std::string text = v->IsString() ? std::string(v->GetString(), v->GetStringLength()) : dump(*v);
    auto lower = [](std::string s) {
        std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
        return s;
    };
    if (c.op == "equals") {
        if (o.IsString() && v->IsString()) return lower(text) == lower(o.GetString());  // "Paris" == "paris"
        if (o.IsNumber() && v->IsNumber()) return std::fabs(o.GetDouble() - v->GetDouble()) < 1e-9;
        return dump(o) == dump(*v);
    }
    if (c.op == "contains") return o.IsString() && lower(text).find(lower(o.GetString())) != std::string::npos;
    if (c.op == "regex") return o.IsString() && std::regex_search(text, std::regex(o.GetString(), std::regex::icase));
    if (c.op == "one_of") {
        if (!o.IsArray()) return false;
        for (const auto& x : o.GetArray()) {
            Check eq{"equals", dump(x)};
            if (passes(eq, v)) return true;
        }
        return false;
    }
    if (c.op == "between") {
        double x = v->IsNumber() ? v->GetDouble() : v->IsString() ? std::strtod(v->GetString(), nullptr) : NAN;
        return o.IsArray() && o.Size() == 2 && x >= o[0].GetDouble() && x <= o[1].GetDouble();
    }
    return false;
}

// The tools of a repository task: the same four, run for real against the task's files.
const char* kRepoTools = R"([
 {"name":"list_files","description":"List the files of the repository.","parameters":{"type":"object","properties":{}}},
 {"name":"read_file","description":"Read a file of the repository.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}},
 {"name":"write_file","description":"Create or replace a file of the repository with the given content.","parameters":{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path","content"]}},
 {"name":"run","description":"Run a shell command in the repository (no network) and get its exit code and output.","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}])";

const char* kRepoSystem =
    "You work in a small repository through tools: list_files, read_file, write_file and run (a shell "
    "command in the repository). Do the task, check it, then answer with a one-line summary.";

std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(s.size() - n); }

// What a repository tool does with `args` (a parsed object).
std::string repo_tool(const std::string& name, const Value& args, Files& files, const SandboxLimits& limits) {
    if (name == "list_files") {
        std::string out;
        for (const auto& [p, _] : files) out += p + "\n";
        return out.empty() ? "(no files)" : out;
    }
    if (name == "read_file") {
        auto it = files.find(str(args, "path"));
        return it == files.end() ? "error: no such file: " + str(args, "path") : it->second;
    }
    if (name == "write_file") {
        std::string path = str(args, "path");
        if (path.empty() || path[0] == '/' || path.find("..") != std::string::npos) return "error: the path must be relative, inside the repository";
        files[path] = str(args, "content");
        return "wrote " + path + " (" + std::to_string(files[path].size()) + " bytes)";
    }
    // run
    SandboxResult r = run_shell_sandboxed(str(args, "command"), files, limits);
    if (r.outcome == Outcome::error) return "error: the command could not be run: " + r.detail;
    std::string head = r.outcome == Outcome::timeout ? "timed out (" + r.detail + ")" : "exit code " + std::to_string(r.exit_code);
    return head + "\n" + tail(r.output, 4000);
}

}  // namespace

namespace {
// Plausible log lines, the same for a given length every time.
std::string filler(size_t chars) {
    static const char* kWords[] = {"worker", "cache", "flush", "queue", "retry", "ok", "shard", "sync", "batch", "index", "disk", "lease"};
    std::string out;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int line = 0; out.size() < chars; ++line) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        out += "2026-11-30T" + std::to_string(10 + line / 3600 % 14) + ":" + std::to_string(10 + line / 60 % 50) + ":" +
               std::to_string(10 + line % 50) + " INFO " + kWords[x % 12] + " " + kWords[(x >> 8) % 12] + " id=" + std::to_string(x % 100000) +
               " took " + std::to_string(x % 997) + " ms\n";
    }
    out.resize(chars);
    return out + "\n";
}
}  // namespace

std::vector<Task> load_suite(const std::string& json, const std::string& source) {
    rapidjson::Document d;
    d.Parse(json.c_str());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("tasks") || !d["tasks"].IsArray())
        throw std::runtime_error(source + ": expected {\"tasks\": [...]}");
    // Tools the tasks name instead of defining ("tools": ["get_weather", ...]): the suite's library.
    std::map<std::string, const rapidjson::Value*> library;
    if (d.HasMember("tool_library")) {
        if (!d["tool_library"].IsArray()) throw std::runtime_error(source + ": tool_library must be an array of tools");
        for (const auto& tl : d["tool_library"].GetArray()) {
            if (str(tl, "name").empty()) throw std::runtime_error(source + ": a tool_library tool has no name");
            library[str(tl, "name")] = &tl;
        }
    }
    std::vector<Task> out;
    for (auto& v : d["tasks"].GetArray()) {
        Task t;
        t.id = str(v, "id");
        const std::string where = source + ": task '" + t.id + "'";
        if (t.id.empty()) throw std::runtime_error(source + ": a task has no id");
        if (std::any_of(out.begin(), out.end(), [&](const Task& x) { return x.id == t.id; })) throw std::runtime_error(where + ": id used twice");
        t.kind = str(v, "kind");
        if (t.kind.empty()) t.kind = "tools";
        if (t.kind != "tools" && t.kind != "repo") throw std::runtime_error(where + ": kind must be \"tools\" or \"repo\"");
        t.system = str(v, "system");
        t.user = str(v, "user");
        t.category = str(v, "category");
        if (t.category.empty()) t.category = t.kind;
        t.smoke = v.HasMember("smoke") && v["smoke"].IsTrue();
        if (t.user.empty()) throw std::runtime_error(where + ": \"user\" (the request) is required");
        if (v.HasMember("max_turns")) {
            if (!v["max_turns"].IsInt() || v["max_turns"].GetInt() < 1 || v["max_turns"].GetInt() > 50)
                throw std::runtime_error(where + ": max_turns must be 1-50");
            t.max_turns = v["max_turns"].GetInt();
        } else if (t.kind == "repo") {
            t.max_turns = 12;
        }
        if (t.kind == "tools") {
            if (!v.HasMember("tools") || !v["tools"].IsArray()) throw std::runtime_error(where + ": \"tools\" (an array) is required");
            for (auto& tl : v["tools"].GetArray()) {
                if (!tl.IsString()) continue;
                auto it = library.find(tl.GetString());
                if (it == library.end()) throw std::runtime_error(where + ": tool '" + tl.GetString() + "' is not in the suite's tool_library");
                tl.CopyFrom(*it->second, d.GetAllocator());
            }
            t.tools_json = dump(v["tools"]);
            if (v.HasMember("expect")) {
                if (!v["expect"].IsArray()) throw std::runtime_error(where + ": expect must be an array");
                for (const auto& e : v["expect"].GetArray()) {
                    ExpectedCall ec;
                    ec.tool = str(e, "tool");
                    if (ec.tool.empty()) throw std::runtime_error(where + ": an expected call has no tool");
                    bool known = false;
                    for (const auto& tool : v["tools"].GetArray()) known = known || str(tool, "name") == ec.tool;
                    if (!known) throw std::runtime_error(where + ": expects a call to '" + ec.tool + "', which is not among its tools");
                    if (e.HasMember("args")) {
                        if (!e["args"].IsObject()) throw std::runtime_error(where + ": args must be an object of checks");
                        for (const auto& a : e["args"].GetObject())
                            ec.args.emplace_back(a.name.GetString(), parse_check(a.value, where + ", " + ec.tool + "." + a.name.GetString()));
                    }
                    ec.result = e.HasMember("result") ? (e["result"].IsString() ? std::string(e["result"].GetString()) : dump(e["result"])) : "ok";
                    // A long tool output (a log, a listing) with the result buried at its end:
                    // result_pad_chars of deterministic filler lines come first.
                    if (e.HasMember("result_pad_chars")) {
                        if (!e["result_pad_chars"].IsInt() || e["result_pad_chars"].GetInt() < 0 || e["result_pad_chars"].GetInt() > 4000000)
                            throw std::runtime_error(where + ": result_pad_chars must be 0-4000000");
                        ec.result = filler(static_cast<size_t>(e["result_pad_chars"].GetInt())) + ec.result;
                    }
                    t.expect.push_back(std::move(ec));
                }
            }
        } else {
            if (!v.HasMember("files") || !v["files"].IsObject()) throw std::runtime_error(where + ": \"files\" (path: content) is required");
            for (const auto& f : v["files"].GetObject()) {
                if (!f.value.IsString()) throw std::runtime_error(where + ": file " + f.name.GetString() + " must be a string");
                t.files[f.name.GetString()] = f.value.GetString();
            }
            t.check = str(v, "check");
            if (t.check.empty()) throw std::runtime_error(where + ": \"check\" (a shell command) is required");
            t.tools_json = kRepoTools;
            if (t.system.empty()) t.system = kRepoSystem;
        }
        if (v.HasMember("final")) {
            if (!v["final"].IsArray()) throw std::runtime_error(where + ": final must be an array of checks");
            for (const auto& c : v["final"].GetArray()) t.final_checks.push_back(parse_check(c, where + ", final"));
        }
        out.push_back(std::move(t));
    }
    if (out.empty()) throw std::runtime_error(source + ": no tasks");
    return out;
}

// ---- the model side ----

namespace {

Value tool_array(const std::string& tools_json, bool chat, rapidjson::Document::AllocatorType& a) {
    rapidjson::Document tools;
    tools.Parse(tools_json.c_str());
    Value out(rapidjson::kArrayType);
    for (const auto& t : tools.GetArray()) {
        Value x(rapidjson::kObjectType);
        x.AddMember("type", "function", a);
        if (chat) {
            Value f(t, a);
            x.AddMember("function", f, a);
        } else {
            for (const auto& m : t.GetObject()) x.AddMember(Value(m.name, a), Value(m.value, a), a);
        }
        out.PushBack(x, a);
    }
    return out;
}

Value s(const std::string& v, rapidjson::Document::AllocatorType& a) { return Value(v.c_str(), static_cast<rapidjson::SizeType>(v.size()), a); }

Reply post_json(const Endpoint& ep, const std::string& path, const rapidjson::Document& body, double timeout_s, rapidjson::Document& out) {
    Reply r;
    HttpReply h = http_post(ep.base + path, dump(body), timeout_s, ep.api_key);
    if (!h.reasoning_budget.empty()) r.budget = std::atoll(h.reasoning_budget.c_str());
    if (h.status != 200) {
        r.error = h.status ? "HTTP " + std::to_string(h.status) + ": " + h.body.substr(0, 300) : h.error;
        // A Pulse gateway serves the Responses API only; a Chat Completions server has no /responses.
        if (h.status == 404 && path == "/chat/completions")
            r.error += " (this server has no Chat Completions route: for a Pulse gateway pass --api responses)";
        if (h.status == 404 && path == "/responses") r.error += " (this server has no Responses route: pass --api chat)";
        return r;
    }
    out.Parse(h.body.c_str());
    if (out.HasParseError() || !out.IsObject()) {
        r.error = "the answer is not a JSON object: " + h.body.substr(0, 200);
        return r;
    }
    r.ok = true;
    return r;
}

}  // namespace

Reply ask_chat(const Endpoint& ep, const Conversation& c, const Sampler& sm, double timeout_s) {
    rapidjson::Document b(rapidjson::kObjectType);
    auto& a = b.GetAllocator();
    if (!ep.model.empty()) b.AddMember("model", s(ep.model, a), a);
    Value msgs(rapidjson::kArrayType);
    auto msg = [&](const char* role, const std::string& content) {
        Value m(rapidjson::kObjectType);
        m.AddMember("role", Value(role, a), a).AddMember("content", s(content, a), a);
        return m;
    };
    if (!c.system.empty()) msgs.PushBack(msg("system", c.system), a);
    msgs.PushBack(msg("user", c.user), a);
    for (const auto& st : c.steps) {
        Value m = msg("assistant", st.reply.text);
        if (!st.reply.calls.empty()) {
            Value calls(rapidjson::kArrayType);
            for (const auto& call : st.reply.calls) {
                Value f(rapidjson::kObjectType);
                f.AddMember("name", s(call.name, a), a).AddMember("arguments", s(call.args, a), a);
                Value x(rapidjson::kObjectType);
                x.AddMember("id", s(call.id, a), a).AddMember("type", "function", a).AddMember("function", f, a);
                calls.PushBack(x, a);
            }
            m.AddMember("tool_calls", calls, a);
        }
        msgs.PushBack(m, a);
        for (const auto& [call, result] : st.results) {
            Value t = msg("tool", result);
            t.AddMember("tool_call_id", s(call.id, a), a);
            msgs.PushBack(t, a);
        }
    }
    b.AddMember("messages", msgs, a);
    b.AddMember("tools", tool_array(c.tools_json, true, a), a);
    b.AddMember("temperature", sm.temperature, a).AddMember("seed", sm.seed, a).AddMember("max_tokens", sm.max_tokens, a);
    b.AddMember("stream", false, a);
    rapidjson::Document d;
    Reply r = post_json(ep, "/chat/completions", b, timeout_s, d);
    if (!r.ok) return r;
    if (!d.HasMember("choices") || !d["choices"].IsArray() || d["choices"].Empty() || !d["choices"][0].HasMember("message")) {
        r.ok = false;
        r.error = "no choices[0].message in the answer";
        return r;
    }
    const auto& m = d["choices"][0]["message"];
    r.text = str(m, "content");
    r.cut = str(d["choices"][0], "finish_reason") == "length";
    if (m.HasMember("tool_calls") && m["tool_calls"].IsArray())
        for (const auto& tc : m["tool_calls"].GetArray()) {
            const Value* f = tc.HasMember("function") ? &tc["function"] : nullptr;
            r.calls.push_back({str(tc, "id"), f ? str(*f, "name") : "", f ? str(*f, "arguments") : ""});
        }
    if (d.HasMember("usage") && d["usage"].IsObject()) {
        if (d["usage"].HasMember("prompt_tokens") && d["usage"]["prompt_tokens"].IsInt64()) r.input_tokens = d["usage"]["prompt_tokens"].GetInt64();
        if (d["usage"].HasMember("completion_tokens") && d["usage"]["completion_tokens"].IsInt64())
            r.output_tokens = d["usage"]["completion_tokens"].GetInt64();
    }
    return r;
}

Reply ask_responses(const Endpoint& ep, const Conversation& c, const Sampler& sm, double timeout_s) {
    rapidjson::Document b(rapidjson::kObjectType);
    auto& a = b.GetAllocator();
    if (!ep.model.empty()) b.AddMember("model", s(ep.model, a), a);
    if (!c.system.empty()) b.AddMember("instructions", s(c.system, a), a);
    Value input(rapidjson::kArrayType);
    auto message = [&](const char* role, const std::string& text, const char* part) {
        Value content(rapidjson::kArrayType), p(rapidjson::kObjectType);
        p.AddMember("type", Value(part, a), a).AddMember("text", s(text, a), a);
        content.PushBack(p, a);
        Value m(rapidjson::kObjectType);
        m.AddMember("type", "message", a).AddMember("role", Value(role, a), a).AddMember("content", content, a);
        return m;
    };
    input.PushBack(message("user", c.user, "input_text"), a);
    for (const auto& st : c.steps) {
        if (!st.reply.text.empty()) input.PushBack(message("assistant", st.reply.text, "output_text"), a);
        for (const auto& call : st.reply.calls) {
            Value x(rapidjson::kObjectType);
            x.AddMember("type", "function_call", a).AddMember("call_id", s(call.id, a), a).AddMember("name", s(call.name, a), a);
            x.AddMember("arguments", s(call.args, a), a);
            input.PushBack(x, a);
        }
        for (const auto& [call, result] : st.results) {
            Value x(rapidjson::kObjectType);
            x.AddMember("type", "function_call_output", a).AddMember("call_id", s(call.id, a), a).AddMember("output", s(result, a), a);
            input.PushBack(x, a);
        }
    }
    b.AddMember("input", input, a);
    b.AddMember("tools", tool_array(c.tools_json, false, a), a);
    b.AddMember("store", false, a).AddMember("stream", false, a);
    b.AddMember("temperature", sm.temperature, a).AddMember("max_output_tokens", sm.max_tokens, a);
    if (!sm.effort.empty()) {
        Value r(rapidjson::kObjectType);
        r.AddMember("effort", s(sm.effort, a), a);
        b.AddMember("reasoning", r, a);
    }
    rapidjson::Document d;
    Reply r = post_json(ep, "/responses", b, timeout_s, d);
    if (!r.ok) return r;
    r.cut = str(d, "status") == "incomplete" && d.HasMember("incomplete_details") && d["incomplete_details"].IsObject() &&
            str(d["incomplete_details"], "reason") == "max_output_tokens";
    if (str(d, "status") == "failed") {
        r.ok = false;
        r.error = "response.failed: " + (d.HasMember("error") && d["error"].IsObject() ? str(d["error"], "message") : std::string());
        return r;
    }
    if (d.HasMember("output") && d["output"].IsArray())
        for (const auto& o : d["output"].GetArray()) {
            std::string type = str(o, "type");
            if (type == "function_call") r.calls.push_back({str(o, "call_id"), str(o, "name"), str(o, "arguments")});
            if (type == "message" && o.HasMember("content") && o["content"].IsArray())
                for (const auto& p : o["content"].GetArray()) r.text += str(p, "text");
        }
    if (d.HasMember("usage") && d["usage"].IsObject()) {
        const auto& u = d["usage"];
        if (u.HasMember("input_tokens") && u["input_tokens"].IsInt64()) r.input_tokens = u["input_tokens"].GetInt64();
        if (u.HasMember("output_tokens") && u["output_tokens"].IsInt64()) r.output_tokens = u["output_tokens"].GetInt64();
    }
    return r;
}

// ---- running and scoring ----

Result run_task(const Task& t, const Ask& ask, const SandboxLimits& limits) {
    Result res;
    const auto t0 = std::chrono::steady_clock::now();
    Conversation c{t.system, t.user, t.tools_json, {}};
    rapidjson::Document tools;
    tools.Parse(t.tools_json.c_str());
    auto known = [&](const std::string& name) {
        for (const auto& x : tools.GetArray())
            if (str(x, "name") == name) return true;
        return false;
    };
    Files files = t.files;
    // Expected calls are matched in any order (as BFCL scores its parallel categories): a call
    // takes the first expected call not yet made whose tool and arguments it satisfies. A task
    // whose calls depend on each other still needs them in order: the later call's arguments
    // come from the earlier call's result.
    std::vector<bool> made(t.expect.size(), false);
    std::string final_text;
    bool finished = false;
    for (int turn = 0; turn < t.max_turns; ++turn) {
        Reply r = ask(c);
        ++res.turns;
        if (!r.ok) {
            res.outcome = "error";
            res.detail = "request failed: " + r.error;
            res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            return res;
        }
        res.input_tokens += r.input_tokens;
        res.output_tokens += r.output_tokens;
        res.cut += r.cut ? 1 : 0;
        res.budget = std::max(res.budget, r.budget);
        res.transcript.push_back("model: " + tail(r.text, 300) + (r.calls.empty() ? "" : " [" + std::to_string(r.calls.size()) + " call(s)]"));
        if (r.calls.empty()) {
            final_text = r.text;
            finished = true;
            break;
        }
        Conversation::Step step{r, {}};
        for (size_t i = 0; i < r.calls.size(); ++i) {
            Call& call = step.reply.calls[i];
            if (call.id.empty()) call.id = "call_" + std::to_string(turn) + "_" + std::to_string(i);
            ++res.calls;
            std::string result;
            rapidjson::Document args;
            args.Parse(call.args.empty() ? "{}" : call.args.c_str());
            if (!known(call.name)) {
                ++res.unknown_tools;
                result = "error: there is no tool named '" + call.name + "'";
            } else if (args.HasParseError() || !args.IsObject()) {
                ++res.bad_arguments;
                result = "error: the arguments are not a JSON object";
            } else if (t.kind == "repo") {
                result = repo_tool(call.name, args, files, limits);
            } else if (auto e = std::find_if(t.expect.begin(), t.expect.end(),
                                             [&](const ExpectedCall& x) {
                                                 return !made[static_cast<size_t>(&x - t.expect.data())] && x.tool == call.name &&
                                                        std::all_of(x.args.begin(), x.args.end(), [&](const auto& a) {
                                                            auto it = args.FindMember(a.first.c_str());
                                                            return passes(a.second, it == args.MemberEnd() ? nullptr : &it->value);
                                                        });
                                             });
                       e != t.expect.end()) {
                made[static_cast<size_t>(e - t.expect.begin())] = true;
                ++res.matched;
                result = e->result;
            } else {
                ++res.extra_calls;
                result = "error: this call was not expected here";
            }
            if (result.rfind("error: ", 0) == 0 && t.kind != "repo") res.wrong.push_back(call.name + "(" + tail(call.args, 80) + ")");
            res.transcript.push_back("  " + call.name + "(" + tail(call.args, 200) + ") -> " + tail(result, 200));
            step.results.emplace_back(call, result);
        }
        c.steps.push_back(std::move(step));
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rapidjson::Document fv;
    fv.SetString(final_text.c_str(), static_cast<rapidjson::SizeType>(final_text.size()), fv.GetAllocator());
    const bool final_ok = finished && std::all_of(t.final_checks.begin(), t.final_checks.end(), [&](const Check& ch) { return passes(ch, &fv); });
    const bool clean = res.unknown_tools == 0 && res.bad_arguments == 0 && res.extra_calls == 0;
    if (t.kind == "repo") {
        // A repository the model left as it was is a failure, whatever its check makes of it.
        if (files == t.files) {
            res.outcome = "fail";
            res.detail = "the repository was not changed";
            return res;
        }
        SandboxResult chk = run_shell_sandboxed(t.check, files, limits);
        if (chk.outcome == Outcome::error) {
            res.outcome = "error";
            res.detail = "the check could not be run: " + chk.detail;
        } else if (chk.exit_code == 0) {
            res.outcome = "pass";
            res.detail = "check passed";
        } else {
            res.outcome = chk.exit_code == 3 ? "partial" : "fail";
            res.detail = "check exited " + std::to_string(chk.exit_code) + ": " + tail(chk.output, 200);
        }
        if (res.outcome == "pass" && !finished) res.outcome = "partial", res.detail = "the check passes, but the model never finished";
        return res;
    }
    if (res.matched == static_cast<int>(t.expect.size()) && clean && final_ok) {
        res.outcome = "pass";
        res.detail = "every expected call, nothing else, and the answer";
    } else {
        // Which checks the answer missed, and which calls were wrong, by name.
        std::string missed;
        for (const Check& ch : t.final_checks)
            if (!passes(ch, &fv)) missed += (missed.empty() ? "" : ", ") + ch.op + " " + tail(ch.text, 60);
        std::string wrong;
        for (const auto& w : res.wrong) wrong += (wrong.empty() ? "" : "; ") + w;
        const std::string answer = final_ok ? "" : finished ? "the answer misses " + missed : "no final answer within " + std::to_string(t.max_turns) + " turns";
        if (res.matched > 0 || (t.expect.empty() && final_ok)) {
            res.outcome = "partial";
            res.detail = std::to_string(res.matched) + " of " + std::to_string(t.expect.size()) + " expected calls" +
                         (clean ? "" : "; wrong: " + wrong) + (answer.empty() ? "" : "; " + answer);
        } else {
            res.outcome = "fail";
            res.detail = (t.expect.empty() ? "" : "no expected call made") + std::string(!t.expect.empty() && !wrong.empty() ? " (wrong: " + wrong + ")" : "") +
                         (answer.empty() ? "" : std::string(t.expect.empty() ? "" : "; ") + answer);
        }
    }
    return res;
}

// ---- statistics ----

Paired compare(const std::vector<bool>& a, const std::vector<bool>& b) {
    Paired p;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        ++p.n;
        if (a[i] && b[i]) ++p.both;
        else if (a[i]) ++p.only_a;
        else if (b[i]) ++p.only_b;
        else ++p.neither;
    }
    if (p.n == 0) return p;
    const double n = p.n;
    p.diff = (p.only_b - p.only_a) / n;
    // The paired (Wald) interval of a difference of proportions on the same tasks.
    const double var = ((p.only_a + p.only_b) - (p.only_b - p.only_a) * (p.only_b - p.only_a) / n) / (n * n);
    const double half = 1.96 * std::sqrt(std::max(0.0, var));
    p.lo = std::max(-1.0, p.diff - half);
    p.hi = std::min(1.0, p.diff + half);
    // Exact McNemar: under "no difference" each discordant pair is a fair coin.
    const int d = p.only_a + p.only_b, k = std::min(p.only_a, p.only_b);
    if (d == 0) {
        p.mcnemar_p = 1;
    } else {
        double sum = 0, term = std::pow(0.5, d);  // C(d, 0) / 2^d
        for (int i = 0; i <= k; ++i) {
            sum += term;
            term = term * (d - i) / (i + 1);
        }
        p.mcnemar_p = std::min(1.0, 2 * sum);
    }
    return p;
}

}  // namespace pulse::bench::agent
