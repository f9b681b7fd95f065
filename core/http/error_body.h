// The OpenAI error shape every error answer has, wherever in Pulse it is written (the front
// end's own refusals, the gateway's routes): {"error":{"message","type","param","code"}} —
// what Codex and the openai SDKs parse. Written with RapidJSON, so any message (quotes,
// control characters, invalid UTF-8 from a backend) comes out as valid JSON.
#pragma once

#include <string>
#include <string_view>

namespace pulse::http {

// An empty `param` or `code` is written as null.
std::string error_body(std::string_view type, std::string_view message, std::string_view param = {}, std::string_view code = {});

}  // namespace pulse::http
