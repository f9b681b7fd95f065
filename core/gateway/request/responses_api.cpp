#include "gateway/request/responses_api.h"

#include <cstdio>
#include <cstring>

#include <rapidjson/error/en.h>

#include <vector>

namespace pulse::gateway {
namespace {

using rapidjson::Value;

std::optional<RequestError> err(std::string param, std::string message, std::string code = "invalid_value") {
    return RequestError{400, std::move(message), std::move(param), std::move(code)};
}

const char* type_name(const Value& v) {
    switch (v.GetType()) {
        case rapidjson::kNullType: return "null";
        case rapidjson::kFalseType:
        case rapidjson::kTrueType: return "a boolean";
        case rapidjson::kNumberType: return "a number";
        case rapidjson::kStringType: return "a string";
        case rapidjson::kArrayType: return "an array";
        default: return "an object";
    }
}

// Iterative depth check (no recursion on attacker-controlled depth).
bool within_depth(const Value& root, int max_depth) {
    std::vector<std::pair<const Value*, int>> stack{{&root, 1}};
    while (!stack.empty()) {
        auto [v, d] = stack.back();
        stack.pop_back();
        if (d > max_depth) return false;
        if (v->IsArray())
            for (const auto& e : v->GetArray()) stack.emplace_back(&e, d + 1);
        else if (v->IsObject())
            for (const auto& m : v->GetObject()) stack.emplace_back(&m.value, d + 1);
    }
    return true;
}

std::optional<RequestError> expect(const Value& obj, const char* key, bool (Value::*is)() const, const char* what,
                                   const std::string& path, bool required) {
    auto it = obj.FindMember(key);
    if (it == obj.MemberEnd() || (!required && it->value.IsNull())) {
        if (required) return err(path + key, "'" + path + key + "' is required", "missing_required_parameter");
        return std::nullopt;
    }
    if (!(it->value.*is)())
        return err(path + key, "'" + path + key + "' must be " + what + ", found " + type_name(it->value), "invalid_type");
    return std::nullopt;
}

std::optional<RequestError> check_content(const Value& content, const std::string& path) {
    if (content.IsString()) return std::nullopt;
    if (!content.IsArray()) return err(path, "'" + path + "' must be a string or an array of content parts", "invalid_type");
    for (rapidjson::SizeType i = 0; i < content.Size(); ++i) {
        std::string p = path + "[" + std::to_string(i) + "]";
        const Value& part = content[i];
        if (!part.IsObject()) return err(p, "'" + p + "' must be an object", "invalid_type");
        if (auto e = expect(part, "type", &Value::IsString, "a string", p + ".", true)) return e;
    }
    return std::nullopt;
}

std::optional<RequestError> check_item(const Value& item, const std::string& p) {
    if (!item.IsObject()) return err(p, "'" + p + "' must be an object", "invalid_type");
    std::string type;
    if (auto t = item.FindMember("type"); t != item.MemberEnd()) {
        if (!t->value.IsString()) return err(p + ".type", "'" + p + ".type' must be a string", "invalid_type");
        type = t->value.GetString();
    } else if (item.HasMember("role")) {
        type = "message";  // EasyInputMessage: {role, content}
    } else {
        return err(p + ".type", "'" + p + ".type' is required", "missing_required_parameter");
    }
    std::string pp = p + ".";
    if (type == "message") {
        if (auto e = expect(item, "role", &Value::IsString, "a string", pp, true)) return e;
        std::string role = item["role"].GetString();
        if (role != "user" && role != "assistant" && role != "system" && role != "developer")
            return err(pp + "role", "'" + pp + "role' must be user, assistant, system or developer, found '" + role + "'");
        if (!item.HasMember("content")) return err(pp + "content", "'" + pp + "content' is required", "missing_required_parameter");
        return check_content(item["content"], pp + "content");
    }
    if (type == "function_call") {
        for (const char* k : {"name", "arguments", "call_id"})
            if (auto e = expect(item, k, &Value::IsString, "a string", pp, true)) return e;
        return expect(item, "namespace", &Value::IsString, "a string", pp, false);
    }
    if (type == "custom_tool_call") {
        for (const char* k : {"name", "input", "call_id"})
            if (auto e = expect(item, k, &Value::IsString, "a string", pp, true)) return e;
        return std::nullopt;
    }
    if (type == "function_call_output" || type == "custom_tool_call_output") {
        // An output that answers no call (Codex 0.171's goal context: {"name":"goal_objective",
        // "namespace":"agent", no call_id}) names the tool instead.
        const bool named = item.HasMember("name") && item["name"].IsString() && item["name"].GetStringLength() > 0;
        if (auto e = expect(item, "call_id", &Value::IsString, "a string", pp, !named)) return e;
        if (auto e = expect(item, "namespace", &Value::IsString, "a string", pp, false)) return e;
        if (!item.HasMember("output")) return err(pp + "output", "'" + pp + "output' is required", "missing_required_parameter");
        return check_content(item["output"], pp + "output");
    }
    if (type == "reasoning") {
        for (const char* k : {"summary", "content"})
            if (auto e = expect(item, k, &Value::IsArray, "an array", pp, false)) return e;
        return std::nullopt;
    }
    return err(pp + "type",
               "input item type '" + type +
                   "' is not supported by this gateway (supported: message, reasoning, function_call, "
                   "function_call_output, custom_tool_call, custom_tool_call_output)",
               "unsupported_value");
}

}  // namespace

namespace {

std::optional<RequestError> parse_result(const rapidjson::Document& doc, int max_depth) {
    if (doc.HasParseError()) {
        if (doc.GetParseError() == rapidjson::kParseErrorStringInvalidEncoding)
            return RequestError{400, "request body is not valid UTF-8 (at byte " + std::to_string(doc.GetErrorOffset()) + ")", "", "invalid_encoding"};
        return RequestError{400,
                            std::string("request body is not valid JSON: ") + rapidjson::GetParseError_En(doc.GetParseError()) +
                                " (at byte " + std::to_string(doc.GetErrorOffset()) + ")",
                            "", "invalid_json"};
    }
    if (!within_depth(doc, max_depth))
        return RequestError{400, "request body nests deeper than " + std::to_string(max_depth) + " levels", "", "invalid_json"};
    return std::nullopt;
}

}  // namespace

std::optional<RequestError> parse_body_in_place(std::string& body, rapidjson::Document& doc, int max_depth) {
    // An in-place parse ends at the first NUL byte; JSON never contains one (raw control
    // characters are invalid even inside strings), so one anywhere is an error.
    if (const void* nul = std::memchr(body.data(), 0, body.size()))
        return RequestError{400,
                            "request body is not valid JSON: a NUL byte (at byte " +
                                std::to_string(static_cast<const char*>(nul) - body.data()) + ")",
                            "", "invalid_json"};
    // The UTF-8 check reads a lead byte's continuation bytes before it looks at them: a body
    // that ends in a lead byte (an unterminated string) would be read up to 3 bytes past its
    // end. Four NULs after it end the parse there, whatever the last byte was (found by
    // tests/fuzz/fuzz_request once it ran this parser).
    body.append(4, '\0');
    doc.ParseInsitu<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseIterativeFlag>(body.data());
    return parse_result(doc, max_depth);
}

std::optional<RequestError> validate_request(const Value& req) {
    if (!req.IsObject()) return err("", "request body must be a JSON object", "invalid_type");
    // Pulse is stateless: Codex always sends the whole history with store:false.
    auto refuse = [&](const char* key, const std::string& why) {
        return err(key, std::string("'") + key + "' is not supported: " + why, "unsupported_parameter");
    };
    if (auto it = req.FindMember("previous_response_id"); it != req.MemberEnd() && !it->value.IsNull())
        return refuse("previous_response_id", "Pulse stores no responses; send the whole conversation in 'input'");
    if (auto it = req.FindMember("conversation"); it != req.MemberEnd() && !it->value.IsNull())
        return refuse("conversation", "Pulse stores no conversations; send the whole conversation in 'input'");
    if (auto it = req.FindMember("background"); it != req.MemberEnd() && it->value.IsTrue())
        return refuse("background", "background responses need server-side storage, which Pulse does not have");
    if (auto it = req.FindMember("store"); it != req.MemberEnd() && it->value.IsTrue())
        return refuse("store", "Pulse stores nothing; send store:false (Codex does)");

    if (auto e = expect(req, "model", &Value::IsString, "a string", "", true)) return e;
    if (auto e = expect(req, "stream", &Value::IsBool, "a boolean", "", false)) return e;
    if (auto e = expect(req, "instructions", &Value::IsString, "a string", "", false)) return e;
    if (auto e = expect(req, "tools", &Value::IsArray, "an array", "", false)) return e;
    if (auto e = expect(req, "parallel_tool_calls", &Value::IsBool, "a boolean", "", false)) return e;
    if (auto e = expect(req, "reasoning", &Value::IsObject, "an object", "", false)) return e;
    if (auto e = expect(req, "text", &Value::IsObject, "an object", "", false)) return e;
    // The Responses API's own ranges: a value outside them is the client's mistake, named here
    // with OpenAI's wording and codes, not passed on for a backend to reject or quietly clamp.
    struct Range {
        const char* key;
        double min, max;
    };
    for (const Range r : {Range{"temperature", 0, 2}, Range{"top_p", 0, 1}}) {
        if (auto e = expect(req, r.key, &Value::IsNumber, "a number", "", false)) return e;
        auto it = req.FindMember(r.key);
        if (it == req.MemberEnd() || it->value.IsNull()) continue;
        const double v = it->value.GetDouble();
        char got[32];
        std::snprintf(got, sizeof got, "%g", v);
        char bound[32];
        std::snprintf(bound, sizeof bound, "%g", v < r.min ? r.min : r.max);
        if (v < r.min || v > r.max)
            return err(r.key,
                       std::string("Invalid '") + r.key + "': decimal " + (v < r.min ? "below minimum" : "above maximum") + " value. Expected a value " +
                           (v < r.min ? ">= " : "<= ") + bound + ", but got " + got + " instead.",
                       v < r.min ? "decimal_below_min_value" : "decimal_above_max_value");
    }
    if (auto it = req.FindMember("max_output_tokens"); it != req.MemberEnd() && !it->value.IsNull()) {
        if (!it->value.IsInt64() || it->value.GetInt64() < 1)
            return err("max_output_tokens", "'max_output_tokens' must be a positive integer", "invalid_type");
    }
    if (auto it = req.FindMember("tool_choice"); it != req.MemberEnd() && !it->value.IsNull()) {
        if (!it->value.IsString() && !it->value.IsObject())
            return err("tool_choice", "'tool_choice' must be a string or an object", "invalid_type");
    }
    if (auto it = req.FindMember("tools"); it != req.MemberEnd()) {
        for (rapidjson::SizeType i = 0; i < it->value.Size(); ++i) {
            std::string p = "tools[" + std::to_string(i) + "]";
            if (!it->value[i].IsObject()) return err(p, "'" + p + "' must be an object", "invalid_type");
            if (auto e = expect(it->value[i], "type", &Value::IsString, "a string", p + ".", true)) return e;
        }
    }
    auto input = req.FindMember("input");
    if (input == req.MemberEnd()) return err("input", "'input' is required", "missing_required_parameter");
    if (input->value.IsString()) return std::nullopt;
    if (!input->value.IsArray())
        return err("input", std::string("'input' must be a string or an array of items, found ") + type_name(input->value), "invalid_type");
    for (rapidjson::SizeType i = 0; i < input->value.Size(); ++i)
        if (auto e = check_item(input->value[i], "input[" + std::to_string(i) + "]")) return e;
    return std::nullopt;
}

}  // namespace pulse::gateway
