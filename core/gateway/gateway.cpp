#include "gateway/gateway.h"

#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <ctime>

#include "common/log.h"
#include "gateway/http_util.h"

namespace pulse::gateway {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

Gateway::Gateway(const config::Config& cfg, plugin::PluginManager& plugins) : cfg_(cfg), plugins_(plugins) {}

std::vector<std::string> Gateway::check_components() const {
    std::vector<std::string> out;
    auto list = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
        return s.empty() ? std::string("none") : s;
    };
    for (const auto& m : cfg_.models) {
        if (!plugins_.translation(m.profile))
            out.push_back("model '" + m.id + "': translation profile '" + m.profile +
                          "' is not provided by any loaded plugin (loaded profiles: " +
                          list(plugins_.component_names(PULSE_KIND_TRANSLATION)) + ")");
        for (const auto& e : m.endpoints)
            if (e.is_plugin() && !plugins_.backend(e.plugin_name()))
                out.push_back("model '" + m.id + "', endpoint '" + e.name + "': backend '" + e.plugin_name() +
                              "' is not provided by any loaded plugin (loaded backends: " +
                              list(plugins_.component_names(PULSE_KIND_BACKEND)) + ")");
    }
    return out;
}

void Gateway::handle(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp) {
    std::string path = req.getURI();
    if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
    const std::string& method = req.getMethod();
    if (path == "/health" && (method == "GET" || method == "HEAD")) return health(resp);
    if (path == "/v1/models" && method == "GET") return models(resp);
    send_error(resp, 404, "invalid_request_error", "no route for " + method + " " + path, {}, "not_found");
}

void Gateway::health(Poco::Net::HTTPServerResponse& resp) {
    rapidjson::StringBuffer b;
    JsonWriter w(b);
    bool draining = draining_.load();
    w.StartObject();
    w.Key("status");
    w.String(draining ? "draining" : "ok");
    w.Key("models");
    w.StartArray();
    for (const auto& m : cfg_.models) {
        w.StartObject();
        w.Key("id");
        w.String(m.id.c_str());
        w.Key("profile");
        w.String(m.profile.c_str());
        w.Key("endpoints");
        w.StartArray();
        for (const auto& e : m.endpoints) {
            w.StartObject();
            w.Key("name");
            w.String(e.name.c_str());
            w.Key("url");
            w.String(e.url.c_str());
            w.EndObject();
        }
        w.EndArray();
        w.EndObject();
    }
    w.EndArray();
    w.Key("plugins");
    w.StartArray();
    for (const auto& s : plugins_.statuses()) {
        w.StartObject();
        w.Key("path");
        w.String(s.path.c_str());
        w.Key("id");
        w.String(s.id.c_str());
        w.Key("version");
        w.String(s.version.c_str());
        w.Key("state");
        w.String(plugin::state_name(s.state));
        if (!s.reason.empty()) {
            w.Key("reason");
            w.String(s.reason.c_str());
        }
        w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    send_json(resp, draining ? 503 : 200, {b.GetString(), b.GetSize()});
}

void Gateway::models(Poco::Net::HTTPServerResponse& resp) {
    rapidjson::StringBuffer b;
    JsonWriter w(b);
    w.StartObject();
    w.Key("object");
    w.String("list");
    w.Key("data");
    w.StartArray();
    for (const auto& m : cfg_.models) {
        w.StartObject();
        w.Key("id");
        w.String(m.id.c_str());
        w.Key("object");
        w.String("model");
        w.Key("created");
        w.Int64(0);
        w.Key("owned_by");
        w.String("pulse");
        if (m.context_window > 0) {
            w.Key("context_window");
            w.Int64(m.context_window);
        }
        w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    send_json(resp, 200, {b.GetString(), b.GetSize()});
}

}  // namespace pulse::gateway
