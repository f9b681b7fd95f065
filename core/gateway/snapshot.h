// The configuration as the gateway serves it: an immutable Snapshot per generation (the config
// plus one ModelRuntime per model: its translation profile's instance and lease, its policy, its
// endpoints with their shared health and in-process backends), and the builder that makes one
// from a config. Endpoint health and backend instances outlive snapshots: they are kept by
// URL (and options) across reloads, so a reload neither forgets what it knew of an endpoint
// nor restarts an engine.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <rapidjson/document.h>

#include "config/config.h"
#include "gateway/background/endpoint_health.h"
#include "gateway/protocol/response_builder.h"
#include "gateway/request/policy.h"
#include "gateway/upstream/upstream.h"
#include "plugin/plugin_manager.h"

namespace pulse::gateway {

// One endpoint of one model, in a snapshot.
struct EndpointRef {
    const config::Endpoint* cfg = nullptr;
    std::shared_ptr<EndpointHealth> health;  // shared across snapshots (keyed by URL)
    BackendInstance* backend = nullptr;      // plugin:// endpoints; owned by the Gateway
    std::string start_error;                 // a plugin:// endpoint that failed to start: why (backend is null)
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
    // The model list as GET /v1/models answers it (OpenAI's shape, plus context_window).
    std::string models_json() const;
};

class SnapshotBuilder {
public:
    explicit SnapshotBuilder(plugin::PluginManager& plugins) : plugins_(plugins) {}

    // Every model's translation profile, policy and plugin:// endpoint must be provided by a
    // loaded plugin. Returns one message per missing component (empty = all present).
    static std::vector<std::string> check_components(const config::Config& cfg, const plugin::PluginManager& plugins);
    // The runtimes of `cfg`, each profile instance created with its options. Throws
    // config::ConfigError when a plugin rejects its options or a component is missing.
    // Backends::skip (`pulse config check`): in-process backends are not started (that would
    // load their models); the snapshot is for validation only.
    enum class Backends { start, skip };
    std::unique_ptr<Snapshot> build(config::Config cfg, Backends backends = Backends::start);
    // Destroys the backend instances (at shutdown, after the last snapshot).
    void release_backends();

private:
    plugin::PluginManager& plugins_;
    uint64_t generations_ = 0;
    std::mutex registry_mutex_;  // health_ and backends_ (grow only)
    std::map<std::string, std::shared_ptr<EndpointHealth>> health_;
    std::map<std::string, std::unique_ptr<BackendInstance>> backends_;
};

}  // namespace pulse::gateway
