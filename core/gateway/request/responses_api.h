// Validation of incoming Responses API requests: the host's half of "bad input gets a clear
// 4xx". The profile never sees a request that fails these checks.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <rapidjson/document.h>

namespace pulse::gateway {

struct RequestError {
    int http_status = 400;
    std::string message;
    std::string param;  // the offending field, e.g. "input[3].type"
    std::string code;   // e.g. "unsupported_parameter"
};

// Parses a request body in place: the document's strings point into `body` (which must outlive
// it and is overwritten), so a large request costs its body and the tree, not two copies.
// Rejects invalid JSON, invalid UTF-8, a NUL byte and nesting deeper than `max_depth`
// (iterative parser: a hostile body cannot overflow the stack).
std::optional<RequestError> parse_body_in_place(std::string& body, rapidjson::Document& doc, int max_depth = 128);

// Checks the shape of a Responses request: statelessness rules, types, item types.
std::optional<RequestError> validate_request(const rapidjson::Value& req);

}  // namespace pulse::gateway
