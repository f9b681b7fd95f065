// Small helpers for writing JSON and OpenAI-shaped errors to a client.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "http/error_body.h"
#include "server/http_server.h"

namespace pulse::gateway {

// Writes `body` (already JSON) with the status and Content-Type: application/json.
void send_json(server::Exchange& ex, int status, std::string_view body, const server::Headers& extra = {});

// {"error":{"message","type","param","code"}} — the shape Codex and the openai SDKs parse.
// `retry_after_s` > 0 adds a Retry-After header.
void send_error(server::Exchange& ex, int status, std::string_view type, std::string_view message, std::string_view param = {},
                std::string_view code = {}, int retry_after_s = 0);

using http::error_body;

}  // namespace pulse::gateway
