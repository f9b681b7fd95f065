// The events of one output item of a Responses stream, in the protocol's order:
// output_item.added (and a message's content part), a reasoning item's part as its first
// summary or raw text arrives, the deltas, and at the end each part's done, then
// output_item.done with the whole item. The response builder decides when, keeps the item's
// state and numbers every event.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "gateway/protocol/response_json.h"

namespace pulse::gateway {

// Writes one event: its type and a function that fills its body (after "type").
using ItemEmitter = std::function<void(std::string_view type, const std::function<void(JsonOut&)>& body)>;

void item_added(const OutputItem& item, uint64_t index, const ItemEmitter& event);
// A reasoning item's summary part (raw = false) or raw-text part begins.
void reasoning_part_added(const OutputItem& item, uint64_t index, bool raw, const ItemEmitter& event);
// A piece of an open item: its text, reasoning summary or raw reasoning, or a tool call's
// arguments (function or custom, by the item's type).
enum class ItemDelta { text, summary, raw, args };
void item_delta(const OutputItem& item, uint64_t index, ItemDelta kind, std::string_view delta, const ItemEmitter& event);
// The item ends: the done events of its text, summary, raw text or arguments, then output_item.done.
void item_done(const OutputItem& item, uint64_t index, const ItemEmitter& event);

}  // namespace pulse::gateway
