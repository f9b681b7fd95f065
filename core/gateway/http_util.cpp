#include "gateway/http_util.h"

#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace pulse::gateway {

bool has_body(const Poco::Net::HTTPServerRequest& req) {
    return req.getChunkedTransferEncoding() || (req.hasContentLength() && req.getContentLength64() > 0);
}

void discard_body(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp, int64_t max_bytes) {
    if (!has_body(req)) return;
    try {
        std::istream& in = req.stream();
        char sink[65536];
        int64_t n = 0;
        while (n < max_bytes && in.read(sink, sizeof sink).gcount() > 0) n += in.gcount();
    } catch (...) {
    }
    resp.setKeepAlive(false);
}

void send_json(Poco::Net::HTTPServerResponse& resp, int status, std::string_view body) {
    resp.setStatusAndReason(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(status));
    resp.setContentType("application/json");
    resp.setContentLength(static_cast<std::streamsize>(body.size()));
    resp.send().write(body.data(), static_cast<std::streamsize>(body.size()));
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

void send_error(Poco::Net::HTTPServerResponse& resp, int status, std::string_view type, std::string_view message,
                std::string_view param, std::string_view code, int retry_after_s) {
    if (retry_after_s > 0) resp.set("Retry-After", std::to_string(retry_after_s));
    send_json(resp, status, error_body(type, message, param, code));
}

}  // namespace pulse::gateway
