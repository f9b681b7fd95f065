// The JSON shapes of the Responses API's objects as Pulse writes them: an output item (message,
// reasoning, function call, custom tool call) in progress or done, and the Response object
// itself with its usage. ResponseBuilder decides when; this file decides how they look.
#pragma once

#include <pulse/plugin.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "gateway/protocol/answer_ledger.h"

namespace pulse::gateway {

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

// One output item of a response, as the deltas built it.
struct OutputItem {
    enum Type { message, reasoning, function_call, custom_tool_call } type;
    std::string id;
    std::string text;     // message text
    std::string summary;  // reasoning summary text
    std::string raw;      // reasoning raw text
    std::string name, ns, call_id, args;
    uint32_t tool_index = 0;
    bool open = true;
    bool incomplete = false;  // cut off by max_output_tokens / a content filter
    bool summary_started = false, raw_started = false;
};

std::string item_json(const OutputItem& it, bool done);

// A Response object: its done items, its error or incomplete details, and (a terminal one) usage.
struct ResponseView {
    std::string_view id, model;
    int64_t created_at;
    std::string_view status;
    const std::vector<OutputItem>& items;
    const std::pair<pulse_status_t, std::string>* failure;  // null: none
    const std::string* incomplete_reason;                    // null: none
    const AnswerLedger::Usage* usage;                        // null: not terminal, no usage
};
std::string response_json(const ResponseView& r);

}  // namespace pulse::gateway
