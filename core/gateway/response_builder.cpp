#include "gateway/response_builder.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <chrono>
#include <random>

namespace pulse::gateway {

namespace {
constexpr const char* kNoRecord = "an attempt reported no token record";
}  // namespace

// A small wrapper so event bodies read as what they are.
class JsonOut {
public:
    JsonOut() : w_(b_) {}
    JsonOut& key(std::string_view k) {
        w_.Key(k.data(), static_cast<rapidjson::SizeType>(k.size()));
        return *this;
    }
    JsonOut& str(std::string_view s) {
        w_.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
        return *this;
    }
    JsonOut& kv(std::string_view k, std::string_view v) { return key(k).str(v); }
    JsonOut& kv(std::string_view k, int64_t v) {
        key(k);
        w_.Int64(v);
        return *this;
    }
    JsonOut& kv(std::string_view k, uint64_t v) {
        key(k);
        w_.Uint64(v);
        return *this;
    }
    JsonOut& kv(std::string_view k, uint32_t v) { return kv(k, static_cast<uint64_t>(v)); }
    JsonOut& null() {
        w_.Null();
        return *this;
    }
    JsonOut& raw(std::string_view json) {
        w_.RawValue(json.data(), json.size(), rapidjson::kObjectType);
        return *this;
    }
    JsonOut& begin() {
        w_.StartObject();
        return *this;
    }
    JsonOut& end() {
        w_.EndObject();
        return *this;
    }
    JsonOut& begin_array() {
        w_.StartArray();
        return *this;
    }
    JsonOut& end_array() {
        w_.EndArray();
        return *this;
    }
    std::string text() const { return {b_.GetString(), b_.GetSize()}; }
    std::string_view view() const { return {b_.GetString(), b_.GetSize()}; }
    void clear() {
        b_.Clear();
        w_.Reset(b_);
    }

private:
    rapidjson::StringBuffer b_;
    rapidjson::Writer<rapidjson::StringBuffer> w_;
};

namespace {
std::string random_hex(size_t n) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char* hex = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; ++i) s += hex[rng() & 15];
    return s;
}
}  // namespace

ResponseBuilder::ResponseBuilder(std::string response_id, std::string model, ReasoningOutput reasoning, Emit emit)
    : id_(std::move(response_id)), model_(std::move(model)), reasoning_mode_(reasoning), emit_(std::move(emit)), out_(std::make_unique<JsonOut>()) {
    created_at_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ResponseBuilder::~ResponseBuilder() = default;

void ResponseBuilder::event(std::string_view type, const std::function<void(JsonOut&)>& body) {
    JsonOut& o = *out_;  // bodies build nested JSON in JsonOuts of their own, never in this one
    o.clear();
    o.begin().kv("type", type);
    body(o);
    o.kv("sequence_number", seq_++).end();
    if (emit_) emit_(type, o.view());
}

std::string ResponseBuilder::response_json(std::string_view status, bool terminal) const {
    JsonOut o;
    o.begin().kv("id", id_).kv("object", "response").kv("created_at", created_at_).kv("status", status).kv("model", model_);
    o.key("output").begin_array();
    for (const auto& it : items_)
        if (!it.open) o.raw(item_json(it, true));
    o.end_array();
    o.key("error");
    if (failure_) {
        o.begin()
            .kv("code", failure_->first == PULSE_E_CONTEXT_LENGTH ? "context_length_exceeded" : "server_error")
            .kv("message", failure_->second)
            .end();
    } else {
        o.null();
    }
    o.key("incomplete_details");
    if (incomplete_reason_) o.begin().kv("reason", *incomplete_reason_).end();
    else o.null();
    if (terminal) {
        // Always present, always integers: Codex's auto-compaction is driven by these numbers.
        const Usage u = usage_totals();
        o.key("usage").begin();
        o.kv("input_tokens", u.input);
        o.key("input_tokens_details").begin().kv("cached_tokens", u.cached).end();
        o.kv("output_tokens", u.output);
        o.key("output_tokens_details").begin().kv("reasoning_tokens", u.reasoning).end();
        o.kv("total_tokens", u.input + u.output);
        o.end();
    }
    o.end();
    return o.text();
}

std::string ResponseBuilder::item_json(const Item& it, bool done) const {
    JsonOut o;
    o.begin().kv("id", it.id);
    const char* status = !done ? "in_progress" : it.incomplete ? "incomplete" : "completed";
    switch (it.type) {
        case Item::message:
            o.kv("type", "message").kv("status", status).kv("role", "assistant").key("content").begin_array();
            if (done) {
                o.begin().kv("type", "output_text").kv("text", it.text).key("annotations").begin_array().end_array().end();
            }
            o.end_array();
            break;
        case Item::reasoning:
            o.kv("type", "reasoning").key("summary").begin_array();
            if (done && it.summary_started) o.begin().kv("type", "summary_text").kv("text", it.summary).end();
            o.end_array().key("content").begin_array();
            if (done && it.raw_started) o.begin().kv("type", "reasoning_text").kv("text", it.raw).end();
            o.end_array().key("encrypted_content").null();
            break;
        case Item::function_call:
            o.kv("type", "function_call").kv("status", status).kv("name", it.name);
            if (!it.ns.empty()) o.kv("namespace", it.ns);
            o.kv("call_id", it.call_id).kv("arguments", done ? it.args : std::string());
            break;
        case Item::custom_tool_call:
            o.kv("type", "custom_tool_call").kv("status", status).kv("name", it.name);
            if (!it.ns.empty()) o.kv("namespace", it.ns);
            o.kv("call_id", it.call_id).kv("input", done ? it.args : std::string());
            break;
    }
    o.end();
    return o.text();
}

void ResponseBuilder::start() {
    if (started_) return;
    started_ = true;
    event("response.created", [&](JsonOut& o) { o.key("response").raw(response_json("in_progress", false)); });
    event("response.in_progress", [&](JsonOut& o) { o.key("response").raw(response_json("in_progress", false)); });
}

void ResponseBuilder::keepalive() {
    if (!started_) start();
    else event("response.in_progress", [&](JsonOut& o) { o.key("response").raw(response_json("in_progress", false)); });
}

ResponseBuilder::Item& ResponseBuilder::open_item(Item::Type type, const std::function<void(Item&)>& fill) {
    start();
    close_current();
    has_output_ = true;
    Item it;
    it.type = type;
    if (fill) fill(it);  // before `added`: strict clients require a tool call's call_id and name there
    static const char* prefixes[] = {"msg_", "rs_", "fc_", "ctc_"};
    it.id = std::string(prefixes[type]) + id_.substr(5) + "_" + std::to_string(items_.size());
    items_.push_back(std::move(it));
    current_ = items_.size() - 1;
    size_t index = *current_;
    Item& item = items_[index];
    event("response.output_item.added", [&](JsonOut& o) {
        o.kv("output_index", static_cast<uint64_t>(index)).key("item").raw(item_json(item, false));
    });
    if (type == Item::message) {
        event("response.content_part.added", [&](JsonOut& o) {
            o.kv("item_id", item.id).kv("output_index", static_cast<uint64_t>(index)).kv("content_index", uint64_t(0));
            o.key("part").begin().kv("type", "output_text").kv("text", "").key("annotations").begin_array().end_array().end();
        });
    }
    return item;
}

void ResponseBuilder::close_current() {
    if (current_) close_item(*current_);
    current_.reset();
}

void ResponseBuilder::close_item(size_t index) {
    Item& it = items_[index];
    if (!it.open) return;
    uint64_t oi = index;
    switch (it.type) {
        case Item::message:
            event("response.output_text.done", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0)).kv("text", it.text);
                o.key("logprobs").begin_array().end_array();
            });
            event("response.content_part.done", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0));
                o.key("part").begin().kv("type", "output_text").kv("text", it.text).key("annotations").begin_array().end_array().end();
            });
            break;
        case Item::reasoning:
            if (it.summary_started) {
                event("response.reasoning_summary_text.done", [&](JsonOut& o) {
                    o.kv("item_id", it.id).kv("output_index", oi).kv("summary_index", uint64_t(0)).kv("text", it.summary);
                });
                event("response.reasoning_summary_part.done", [&](JsonOut& o) {
                    o.kv("item_id", it.id).kv("output_index", oi).kv("summary_index", uint64_t(0));
                    o.key("part").begin().kv("type", "summary_text").kv("text", it.summary).end();
                });
            }
            if (it.raw_started) {
                event("response.reasoning_text.done", [&](JsonOut& o) {
                    o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0)).kv("text", it.raw);
                });
                event("response.content_part.done", [&](JsonOut& o) {
                    o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0));
                    o.key("part").begin().kv("type", "reasoning_text").kv("text", it.raw).end();
                });
            }
            break;
        case Item::function_call:
            event("response.function_call_arguments.done", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("name", it.name).kv("arguments", it.args);
            });
            break;
        case Item::custom_tool_call:
            event("response.custom_tool_call_input.done", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("input", it.args);
            });
            break;
    }
    it.open = false;
    event("response.output_item.done", [&](JsonOut& o) { o.kv("output_index", oi).key("item").raw(item_json(it, true)); });
}

pulse_status_t ResponseBuilder::text(std::string_view t) {
    if (ended_) return PULSE_E_INVALID_ARGUMENT;
    if (t.empty()) return PULSE_OK;
    if (!current_ || items_[*current_].type != Item::message) open_item(Item::message);
    ++attempt_deltas_;
    Item& it = items_[*current_];
    it.text += t;
    event("response.output_text.delta", [&](JsonOut& o) {
        o.kv("item_id", it.id).kv("output_index", static_cast<uint64_t>(*current_)).kv("content_index", uint64_t(0)).kv("delta", t);
        o.key("logprobs").begin_array().end_array();
    });
    return PULSE_OK;
}

pulse_status_t ResponseBuilder::reasoning(std::string_view t) {
    if (ended_) return PULSE_E_INVALID_ARGUMENT;
    if (t.empty()) return PULSE_OK;
    if (!current_ || items_[*current_].type != Item::reasoning) open_item(Item::reasoning);
    ++reasoning_deltas_;
    ++attempt_deltas_;
    Item& it = items_[*current_];
    uint64_t oi = *current_;
    if (reasoning_mode_ != ReasoningOutput::raw) {
        if (!it.summary_started) {
            it.summary_started = true;
            event("response.reasoning_summary_part.added", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("summary_index", uint64_t(0));
                o.key("part").begin().kv("type", "summary_text").kv("text", "").end();
            });
        }
        it.summary += t;
        event("response.reasoning_summary_text.delta", [&](JsonOut& o) {
            o.kv("item_id", it.id).kv("output_index", oi).kv("summary_index", uint64_t(0)).kv("delta", t);
        });
    }
    if (reasoning_mode_ != ReasoningOutput::summary) {
        if (!it.raw_started) {
            it.raw_started = true;
            event("response.content_part.added", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0));
                o.key("part").begin().kv("type", "reasoning_text").kv("text", "").end();
            });
        }
        it.raw += t;
        event("response.reasoning_text.delta", [&](JsonOut& o) {
            o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0)).kv("delta", t);
        });
    }
    return PULSE_OK;
}

std::string ResponseBuilder::new_call_id() { return "call_" + random_hex(24); }

pulse_status_t ResponseBuilder::tool_begin(uint32_t index, pulse_tool_kind_t kind, std::string_view call_id,
                                           std::string_view name, std::string_view ns) {
    if (ended_ || name.empty() || (kind != PULSE_TOOL_FUNCTION && kind != PULSE_TOOL_CUSTOM)) return PULSE_E_INVALID_ARGUMENT;
    for (const auto& it : items_)
        if (it.open && (it.type == Item::function_call || it.type == Item::custom_tool_call) && it.tool_index == index)
            return PULSE_E_INVALID_ARGUMENT;  // index already open
    // The backend's id unless it is empty or was used before in this response: ours then.
    std::string id(call_id);
    bool clash = id.empty();
    for (const auto& other : items_)
        if (other.call_id == id) clash = true;
    if (clash) id = new_call_id();
    open_item(kind == PULSE_TOOL_CUSTOM ? Item::custom_tool_call : Item::function_call, [&](Item& it) {
        it.tool_index = index;
        it.name = name;
        it.ns = ns;
        it.call_id = id;
    });
    return PULSE_OK;
}

pulse_status_t ResponseBuilder::tool_args(uint32_t index, std::string_view fragment) {
    if (ended_ || !current_) return PULSE_E_INVALID_ARGUMENT;
    Item& it = items_[*current_];
    if (!it.open || (it.type != Item::function_call && it.type != Item::custom_tool_call) || it.tool_index != index)
        return PULSE_E_INVALID_ARGUMENT;  // deltas must follow their own begin, in order
    it.args += fragment;
    ++attempt_deltas_;
    uint64_t oi = *current_;
    if (it.type == Item::function_call)
        event("response.function_call_arguments.delta",
              [&](JsonOut& o) { o.kv("item_id", it.id).kv("output_index", oi).kv("delta", fragment); });
    else
        event("response.custom_tool_call_input.delta",
              [&](JsonOut& o) { o.kv("item_id", it.id).kv("output_index", oi).kv("delta", fragment); });
    return PULSE_OK;
}

pulse_status_t ResponseBuilder::tool_end(uint32_t index) {
    if (ended_ || !current_) return PULSE_E_INVALID_ARGUMENT;
    Item& it = items_[*current_];
    if ((it.type != Item::function_call && it.type != Item::custom_tool_call) || it.tool_index != index)
        return PULSE_E_INVALID_ARGUMENT;
    if (it.type == Item::function_call && it.args.empty()) it.args = "{}";
    close_current();
    return PULSE_OK;
}

pulse_status_t ResponseBuilder::finish(pulse_finish_t reason) {
    finish_ = reason;
    return PULSE_OK;
}

pulse_status_t ResponseBuilder::usage(const pulse_usage_t& u) {
    auto nz = [](int64_t v) { return v < 0 ? int64_t(0) : v; };
    usage_.input = nz(u.input_tokens);
    usage_.cached = std::min(nz(u.cached_tokens), usage_.input);
    usage_.output = nz(u.output_tokens);
    // A backend that does not count reasoning tokens (llama-server) streams one token per
    // delta: the deltas are the count.
    usage_.reasoning = std::min(u.reasoning_tokens >= 0 ? u.reasoning_tokens : reasoning_deltas_, usage_.output);
    usage_.reported = true;
    return PULSE_OK;
}

bool ResponseBuilder::can_resume() const {
    if (ended_) return false;
    for (const auto& it : items_)
        if (it.type != Item::message && it.type != Item::reasoning) return false;
    return true;
}

std::optional<ResponseBuilder::Partial> ResponseBuilder::resume_point() const {
    if (!can_resume()) return std::nullopt;
    Partial p;
    for (const auto& it : items_) {
        if (it.type == Item::message) p.text += it.text;
        else p.reasoning += it.raw_started ? it.raw : it.summary;
    }
    if (!trail_lost_.empty()) p.no_trail = trail_lost_;
    else if (attempt_left_hole()) p.no_trail = kNoRecord;
    else if (!trail_ids_.empty()) p.trail.emplace(trail_ids_, trail_raw_);
    return p;
}

// An attempt that showed output and reported no record, after one that did: the record has a
// hole there that no later report can fill.
bool ResponseBuilder::attempt_left_hole() const { return attempt_deltas_ > 0 && !attempt_trailed_ && !trail_ids_.empty(); }

pulse_status_t ResponseBuilder::trail(const int32_t* tokens, size_t n, std::string_view raw) {
    if (ended_) return PULSE_OK;
    attempt_trailed_ = true;
    attempt_trail_ids_ += static_cast<int64_t>(n);
    trail_ids_.insert(trail_ids_.end(), tokens, tokens + n);
    trail_raw_.append(raw);
    return PULSE_OK;
}

pulse_status_t ResponseBuilder::trail_lost(std::string_view why) {
    if (trail_lost_.empty()) trail_lost_ = why.empty() ? std::string("the backend's token record has a hole") : std::string(why);
    return PULSE_OK;
}

void ResponseBuilder::restart_trail() {
    trail_ids_.clear();
    trail_raw_.clear();
    trail_lost_.clear();
    attempt_trailed_ = false;
    attempt_trail_ids_ = 0;
}

void ResponseBuilder::begin_resume() {
    if (attempt_left_hole() && trail_lost_.empty()) trail_lost_ = kNoRecord;
    attempt_trailed_ = false;
    failure_.reset();
    finish_.reset();
    Usage spent = attempt_usage();
    spent.reported = true;
    carried_.input += spent.input;
    carried_.cached += spent.cached;
    carried_.output += spent.output;
    carried_.reasoning += spent.reasoning;
    carried_.reported = true;
    usage_ = Usage{};
    attempt_deltas_ = 0;
    attempt_trail_ids_ = 0;
    reasoning_deltas_ = 0;
}

ResponseBuilder::Usage ResponseBuilder::attempt_usage() const {
    // A backend that reported no usage (it failed, or the client left, before its last chunk):
    // its output deltas stand for its output tokens, the input is unknown.
    // A token record counts its tokens exactly (deltas miss the tokens that make none).
    if (usage_.reported) return usage_;
    const int64_t out = attempt_trail_ids_ > 0 ? attempt_trail_ids_ : attempt_deltas_;
    return Usage{0, 0, out, std::min(reasoning_deltas_, out), false};
}

ResponseBuilder::Usage ResponseBuilder::spent() const {
    Usage u = attempt_usage();
    u.output += carried_.output;
    u.reasoning += carried_.reasoning;
    return u;
}

ResponseBuilder::Usage ResponseBuilder::usage_totals() const {
    Usage u = usage_;
    u.input += carried_.input;
    u.cached += carried_.cached;
    u.output += carried_.output;
    u.reasoning += carried_.reasoning;
    u.reported = usage_.reported || carried_.reported;
    return u;
}

pulse_status_t ResponseBuilder::error(pulse_status_t status, std::string_view message) {
    if (!failure_) failure_ = std::make_pair(status, std::string(message));
    return PULSE_OK;
}

void ResponseBuilder::fail(pulse_status_t status, std::string_view message) {
    error(status, message);
    end(PULSE_STREAM_TRUNCATED);
}

ResponseBuilder::Ending ResponseBuilder::end(pulse_stream_end_t how, std::string_view truncation_reason) {
    if (ended_) return Ending::none;
    start();
    Ending ending = Ending::failed;
    if (!failure_ && how == PULSE_STREAM_TRUNCATED)
        failure_ = std::make_pair(PULSE_E_UNAVAILABLE, truncation_reason.empty()
                                                          ? std::string("the backend stream ended before it finished")
                                                          : std::string(truncation_reason));
    if (!failure_ && how == PULSE_STREAM_CLEAN) {
        // (A failed response keeps no item still open: Codex keeps every item it got a done
        // for, even when the response then fails, and an open item is not certain.)
        if (finish_ == PULSE_FINISH_LENGTH) incomplete_reason_ = "max_output_tokens";
        else if (finish_ == PULSE_FINISH_CONTENT_FILTER) incomplete_reason_ = "content_filter";
        if (incomplete_reason_ && current_) items_[*current_].incomplete = true;  // the item that was cut off
        close_current();
        ending = incomplete_reason_ ? Ending::incomplete : Ending::completed;
    }
    const char* status = ending == Ending::completed ? "completed" : ending == Ending::incomplete ? "incomplete" : "failed";
    ended_ = true;
    final_ = response_json(status, true);
    event(std::string("response.") + status, [&](JsonOut& o) { o.key("response").raw(final_); });
    return ending;
}

}  // namespace pulse::gateway
