#include "gateway/status/status.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "common/metric_defs.h"
#include "common/metrics.h"
#include "gateway/protocol/http_util.h"
#include "gateway/snapshot.h"
#include "gateway/status/request_board.h"
#include "status_page.h"  // kStatusPage: status_page.html, generated at build time

namespace pulse::gateway {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

// Zero series for what the shipped alerts count (common/metric_defs.h), for every model and
// endpoint of `snap`: a counter that appeared at its first event would hide that event from
// increase(), and the alert on it would never fire.
void StatusReport::seed_alert_series(const Snapshot& snap) {
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
void StatusReport::publish_endpoint_gauges(const Snapshot& snap) {
    auto& reg = metrics::global();
    for (const auto& m : snap.models)
        for (const auto& e : m->endpoints) {
            const metrics::Labels l = {{"model", m->cfg->id}, {"endpoint", e.cfg->name}};
            reg.gauge(metrics::kEndpointUp.name, metrics::kEndpointUp.help, l).set(e.health->healthy() ? 1 : 0);
            reg.gauge(metrics::kEndpointInFlight.name, metrics::kEndpointInFlight.help, l).set(e.health->in_flight.load());
        }
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

const char* StatusReport::write_state(JsonWriter& w, const Snapshot& snap, bool live, bool draining, int active) const {
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
        if (m->cfg->demo) {
            w.Key("demo");
            w.Bool(true);
        }
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
    w.Int(active);
    w.Key("config_generation");
    w.Uint64(snap.generation);
    return status;
}

void StatusReport::health(server::Exchange& ex, const Snapshot& snap, bool draining, int active) const {
    rapidjson::StringBuffer b;
    JsonWriter w(b);
    w.StartObject();
    const char* status = write_state(w, snap, /*live=*/false, draining, active);
    w.EndObject();
    send_json(ex, std::string_view(status) == "ok" ? 200 : 503, {b.GetString(), b.GetSize()});
}

// What the status page polls: the /health state plus requests in flight and recent, rates and
// the last reload. Always 200 (the page shows a degraded gateway; /health is the probe).
void StatusReport::status_json(server::Exchange& ex, const Snapshot& snap, bool draining, int active) const {
    rapidjson::StringBuffer b;
    JsonWriter w(b);
    w.StartObject();
    w.Key("version");
    w.String(PULSE_VERSION);
    w.Key("now_ms");
    w.Int64(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
    w.Key("uptime_s");
    w.Int64(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_).count());
    write_state(w, snap, /*live=*/true, draining, active);
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

void StatusReport::status_page(server::Exchange& ex) {
    // Everything it needs is inline; the policy makes the browser refuse any other origin, so a
    // page that works here works offline and tells nobody that it was opened.
    ex.respond(200, "text/html; charset=utf-8", {reinterpret_cast<const char*>(kStatusPage), sizeof kStatusPage},
               {{"Cache-Control", "no-cache"},
                {"Content-Security-Policy",
                 "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
                 "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
                {"X-Content-Type-Options", "nosniff"}});
}

void StatusReport::note_reload(bool ok, std::string message) {
    std::lock_guard lock(reload_mutex_);
    last_reload_ = Reload{std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count(), ok,
                          std::move(message)};
}

}  // namespace pulse::gateway
