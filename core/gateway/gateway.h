// The gateway: routes HTTP requests (status endpoints, the Responses API) and owns what every
// request needs.
//
// Configuration lives in immutable Snapshots (config + per-model runtimes holding leases on
// their translation profiles). A request takes a shared_ptr to the current snapshot when it
// starts and keeps it to the end, so SIGHUP can publish a new snapshot (new endpoints, settings
// and profile generations) without touching streams in flight. Retired snapshots are destroyed
// on the control thread once no request holds them (collect_retired), so profile `destroy`
// and plugin `deinit` always run there.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <rapidjson/document.h>

#include "config/config.h"
#include "gateway/endpoint_health.h"
#include "gateway/liveness.h"
#include "gateway/policy.h"
#include "gateway/request_board.h"
#include "gateway/response_builder.h"
#include "gateway/stream_loop.h"
#include "gateway/upstream.h"
#include "gateway/warmup.h"
#include "plugin/plugin_manager.h"

#include "server/http_server.h"

namespace pulse::gateway {

// One endpoint of one model, in a snapshot.
struct EndpointRef {
    const config::Endpoint* cfg = nullptr;
    std::shared_ptr<EndpointHealth> health;  // shared across snapshots (keyed by URL)
    BackendInstance* backend = nullptr;      // plugin:// endpoints; owned by the Gateway
};

// One configured model, ready to serve.
struct ModelRuntime {
    const config::Model* cfg = nullptr;
    plugin::ComponentLease profile;  // lease on the profile's plugin generation
    void* instance = nullptr;        // the profile's per-model instance
    rapidjson::Document view;        // {id, upstream_model, context_window, sampling{...}} for the profile
    std::vector<EndpointRef> endpoints;
    ReasoningOutput reasoning = ReasoningOutput::summary;
    std::unique_ptr<Policy> policy;  // [models.X.policy], if any

    ModelRuntime() = default;
    ModelRuntime(const ModelRuntime&) = delete;
    ~ModelRuntime();
    // Endpoint indices in the order to try them for a request of conversation `key`
    // (conversation_key()): healthy ones first, each group in the model's routing order
    // (failover: config order; round_robin: rotating per request; sticky: by the key's
    // weighted rendezvous score, so a conversation always starts at the same endpoint and only
    // the conversations of an endpoint that is down move, each to its own second choice).
    // Last-resort endpoints are never in it (see last_resorts()).
    std::vector<size_t> order(std::string_view key) const;
    // The last-resort endpoints, healthy ones first, in config order.
    std::vector<size_t> last_resorts() const;
    // Whether some endpoint that is not a last resort is healthy now.
    bool regular_healthy() const;
    // sticky: where `key`'s conversation goes while every endpoint is healthy.
    size_t home(std::string_view key) const;
    mutable std::atomic<uint64_t> rotation{0};  // round_robin: requests routed so far
};

struct Snapshot {
    config::Config cfg;
    std::vector<std::unique_ptr<ModelRuntime>> models;
    uint64_t generation = 0;
    const ModelRuntime* find(std::string_view id) const;
};

// What one request may use of the gateway, and nothing more: its configuration snapshot, the
// shared services, and the two calls that report what a request learned about an endpoint.
class RequestContext {
public:
    virtual std::shared_ptr<const Snapshot> snapshot() const = 0;
    // The drain deadline passed: responses in flight end now.
    virtual bool cutting() const = 0;
    virtual RequestBoard& board() = 0;
    virtual PrefixStore& prefixes() = 0;
    virtual Warmer* warmer() = 0;  // null when warmup is off
    virtual Liveness* liveness() = 0;
    virtual StreamLoop& relay() = 0;
    virtual void endpoint_ok(const std::string& model, const EndpointRef& ep, bool real_request) = 0;
    virtual void endpoint_failed(const EndpointRef& ep, const std::string& why, bool real_request) = 0;

protected:
    ~RequestContext() = default;
};

class Gateway : private RequestContext {
public:
    Gateway(config::Config cfg, plugin::PluginManager& plugins);
    ~Gateway();

    // Every model's translation profile, policy and plugin:// endpoint must be provided by a
    // loaded plugin. Returns one message per missing component (empty = all present).
    static std::vector<std::string> check_components(const config::Config& cfg, const plugin::PluginManager& plugins);

    // Builds the first snapshot, loads warmup state, starts the health prober and the warmer
    // (control thread, before serving). Throws config::ConfigError when a plugin rejects its
    // options.
    void start();
    // Publishes a new snapshot for `cfg` (control thread). Throws config::ConfigError and keeps
    // the current snapshot when the new one cannot be built.
    void reload(config::Config cfg);
    // Destroys retired snapshots that no request holds any more (control thread).
    void collect_retired();
    // Stops background threads and saves warmup state (control thread, after the server).
    void stop();

    void handle(server::Exchange& ex);

    // What `POST /admin/reload` does (the CLI raises SIGHUP); unset = the route answers 501.
    // Set before start(); called on a request thread.
    void set_reload_hook(std::function<void()> hook) { reload_hook_ = std::move(hook); }

    // The outcome of the latest reload (SIGHUP, POST /admin/reload, a plugin directory change),
    // for the status page. Control thread.
    void note_reload(bool ok, std::string message);

    void set_draining(bool d) { draining_ = d; }
    // At the drain deadline: every response still in flight ends now with response.failed
    // (streaming) or a 503 (not yet answered), instead of a cut connection.
    void cut_streams();
    bool cutting() const override { return cutting_.load(); }
    int active_requests() const { return active_.load(); }
    std::shared_ptr<const Snapshot> snapshot() const override;

private:
    // RequestContext, for the requests this gateway serves.
    RequestBoard& board() override { return board_; }
    PrefixStore& prefixes() override { return *prefixes_; }
    Warmer* warmer() override { return warmer_.get(); }
    Liveness* liveness() override { return liveness_.get(); }
    StreamLoop& relay() override { return *relay_; }
    std::unique_ptr<Snapshot> build(config::Config cfg);
    void health(server::Exchange& ex);
    void status_json(server::Exchange& ex);
    void status_page(server::Exchange& ex);
    const char* write_state(rapidjson::Writer<rapidjson::StringBuffer>& w, const Snapshot& snap, bool live) const;
    void models(server::Exchange& ex);
    void responses(server::Exchange& ex);
    bool authorized(const server::Exchange& ex, const config::Config& cfg) const;
    void admin_reload(server::Exchange& ex);
    std::function<void()> reload_hook_;
    void probe_loop();
    void probe_once(const Snapshot& snap);
    // Record an endpoint's state change (from a probe or a request); starts a warmup on recovery.
    void endpoint_ok(const std::string& model, const EndpointRef& ep, bool real_request) override;
    void endpoint_failed(const EndpointRef& ep, const std::string& why, bool real_request) override;

    plugin::PluginManager& plugins_;
    config::Config initial_;

    mutable std::mutex snap_mutex_;
    std::shared_ptr<const Snapshot> current_;
    std::vector<std::shared_ptr<const Snapshot>> retired_;
    uint64_t generations_ = 0;

    std::mutex registry_mutex_;  // health_ and backends_ (grow only)
    std::map<std::string, std::shared_ptr<EndpointHealth>> health_;
    std::map<std::string, std::unique_ptr<BackendInstance>> backends_;

    std::unique_ptr<PrefixStore> prefixes_;
    std::unique_ptr<Warmer> warmer_;
    std::unique_ptr<Liveness> liveness_ = std::make_unique<Liveness>();  // outlives relay_: its streams ask it
    std::unique_ptr<StreamLoop> relay_;

    RequestBoard board_;
    const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
    struct Reload {
        int64_t at_ms;
        bool ok;
        std::string message;
    };
    mutable std::mutex reload_mutex_;
    std::optional<Reload> last_reload_;

    std::atomic<bool> draining_{false}, cutting_{false};
    std::atomic<int> active_{0};
    std::atomic<bool> stop_{false};
    std::mutex probe_mutex_;
    std::condition_variable probe_cv_;
    std::thread prober_;
};

}  // namespace pulse::gateway
