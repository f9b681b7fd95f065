#include "qwen_format.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <cstring>
#include <stdexcept>

namespace pulse::qwen {

namespace {

std::string dump(const rapidjson::Value& v) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    v.Accept(w);
    return {b.GetString(), b.GetSize()};
}

std::string str(const rapidjson::Value& v, const char* k) {
    if (!v.IsObject()) return {};
    auto it = v.FindMember(k);
    return it != v.MemberEnd() && it->value.IsString() ? std::string(it->value.GetString(), it->value.GetStringLength()) : std::string();
}

// Message content: a string, or an array of parts of which the text ones count.
std::string content_of(const rapidjson::Value& m) {
    if (!m.IsObject() || !m.HasMember("content")) return {};
    const auto& c = m["content"];
    if (c.IsString()) return std::string(c.GetString(), c.GetStringLength());
    std::string out;
    if (c.IsArray())
        for (const auto& p : c.GetArray())
            if (p.IsObject() && str(p, "type") == "text") out += str(p, "text");
    return out;
}

const char* kToolsPreamble =
    "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
const char* kToolsFormat =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within "
    "<tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and do not tell "
    "the user about function calls\n</IMPORTANT>";

std::string render_tool_call(const rapidjson::Value& tc) {
    const rapidjson::Value* fn = tc.IsObject() && tc.HasMember("function") ? &tc["function"] : nullptr;
    if (!fn || !fn->IsObject()) throw std::invalid_argument("an assistant tool_calls entry has no function");
    std::string out = "<tool_call>\n<function=" + str(*fn, "name") + ">\n";
    rapidjson::Document args;
    if (fn->HasMember("arguments") && (*fn)["arguments"].IsString()) {
        std::string a = (*fn)["arguments"].GetString();
        args.Parse(a.empty() ? "{}" : a.c_str());
        if (args.HasParseError() || !args.IsObject())
            throw std::invalid_argument("tool call '" + str(*fn, "name") + "' has arguments that are not a JSON object");
    } else if (fn->HasMember("arguments") && (*fn)["arguments"].IsObject()) {
        args.CopyFrom((*fn)["arguments"], args.GetAllocator());
    } else {
        args.SetObject();
    }
    for (const auto& m : args.GetObject()) {
        out += "<parameter=" + std::string(m.name.GetString()) + ">\n";
        out += m.value.IsString() ? std::string(m.value.GetString(), m.value.GetStringLength()) : dump(m.value);
        out += "\n</parameter>\n";
    }
    return out + "</function>\n</tool_call>";
}

}  // namespace

namespace {

// Whether the request continues its last (assistant) message: continue_final_message, checked
// as vLLM and llama-server check it.
bool continues_last(const rapidjson::Value& req) {
    if (!(req.HasMember("continue_final_message") && req["continue_final_message"].IsTrue())) return false;
    const auto& msgs = req["messages"].GetArray();
    if (!(req.HasMember("add_generation_prompt") && req["add_generation_prompt"].IsFalse()))
        throw std::invalid_argument("continue_final_message needs add_generation_prompt: false");
    if (msgs.Empty() || str(msgs[msgs.Size() - 1], "role") != "assistant")
        throw std::invalid_argument("continue_final_message: the last message is not an assistant message");
    const auto& last = msgs[msgs.Size() - 1];
    if (last.HasMember("tool_calls") && last["tool_calls"].IsArray() && !last["tool_calls"].Empty())
        throw std::invalid_argument("cannot continue an assistant message that contains tool calls");
    return true;
}

// The system turn's text: the system/developer messages first, then the tool definitions.
std::string system_turn(const rapidjson::Value& req) {
    std::string system;
    for (const auto& m : req["messages"].GetArray())
        if (str(m, "role") == "system" || str(m, "role") == "developer") system += (system.empty() ? "" : "\n\n") + content_of(m);
    if (req.HasMember("tools") && req["tools"].IsArray() && !req["tools"].Empty()) {
        std::string t = kToolsPreamble;
        for (const auto& tool : req["tools"].GetArray()) t += "\n" + dump(tool);
        t += kToolsFormat;
        system = system.empty() ? t.substr(2) : system + t;
    }
    return system;
}

}  // namespace

std::string render_chat(const rapidjson::Value& req, bool* thinking_out) {
    if (!req.IsObject() || !req.HasMember("messages") || !req["messages"].IsArray())
        throw std::invalid_argument("the request has no messages array");
    const auto& msgs = req["messages"].GetArray();
    bool thinking = true;
    if (req.HasMember("chat_template_kwargs") && req["chat_template_kwargs"].IsObject()) {
        const auto& kw = req["chat_template_kwargs"];
        if (kw.HasMember("enable_thinking") && kw["enable_thinking"].IsBool()) thinking = kw["enable_thinking"].GetBool();
    }
    // Continuing the last (assistant) message instead of answering after it, as vLLM and
    // llama-server do with continue_final_message (mid-stream resume sends this).
    const bool cont = continues_last(req);
    const size_t rendered = cont ? msgs.Size() - 1 : msgs.Size();
    if (thinking_out) *thinking_out = thinking;
    std::string out;
    if (std::string system = system_turn(req); !system.empty()) out += "<|im_start|>system\n" + system + "<|im_end|>\n";
    // Reasoning is kept only for assistant turns after the last user message (a tool loop in
    // progress), as the Qwen3.5 template does by default.
    size_t last_user = 0;
    for (size_t i = 0; i < msgs.Size(); ++i)
        if (str(msgs[static_cast<rapidjson::SizeType>(i)], "role") == "user") last_user = i;
    for (size_t i = 0; i < rendered; ++i) {
        const auto& m = msgs[static_cast<rapidjson::SizeType>(i)];
        std::string role = str(m, "role");
        if (role == "system" || role == "developer") continue;
        if (role == "user") {
            out += "<|im_start|>user\n" + content_of(m) + "<|im_end|>\n";
        } else if (role == "assistant") {
            out += "<|im_start|>assistant\n";
            std::string reasoning = str(m, "reasoning_content");
            if (reasoning.empty()) reasoning = str(m, "reasoning");
            std::string content = content_of(m);
            if (i > last_user && !reasoning.empty()) out += "<think>\n" + reasoning + "\n</think>\n\n";
            out += content;
            if (m.HasMember("tool_calls") && m["tool_calls"].IsArray())
                for (const auto& tc : m["tool_calls"].GetArray())
                    out += (out.back() == '\n' || content.empty() ? "" : "\n") + render_tool_call(tc);
            out += "<|im_end|>\n";
        } else if (role == "tool") {
            // Consecutive tool results share one user turn.
            bool first = i == 0 || str(msgs[static_cast<rapidjson::SizeType>(i - 1)], "role") != "tool";
            bool last = i + 1 == msgs.Size() || str(msgs[static_cast<rapidjson::SizeType>(i + 1)], "role") != "tool";
            if (first) out += "<|im_start|>user";
            out += "\n<tool_response>\n" + content_of(m) + "\n</tool_response>";
            if (last) out += "<|im_end|>\n";
        } else {
            throw std::invalid_argument("message role '" + role + "' cannot be rendered (system, developer, user, assistant, tool)");
        }
    }
    out += "<|im_start|>assistant\n";
    if (!cont) {
        out += thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
        return out;
    }
    // The continued message: its reasoning stays open when it has no content yet (the model
    // goes on thinking, as llama-server's automatic continuation does), else it is closed and
    // the content goes on.
    const auto& last = msgs[msgs.Size() - 1];
    std::string reasoning = str(last, "reasoning_content");
    if (reasoning.empty()) reasoning = str(last, "reasoning");
    std::string content = content_of(last);
    if (thinking && content.empty()) {
        out += "<think>\n" + reasoning;
        return out;
    }
    out += thinking || !reasoning.empty() ? "<think>\n" + reasoning + "\n</think>\n\n" : "<think>\n\n</think>\n\n";
    out += content;
    if (thinking_out) *thinking_out = false;  // the output is content
    return out;
}

// ---- output parsing ---------------------------------------------------------------------------

OutputParser::OutputParser(const rapidjson::Value* tools, bool thinking) : state_(thinking ? think : text) {
    if (tools) tools_.CopyFrom(*tools, tools_.GetAllocator());
}

namespace {
// Length of the longest suffix of `s` that is a proper prefix of `tag` (may become the tag).
size_t partial_tag(const std::string& s, const std::string& tag) {
    for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
        if (s.compare(s.size() - n, n, tag, 0, n) == 0) return n;
    return 0;
}

// What must wait for more text: a possible start of `tag`, and the whitespace before it (the
// template puts a newline before </think> and <tool_call> that is not part of the text).
size_t held_back(const std::string& s, const std::string& tag, const char* ws) {
    size_t k = partial_tag(s, tag);
    while (k < s.size() && std::strchr(ws, s[s.size() - k - 1])) ++k;
    return k;
}
}  // namespace

void OutputParser::run(std::vector<Event>& out, bool final) {
    while (true) {
        if (state_ == think) {
            auto end = buf_.find("</think>");
            if (end == std::string::npos) {
                size_t keep = final ? 0 : held_back(buf_, "</think>", "\n");
                if (buf_.size() > keep) out.push_back({Event::reasoning, buf_.substr(0, buf_.size() - keep), "", ""});
                buf_.erase(0, buf_.size() - keep);
                return;
            }
            std::string r = buf_.substr(0, end);
            while (!r.empty() && r.back() == '\n') r.pop_back();  // the template's newline before </think>
            if (!r.empty()) out.push_back({Event::reasoning, r, "", ""});
            buf_.erase(0, end + 8);
            state_ = text;
            strip_newlines_ = true;
            continue;
        }
        if (state_ == text) {
            if (strip_newlines_) {
                size_t n = 0;
                while (n < buf_.size() && buf_[n] == '\n') ++n;
                buf_.erase(0, n);
                if (buf_.empty() && !final) return;
                strip_newlines_ = false;
            }
            auto start = buf_.find("<tool_call>");
            if (start == std::string::npos) {
                size_t keep = final ? 0 : held_back(buf_, "<tool_call>", " \n");
                std::string emit = buf_.substr(0, buf_.size() - keep);
                if (!emit.empty()) out.push_back({Event::content, emit, "", ""});
                buf_.erase(0, buf_.size() - keep);
                return;
            }
            std::string before = buf_.substr(0, start);
            while (!before.empty() && (before.back() == '\n' || before.back() == ' ')) before.pop_back();  // the newline before a call
            if (!before.empty()) out.push_back({Event::content, before, "", ""});
            buf_.erase(0, start + 11);
            state_ = call;
            continue;
        }
        // call: wait for the closing tag
        auto end = buf_.find("</tool_call>");
        if (end == std::string::npos) {
            if (final && !buf_.empty()) broken_ = true;
            return;
        }
        Event e = parse_call(buf_.substr(0, end));
        if (!e.name.empty()) {
            out.push_back(std::move(e));
            ++calls_;
        } else {
            broken_ = true;
        }
        buf_.erase(0, end + 12);
        state_ = text;
        strip_newlines_ = true;
    }
}

OutputParser::Event OutputParser::parse_call(const std::string& body) {
    Event e{Event::tool_call, "", "", ""};
    auto f = body.find("<function=");
    if (f == std::string::npos) return e;
    auto close = body.find('>', f);
    if (close == std::string::npos) return e;
    e.name = body.substr(f + 10, close - f - 10);
    // The tool's parameter schema, for typing values (strings when unknown).
    const rapidjson::Value* props = nullptr;
    if (tools_.IsArray())
        for (const auto& t : tools_.GetArray()) {
            if (!t.IsObject() || !t.HasMember("function") || str(t["function"], "name") != e.name) continue;
            const auto& fn = t["function"];
            if (fn.HasMember("parameters") && fn["parameters"].IsObject() && fn["parameters"].HasMember("properties") &&
                fn["parameters"]["properties"].IsObject())
                props = &fn["parameters"]["properties"];
        }
    rapidjson::Document args(rapidjson::kObjectType);
    auto& a = args.GetAllocator();
    size_t pos = close + 1;
    while (true) {
        auto p = body.find("<parameter=", pos);
        if (p == std::string::npos) break;
        auto pc = body.find('>', p);
        auto pe = body.find("</parameter>", pc == std::string::npos ? p : pc);
        if (pc == std::string::npos || pe == std::string::npos) {
            e.name.clear();  // malformed
            return e;
        }
        std::string key = body.substr(p + 11, pc - p - 11);
        std::string value = body.substr(pc + 1, pe - pc - 1);
        if (!value.empty() && value.front() == '\n') value.erase(0, 1);
        if (!value.empty() && value.back() == '\n') value.pop_back();
        std::string type;
        if (props && props->HasMember(key.c_str())) type = str((*props)[key.c_str()], "type");
        rapidjson::Value v;
        rapidjson::Document parsed;
        if (type != "string" && !type.empty()) parsed.Parse(value.c_str());
        if (!type.empty() && type != "string" && !parsed.HasParseError()) v.CopyFrom(parsed, a);
        else v.SetString(value.c_str(), static_cast<rapidjson::SizeType>(value.size()), a);
        if (args.HasMember(key.c_str())) args.RemoveMember(key.c_str());
        args.AddMember(rapidjson::Value(key.c_str(), a), v, a);
        pos = pe + 12;
    }
    e.arguments = dump(args);
    return e;
}

std::vector<OutputParser::Event> OutputParser::feed(const std::string& text) {
    std::vector<Event> out;
    buf_ += text;
    run(out, false);
    return out;
}

std::vector<OutputParser::Event> OutputParser::finish() {
    std::vector<Event> out;
    run(out, true);
    return out;
}

}  // namespace pulse::qwen
