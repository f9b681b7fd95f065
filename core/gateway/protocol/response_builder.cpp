#include "gateway/protocol/response_builder.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <chrono>
#include <random>

namespace pulse::gateway {

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

ItemEmitter ResponseBuilder::emitter() {
    return [this](std::string_view type, const std::function<void(JsonOut&)>& body) { event(type, body); };
}

std::string ResponseBuilder::response_json(std::string_view status, bool terminal) const {
    // Totals only for a terminal object: an in-progress one (response.created, keepalives) has no usage.
    std::optional<Usage> u;
    if (terminal) u = ledger_.totals();
    return gateway::response_json({id_, model_, created_at_, status, items_, failure_ ? &*failure_ : nullptr,
                                   incomplete_reason_ ? &*incomplete_reason_ : nullptr, u ? &*u : nullptr});
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
    item_added(item, index, emitter());
    return item;
}

void ResponseBuilder::close_current() {
    if (current_) close_item(*current_);
    current_.reset();
}

void ResponseBuilder::close_item(size_t index) {
    Item& it = items_[index];
    if (!it.open) return;
    it.open = false;
    item_done(it, index, emitter());
}

pulse_status_t ResponseBuilder::text(std::string_view t) {
    if (ended_) return PULSE_E_INVALID_ARGUMENT;
    if (t.empty()) return PULSE_OK;
    if (!current_ || items_[*current_].type != Item::message) open_item(Item::message);
    ledger_.delta(false);
    Item& it = items_[*current_];
    it.text += t;
    item_delta(it, *current_, ItemDelta::text, t, emitter());
    return PULSE_OK;
}

pulse_status_t ResponseBuilder::reasoning(std::string_view t) {
    if (ended_) return PULSE_E_INVALID_ARGUMENT;
    if (t.empty()) return PULSE_OK;
    if (!current_ || items_[*current_].type != Item::reasoning) open_item(Item::reasoning);
    ledger_.delta(true);
    Item& it = items_[*current_];
    uint64_t oi = *current_;
    if (reasoning_mode_ != ReasoningOutput::raw) {
        if (!it.summary_started) {
            it.summary_started = true;
            reasoning_part_added(it, oi, /*raw=*/false, emitter());
        }
        it.summary += t;
        item_delta(it, oi, ItemDelta::summary, t, emitter());
    }
    if (reasoning_mode_ != ReasoningOutput::summary) {
        if (!it.raw_started) {
            it.raw_started = true;
            reasoning_part_added(it, oi, /*raw=*/true, emitter());
        }
        it.raw += t;
        item_delta(it, oi, ItemDelta::raw, t, emitter());
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
    ledger_.delta(false);
    item_delta(it, *current_, ItemDelta::args, fragment, emitter());
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
    ledger_.usage(u);
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
    p.trail = ledger_.record(&p.no_trail);
    return p;
}

pulse_status_t ResponseBuilder::trail(const int32_t* tokens, size_t n, std::string_view raw) {
    if (!ended_) ledger_.trail(tokens, n, raw);
    return PULSE_OK;
}

pulse_status_t ResponseBuilder::trail_lost(std::string_view why) {
    ledger_.trail_lost(why);
    return PULSE_OK;
}

void ResponseBuilder::begin_resume() {
    failure_.reset();
    finish_.reset();
    ledger_.next_attempt();
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
