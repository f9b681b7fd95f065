// Small helpers for writing JSON and OpenAI-shaped errors on POCO responses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace Poco::Net {
class HTTPServerRequest;
class HTTPServerResponse;
}

namespace pulse::gateway {

// Writes `body` (already JSON) with the status and Content-Type: application/json.
void send_json(Poco::Net::HTTPServerResponse& resp, int status, std::string_view body);

// {"error":{"message","type","param","code"}} — the shape Codex and the openai SDKs parse.
// `retry_after_s` > 0 adds a Retry-After header.
void send_error(Poco::Net::HTTPServerResponse& resp, int status, std::string_view type, std::string_view message,
                std::string_view param = {}, std::string_view code = {}, int retry_after_s = 0);

// Reads and drops the rest of a request body (bounded), then marks the connection to close,
// so a client that is still sending sees our status instead of a reset connection.
// RFC 9112 §6.3: a request with neither Content-Length nor chunked Transfer-Encoding has no
// body. POCO would read such a body until the client closes, which hangs a keep-alive client.
bool has_body(const Poco::Net::HTTPServerRequest& req);

void discard_body(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp, int64_t max_bytes = 64 << 20);

std::string error_body(std::string_view type, std::string_view message, std::string_view param = {},
                       std::string_view code = {});

}  // namespace pulse::gateway
