#include "gateway/http_util.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace pulse::gateway {

void send_json(server::Exchange& ex, int status, std::string_view body, const server::Headers& extra) {
    ex.respond(status, "application/json", body, extra);
}

std::string error_body(std::string_view type, std::string_view message, std::string_view param, std::string_view code) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    auto str_or_null = [&](std::string_view s) {
        if (s.empty()) w.Null();
        else w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
    };
    w.StartObject();
    w.Key("error");
    w.StartObject();
    w.Key("message");
    w.String(message.data(), static_cast<rapidjson::SizeType>(message.size()));
    w.Key("type");
    w.String(type.data(), static_cast<rapidjson::SizeType>(type.size()));
    w.Key("param");
    str_or_null(param);
    w.Key("code");
    str_or_null(code);
    w.EndObject();
    w.EndObject();
    return {b.GetString(), b.GetSize()};
}

void send_error(server::Exchange& ex, int status, std::string_view type, std::string_view message, std::string_view param,
                std::string_view code, int retry_after_s) {
    server::Headers extra;
    if (retry_after_s > 0) extra.emplace_back("Retry-After", std::to_string(retry_after_s));
    send_json(ex, status, error_body(type, message, param, code), extra);
}

}  // namespace pulse::gateway
