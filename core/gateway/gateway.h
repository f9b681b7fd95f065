// The gateway: routes HTTP requests (status endpoints, the Responses API) and holds what every
// request needs: the config, the plugin registry, and per model its translation profile
// instance and the backend plugin instances of its endpoints.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <rapidjson/document.h>

#include "config/config.h"
#include "gateway/response_builder.h"
#include "gateway/upstream.h"
#include "plugin/plugin_manager.h"

namespace Poco::Net {
class HTTPServerRequest;
class HTTPServerResponse;
}  // namespace Poco::Net

namespace pulse::gateway {

// One configured model, ready to serve.
struct ModelRuntime {
    const config::Model* cfg = nullptr;
    plugin::ComponentLease profile;  // lease on the profile's plugin generation
    void* instance = nullptr;        // the profile's per-model instance
    rapidjson::Document view;        // {id, upstream_model, context_window, sampling{...}} for the profile
    std::vector<std::unique_ptr<BackendInstance>> backends;  // per endpoint; null for http://
    ReasoningOutput reasoning = ReasoningOutput::summary;

    ModelRuntime() = default;
    ModelRuntime(const ModelRuntime&) = delete;
    ~ModelRuntime();
};

class Gateway {
public:
    Gateway(const config::Config& cfg, plugin::PluginManager& plugins);
    ~Gateway();

    // Every model's translation profile and every plugin:// endpoint must be provided by a
    // loaded plugin. Returns one message per missing component (empty = all present).
    std::vector<std::string> check_components() const;

    // Creates profile and backend instances (control thread, before serving). Throws
    // config::ConfigError when a plugin rejects its options.
    void start();

    void handle(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp);

    void set_draining(bool d) { draining_ = d; }

private:
    void health(Poco::Net::HTTPServerResponse& resp);
    void models(Poco::Net::HTTPServerResponse& resp);
    void responses(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp);
    bool authorized(const Poco::Net::HTTPServerRequest& req) const;
    const ModelRuntime* runtime(std::string_view model_id) const;

    const config::Config& cfg_;
    plugin::PluginManager& plugins_;
    std::vector<std::unique_ptr<ModelRuntime>> runtimes_;
    std::atomic<bool> draining_{false};
};

}  // namespace pulse::gateway
