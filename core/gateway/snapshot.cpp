#include "gateway/snapshot.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cmath>

#include <pulse/plugin.hpp>

#include "common/log.h"
#include "plugin/host_api.h"

namespace pulse::gateway {

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

std::vector<std::string> SnapshotBuilder::check_components(const config::Config& cfg, const plugin::PluginManager& plugins_) {
    std::vector<std::string> out;
    auto list = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
        return s.empty() ? std::string("none") : s;
    };
    for (const auto& m : cfg.models) {
        if (!plugins_.translation(m.profile))
            out.push_back("model '" + m.id + "': translation profile '" + m.profile + "'" +
                          pulse::did_you_mean(m.profile, plugins_.component_names(PULSE_KIND_TRANSLATION)) +
                          " is not provided by any loaded plugin (loaded profiles: " +
                          list(plugins_.component_names(PULSE_KIND_TRANSLATION)) + ")");
        if (m.policy && !plugins_.policy(m.policy->name))
            out.push_back("model '" + m.id + "': policy '" + m.policy->name + "'" + pulse::did_you_mean(m.policy->name, plugins_.component_names(PULSE_KIND_POLICY)) + " is not provided by any loaded plugin (loaded policies: " +
                          list(plugins_.component_names(PULSE_KIND_POLICY)) + ")");
        for (const auto& e : m.endpoints)
            if (e.is_plugin() && !plugins_.backend(e.plugin_name()))
                out.push_back("model '" + m.id + "', endpoint '" + e.name + "': backend '" + e.plugin_name() + "'" +
                              pulse::did_you_mean(e.plugin_name(), plugins_.component_names(PULSE_KIND_BACKEND)) + " is not provided by any loaded plugin (loaded backends: " +
                              list(plugins_.component_names(PULSE_KIND_BACKEND)) + ")");
    }
    return out;
}

namespace {

// The model as its profile sees it: id, upstream name, window, sampling defaults.
void model_view(const config::Model& m, rapidjson::Document& v) {
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
}

}  // namespace

std::unique_ptr<Snapshot> SnapshotBuilder::build(config::Config cfg, Backends backends) {
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
        model_view(m, rt->view);

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
            if (e.is_plugin() && backends == Backends::start) {
                auto& b = backends_[key];
                if (!b) {
                    auto lease = plugins_.backend(e.plugin_name());
                    if (!lease) throw config::ConfigError(file + ": model '" + m.id + "': backend '" + e.plugin_name() + "' is not loaded");
                    try {
                        b = std::make_unique<BackendInstance>(lease, e.options_json);
                        h->set_misconfigured(false);  // it starts now (an earlier start may have failed): its probe brings it back
                    } catch (const BackendStartError& ex) {
                        if (ex.status == PULSE_E_INVALID_ARGUMENT) throw config::ConfigError(file + ": models." + m.id + " endpoint '" + e.name + "': " + ex.what());
                        // It cannot start now (its model file is missing): down with the reason,
                        // out of the rounds (endpoint_health.h); the next reload tries again.
                        backends_.erase(key);
                        ref.start_error = std::string("failed to start: ") + ex.what();
                        log::error("serve", "model '" + m.id + "', endpoint '" + e.name + "': " + ref.start_error);
                        h->set_misconfigured(true);
                        h->mark_unhealthy(ref.start_error, false);
                    }
                }
                if (auto it = backends_.find(key); it != backends_.end()) ref.backend = it->second.get();
            }
            rt->endpoints.push_back(std::move(ref));
        }
        snap->models.push_back(std::move(rt));
    }
    snap->generation = ++generations_;
    return snap;
}

void SnapshotBuilder::release_backends() {
    std::map<std::string, std::unique_ptr<BackendInstance>> backends;
    {
        std::lock_guard lock(registry_mutex_);
        backends.swap(backends_);
    }
}

std::string Snapshot::models_json() const {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.StartObject();
    w.Key("object");
    w.String("list");
    w.Key("data");
    w.StartArray();
    for (const auto& m : models) {
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
    return {b.GetString(), b.GetSize()};
}

}  // namespace pulse::gateway
