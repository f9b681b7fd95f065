#include "gateway/protocol/response_json.h"

#include "gateway/protocol/status_errors.h"

namespace pulse::gateway {

std::string response_json(const ResponseView& r) {
    JsonOut o;
    o.begin().kv("id", r.id).kv("object", "response").kv("created_at", r.created_at).kv("status", r.status).kv("model", r.model);
    o.key("output").begin_array();
    for (const auto& it : r.items)
        if (!it.open) o.raw(item_json(it, true));
    o.end_array();
    o.key("error");
    if (r.failure) {
        o.begin()
            .kv("code", status_error(r.failure->first).event_code)
            .kv("message", r.failure->second)
            .end();
    } else {
        o.null();
    }
    o.key("incomplete_details");
    if (r.incomplete_reason) o.begin().kv("reason", *r.incomplete_reason).end();
    else o.null();
    if (r.usage) {
        // Always present, always integers: Codex's auto-compaction is driven by these numbers.
        const auto& u = *r.usage;
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

std::string item_json(const OutputItem& it, bool done) {
    JsonOut o;
    o.begin().kv("id", it.id);
    const char* status = !done ? "in_progress" : it.incomplete ? "incomplete" : "completed";
    switch (it.type) {
        case OutputItem::message:
            o.kv("type", "message").kv("status", status).kv("role", "assistant").key("content").begin_array();
            if (done) {
                o.begin().kv("type", "output_text").kv("text", it.text).key("annotations").begin_array().end_array().end();
            }
            o.end_array();
            break;
        case OutputItem::reasoning:
            o.kv("type", "reasoning").key("summary").begin_array();
            if (done && it.summary_started) o.begin().kv("type", "summary_text").kv("text", it.summary).end();
            o.end_array().key("content").begin_array();
            if (done && it.raw_started) o.begin().kv("type", "reasoning_text").kv("text", it.raw).end();
            o.end_array().key("encrypted_content").null();
            break;
        case OutputItem::function_call:
            o.kv("type", "function_call").kv("status", status).kv("name", it.name);
            if (!it.ns.empty()) o.kv("namespace", it.ns);
            o.kv("call_id", it.call_id).kv("arguments", done ? it.args : std::string());
            break;
        case OutputItem::custom_tool_call:
            o.kv("type", "custom_tool_call").kv("status", status).kv("name", it.name);
            if (!it.ns.empty()) o.kv("namespace", it.ns);
            o.kv("call_id", it.call_id).kv("input", done ? it.args : std::string());
            break;
    }
    o.end();
    return o.text();
}

}  // namespace pulse::gateway
