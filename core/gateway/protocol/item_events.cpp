#include "gateway/protocol/item_events.h"

namespace pulse::gateway {

void item_added(const OutputItem& item, uint64_t index, const ItemEmitter& event) {
    event("response.output_item.added", [&](JsonOut& o) { o.kv("output_index", index).key("item").raw(item_json(item, false)); });
    if (item.type == OutputItem::message) {
        event("response.content_part.added", [&](JsonOut& o) {
            o.kv("item_id", item.id).kv("output_index", index).kv("content_index", uint64_t(0));
            o.key("part").begin().kv("type", "output_text").kv("text", "").key("annotations").begin_array().end_array().end();
        });
    }
}

void reasoning_part_added(const OutputItem& it, uint64_t oi, bool raw, const ItemEmitter& event) {
    if (raw) {
        event("response.content_part.added", [&](JsonOut& o) {
            o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0));
            o.key("part").begin().kv("type", "reasoning_text").kv("text", "").end();
        });
    } else {
        event("response.reasoning_summary_part.added", [&](JsonOut& o) {
            o.kv("item_id", it.id).kv("output_index", oi).kv("summary_index", uint64_t(0));
            o.key("part").begin().kv("type", "summary_text").kv("text", "").end();
        });
    }
}

void item_delta(const OutputItem& it, uint64_t oi, ItemDelta kind, std::string_view delta, const ItemEmitter& event) {
    switch (kind) {
        case ItemDelta::text:
            event("response.output_text.delta", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0)).kv("delta", delta);
                o.key("logprobs").begin_array().end_array();
            });
            break;
        case ItemDelta::summary:
            event("response.reasoning_summary_text.delta", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("summary_index", uint64_t(0)).kv("delta", delta);
            });
            break;
        case ItemDelta::raw:
            event("response.reasoning_text.delta", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0)).kv("delta", delta);
            });
            break;
        case ItemDelta::args:
            event(it.type == OutputItem::function_call ? "response.function_call_arguments.delta" : "response.custom_tool_call_input.delta",
                  [&](JsonOut& o) { o.kv("item_id", it.id).kv("output_index", oi).kv("delta", delta); });
            break;
    }
}

void item_done(const OutputItem& it, uint64_t oi, const ItemEmitter& event) {
    switch (it.type) {
        case OutputItem::message:
            event("response.output_text.done", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0)).kv("text", it.text);
                o.key("logprobs").begin_array().end_array();
            });
            event("response.content_part.done", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("content_index", uint64_t(0));
                o.key("part").begin().kv("type", "output_text").kv("text", it.text).key("annotations").begin_array().end_array().end();
            });
            break;
        case OutputItem::reasoning:
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
        case OutputItem::function_call:
            event("response.function_call_arguments.done", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("name", it.name).kv("arguments", it.args);
            });
            break;
        case OutputItem::custom_tool_call:
            event("response.custom_tool_call_input.done", [&](JsonOut& o) {
                o.kv("item_id", it.id).kv("output_index", oi).kv("input", it.args);
            });
            break;
    }
    event("response.output_item.done", [&](JsonOut& o) { o.kv("output_index", oi).key("item").raw(item_json(it, true)); });
}

}  // namespace pulse::gateway
