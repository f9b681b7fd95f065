// What the gateway says about itself: /health (the probe: 200 when every model has a healthy
// endpoint, else 503 "degraded" or "draining"), /status.json (what the status page polls: the
// same state plus live and recent requests, rates, uptime and the last reload), the status page
// itself, the endpoint gauges /metrics reads at each scrape, and the zero series the shipped
// alerts need. It reads; it changes nothing but its note of the last reload.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>
#include <string>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "plugin/plugin_manager.h"
#include "server/http_server.h"

namespace pulse::gateway {

struct Snapshot;
class RequestBoard;

class StatusReport {
public:
    StatusReport(const plugin::PluginManager& plugins, const RequestBoard& board) : plugins_(plugins), board_(board) {}

    void health(server::Exchange& ex, const Snapshot& snap, bool draining, int active) const;
    void status_json(server::Exchange& ex, const Snapshot& snap, bool draining, int active) const;
    static void status_page(server::Exchange& ex);
    // The outcome of the latest reload (SIGHUP, POST /admin/reload, a plugin directory change).
    void note_reload(bool ok, std::string message);

    // Zero series for what the shipped alerts count, for every model and endpoint of `snap`.
    static void seed_alert_series(const Snapshot& snap);
    // Endpoint state as gauges: always what /health says now.
    static void publish_endpoint_gauges(const Snapshot& snap);

private:
    // The state /health and /status.json share: models with their endpoints, plugins, status.
    // Returns the overall status ("ok", "degraded", "draining").
    const char* write_state(rapidjson::Writer<rapidjson::StringBuffer>& w, const Snapshot& snap, bool live, bool draining, int active) const;

    const plugin::PluginManager& plugins_;
    const RequestBoard& board_;
    const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
    struct Reload {
        int64_t at_ms;
        bool ok;
        std::string message;
    };
    mutable std::mutex reload_mutex_;
    std::optional<Reload> last_reload_;
};

}  // namespace pulse::gateway
