#include "http/error_body.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace pulse::http {

namespace {

using Validating = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>, rapidjson::CrtAllocator,
                                     rapidjson::kWriteValidateEncodingFlag>;

// `s` as valid UTF-8: a text with an invalid sequence keeps its ASCII and gets '?' for the rest.
std::string_view valid_utf8(std::string_view s, std::string& scratch) {
    rapidjson::StringBuffer probe;
    if (Validating(probe).String(s.data(), static_cast<rapidjson::SizeType>(s.size()))) return s;
    scratch.clear();
    for (unsigned char c : s) scratch += c < 0x80 ? static_cast<char>(c) : '?';
    return scratch;
}

}  // namespace

std::string error_body(std::string_view type, std::string_view message, std::string_view param, std::string_view code) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    std::string scratch;
    auto text = [&](std::string_view s) {
        s = valid_utf8(s, scratch);  // invalid UTF-8 (say from a backend) is replaced: the body must parse
        w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
    };
    auto text_or_null = [&](std::string_view s) {
        if (s.empty()) w.Null();
        else text(s);
    };
    w.StartObject();
    w.Key("error");
    w.StartObject();
    w.Key("message");
    text(message);
    w.Key("type");
    text(type);
    w.Key("param");
    text_or_null(param);
    w.Key("code");
    text_or_null(code);
    w.EndObject();
    w.EndObject();
    return {b.GetString(), b.GetSize()};
}

}  // namespace pulse::http
