// The gateway: routes HTTP requests to the right piece (status endpoints, the Responses API)
// and holds what every request needs (config, plugin registry).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "config/config.h"
#include "plugin/plugin_manager.h"

namespace Poco::Net {
class HTTPServerRequest;
class HTTPServerResponse;
}  // namespace Poco::Net

namespace pulse::gateway {

class Gateway {
public:
    Gateway(const config::Config& cfg, plugin::PluginManager& plugins);

    // Every model's translation profile and every plugin:// endpoint must be provided by a
    // loaded plugin. Returns one message per missing component (empty = all present).
    std::vector<std::string> check_components() const;

    void handle(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp);

    void set_draining(bool d) { draining_ = d; }

private:
    void health(Poco::Net::HTTPServerResponse& resp);
    void models(Poco::Net::HTTPServerResponse& resp);

    const config::Config& cfg_;
    plugin::PluginManager& plugins_;
    std::atomic<bool> draining_{false};
};

}  // namespace pulse::gateway
