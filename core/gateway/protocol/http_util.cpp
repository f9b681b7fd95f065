#include "gateway/protocol/http_util.h"

namespace pulse::gateway {

void send_json(server::Exchange& ex, int status, std::string_view body, const server::Headers& extra) {
    ex.respond(status, "application/json", body, extra);
}

void send_error(server::Exchange& ex, int status, std::string_view type, std::string_view message, std::string_view param,
                std::string_view code, int retry_after_s) {
    server::Headers extra;
    if (retry_after_s > 0) extra.emplace_back("Retry-After", std::to_string(retry_after_s));
    send_json(ex, status, error_body(type, message, param, code), extra);
}

}  // namespace pulse::gateway
