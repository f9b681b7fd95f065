#include "chat_translation.h"

#include <algorithm>
#include <cstdio>

namespace pulse::chat {

std::string excerpt(std::string_view s, size_t n) {
    return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

pulse_finish_t finish_from(std::string_view r) {
    if (r == "length") return PULSE_FINISH_LENGTH;
    if (r == "tool_calls" || r == "function_call") return PULSE_FINISH_TOOL_CALLS;
    if (r == "content_filter") return PULSE_FINISH_CONTENT_FILTER;
    return PULSE_FINISH_STOP;
}

namespace {

// The text of a Responses content array (input_text, output_text, summary_text,
// reasoning_text, refusal parts), or of a plain string.
std::string text_of(const Json& content) {
    if (auto s = content.string()) return std::string(*s);
    std::string out;
    for (size_t i = 0; i < content.size(); ++i) {
        Json part = content.at(i);
        if (auto t = part["text"].string()) out += *t;
        else if (auto r = part["refusal"].string()) out += *r;
    }
    return out;
}

// Text or an image URL: a view into the request where it comes from there (a long prompt is
// then written to the upstream request without a copy of its own), else text made here.
struct Part {
    bool image = false;
    bool borrowed = false;
    std::string owned;
    std::string_view view;  // valid for the whole build_request call
    static Part of_request(std::string_view s, bool image = false) {
        Part p;
        p.image = image;
        p.borrowed = true;
        p.view = s;
        return p;
    }
    static Part made(std::string s) {
        Part p;
        p.owned = std::move(s);
        return p;
    }
    std::string_view value() const { return borrowed ? view : std::string_view(owned); }
};

struct Call {
    std::string id, name, arguments;
};

struct Message {
    std::string role;
    std::vector<Part> parts;
    std::vector<Call> calls;
    std::string tool_call_id;
    std::string reasoning;

    bool has_images() const {
        return std::any_of(parts.begin(), parts.end(), [](const Part& p) { return p.image; });
    }
    std::string text() const {
        std::string t;
        for (const auto& p : parts)
            if (!p.image) t += p.value();
        return t;
    }
};

std::string flat_name(const Options& opt, std::string_view ns, std::string_view name) {
    return ns.empty() ? std::string(name) : std::string(ns) + opt.ns_separator + std::string(name);
}

// A template switch's value, whichever JSON scalar it is.
void write_scalar(Writer& w, const std::string& s) { w.string(s); }
void write_scalar(Writer& w, bool b) { w.boolean(b); }
void write_scalar(Writer& w, int64_t n) { w.i64(n); }
void write_scalar(Writer& w, double x) { w.f64(x); }

// chat_template_kwargs: the per-request thinking switch, then the profile's own switches.
void write_template_kwargs(Writer& w, const Options& opt, bool thinking) {
    w.key("chat_template_kwargs").begin_object().key("enable_thinking").boolean(thinking);
    for (const auto& arg : opt.template_kwargs) {
        w.key(arg.key);
        std::visit([&](const auto& x) { write_scalar(w, x); }, arg.value);
    }
    w.end_object();
}

bool valid_json(const pulse_host_api_t* host, pulse_call_t* call, std::string_view text) {
    return host->json->parse(call, str(text)) != nullptr;
}

// Image / text parts of a user-side content array.
void add_parts(const Options& opt, const Json& content, std::vector<Part>& parts) {
    if (auto s = content.string()) {
        parts.push_back(Part::of_request(*s));
        return;
    }
    for (size_t i = 0; i < content.size(); ++i) {
        Json p = content.at(i);
        std::string_view type = p["type"].string_or("");
        if (type == "input_image" || type == "image_url") {
            std::string_view url(p["image_url"].is_object() ? p["image_url"]["url"].string_or("") : p["image_url"].string_or(""));
            if (opt.pass_images && !url.empty()) parts.push_back(Part::of_request(url, true));
            else parts.push_back(Part::made("[image omitted: this model takes text only]"));
        } else if (auto t = p["text"].string()) {
            parts.push_back(Part::of_request(*t));
        }
    }
}

void write_content(Writer& w, const Message& m) {
    if (!m.has_images()) {
        if (m.parts.size() == 1) w.string(m.parts[0].value());  // the common case, without a copy
        else w.string(m.text());
        return;
    }
    w.begin_array();
    for (const auto& p : m.parts) {
        w.begin_object();
        if (p.image) {
            w.kv("type", "image_url").key("image_url").begin_object().kv("url", p.value()).end_object();
        } else {
            w.kv("type", "text").kv("text", p.value());
        }
        w.end_object();
    }
    w.end_array();
}

// The function parameters a `custom` (freeform) tool is offered with.
constexpr std::string_view kCustomParams =
    R"({"type":"object","properties":{"input":{"type":"string","description":"The complete raw input for the tool (for apply_patch: the whole patch, from *** Begin Patch to *** End Patch)."}},"required":["input"],"additionalProperties":false})";

std::string custom_description(const Json& tool) {
    std::string d(tool["description"].string_or(""));
    d += "\n\nPass the raw input text as the `input` string argument.";
    Json fmt = tool["format"];
    if (fmt["type"].string_or("") == "grammar") {
        if (auto def = fmt["definition"].string()) {
            d += " The input must match this ";
            d += fmt["syntax"].string_or("lark");
            d += " grammar:\n";
            d += *def;
        }
    }
    return d;
}

// Writes {"type":"function","function":{...}} for one function tool.
void write_function_tool(Writer& w, std::string_view name, std::string_view description, const Json* params,
                         std::string_view raw_params) {
    w.begin_object().kv("type", "function").key("function").begin_object().kv("name", name);
    if (!description.empty()) w.kv("description", description);
    w.key("parameters");
    if (params && params->is_object()) w.copy(*params);
    else if (!raw_params.empty()) w.raw(raw_params);
    else w.raw(R"({"type":"object","properties":{}})");
    w.end_object().end_object();
}

bool is_context_error(std::string_view msg) {
    return msg.find("maximum context length") != std::string_view::npos ||
           msg.find("exceed_context_size_error") != std::string_view::npos ||
           msg.find("exceeds the available context size") != std::string_view::npos ||
           msg.find("context length") != std::string_view::npos;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

Options Options::parse(const Json& cfg, std::string_view profile) {
    Options o;
    if (!cfg.present() || cfg.is_null()) return o;
    if (!cfg.is_object())
        throw Error(PULSE_E_INVALID_ARGUMENT, std::string(profile) + ": profile_options must be a table");
    auto bad = [&](std::string_view key, std::string_view expected) {
        throw Error(PULSE_E_INVALID_ARGUMENT, std::string(profile) + ": profile_options." + std::string(key) + ": expected " +
                                                  std::string(expected));
    };
    for (size_t i = 0; i < cfg.size(); ++i) {
        auto [key, v] = cfg.member_at(i);
        if (key == "thinking") {
            auto s = v.string_or("");
            if (s == "effort") o.thinking = Thinking::effort;
            else if (s == "on") o.thinking = Thinking::on;
            else if (s == "off") o.thinking = Thinking::off;
            else bad(key, "\"effort\", \"on\" or \"off\"");
        } else if (key == "force_tool_choice") {
            auto s = v.string_or("");
            if (s == "schema") o.force = ForceMode::schema;
            else if (s == "native") o.force = ForceMode::native;
            else bad(key, "\"schema\" or \"native\"");
        } else if (key == "namespace_separator") {
            auto s = v.string();
            if (!s || s->empty()) bad(key, "a non-empty string");
            o.ns_separator = std::string(*s);
        } else if (key == "images") {
            auto s = v.string_or("");
            if (s == "pass") o.pass_images = true;
            else if (s == "drop") o.pass_images = false;
            else bad(key, "\"pass\" or \"drop\"");
        } else if (key == "chat_template_kwargs") {
            if (!v.is_object()) bad(key, "a table");
            for (size_t j = 0; j < v.size(); ++j) {
                auto [k, x] = v.member_at(j);
                const std::string name = std::string(key) + "." + std::string(k);
                if (k == "enable_thinking") bad(name, "nothing: the profile option thinking sets it (\"effort\", \"on\" or \"off\")");
                TemplateKwarg arg{std::string(k), {}};
                if (auto s = x.string()) arg.value = std::string(*s);
                else if (auto b = x.boolean()) arg.value = *b;
                else if (auto n = x.i64()) arg.value = *n;
                else if (auto f = x.f64()) arg.value = *f;
                else bad(name, "a string, number or boolean");
                o.template_kwargs.push_back(std::move(arg));
            }
        } else if (key == "cache_prompt") {
            auto b = v.boolean();
            if (!b) bad(key, "true or false");
            o.cache_prompt = *b;
        } else if (key == "slots") {
            auto n = v.i64();
            if (!n || *n < 0 || *n > 1024) bad(key, "an integer 0-1024");
            o.slots = *n;
        } else if (key == "resume") {
            auto s = v.string_or("");
            if (s == "tokens") o.token_resume = true;
            else if (s == "text") o.token_resume = false;
            else bad(key, "\"tokens\" or \"text\"");
        } else if (key == "budget_field") {
            auto s = v.string();
            if (!s) bad(key, "a string (\"\" when the backend has no per-request reasoning budget)");
            o.budget_field = std::string(*s);
        } else {
            static constexpr std::string_view kOptions[] = {"thinking",     "force_tool_choice", "namespace_separator",
                                                            "images",       "chat_template_kwargs", "cache_prompt",
                                                            "slots",        "budget_field",      "resume"};
            std::string allowed;
            for (const auto k : kOptions) allowed += (allowed.empty() ? "" : ", ") + std::string(k);
            throw Error(PULSE_E_INVALID_ARGUMENT, std::string(profile) + ": unknown profile option '" + std::string(key) + "'" +
                                                      did_you_mean(key, kOptions) + " (allowed: " + allowed + ")");
        }
    }
    return o;
}

// ---------------------------------------------------------------------------------------------
// Request side
// ---------------------------------------------------------------------------------------------

bool thinking_on(const Options& opt, const Json& req) {
    if (opt.thinking == Thinking::off) return false;
    if (opt.thinking == Thinking::on) return true;
    std::string_view effort = req["reasoning"]["effort"].string_or("medium");
    return !(effort == "none" || effort == "minimal");
}

std::optional<std::string> budget_note(const Options& opt, const Json& req) {
    auto budget = req["reasoning"]["budget_tokens"].i64();
    if (!budget) return std::nullopt;
    if (!thinking_on(opt, req)) return std::string("enforced: the model does not think for this request");
    if (!opt.budget_field || opt.budget_field->empty())
        return std::string("not enforced: this backend has no per-request reasoning budget (profile option budget_field is empty)");
    return "enforced by " + *opt.budget_field + (opt.budget_requires.empty() ? "" : " (" + opt.budget_requires + ")");
}

RequestInfo request_info(const Options& opt, const Json& req) {
    RequestInfo info;
    Json tools = req["tools"];
    for (size_t i = 0; i < tools.size(); ++i) {
        Json t = tools.at(i);
        std::string_view type = t["type"].string_or("");
        if (type == "function") {
            std::string name(t["name"].string_or(""));
            if (name.empty()) throw Error(PULSE_E_INVALID_ARGUMENT, "tools[" + std::to_string(i) + "]: function tool without a name");
            info.tools[name] = {name, "", false, t["parameters"].is_object() ? t["parameters"].dump() : std::string()};
        } else if (type == "custom") {
            std::string name(t["name"].string_or(""));
            if (name.empty()) throw Error(PULSE_E_INVALID_ARGUMENT, "tools[" + std::to_string(i) + "]: custom tool without a name");
            info.tools[name] = {name, "", true, std::string(kCustomParams)};
        } else if (type == "namespace") {
            std::string ns(t["name"].string_or(""));
            Json members = t["tools"];
            for (size_t j = 0; j < members.size(); ++j) {
                Json m = members.at(j);
                std::string name(m["name"].string_or(""));
                if (name.empty()) continue;
                bool custom = m["type"].string_or("function") == "custom";
                info.tools[flat_name(opt, ns, name)] = {name, ns, custom,
                                                        custom ? std::string(kCustomParams) : m["parameters"].is_object() ? m["parameters"].dump() : std::string()};
            }
        } else {
            info.dropped_tools.push_back(type.empty() ? std::string("(untyped)") : std::string(type));
        }
    }

    info.thinking = thinking_on(opt, req);
    Json choice = req["tool_choice"];
    std::string_view mode = choice.string_or("");
    if (choice.is_object()) {
        std::string_view ctype = choice["type"].string_or("");
        std::string_view name = choice["name"].string_or(choice["function"]["name"].string_or(""));
        if ((ctype == "function" || ctype == "custom") && !name.empty()) {
            info.forced.active = true;
            for (const auto& [flat, t] : info.tools)
                if (t.name == name || flat == name) info.forced.only = flat;
            if (info.forced.only.empty())
                throw Error(PULSE_E_INVALID_ARGUMENT,
                            "tool_choice names tool '" + std::string(name) + "', which is not in tools");
        }
    } else if (mode == "required") {
        if (info.tools.empty())
            throw Error(PULSE_E_INVALID_ARGUMENT, "tool_choice is \"required\" but the request offers no tool the backend can run");
        info.forced.active = true;
    } else if (!mode.empty() && mode != "auto" && mode != "none") {
        throw Error(PULSE_E_INVALID_ARGUMENT, "tool_choice must be \"auto\", \"none\", \"required\" or a named tool, found \"" +
                                                  std::string(mode) + "\"");
    }
    return info;
}

namespace {

// The Responses input (instructions, messages, reasoning, calls and their outputs) as Chat
// Completions messages, item by item: reasoning waits for the assistant message it belongs to,
// images a tool returned wait for the end of the run of tool messages, system text is gathered
// into the one leading system message.
class HistoryBuilder {
public:
    HistoryBuilder(const pulse_host_api_t* host, pulse_call_t* call, const Options& opt, const Log& log)
        : host_(host), call_(call), opt_(opt), log_(log) {}

    std::vector<Message> build(const Json& req) {
        if (auto ins = req["instructions"].string(); ins && !ins->empty()) system_ = std::string(*ins);
        Json input = req["input"];
        if (auto s = input.string()) {
            Message m;
            m.role = "user";
            m.parts.push_back(Part::of_request(*s));
            out_.push_back(std::move(m));
        }
        for (size_t i = 0; i < (input.is_array() ? input.size() : 0); ++i) add(input.at(i), i);
        flush_images();
        if (!system_.empty()) {
            Message s;
            s.role = "system";
            s.parts.push_back(Part::made(std::move(system_)));
            out_.insert(out_.begin(), std::move(s));
        }
        return std::move(out_);
    }

private:
    void add(const Json& item, size_t i) {
        std::string_view type = item["type"].string_or(item["role"].present() ? "message" : "");
        bool is_output = type == "function_call_output" || type == "custom_tool_call_output";
        if (!is_output) flush_images();
        if (type == "message") {
            add_message(item);
        } else if (type == "reasoning") {
            std::string text = text_of(item["content"]);
            if (text.empty()) text = text_of(item["summary"]);
            pending_reasoning_ += text;
        } else if (type == "function_call") {
            leading_ = false;
            std::string args(item["arguments"].string_or("{}"));
            if (args.empty()) args = "{}";
            if (!valid_json(host_, call_, args)) {
                log_(PULSE_LOG_WARN, "history function_call " + std::string(item["name"].string_or("")) +
                                         " has arguments that are not JSON; replaying them as {} (backend would reject them)",
                     call_);
                args = "{}";
            }
            assistant().calls.push_back({std::string(item["call_id"].string_or("")),
                                         flat_name(opt_, item["namespace"].string_or(""), item["name"].string_or("")), args});
        } else if (type == "custom_tool_call") {
            leading_ = false;
            assistant().calls.push_back({std::string(item["call_id"].string_or("")),
                                         flat_name(opt_, item["namespace"].string_or(""), item["name"].string_or("")),
                                         "{\"input\":" + json_quote(item["input"].string_or("")) + "}"});
        } else if (is_output) {
            add_output(item, i);
        }
        // The host has already rejected any other item type.
    }

    void add_message(const Json& item) {
        std::string_view role = item["role"].string_or("user");
        if (role == "developer" || role == "system") {
            std::string text = text_of(item["content"]);
            if (leading_) {
                if (!system_.empty() && !text.empty()) system_ += "\n\n";
                system_ += text;
            } else {
                // Qwen templates reject a system message that is not first: keep the
                // instruction, in order, as a user turn.
                Message m;
                m.role = "user";
                m.parts.push_back(Part::made("[" + std::string(role) + " message]\n" + text));
                out_.push_back(std::move(m));
            }
            return;
        }
        leading_ = false;
        if (role != "assistant") {
            Message m;
            m.role = "user";
            add_parts(opt_, item["content"], m.parts);
            out_.push_back(std::move(m));
            return;
        }
        std::string text = text_of(item["content"]);
        if (!out_.empty() && out_.back().role == "assistant") {
            // Consecutive assistant messages (Codex keeps each partial answer of a stream that
            // broke off, then asks again): llama-server refuses two at the end of the list, and
            // no chat template means them as two turns. One message: a retry that got further
            // replaces the partial text before it, a repeat is dropped, anything else is joined.
            Message& prev = out_.back();
            std::string before = prev.text();
            if (text.rfind(before, 0) == 0) before = std::move(text);
            else if (before.rfind(text, 0) != 0) before += (before.empty() ? "" : "\n\n") + text;
            prev.parts.clear();
            prev.parts.push_back(Part::made(std::move(before)));
            prev.reasoning += pending_reasoning_;
            pending_reasoning_.clear();
            return;
        }
        Message m;
        m.role = "assistant";
        m.parts.push_back(Part::made(std::move(text)));
        m.reasoning = std::move(pending_reasoning_);
        pending_reasoning_.clear();
        out_.push_back(std::move(m));
    }

    void add_output(const Json& item, size_t i) {
        leading_ = false;
        std::string call_id(item["call_id"].string_or(""));
        if (call_id.empty()) {
            // Output the client supplies without a call (Codex 0.171 sends its goal this way, as
            // agent/goal_objective): Chat Completions has tool messages only as answers to
            // calls, so the call is written before it, under the item's id.
            call_id = std::string(item["id"].string_or(""));
            if (call_id.empty()) call_id = "ctx_" + std::to_string(i);
            assistant().calls.push_back({call_id, flat_name(opt_, item["namespace"].string_or(""), item["name"].string_or("")), "{}"});
        }
        Message m;
        m.role = "tool";
        m.tool_call_id = std::move(call_id);
        m.parts.push_back(Part::made(tool_output_text(item["output"])));
        out_.push_back(std::move(m));
    }

    // A tool's output as text; the images in it wait for the end of the run of tool messages.
    std::string tool_output_text(const Json& output) {
        if (auto s = output.string()) return std::string(*s);
        std::vector<Part> parts;
        add_parts(opt_, output, parts);
        std::string text;
        for (auto& p : parts) {
            if (p.image) pending_images_.push_back(std::move(p));
            else text += p.value();
        }
        if (text.empty() && !pending_images_.empty()) text = "(image output follows)";
        return text;
    }

    void flush_images() {
        if (pending_images_.empty()) return;
        Message m;
        m.role = "user";
        m.parts.push_back(Part::made("Images returned by the tool calls above:"));
        for (auto& p : pending_images_) m.parts.push_back(std::move(p));
        pending_images_.clear();
        out_.push_back(std::move(m));
    }

    // The assistant message that tool calls attach to: the last message if it is an assistant
    // message, else a new (empty) one.
    Message& assistant() {
        if (out_.empty() || out_.back().role != "assistant") {
            Message m;
            m.role = "assistant";
            out_.push_back(std::move(m));
        }
        Message& m = out_.back();
        if (!pending_reasoning_.empty()) {
            m.reasoning += pending_reasoning_;
            pending_reasoning_.clear();
        }
        return m;
    }

    const pulse_host_api_t* host_;
    pulse_call_t* call_;
    const Options& opt_;
    const Log& log_;
    std::vector<Message> out_;
    std::string system_;
    bool leading_ = true;  // no message but system ones yet
    std::string pending_reasoning_;
    std::vector<Part> pending_images_;  // from tool outputs; sent after the run of tool messages
};

std::vector<Message> build_messages(const pulse_host_api_t* host, pulse_call_t* call, const Options& opt, const Json& req,
                                    const Log& log) {
    return HistoryBuilder(host, call, opt, log).build(req);
}

}  // namespace

void write_sampling(const Options& opt, const Json& req, const Json& model, const Partial* resume, Writer& w) {
    // sampling: the model's configured defaults, then what the request says
    Json sampling = model["sampling"];
    for (std::string_view k : {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "repetition_penalty"}) {
        Json v = req[k].is_number() ? req[k] : sampling[k];
        if (v.is_number()) w.key(k).copy(v);
    }
    Json max_tokens = req["max_output_tokens"].is_number() ? req["max_output_tokens"] : sampling["max_output_tokens"];
    // A continuation asks for what is left of the limit: the client's budget covers every
    // attempt together (the host ends the response itself when nothing is left).
    if (max_tokens.is_number() && resume) w.key("max_tokens").i64(std::max<int64_t>(1, max_tokens.i64().value_or(0) - resume->output_tokens));
    else if (max_tokens.is_number()) w.key("max_tokens").copy(max_tokens);

    if (opt.cache_prompt) w.key("cache_prompt").boolean(true);
    // Prefill progress chunks: the gateway tells a long prefill from a stalled one by them
    // (upstream.stall_after_s) and shows them on its status page.
    if (opt.server == Options::Server::llama_server) w.key("return_progress").boolean(true);
    if (opt.slots > 0) {
        if (auto key = req["prompt_cache_key"].string(); key && !key->empty()) {
            uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across restarts
            for (unsigned char c : *key) h = (h ^ c) * 1099511628211ull;
            w.key("id_slot").i64(static_cast<int64_t>(h % static_cast<uint64_t>(opt.slots)));
        }
    }
}

namespace {

// A resumed attempt: the partial answer is the message to continue. A history that already
// ends with an assistant message (one without calls: a partial answer Codex kept) gets it
// joined, as two assistant messages at the end are refused (llama-server) or read as two turns.
void continue_partial(std::vector<Message>& messages, const Partial& resume) {
    if (messages.empty() || messages.back().role != "assistant" || !messages.back().calls.empty()) {
        Message m;
        m.role = "assistant";
        messages.push_back(std::move(m));
    }
    Message& last = messages.back();
    std::string text = last.text() + resume.text;
    last.parts.clear();
    last.parts.push_back(Part::made(std::move(text)));
    last.reasoning += resume.reasoning;
}

void write_messages(Writer& w, const Options& opt, const std::vector<Message>& messages) {
    w.key("messages").begin_array();
    for (const auto& m : messages) {
        w.begin_object().kv("role", m.role);
        w.key("content");
        write_content(w, m);
        if (!m.reasoning.empty()) w.kv(opt.history_reasoning_field, m.reasoning);
        if (!m.tool_call_id.empty()) w.kv("tool_call_id", m.tool_call_id);
        if (!m.calls.empty()) {
            w.key("tool_calls").begin_array();
            for (const auto& c : m.calls)
                w.begin_object()
                    .kv("id", c.id)
                    .kv("type", "function")
                    .key("function")
                    .begin_object()
                    .kv("name", c.name)
                    .kv("arguments", c.arguments)
                    .end_object()
                    .end_object();
            w.end_array();
        }
        w.end_object();
    }
    w.end_array();
}

// The request's tools as Chat Completions functions: custom tools take one string, namespaces
// are flattened.
void write_tools(Writer& w, const Options& opt, const Json& tools) {
    w.key("tools").begin_array();
    for (size_t i = 0; i < tools.size(); ++i) {
        Json t = tools.at(i);
        std::string_view type = t["type"].string_or("");
        if (type == "function") {
            Json params = t["parameters"];
            write_function_tool(w, t["name"].string_or(""), t["description"].string_or(""), &params, {});
        } else if (type == "custom") {
            write_function_tool(w, t["name"].string_or(""), custom_description(t), nullptr, kCustomParams);
        } else if (type == "namespace") {
            std::string_view ns = t["name"].string_or("");
            Json members = t["tools"];
            for (size_t j = 0; j < members.size(); ++j) {
                Json m = members.at(j);
                if (m["name"].string_or("").empty()) continue;
                Json params = m["parameters"];
                std::string flat = flat_name(opt, ns, m["name"].string_or(""));
                if (m["type"].string_or("function") == "custom")
                    write_function_tool(w, flat, custom_description(m), nullptr, kCustomParams);
                else
                    write_function_tool(w, flat, m["description"].string_or(""), &params, {});
            }
        }
    }
    w.end_array();
}

// tool_choice "required" or named, enforced by a schema: vLLM accepts those choices without
// always applying them, so the output is constrained to {"name": <tool>, "arguments": <its
// schema>} and parsed back into a tool call (ChunkTranslator::finish).
void write_forced_call_schema(Writer& w, const Options& opt, const Json& tools, const RequestInfo& info) {
    w.kv("tool_choice", "none");
    w.key("response_format").begin_object().kv("type", "json_schema").key("json_schema").begin_object();
    w.kv("name", "tool_call").key("strict").boolean(true).key("schema").begin_object().key("anyOf").begin_array();
    auto option = [&](std::string_view flat, const Json* params, bool custom) {
        w.begin_object().kv("type", "object").key("properties").begin_object();
        w.key("name").begin_object().kv("const", flat).end_object();
        w.key("arguments");
        if (custom) w.raw(kCustomParams);
        else if (params && params->is_object()) w.copy(*params);
        else w.raw(R"({"type":"object"})");
        w.end_object().key("required").begin_array().string("name").string("arguments").end_array();
        w.key("additionalProperties").boolean(false).end_object();
    };
    for (size_t i = 0; i < tools.size(); ++i) {
        Json t = tools.at(i);
        std::string_view type = t["type"].string_or("");
        if (type == "function" || type == "custom") {
            std::string flat(t["name"].string_or(""));
            if (!info.forced.only.empty() && flat != info.forced.only) continue;
            Json params = t["parameters"];
            option(flat, &params, type == "custom");
        } else if (type == "namespace") {
            Json members = t["tools"];
            for (size_t j = 0; j < members.size(); ++j) {
                Json m = members.at(j);
                std::string flat = flat_name(opt, t["name"].string_or(""), m["name"].string_or(""));
                if (!info.forced.only.empty() && flat != info.forced.only) continue;
                Json params = m["parameters"];
                option(flat, &params, m["type"].string_or("function") == "custom");
            }
        }
    }
    w.end_array().end_object().end_object().end_object();
}

}  // namespace

void write_request(const pulse_host_api_t* host, pulse_call_t* call, const Options& opt, const Json& req,
                   const Json& model, const RequestInfo& info, Writer& w, const Log& log, const Partial* resume, bool render_only) {
    w.begin_object();
    w.kv("model", model["upstream_model"].string_or(model["id"].string_or("")));

    std::vector<Message> messages = build_messages(host, call, opt, req, log);
    if (resume) continue_partial(messages, *resume);
    write_messages(w, opt, messages);

    // tools
    bool forced_schema = info.forced.active && opt.force == ForceMode::schema;
    if (!info.tools.empty()) {
        Json tools = req["tools"];
        write_tools(w, opt, tools);
        if (forced_schema) {
            write_forced_call_schema(w, opt, tools, info);
        } else if (info.forced.active) {
            if (info.forced.only.empty()) w.kv("tool_choice", "required");
            else
                w.key("tool_choice").begin_object().kv("type", "function").key("function").begin_object().kv("name", info.forced.only).end_object().end_object();
        } else {
            std::string_view mode = req["tool_choice"].string_or("auto");
            w.kv("tool_choice", mode == "none" ? "none" : "auto");
        }
        if (auto p = req["parallel_tool_calls"].boolean()) w.key("parallel_tool_calls").boolean(*p);
    }

    // thinking switch, from the reasoning effort unless the profile pins it
    const bool thinking = thinking_on(opt, req);
    if (render_only) {  // what the chat template needs, nothing else (vLLM's /tokenize)
        write_template_kwargs(w, opt, thinking);
        w.key("add_generation_prompt").boolean(true);
        w.end_object();
        if (!w.ok()) throw Error(PULSE_E_INTERNAL, "writing the upstream request failed");
        return;
    }

    // Codex --output-schema: a JSON-schema constrained final answer.
    Json format = req["text"]["format"];
    if (!forced_schema && format["type"].string_or("") == "json_schema") {
        w.key("response_format").begin_object().kv("type", "json_schema").key("json_schema").begin_object();
        w.kv("name", format["name"].string_or("output"));
        if (auto s = format["strict"].boolean()) w.key("strict").boolean(*s);
        w.key("schema").copy(format["schema"]);
        w.end_object().end_object();
    }

    write_sampling(opt, req, model, resume, w);

    if (auto budget = req["reasoning"]["budget_tokens"].i64(); budget && thinking && opt.budget_field && !opt.budget_field->empty())
        w.key(*opt.budget_field).i64(resume ? std::max<int64_t>(0, *budget - resume->reasoning_tokens) : *budget);
    write_template_kwargs(w, opt, thinking);

    if (opt.token_timings) w.key("timings_per_token").boolean(true);
    if (resume) w.key("continue_final_message").boolean(true).key("add_generation_prompt").boolean(false);
    w.key("stream").boolean(true);
    w.key("stream_options").begin_object().key("include_usage").boolean(true).end_object();
    w.end_object();
    if (!w.ok()) throw Error(PULSE_E_INTERNAL, "writing the upstream request failed");
}

// ---------------------------------------------------------------------------------------------
// Response side
// ---------------------------------------------------------------------------------------------

pulse_status_t ChunkTranslator::feed(pulse_call_t* call, std::string_view data, pulse_delta_sink_t* sink) {
    const pulse_delta_api_t* d = host_->delta;
    Json chunk(host_->json, host_->json->parse(call, str(data)));
    if (!chunk.present())
        return host_->set_error(call, PULSE_E_UNAVAILABLE, str("upstream sent a chunk that is not JSON: " + excerpt(data)));
    if (Json err = chunk["error"]; err.present() && !err.is_null()) {
        // vLLM's engine failing mid-request ({"error": ...} then [DONE]): the endpoint failed
        // here (UNAVAILABLE from feed: the host moves on, or resumes). A context overflow is
        // the request's own error, whichever endpoint serves it.
        std::string msg(err["message"].string_or(err.string_or("upstream error")));
        if (is_context_error(msg)) return d->error(sink, PULSE_E_CONTEXT_LENGTH, str(msg));
        return host_->set_error(call, PULSE_E_UNAVAILABLE, str("the backend reported an error: " + msg));
    }
    if (raw_ || chunk["object"].string_or("") == "text_completion") return feed_raw(call, chunk, sink);
    Json timings = chunk["timings"];
    Json choices = chunk["choices"];
    if (auto n = timings["predicted_n"].i64()) {
        generated_ = *n;
        // Counts that come with the deltas (not only with the final usage) are per token.
        if (choices.size() > 0) per_token_ = true;
    }
    if (choices.size() > 0)
        if (pulse_status_t s = feed_choice(choices.at(0), sink); s != PULSE_OK) return s;
    return feed_usage(chunk, sink);
}

// One choice's delta: reasoning, text and call fragments to the sink; its finish reason kept.
pulse_status_t ChunkTranslator::feed_choice(const Json& choice, pulse_delta_sink_t* sink) {
    const pulse_delta_api_t* d = host_->delta;
    Json delta = choice["delta"];
    // The first chunk of the answer proper (text or a call) ends the thinking: every token
    // before its own (one a chunk, as llama-server streams) was thinking, the block's end
    // and whatever produced no delta included.
    if (!thought_ && per_token_ && (delta["content"].string_or("").size() > 0 || delta["tool_calls"].size() > 0))
        thought_ = info_.thinking ? std::max<int64_t>(0, generated_ - 1) : 0;
    // vLLM >= 0.12 says "reasoning"; older vLLM and llama-server say "reasoning_content".
    for (std::string_view field : {"reasoning", "reasoning_content"}) {
        if (auto r = delta[field].string(); r && !r->empty()) {
            std::string fresh = echo_reasoning_.take(*r);
            if (!fresh.empty())
                if (pulse_status_t s = d->reasoning(sink, str(fresh)); s != PULSE_OK) return s;
            break;
        }
    }
    if (auto c = delta["content"].string(); c && !c->empty()) {
        std::string fresh = echo_text_.take(*c);
        if (fresh.empty()) {
        } else if (info_.forced.active) {
            forced_content_ += fresh;
        } else if (pulse_status_t s = d->text(sink, str(fresh)); s != PULSE_OK) {
            return s;
        }
    }
    Json tcs = delta["tool_calls"];
    for (size_t i = 0; i < tcs.size(); ++i) {
        Json tc = tcs.at(i);
        uint32_t index = static_cast<uint32_t>(tc["index"].i64().value_or(static_cast<int64_t>(i)));
        PendingCall& p = calls_[index];
        if (auto id = tc["id"].string(); id && !id->empty()) p.id = std::string(*id);
        if (auto n = tc["function"]["name"].string(); n && !n->empty()) p.name += std::string(*n);
        if (auto a = tc["function"]["arguments"].string()) p.args += *a;
    }
    if (auto f = choice["finish_reason"].string()) finish_ = finish_from(*f);
    return PULSE_OK;
}

// With per-token counts, the thinking took every token so far until the answer proper began
// (or none, when the model does not think for this request); -1: not known.
int64_t ChunkTranslator::thought_tokens(int64_t output) const {
    if (!per_token_) return -1;
    if (!info_.thinking) return 0;
    return thought_ ? *thought_ : output;
}

// The usage a chunk reports, or (llama-server without usage) rebuilds from its timings.
pulse_status_t ChunkTranslator::feed_usage(const Json& chunk, pulse_delta_sink_t* sink) {
    const pulse_delta_api_t* d = host_->delta;
    Json u = chunk["usage"];
    if (Json t = chunk["timings"]; !u.is_object() && t.is_object() && t["prompt_n"].is_number()) {
        // llama-server without usage: rebuild it from timings (prompt_n excludes the cached part).
        // With timings_per_token that is every chunk: the count is exact at any point, so an
        // answer cut off mid-stream has its tokens counted, not guessed from its deltas.
        pulse_usage_t usage{sizeof(pulse_usage_t), -1, -1, -1, -1};
        int64_t cache_n = t["cache_n"].i64().value_or(0);
        usage.input_tokens = t["prompt_n"].i64().value_or(0) + cache_n;
        usage.cached_tokens = cache_n;
        usage.output_tokens = t["predicted_n"].i64().value_or(-1);
        usage.reasoning_tokens = thought_tokens(usage.output_tokens);
        if (pulse_status_t s = d->usage(sink, &usage); s != PULSE_OK) return s;
    }
    if (u.is_object()) {
        pulse_usage_t usage{sizeof(pulse_usage_t), -1, -1, -1, -1};
        usage.input_tokens = u["prompt_tokens"].i64().value_or(-1);
        usage.output_tokens = u["completion_tokens"].i64().value_or(-1);
        usage.cached_tokens = u["prompt_tokens_details"]["cached_tokens"].i64().value_or(-1);
        usage.reasoning_tokens = u["completion_tokens_details"]["reasoning_tokens"].i64().value_or(thought_tokens(usage.output_tokens));
        // llama-server: cached prompt tokens are in timings when usage lacks them.
        if (usage.cached_tokens < 0) usage.cached_tokens = chunk["timings"]["cache_n"].i64().value_or(-1);
        if (pulse_status_t s = d->usage(sink, &usage); s != PULSE_OK) return s;
    }
    return PULSE_OK;
}

void ChunkTranslator::expect_echo(const Partial& p) {
    echo_text_ = Echo{p.text, "", p.text.empty()};
    echo_reasoning_ = Echo{p.reasoning, "", p.reasoning.empty()};
}

std::string ChunkTranslator::Echo::take(std::string_view d) {
    if (done) return std::string(d);
    if (d.size() >= left.size() && d.substr(0, left.size()) == left) {  // the repeat ends here
        done = true;
        return std::string(d.substr(left.size()));
    }
    if (left.compare(0, d.size(), d) == 0) {  // still inside it
        held += d;
        left.erase(0, d.size());
        return {};
    }
    done = true;  // not a repeat: what was held back is output after all
    return std::move(held) + std::string(d);
}

pulse_status_t ChunkTranslator::emit_call(pulse_call_t* call, pulse_delta_sink_t* sink, uint32_t index,
                                          const std::string& backend_name, const std::string& args) {
    const pulse_delta_api_t* d = host_->delta;
    ToolInfo tool{backend_name, "", false, ""};
    if (auto it = info_.tools.find(backend_name); it != info_.tools.end()) tool = it->second;
    std::string body = args.empty() ? "{}" : args;
    Json parsed(host_->json, host_->json->parse(call, str(body)));
    // Cut off by the token limit: the call never finished, so it is not sent, and the response
    // ends incomplete (max_output_tokens), as text that is cut off does.
    if (!parsed.present() && finish_ == PULSE_FINISH_LENGTH) return PULSE_OK;
    if (!parsed.present())
        return d->error(sink, PULSE_E_UNAVAILABLE,
                        str("the model produced arguments for tool '" + tool.name + "' that are not valid JSON: " + excerpt(body)));
    pulse_status_t s;
    if (tool.custom) {
        // The backend saw a function taking {"input": string}; Codex wants the raw text.
        std::string input;
        if (auto v = parsed["input"].string()) input = std::string(*v);
        else if (auto v2 = parsed.string()) input = std::string(*v2);
        else if (parsed.is_object() && parsed.size() == 1 && parsed.member_at(0).second.string())
            input = std::string(*parsed.member_at(0).second.string());
        else
            return d->error(sink, PULSE_E_UNAVAILABLE,
                            str("the model called '" + tool.name + "' without an `input` string: " + excerpt(body)));
        if (tool.name == "apply_patch") input = repair_patch(input);
        if ((s = d->tool_begin(sink, index, PULSE_TOOL_CUSTOM, str(""), str(tool.name), str(tool.ns))) != PULSE_OK) return s;
        if ((s = d->tool_args(sink, index, str(input))) != PULSE_OK) return s;
    } else {
        if (!parsed.is_object())
            return d->error(sink, PULSE_E_UNAVAILABLE,
                            str("the model produced arguments for tool '" + tool.name + "' that are not a JSON object: " + excerpt(body)));
        if ((s = d->tool_begin(sink, index, PULSE_TOOL_FUNCTION, str(""), str(tool.name), str(tool.ns))) != PULSE_OK) return s;
        if ((s = d->tool_args(sink, index, str(body))) != PULSE_OK) return s;
    }
    ++emitted_calls_;
    return d->tool_end(sink, index);
}

pulse_status_t ChunkTranslator::flush_calls(pulse_call_t* call, pulse_delta_sink_t* sink) {
    for (const auto& [index, p] : calls_) {
        if (p.name.empty())
            return host_->delta->error(sink, PULSE_E_UNAVAILABLE, str("the upstream streamed a tool call without a name"));
        if (pulse_status_t s = emit_call(call, sink, index, p.name, p.args); s != PULSE_OK) return s;
    }
    calls_.clear();
    return PULSE_OK;
}

pulse_status_t ChunkTranslator::finish(pulse_call_t* call, pulse_stream_end_t how, pulse_delta_sink_t* sink) {
    // A truncated or cancelled stream: tool calls may be incomplete, so none is emitted.
    if (how != PULSE_STREAM_CLEAN) return PULSE_OK;
    const pulse_delta_api_t* d = host_->delta;
    pulse_status_t s;
    if (raw_ && (s = finish_raw(call, sink)) != PULSE_OK) return s;
    if (!forced_content_.empty()) {
        Json v(host_->json, host_->json->parse(call, str(forced_content_)));
        std::string name(v["name"].string_or(""));
        Json args = v["arguments"];
        if ((name.empty() || !args.is_object()) && finish_ != PULSE_FINISH_LENGTH)
            return d->error(sink, PULSE_E_UNAVAILABLE,
                            str("tool_choice forced a tool call, but the model's output is not one: " + excerpt(forced_content_)));
        if (!name.empty() && args.is_object()) {
            std::string args_text = args.dump();
            if (args_text.empty()) args_text = "{}";
            if ((s = emit_call(call, sink, 0, name, args_text)) != PULSE_OK) return s;
        }
    }
    if ((s = flush_calls(call, sink)) != PULSE_OK) return s;
    if (info_.forced.active && emitted_calls_ == 0 && finish_ != PULSE_FINISH_LENGTH)
        return d->error(sink, PULSE_E_UNAVAILABLE,
                        str("tool_choice required a tool call, but the model answered without one"));
    pulse_finish_t f = finish_.value_or(PULSE_FINISH_STOP);
    if (emitted_calls_ > 0 && f == PULSE_FINISH_STOP) f = PULSE_FINISH_TOOL_CALLS;
    return d->finish(sink, f);
}

pulse_status_t map_http_error(const pulse_host_api_t* host, pulse_call_t* call, int32_t status, std::string_view body) {
    Json v(host->json, host->json->parse(call, str(body)));
    std::string msg(v["error"]["message"].string_or(v["message"].string_or(v["error"].string_or(""))));
    if (msg.empty()) msg = excerpt(body);
    std::string_view type = v["error"]["type"].string_or("");
    std::string prefix = "backend answered HTTP " + std::to_string(status) + ": ";
    if (is_context_error(msg) || type == "exceed_context_size_error")
        return host->set_error(call, PULSE_E_CONTEXT_LENGTH, str("the conversation is too long for the model: " + msg));
    if (status == 429) return host->set_error(call, PULSE_E_RESOURCE_EXHAUSTED, str(prefix + msg));
    if (msg.find("Failed to parse tool call arguments as JSON") != std::string::npos)
        return host->set_error(call, PULSE_E_INVALID_ARGUMENT,
                               str("the backend could not parse tool-call arguments (a call cut off at max tokens, or "
                                   "invalid arguments in the history): " + msg));
    if (status == 400 || status == 422)
        return host->set_error(call, PULSE_E_INVALID_ARGUMENT, str("the backend rejected the request: " + msg));
    // llama-server without a vision projector answers an image with a 500 (and would answer
    // every retry the same way): the request's failure, not the endpoint's.
    if (msg.find("image input is not supported") != std::string::npos || msg.find("audio input is not supported") != std::string::npos)
        return host->set_error(call, PULSE_E_UNSUPPORTED,
                               str("the model behind this endpoint takes no images (llama-server without --mmproj): " + msg));
    return host->set_error(call, PULSE_E_UNAVAILABLE, str(prefix + msg));
}

std::string repair_patch(std::string_view input) {
    auto trim = [](std::string_view s) {
        while (!s.empty() && (s.front() == '\n' || s.front() == '\r' || s.front() == ' ')) s.remove_prefix(1);
        while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.remove_suffix(1);
        return s;
    };
    std::string_view body = trim(input);
    std::string out;
    if (body.rfind("*** Begin Patch", 0) != 0) out += "*** Begin Patch\n";
    out += body;
    if (body.size() < 13 || body.substr(body.size() - 13) != "*** End Patch") out += "\n*** End Patch";
    out += "\n";
    return out;
}

}  // namespace pulse::chat
