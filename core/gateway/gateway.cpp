#include "gateway/gateway.h"

#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <ctime>

#include "common/log.h"
#include "common/metrics.h"
#include "gateway/http_util.h"

namespace pulse::gateway {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

Gateway::Gateway(const config::Config& cfg, plugin::PluginManager& plugins) : cfg_(cfg), plugins_(plugins) {}

Gateway::~Gateway() = default;

ModelRuntime::~ModelRuntime() {
    backends.clear();
    if (instance && profile && profile->registration.translation.destroy) profile->registration.translation.destroy(instance);
}

void Gateway::start() {
    for (const auto& m : cfg_.models) {
        auto rt = std::make_unique<ModelRuntime>();
        rt->cfg = &m;
        rt->profile = plugins_.translation(m.profile);
        if (!rt->profile) throw config::ConfigError("model '" + m.id + "': translation profile '" + m.profile + "' is not loaded");
        rt->reasoning = m.reasoning_output == "raw"    ? ReasoningOutput::raw
                        : m.reasoning_output == "both" ? ReasoningOutput::both
                                                       : ReasoningOutput::summary;
        // The model as the profile sees it.
        auto& v = rt->view;
        auto& a = v.GetAllocator();
        v.SetObject();
        v.AddMember("id", rapidjson::Value(m.id.c_str(), a), a);
        v.AddMember("upstream_model", rapidjson::Value(m.upstream_model.c_str(), a), a);
        v.AddMember("context_window", m.context_window, a);
        rapidjson::Value sampling(rapidjson::kObjectType);
        auto num = [&](const char* k, const auto& opt) {
            if (opt) sampling.AddMember(rapidjson::StringRef(k), rapidjson::Value(*opt), a);
        };
        num("temperature", m.sampling.temperature);
        num("top_p", m.sampling.top_p);
        num("min_p", m.sampling.min_p);
        num("presence_penalty", m.sampling.presence_penalty);
        num("repetition_penalty", m.sampling.repetition_penalty);
        num("top_k", m.sampling.top_k);
        num("max_output_tokens", m.sampling.max_output_tokens);
        v.AddMember("sampling", sampling, a);

        rapidjson::Document opts;
        opts.Parse(m.profile_options_json.c_str());
        pulse_call call;
        const auto& vt = rt->profile->registration.translation;
        pulse_status_t rc = vt.create(rt->profile->registration.user, &call, opts.IsNull() ? nullptr : host::view(&opts), &rt->instance);
        if (rc != PULSE_OK)
            throw config::ConfigError((cfg_.source.empty() ? std::string("config") : cfg_.source.string()) + ": models." + m.id +
                                      ".profile_options: " + host::call_error(call, rc, rt->profile->plugin_id()));
        for (const auto& e : m.endpoints) {
            if (!e.is_plugin()) {
                rt->backends.emplace_back();
                continue;
            }
            auto lease = plugins_.backend(e.plugin_name());
            if (!lease) throw config::ConfigError("model '" + m.id + "': backend '" + e.plugin_name() + "' is not loaded");
            try {
                rt->backends.push_back(std::make_unique<BackendInstance>(lease, e.options_json));
            } catch (const std::exception& ex) {
                throw config::ConfigError("models." + m.id + ".endpoints '" + e.name + "': " + ex.what());
            }
        }
        runtimes_.push_back(std::move(rt));
    }
}

const ModelRuntime* Gateway::runtime(std::string_view model_id) const {
    for (const auto& r : runtimes_)
        if (r->cfg->id == model_id) return r.get();
    return nullptr;
}

bool Gateway::authorized(const Poco::Net::HTTPServerRequest& req) const {
    const std::string& key = cfg_.server.api_key;
    if (key.empty()) return true;
    const std::string& auth = req.get("Authorization", "");
    static const std::string kBearer = "Bearer ";
    if (auth.size() != kBearer.size() + key.size() || auth.compare(0, kBearer.size(), kBearer) != 0) return false;
    // Constant time in the key's length: no early exit on the first differing byte.
    unsigned char diff = 0;
    for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(auth[kBearer.size() + i] ^ key[i]);
    return diff == 0;
}

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
    bool status_path = path == "/health" || path == "/metrics";
    if ((!status_path || cfg_.server.protect_status) && !authorized(req))
        return send_error(resp, 401, "invalid_request_error", "missing or wrong API key (send Authorization: Bearer KEY)",
                          {}, "invalid_api_key");
    if (path == "/health" && (method == "GET" || method == "HEAD")) return health(resp);
    if (path == "/metrics" && method == "GET") {
        if (req.get("Accept", "").find("application/json") != std::string::npos)
            return send_json(resp, 200, metrics::global().json());
        std::string text = metrics::global().prometheus();
        resp.setStatusAndReason(Poco::Net::HTTPResponse::HTTP_OK);
        resp.setContentType("text/plain; version=0.0.4; charset=utf-8");
        resp.sendBuffer(text.data(), text.size());
        return;
    }
    if (path == "/v1/models" && method == "GET") return models(resp);
    if (path == "/v1/responses" || path == "/responses") {
        if (method != "POST") {
            resp.set("Allow", "POST");
            return send_error(resp, 405, "invalid_request_error", "use POST for " + path);
        }
        return responses(req, resp);
    }
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
