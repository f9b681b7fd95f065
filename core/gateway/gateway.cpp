#include "gateway/gateway.h"
#include "gateway/response_session.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <Poco/String.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"
#include "gateway/http_util.h"
#include "status_page.h"  // kStatusPage: status_page.html, generated at build time

namespace pulse::gateway {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

ModelRuntime::~ModelRuntime() {
    if (instance && profile && profile->registration.translation.destroy) profile->registration.translation.destroy(instance);
}

namespace {

// Weighted rendezvous ("highest random weight") score of endpoint `name` for `key`: every
// gateway computes the same ranking with no shared state, an endpoint's weight is its expected
// share of keys, and removing an endpoint moves only the keys it ranked first.
double rendezvous_score(std::string_view key, std::string_view name, double weight) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over key, a separator, name
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
    for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
    h ^= h >> 30;  // splitmix64's finalizer: FNV's low bits alone are not uniform enough
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    const double u = (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0;  // (0, 1)
    return weight / -std::log(u);
}

}  // namespace

std::vector<size_t> ModelRuntime::order(std::string_view key) const {
    std::vector<size_t> all;
    for (size_t i = 0; i < endpoints.size(); ++i)
        if (!endpoints[i].cfg->last_resort) all.push_back(i);
    if (cfg->routing == config::Model::Routing::sticky) {
        std::vector<double> score(all.size());
        for (size_t i = 0; i < all.size(); ++i) score[i] = rendezvous_score(key, endpoints[i].cfg->name, endpoints[i].cfg->weight);
        std::stable_sort(all.begin(), all.end(), [&](size_t a, size_t b) { return score[a] > score[b]; });
    } else if (cfg->routing == config::Model::Routing::round_robin && !all.empty()) {
        std::rotate(all.begin(), all.begin() + static_cast<ptrdiff_t>(rotation.fetch_add(1) % all.size()), all.end());
    }
    std::stable_partition(all.begin(), all.end(), [&](size_t i) { return endpoints[i].health->healthy(); });
    return all;
}

std::vector<size_t> ModelRuntime::last_resorts() const {
    std::vector<size_t> out;
    for (size_t i = 0; i < endpoints.size(); ++i)
        if (endpoints[i].cfg->last_resort) out.push_back(i);
    std::stable_partition(out.begin(), out.end(), [&](size_t i) { return endpoints[i].health->healthy(); });
    return out;
}

bool ModelRuntime::regular_healthy() const {
    return std::any_of(endpoints.begin(), endpoints.end(), [](const EndpointRef& e) { return !e.cfg->last_resort && e.health->healthy(); });
}

size_t ModelRuntime::home(std::string_view key) const {
    size_t best = 0;
    double top = -1;
    for (size_t i = 0; i < endpoints.size(); ++i) {
        if (endpoints[i].cfg->last_resort) continue;
        if (double s = rendezvous_score(key, endpoints[i].cfg->name, endpoints[i].cfg->weight); s > top) {
            top = s;
            best = i;
        }
    }
    return best;
}

const ModelRuntime* Snapshot::find(std::string_view id) const {
    for (const auto& m : models)
        if (m->cfg->id == id) return m.get();
    return nullptr;
}

Gateway::Gateway(config::Config cfg, plugin::PluginManager& plugins) : plugins_(plugins), initial_(std::move(cfg)) {}

Gateway::~Gateway() { stop(); }

std::shared_ptr<const Snapshot> Gateway::snapshot() const {
    std::lock_guard lock(snap_mutex_);
    return current_;
}

std::vector<std::string> Gateway::check_components(const config::Config& cfg, const plugin::PluginManager& plugins_) {
    std::vector<std::string> out;
    auto list = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
        return s.empty() ? std::string("none") : s;
    };
    for (const auto& m : cfg.models) {
        if (!plugins_.translation(m.profile))
            out.push_back("model '" + m.id + "': translation profile '" + m.profile +
                          "' is not provided by any loaded plugin (loaded profiles: " +
                          list(plugins_.component_names(PULSE_KIND_TRANSLATION)) + ")");
        if (m.policy && !plugins_.policy(m.policy->name))
            out.push_back("model '" + m.id + "': policy '" + m.policy->name + "' is not provided by any loaded plugin (loaded policies: " +
                          list(plugins_.component_names(PULSE_KIND_POLICY)) + ")");
        for (const auto& e : m.endpoints)
            if (e.is_plugin() && !plugins_.backend(e.plugin_name()))
                out.push_back("model '" + m.id + "', endpoint '" + e.name + "': backend '" + e.plugin_name() +
                              "' is not provided by any loaded plugin (loaded backends: " +
                              list(plugins_.component_names(PULSE_KIND_BACKEND)) + ")");
    }
    return out;
}

std::unique_ptr<Snapshot> Gateway::build(config::Config cfg) {
    auto snap = std::make_unique<Snapshot>();
    snap->cfg = std::move(cfg);
    const std::string file = snap->cfg.source.empty() ? std::string("config") : snap->cfg.source.string();
    for (const auto& m : snap->cfg.models) {
        auto rt = std::make_unique<ModelRuntime>();
        rt->cfg = &m;
        rt->profile = plugins_.translation(m.profile);
        if (!rt->profile) throw config::ConfigError(file + ": model '" + m.id + "': translation profile '" + m.profile + "' is not loaded");
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
            throw config::ConfigError(file + ": models." + m.id + ".profile_options: " + host::call_error(call, rc, rt->profile->plugin_id()));
        if (m.policy) {
            auto lease = plugins_.policy(m.policy->name);
            if (!lease) throw config::ConfigError(file + ": model '" + m.id + "': policy '" + m.policy->name + "' is not loaded");
            rt->policy = std::make_unique<Policy>(lease, *m.policy, file + ": models." + m.id + ".policy");
        }

        std::lock_guard lock(registry_mutex_);
        for (const auto& e : m.endpoints) {
            EndpointRef ref;
            ref.cfg = &e;
            std::string key = e.is_plugin() ? e.url + "#" + e.options_json : e.url;
            auto& h = health_[key];
            if (!h) h = std::make_shared<EndpointHealth>(key);
            ref.health = h;
            if (e.is_plugin()) {
                auto& b = backends_[key];
                if (!b) {
                    auto lease = plugins_.backend(e.plugin_name());
                    if (!lease) throw config::ConfigError(file + ": model '" + m.id + "': backend '" + e.plugin_name() + "' is not loaded");
                    try {
                        b = std::make_unique<BackendInstance>(lease, e.options_json);
                    } catch (const std::exception& ex) {
                        throw config::ConfigError(file + ": models." + m.id + " endpoint '" + e.name + "': " + ex.what());
                    }
                }
                ref.backend = b.get();
            }
            rt->endpoints.push_back(std::move(ref));
        }
        snap->models.push_back(std::move(rt));
    }
    snap->generation = ++generations_;
    return snap;
}

// Zero series for what the shipped alerts count (common/metric_defs.h), for every model and
// endpoint of `snap`: a counter that appeared at its first event would hide that event from
// increase(), and the alert on it would never fire.
static void seed_alert_series(const Snapshot& snap) {
    auto& reg = metrics::global();
    reg.counter(metrics::kCapacityRejections.name, metrics::kCapacityRejections.help);
    reg.counter(metrics::kConfigReloadFailures.name, metrics::kConfigReloadFailures.help);
    reg.counter(metrics::kPluginReloadFailures.name, metrics::kPluginReloadFailures.help);
    for (const auto& m : snap.models) {
        const std::string& id = m->cfg->id;
        reg.counter(metrics::kRequests.name, metrics::kRequests.help, {{"model", id}, {"endpoint", "-"}, {"outcome", "unavailable"}});
        reg.counter(metrics::kFailovers.name, metrics::kFailovers.help, {{"model", id}});
        reg.counter(metrics::kRetries.name, metrics::kRetries.help, {{"model", id}});
        reg.histogram(metrics::kTtft.name, metrics::kTtft.help, {{"model", id}});
        for (const auto& e : m->endpoints) reg.counter(metrics::kResumed.name, metrics::kResumed.help, {{"model", id}, {"endpoint", e.cfg->name}});
        if (m->policy)
            for (const char* outcome : {"error", "timeout", "invalid"})
                reg.counter(metrics::kPolicyDecisions.name, metrics::kPolicyDecisions.help,
                            {{"model", id}, {"policy", m->policy->component()}, {"outcome", outcome}});
    }
}

// Endpoint state as gauges, read at each scrape: always what /health says now.
static void publish_endpoint_gauges(const Snapshot& snap) {
    auto& reg = metrics::global();
    for (const auto& m : snap.models)
        for (const auto& e : m->endpoints) {
            const metrics::Labels l = {{"model", m->cfg->id}, {"endpoint", e.cfg->name}};
            reg.gauge(metrics::kEndpointUp.name, metrics::kEndpointUp.help, l).set(e.health->healthy() ? 1 : 0);
            reg.gauge(metrics::kEndpointInFlight.name, metrics::kEndpointInFlight.help, l).set(e.health->in_flight.load());
        }
}

void Gateway::start() {
    std::shared_ptr<const Snapshot> snap = build(initial_);
    seed_alert_series(*snap);
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
    auto problems = check_components(cfg, plugins_);
    if (!problems.empty()) {
        std::string all;
        for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
        throw config::ConfigError(all);
    }
    auto old = snapshot();
    if (cfg.server.listen.host != old->cfg.server.listen.host || cfg.server.listen.port != old->cfg.server.listen.port ||
        cfg.server.max_streams != old->cfg.server.max_streams || cfg.server.stream_threads != old->cfg.server.stream_threads)
        log::warn("reload", "server.listen, server.max_streams and server.stream_threads take effect only after a restart");
    std::shared_ptr<const Snapshot> next = build(std::move(cfg));  // throws: the old snapshot keeps serving
    seed_alert_series(*next);
    std::lock_guard lock(snap_mutex_);
    retired_.push_back(current_);
    current_ = next;
    log::info("reload", "configuration generation " + std::to_string(next->generation) + " is serving (" +
                            std::to_string(next->models.size()) + " models)");
}

void Gateway::cut_streams() {
    cutting_ = true;
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
    std::map<std::string, std::unique_ptr<BackendInstance>> backends;
    {
        std::lock_guard lock(registry_mutex_);
        backends.swap(backends_);
    }
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
    std::map<std::string, std::string> result;  // health key -> "" or why not
    for (const auto& m : snap.models)
        for (const auto& ep : m->endpoints) {
            auto it = result.find(ep.health->key());
            if (it == result.end()) {
                std::string detail;
                // An endpoint several models share is probed once, its answer read by the first
                // model's profile.
                it = result.emplace(ep.health->key(), ep.backend ? ep.backend->health(&detail)
                                                                 : probe_http(*ep.cfg, snap.cfg.upstream.connect_timeout_s, BackendDialect(*m, nullptr)))
                         .first;
                if (ep.backend) ep.health->set_detail(std::move(detail));
            }
            if (it->second.empty()) endpoint_ok(m->cfg->id, ep, false);
            else endpoint_failed(ep, it->second, false);
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
    // The scheme name is case-insensitive (RFC 9110 §11.1): "bearer KEY" is the same credential.
    constexpr std::string_view kBearer = "bearer ";
    const bool bearer = auth.size() >= kBearer.size() && Poco::icompare(auth.substr(0, kBearer.size()), std::string(kBearer)) == 0;
    // Time depends on the configured key's length only: every byte of it is compared, whatever
    // the client sent and wherever the first difference is.
    const std::string_view given = bearer ? std::string_view(auth).substr(kBearer.size()) : std::string_view();
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
    if ((path == "/" || path == "/status") && (method == "GET" || method == "HEAD")) return status_page(ex);
    bool status_path = path == "/health" || path == "/metrics" || path == "/status.json";
    if ((!status_path || snap->cfg.server.protect_status) && !authorized(ex, snap->cfg)) {
        metrics::global().counter("pulse_unauthorized_total", "requests refused with 401 (missing or wrong API key)").add();
        return send_error(ex, 401, "invalid_request_error", "missing or wrong API key (send Authorization: Bearer KEY)", {}, "invalid_api_key");
    }
    if (path == "/health" && (method == "GET" || method == "HEAD")) return health(ex);
    if (path == "/status.json" && method == "GET") return status_json(ex);
    if (path == "/metrics" && method == "GET") {
        publish_endpoint_gauges(*snap);
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

// The state /health and /status.json share: models with their endpoints, plugins, status.
// Returns the overall status ("ok", "degraded", "draining").
namespace {

// One endpoint of /health and /status.json; true when it is healthy.
bool write_endpoint(JsonWriter& w, const EndpointRef& e, bool live) {
    const bool ok = e.health->healthy();
    w.StartObject();
    w.Key("name");
    w.String(e.cfg->name.c_str());
    w.Key("url");
    w.String(e.cfg->url.c_str());
    w.Key("state");
    w.String(ok ? "healthy" : e.health->last_error().rfind("loading", 0) == 0 ? "loading" : "down");
    w.Key("for_s");
    w.Double(static_cast<double>(static_cast<int64_t>(e.health->seconds_in_state() * 10)) / 10);
    w.Key("in_flight");
    w.Int(e.health->in_flight.load());
    if (live && e.cfg->last_resort) {
        w.Key("last_resort");
        w.Bool(true);
    }
    if (!ok) {
        w.Key("last_error");
        w.String(e.health->last_error().c_str());
    }
    if (std::string d = e.health->detail(); !d.empty()) {  // an in-process backend's own report
        w.Key("backend");
        w.RawValue(d.c_str(), d.size(), rapidjson::kObjectType);
    }
    w.EndObject();
    return ok;
}

}  // namespace

const char* Gateway::write_state(JsonWriter& w, const Snapshot& snap, bool live) const {
    bool draining = draining_.load();
    bool all_models_served = true;
    w.Key("models");
    w.StartArray();
    for (const auto& m : snap.models) {
        bool any = false;
        int in_flight = 0;
        w.StartObject();
        w.Key("id");
        w.String(m->cfg->id.c_str());
        w.Key("profile");
        w.String(m->cfg->profile.c_str());
        w.Key("profile_plugin");
        w.String(m->profile->plugin_id().c_str());
        w.Key("profile_generation");
        w.Uint64(m->profile->generation->ctx.generation);
        w.Key("endpoints");
        w.StartArray();
        for (const auto& e : m->endpoints) {
            any = write_endpoint(w, e, live) || any;
            in_flight += e.health->in_flight.load();
        }
        w.EndArray();
        if (live) {
            w.Key("in_flight");
            w.Int(in_flight);
        }
        w.Key("status");
        w.String(any ? "ok" : "degraded");
        w.EndObject();
        all_models_served = all_models_served && any;
    }
    w.EndArray();
    w.Key("plugins");
    w.StartArray();
    for (const auto& s : plugins_.status_snapshot()) {
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
        if (!s.reload_refused.empty()) {  // `version` above is the one still serving
            w.Key("reload_refused");
            w.String(s.reload_refused.c_str());
        }
        w.EndObject();
    }
    w.EndArray();
    const char* status = draining ? "draining" : all_models_served ? "ok" : "degraded";
    w.Key("status");
    w.String(status);
    w.Key("active_requests");
    w.Int(active_.load());
    w.Key("config_generation");
    w.Uint64(snap.generation);
    return status;
}

void Gateway::health(server::Exchange& ex) {
    auto snap = snapshot();
    rapidjson::StringBuffer b;
    JsonWriter w(b);
    w.StartObject();
    const char* status = write_state(w, *snap, /*live=*/false);
    w.EndObject();
    send_json(ex, std::string_view(status) == "ok" ? 200 : 503, {b.GetString(), b.GetSize()});
}

// What the status page polls: the /health state plus requests in flight and recent, rates and
// the last reload. Always 200 (the page shows a degraded gateway; /health is the probe).
void Gateway::status_json(server::Exchange& ex) {
    auto snap = snapshot();
    rapidjson::StringBuffer b;
    JsonWriter w(b);
    w.StartObject();
    w.Key("version");
    w.String(PULSE_VERSION);
    w.Key("now_ms");
    w.Int64(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
    w.Key("uptime_s");
    w.Int64(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_).count());
    write_state(w, *snap, /*live=*/true);
    {
        std::lock_guard lock(reload_mutex_);
        w.Key("last_reload");
        if (!last_reload_) {
            w.Null();
        } else {
            w.StartObject();
            w.Key("at_ms");
            w.Int64(last_reload_->at_ms);
            w.Key("ok");
            w.Bool(last_reload_->ok);
            w.Key("message");
            w.String(last_reload_->message.c_str());
            w.EndObject();
        }
    }
    board_.write(w);
    w.EndObject();
    ex.respond(200, "application/json", {b.GetString(), b.GetSize()}, {{"Cache-Control", "no-store"}});
}

void Gateway::status_page(server::Exchange& ex) {
    // Everything it needs is inline; the policy makes the browser refuse any other origin, so a
    // page that works here works offline and tells nobody that it was opened.
    ex.respond(200, "text/html; charset=utf-8", {reinterpret_cast<const char*>(kStatusPage), sizeof kStatusPage},
               {{"Cache-Control", "no-cache"},
                {"Content-Security-Policy",
                 "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
                 "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
                {"X-Content-Type-Options", "nosniff"}});
}

void Gateway::note_reload(bool ok, std::string message) {
    std::lock_guard lock(reload_mutex_);
    last_reload_ = Reload{std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count(), ok,
                          std::move(message)};
}

void Gateway::models(server::Exchange& ex) {
    auto snap = snapshot();
    rapidjson::StringBuffer b;
    JsonWriter w(b);
    w.StartObject();
    w.Key("object");
    w.String("list");
    w.Key("data");
    w.StartArray();
    for (const auto& m : snap->models) {
        w.StartObject();
        w.Key("id");
        w.String(m->cfg->id.c_str());
        w.Key("object");
        w.String("model");
        w.Key("created");
        w.Int64(0);
        w.Key("owned_by");
        w.String("pulse");
        if (m->cfg->context_window > 0) {
            w.Key("context_window");
            w.Int64(m->cfg->context_window);
        }
        w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    send_json(ex, 200, {b.GetString(), b.GetSize()});
}

void Gateway::responses(server::Exchange& ex) {
    struct Active {
        std::atomic<int>& n;
        metrics::Gauge& g = metrics::global().gauge("pulse_active_requests", "Responses requests in flight");
        explicit Active(std::atomic<int>& a) : n(a) {
            n.fetch_add(1);
            g.add(1);
        }
        ~Active() {
            n.fetch_sub(1);
            g.add(-1);
        }
    } active(active_);
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
