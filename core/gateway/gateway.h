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
#include <condition_variable>
#include <map>
#include <optional>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <rapidjson/document.h>

#include "common/wakeup.h"
#include "config/config.h"
#include "gateway/background/warmup.h"
#include "gateway/request/request_context.h"
#include "gateway/snapshot.h"
#include "gateway/status/request_board.h"
#include "gateway/status/status.h"
#include "gateway/upstream/liveness.h"
#include "gateway/upstream/stream_loop.h"
#include "plugin/plugin_manager.h"

#include "server/http_server.h"

namespace pulse::gateway {

class Gateway : private RequestContext {
public:
    Gateway(config::Config cfg, plugin::PluginManager& plugins);
    ~Gateway();

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
    void note_reload(bool ok, std::string message) { status_.note_reload(ok, std::move(message)); }

    void set_draining(bool d) { draining_ = d; }
    // At the drain deadline: every response still in flight ends now with response.failed
    // (streaming) or a 503 (not yet answered), instead of a cut connection.
    void cut_streams();
    bool cutting() const override { return cutting_.load(); }
    const Wakeup& cut_signal() const override { return cut_signal_; }
    int active_requests() const { return active_.load(); }
    // Sleeps until no Responses request is in flight (woken by the last one's end) or `until`;
    // true when none is.
    bool wait_idle(std::chrono::steady_clock::time_point until);
    std::shared_ptr<const Snapshot> snapshot() const override;

private:
    // RequestContext, for the requests this gateway serves.
    RequestBoard& board() override { return board_; }
    PrefixStore& prefixes() override { return *prefixes_; }
    Warmer* warmer() override { return warmer_.get(); }
    Liveness* liveness() override { return liveness_.get(); }
    StreamLoop& relay() override { return *relay_; }
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
    SnapshotBuilder builder_{plugins_};

    std::unique_ptr<PrefixStore> prefixes_;
    std::unique_ptr<Warmer> warmer_;
    std::unique_ptr<Liveness> liveness_ = std::make_unique<Liveness>();  // outlives relay_: its streams ask it
    std::unique_ptr<StreamLoop> relay_;

    RequestBoard board_;
    StatusReport status_{plugins_, board_};

    std::atomic<bool> draining_{false}, cutting_{false};
    Wakeup cut_signal_;  // signalled with cutting_, never cleared
    std::atomic<int> active_{0};
    std::mutex idle_mutex_;
    std::condition_variable idle_cv_;  // active_ fell to 0
    std::atomic<bool> stop_{false};
    std::mutex probe_mutex_;
    std::condition_variable probe_cv_;
    std::thread prober_;
};

}  // namespace pulse::gateway
