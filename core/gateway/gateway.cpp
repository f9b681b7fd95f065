#include "gateway/gateway.h"
#include "gateway/request/response_session.h"

#include <Poco/String.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"
#include "gateway/protocol/http_util.h"

namespace pulse::gateway {

Gateway::Gateway(config::Config cfg, plugin::PluginManager& plugins) : plugins_(plugins), initial_(std::move(cfg)) {}

Gateway::~Gateway() { stop(); }

std::shared_ptr<const Snapshot> Gateway::snapshot() const {
    std::lock_guard lock(snap_mutex_);
    return current_;
}

void Gateway::start() {
    std::shared_ptr<const Snapshot> snap = builder_.build(initial_);
    StatusReport::seed_alert_series(*snap);
    {
        std::lock_guard lock(snap_mutex_);
        current_ = snap;
    }
    const auto& w = snap->cfg.warmup;
    prefixes_ = std::make_unique<PrefixStore>(w.enabled ? static_cast<size_t>(w.max_prefixes) : 0, 64u << 20);
    if (w.enabled && !w.state_file.empty()) prefixes_->load(w.state_file);
    if (w.enabled) warmer_ = std::make_unique<Warmer>(*prefixes_, snap->cfg.upstream, w.slot_save_interval_s, w.quiet_s);
    relay_ = std::make_unique<StreamLoop>(static_cast<int>(snap->cfg.server.stream_threads));
    prober_ = std::thread([this] { probe_loop(); });
}

void Gateway::reload(config::Config cfg) {
    auto problems = SnapshotBuilder::check_components(cfg, plugins_);
    if (!problems.empty()) {
        std::string all;
        for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
        throw config::ConfigError(all);
    }
    auto old = snapshot();
    if (cfg.server.listen.host != old->cfg.server.listen.host || cfg.server.listen.port != old->cfg.server.listen.port ||
        cfg.server.max_streams != old->cfg.server.max_streams || cfg.server.stream_threads != old->cfg.server.stream_threads)
        log::warn("reload", "server.listen, server.max_streams and server.stream_threads take effect only after a restart");
    std::shared_ptr<const Snapshot> next = builder_.build(std::move(cfg));  // throws: the old snapshot keeps serving
    StatusReport::seed_alert_series(*next);
    std::lock_guard lock(snap_mutex_);
    retired_.push_back(current_);
    current_ = next;
    log::info("reload", "configuration generation " + std::to_string(next->generation) + " is serving (" +
                            std::to_string(next->models.size()) + " models)");
}

bool Gateway::wait_idle(std::chrono::steady_clock::time_point until) {
    std::unique_lock lock(idle_mutex_);
    return idle_cv_.wait_until(lock, until, [&] { return active_.load() == 0; });
}

void Gateway::cut_streams() {
    cutting_ = true;
    cut_signal_.signal();
    if (relay_) relay_->cut_all();
}

void Gateway::collect_retired() {
    std::vector<std::shared_ptr<const Snapshot>> done;
    {
        std::lock_guard lock(snap_mutex_);
        auto it = std::partition(retired_.begin(), retired_.end(), [](const auto& s) { return s.use_count() > 1; });
        done.assign(std::make_move_iterator(it), std::make_move_iterator(retired_.end()));
        retired_.erase(it, retired_.end());
    }
    for (const auto& s : done) log::debug("reload", "configuration generation " + std::to_string(s->generation) + " retired");
    // `done` goes out of scope here, on the control thread: profile instances are destroyed
    // and their plugin generations' leases released.
}

void Gateway::stop() {
    if (stop_.exchange(true)) return;
    probe_cv_.notify_all();
    if (prober_.joinable()) prober_.join();
    if (warmer_) warmer_->stop();
    relay_.reset();  // after the server: no request thread waits on it any more
    auto snap = snapshot();
    if (snap && prefixes_ && !snap->cfg.warmup.state_file.empty() && prefixes_->dirty()) prefixes_->save(snap->cfg.warmup.state_file);
    snap.reset();
    // The models go last, and now: their profile and backend instances are destroyed (streams
    // were closed with their requests) before the plugins' deinit runs (PluginManager::shutdown),
    // as the SDK promises; a destroy after deinit would use what deinit freed.
    std::shared_ptr<const Snapshot> last;
    std::vector<std::shared_ptr<const Snapshot>> retired;
    {
        std::lock_guard lock(snap_mutex_);
        last = std::move(current_);
        retired = std::move(retired_);
        retired_.clear();
    }
    last.reset();
    retired.clear();
    // Then the backend instances the models pointed at (shared by every snapshot).
    builder_.release_backends();
}

void Gateway::endpoint_ok(const std::string& model, const EndpointRef& ep, bool real_request) {
    if (!ep.health->mark_healthy(real_request)) return;
    log::info("health", "endpoint " + ep.cfg->name + " (" + ep.cfg->url + ") is healthy again");
    if (!warmer_) return;
    // Sticky routing: replay only the conversations that will now start at this endpoint (their
    // home, or their next choice while their home is down); the others are warm elsewhere.
    std::function<bool(const std::string&)> wanted;
    auto snap = snapshot();
    const ModelRuntime* rt = snap ? snap->find(model) : nullptr;
    if (!rt) return;  // a model a reload just removed
    if (rt->cfg->routing == config::Model::Routing::sticky)
        for (size_t i = 0; i < rt->endpoints.size(); ++i)
            if (rt->endpoints[i].health == ep.health)
                wanted = [snap, rt, i](const std::string& key) { return rt->order(key).front() == i; };
    warmer_->recovered(model, *ep.cfg, ep.health, BackendDialect(*rt, snap), std::move(wanted));
}

void Gateway::endpoint_failed(const EndpointRef& ep, const std::string& why, bool real_request) {
    const bool was_run = ep.health->request_failures() >= EndpointHealth::kFailureRun;
    if (ep.health->mark_unhealthy(why, real_request))
        log::warn("health", "endpoint " + ep.cfg->name + " (" + ep.cfg->url + ") is " + (why.rfind("loading", 0) == 0 ? "" : "down: ") + why);
    if (real_request && !was_run && ep.health->request_failures() >= EndpointHealth::kFailureRun)
        log::warn("health", "endpoint " + ep.cfg->name + " failed " + std::to_string(EndpointHealth::kFailureRun) +
                                " requests in a row: it stays down until a request succeeds (its probe answering is not enough)");
}

void Gateway::probe_once(const Snapshot& snap) {
    struct Result {
        std::string why;   // "" ready, else why not
        std::string body;  // an HTTP endpoint's GET /models answer
    };
    std::map<std::string, Result> result;  // by health key
    for (const auto& m : snap.models)
        for (const auto& ep : m->endpoints) {
            if (!ep.start_error.empty()) {  // no instance to ask: it stays down with why
                endpoint_failed(ep, ep.start_error, false);
                continue;
            }
            auto it = result.find(ep.health->key());
            if (it == result.end()) {
                std::string detail;
                Result r;
                // An endpoint several models share is probed once, its answer read by the first
                // model's profile.
                r.why = ep.backend ? ep.backend->health(&detail)
                                   : probe_http(*ep.cfg, snap.cfg.upstream.connect_timeout_s, BackendDialect(*m, nullptr), &r.body);
                it = result.emplace(ep.health->key(), std::move(r)).first;
                if (ep.backend) ep.health->set_detail(std::move(detail));
            }
            if (!it->second.why.empty()) {
                endpoint_failed(ep, it->second.why, false);
                continue;
            }
            // A misconfigured endpoint (it answered 404 for the model) was answering probes all
            // along: it is back only once its model list names the model. A server that serves
            // only what it lists (vLLM) and does not list the model is misconfigured before any
            // request finds out.
            const auto ids = ep.backend ? std::vector<std::string>{} : listed_models(it->second.body);
            const bool listed = std::find(ids.begin(), ids.end(), m->cfg->upstream_model) != ids.end();
            if (!ep.backend && !listed && !ep.health->misconfigured() && serves_only_listed(it->second.body)) {
                std::string names;
                for (const auto& i : ids) names += (names.empty() ? "'" : ", '") + i + "'";
                ep.health->set_misconfigured(true);
                endpoint_failed(ep, "misconfigured: the server serves " + names + ", not '" + m->cfg->upstream_model +
                                        "' (start vLLM with --served-model-name " + m->cfg->upstream_model + ", or set upstream_model)", false);
                continue;
            }
            if (ep.health->misconfigured() && !ep.backend) {
                if (!listed) continue;
                ep.health->set_misconfigured(false);
                log::info("health", "endpoint " + ep.cfg->name + " now lists model '" + m->cfg->upstream_model + "'");
            }
            endpoint_ok(m->cfg->id, ep, false);
        }
}

void Gateway::probe_loop() {
    for (;;) {
        auto snap = snapshot();
        probe_once(*snap);
        if (prefixes_ && !snap->cfg.warmup.state_file.empty() && prefixes_->dirty()) prefixes_->save(snap->cfg.warmup.state_file);
        std::unique_lock lock(probe_mutex_);
        auto wait = std::chrono::duration<double>(snap->cfg.upstream.health_interval_s);
        if (probe_cv_.wait_for(lock, wait, [&] { return stop_.load(); })) return;
    }
}

bool Gateway::authorized(const server::Exchange& ex, const config::Config& cfg) const {
    const std::string& key = cfg.server.api_key;
    if (key.empty()) return true;
    const std::string auth = ex.request().get("Authorization", "");  // by value: get() returns the default by reference
    // credentials = auth-scheme 1*SP token68 (RFC 9110 §11.4); the scheme name is
    // case-insensitive (§11.1): "bearer  KEY" is the same credential as "Bearer KEY".
    constexpr std::string_view kBearer = "bearer";
    const bool bearer = auth.size() > kBearer.size() && Poco::icompare(auth.substr(0, kBearer.size()), std::string(kBearer)) == 0 &&
                        auth[kBearer.size()] == ' ';
    std::string_view given = bearer ? std::string_view(auth).substr(kBearer.size()) : std::string_view();
    while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
    // Time depends on the configured key's length only: every byte of it is compared, whatever
    // the client sent and wherever the first difference is.
    unsigned char diff = given.size() == key.size() ? 0 : 1;
    for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>((i < given.size() ? given[i] : 0) ^ key[i]);
    return diff == 0;
}

void Gateway::handle(server::Exchange& ex) {
    const auto& req = ex.request();
    std::string path = req.getURI();
    if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
    const std::string& method = req.getMethod();
    auto snap = snapshot();
    // The page itself holds no data (what it shows comes from /status.json): served to anyone, so
    // that a browser, which cannot send an API key on navigation, can open it and ask for one.
    if ((path == "/" || path == "/status") && (method == "GET" || method == "HEAD")) return StatusReport::status_page(ex);
    bool status_path = path == "/health" || path == "/metrics" || path == "/status.json";
    if ((!status_path || snap->cfg.server.protect_status) && !authorized(ex, snap->cfg)) {
        metrics::global().counter("pulse_unauthorized_total", "requests refused with 401 (missing or wrong API key)").add();
        return send_json(ex, 401, error_body("invalid_request_error", "missing or wrong API key (send Authorization: Bearer KEY)", {}, "invalid_api_key"),
                         {{"WWW-Authenticate", "Bearer realm=\"pulse-gateway\""}});
    }
    if (path == "/health" && (method == "GET" || method == "HEAD")) return status_.health(ex, *snap, draining_.load(), active_.load());
    if (path == "/status.json" && method == "GET") return status_.status_json(ex, *snap, draining_.load(), active_.load());
    if (path == "/metrics" && method == "GET") {
        StatusReport::publish_endpoint_gauges(*snap);
        if (req.get("Accept", "").find("application/json") != std::string::npos) return send_json(ex, 200, metrics::global().json());
        return ex.respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics::global().prometheus());
    }
    if (path == "/v1/models" && method == "GET") return models(ex);
    if (path == "/admin/reload") return admin_reload(ex);
    if (path == "/v1/responses" || path == "/responses") {
        if (method != "POST") return send_json(ex, 405, error_body("invalid_request_error", "use POST for " + path), {{"Allow", "POST"}});
        return responses(ex);
    }
    send_error(ex, 404, "invalid_request_error", "no route for " + method + " " + path, {}, "not_found");
}

// Same effect as SIGHUP, for tools that cannot signal the process (`pulse model up` on another
// user account, or through systemd's sandbox). Loopback clients only, API key as for /v1/*.
void Gateway::admin_reload(server::Exchange& ex) {
    if (ex.request().getMethod() != "POST")
        return send_json(ex, 405, error_body("invalid_request_error", "use POST for /admin/reload"), {{"Allow", "POST"}});
    const auto host = ex.peer().host();
    const bool loopback = host.isLoopback() || host.toString().rfind("::ffff:127.", 0) == 0;
    if (!loopback) return send_error(ex, 403, "invalid_request_error", "/admin/reload is only served to loopback clients", {}, "forbidden");
    if (!reload_hook_) return send_error(ex, 501, "server_error", "reload is not available in this process", {}, "not_implemented");
    reload_hook_();
    send_json(ex, 202, R"({"status":"reload requested"})");
}

void Gateway::models(server::Exchange& ex) { send_json(ex, 200, snapshot()->models_json()); }

void Gateway::responses(server::Exchange& ex) {
    struct Active {
        Gateway& gw;
        metrics::Gauge& g = metrics::global().gauge("pulse_active_requests", "Responses requests in flight");
        explicit Active(Gateway& w) : gw(w) {
            gw.active_.fetch_add(1);
            g.add(1);
        }
        ~Active() {
            g.add(-1);
            if (gw.active_.fetch_sub(1) != 1) return;
            std::lock_guard lock(gw.idle_mutex_);  // the last one: wake a drain waiting for it
            gw.idle_cv_.notify_all();
        }
    } active(*this);
    auto snap = snapshot();
    if (draining_) {
        ex.close_after();
        return send_error(ex, 503, "server_error", "the gateway is shutting down; retry shortly", {}, "draining", 1);
    }
    if (active_.load() > snap->cfg.server.max_streams) {
        // The server keeps spare workers so an over-capacity request still gets a clear answer.
        metrics::global().counter(metrics::kCapacityRejections.name, metrics::kCapacityRejections.help).add();
        return send_error(ex, 503, "server_error",
                          "the gateway is at capacity (" + std::to_string(snap->cfg.server.max_streams) +
                              " requests in flight, server.max_streams); retry shortly",
                          {}, "at_capacity", 1);
    }
    serve_response(*this, ex);
}

}  // namespace pulse::gateway
