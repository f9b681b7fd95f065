#include "config/config.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <optional>
#include <sstream>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <pulse/plugin.hpp>
#include <toml++/toml.h>

#include "toml/reader.h"

namespace pulse::config {
namespace {

using toml_reader::where;

// The gateway's config stops at its first problem: each Table reports to a Problems of its
// own in throw_first mode. The load functions turn toml_reader::Error into ConfigError.
struct FirstProblem {
    toml_reader::Problems problems;
};
class Table : private FirstProblem, public toml_reader::Table {
public:
    Table(const toml::table& t, std::string path, const std::string& file)
        : FirstProblem{toml_reader::Problems(file, toml_reader::Problems::Mode::throw_first)},
          toml_reader::Table(t, std::move(path), FirstProblem::problems) {}
    [[noreturn]] void fail(const toml::node& n, const std::string& msg) const {
        toml_reader::Table::fail(n, msg);
        throw ConfigError(msg);  // not reached: throw_first throws
    }
    [[noreturn]] void fail_here(const std::string& msg) const {
        toml_reader::Table::fail_here(msg);
        throw ConfigError(msg);  // not reached
    }
};

// Plugin option tables as JSON; a value with no JSON form is a config error at its place.
std::string to_json(const toml::node& n) {
    toml_reader::Problems p(n.source().path ? *n.source().path : std::string("config"), toml_reader::Problems::Mode::throw_first);
    return toml_reader::to_json(n, p);
}

std::filesystem::path resolve(const std::filesystem::path& base, const std::string& p) {
    std::filesystem::path path(p);
    return path.is_relative() ? (base / path).lexically_normal() : path;
}

// An endpoint's options with "model" set first: the decoder:// alias. nullopt when the options
// name a model already.
std::optional<std::string> with_model_option(const std::string& options_json, const std::string& model) {
    rapidjson::Document options;
    options.Parse(options_json.c_str());
    if (options.IsObject() && options.HasMember("model")) return std::nullopt;
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.StartObject();
    w.Key("model");
    w.String(model.c_str(), static_cast<rapidjson::SizeType>(model.size()));
    if (options.IsObject())
        for (const auto& m : options.GetObject()) {
            w.Key(m.name.GetString(), m.name.GetStringLength());
            m.value.Accept(w);
        }
    w.EndObject();
    return std::string(b.GetString(), b.GetSize());
}

void check_url(const Table& t, const toml::node& n, const std::string& url) {
    bool http = url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0;
    bool plugin = url.rfind("plugin://", 0) == 0 && url.size() > 9;
    if (!http && !plugin)
        t.fail(n, "endpoint url '" + url + "' must start with http://, plugin://NAME or decoder:///path/model.gguf");
    if (url.rfind("https://", 0) == 0)
        t.fail(n, "endpoint url '" + url + "': https upstreams are not supported; Pulse talks to local "
                  "backends over plain HTTP on loopback or a private network");
}

Endpoint parse_endpoint(const toml::node& node, const std::string& path, const std::string& file, size_t idx,
                        const std::filesystem::path& base) {
    const toml::table* et = node.as_table();
    if (!et) throw ConfigError(where(file, node.source()) + ": '" + path + "' entries must be tables {name, url}");
    Table t(*et, path + "[" + std::to_string(idx) + "]", file);
    Endpoint e;
    t.str("name", e.name);
    t.str("url", e.url);
    t.number("weight", e.weight, 0.001, 1e6);
    t.boolean("last_resort", e.last_resort);
    if (const toml::table* o = t.subtable("options")) e.options_json = to_json(*o);
    t.reject_unknown();
    if (e.url.empty()) t.fail_here("'" + t.qualified("url") + "' is required");
    // decoder:///path/model.gguf: the in-process decoder backend with options.model = the path.
    if (e.url.rfind("decoder://", 0) == 0) {
        std::string model = e.url.substr(10);
        if (model.empty()) t.fail(*et->get("url"), "endpoint url '" + e.url + "' names no model file (decoder:///path/model.gguf)");
        auto options = with_model_option(e.options_json, resolve(base, model).string());
        if (!options) t.fail(*et->get("url"), "endpoint url '" + e.url + "' already names the model; drop options.model");
        e.options_json = *options;
        e.url = "plugin://decoder";
    }
    check_url(t, *et->get("url"), e.url);
    if (e.name.empty()) e.name = "ep" + std::to_string(idx);
    return e;
}

Model parse_model(const std::string& id, const toml::table& mt, const std::string& file, const std::filesystem::path& base) {
    Table t(mt, "models." + id, file);
    Model m;
    m.id = id;
    t.str("profile", m.profile);
    t.str("upstream_model", m.upstream_model);
    t.integer("context_window", m.context_window, 0, int64_t(1) << 32);
    t.str("reasoning_output", m.reasoning_output);
    std::string routing = "failover";
    t.str("routing", routing);
    t.boolean("resume", m.resume);
    t.boolean("demo", m.demo);
    if (routing == "failover") m.routing = Model::Routing::failover;
    else if (routing == "round_robin") m.routing = Model::Routing::round_robin;
    else if (routing == "sticky") m.routing = Model::Routing::sticky;
    else t.fail(*mt.get("routing"), "'" + t.qualified("routing") + "' must be \"failover\", \"round_robin\" or \"sticky\"");
    if (m.reasoning_output != "summary" && m.reasoning_output != "raw" && m.reasoning_output != "both")
        t.fail(*mt.get("reasoning_output"), "'" + t.qualified("reasoning_output") + "' must be \"summary\", \"raw\" or \"both\"");
    if (const toml::array* eps = t.array("endpoints")) {
        for (size_t i = 0; i < eps->size(); ++i)
            m.endpoints.push_back(parse_endpoint(*eps->get(i), t.qualified("endpoints"), file, i, base));
    }
    if (const toml::table* st = t.subtable("sampling")) {
        Table s(*st, t.qualified("sampling"), file);
        s.number("temperature", m.sampling.temperature, 0, 10);
        s.number("top_p", m.sampling.top_p, 0, 1);
        s.number("min_p", m.sampling.min_p, 0, 1);
        s.number("presence_penalty", m.sampling.presence_penalty, -2, 2);
        s.number("repetition_penalty", m.sampling.repetition_penalty, 0, 10);
        s.integer("top_k", m.sampling.top_k, -1, 1000000);
        s.integer("max_output_tokens", m.sampling.max_output_tokens, 1, int64_t(1) << 32);
        s.reject_unknown();
    }
    if (const toml::table* po = t.subtable("profile_options")) {
        m.profile_options_json = to_json(*po);
    }
    if (const toml::table* pt = t.subtable("policy")) {
        Table p(*pt, t.qualified("policy"), file);
        ModelPolicy pol;
        p.str("name", pol.name);
        p.integer("timeout_ms", pol.timeout_ms, 1, 60000);
        if (const toml::table* o = p.subtable("options")) {
            pol.options_json = to_json(*o);
        }
        p.reject_unknown();
        if (pol.name.empty()) p.fail_here("'" + p.qualified("name") + "' is required (a policy component, e.g. \"static\")");
        m.policy = std::move(pol);
    }
    t.reject_unknown();
    if (m.profile.empty()) t.fail_here("'" + t.qualified("profile") + "' is required (e.g. \"qwen38\")");
    if (m.endpoints.empty())
        t.fail_here("model '" + id + "' has no endpoints; add [[" + t.qualified("endpoints") + "]] with a url");
    if (std::all_of(m.endpoints.begin(), m.endpoints.end(), [](const Endpoint& e) { return e.last_resort; }))
        t.fail_here("model '" + id + "': every endpoint is last_resort; at least one must serve normally");
    std::set<std::string> names;
    for (const auto& e : m.endpoints)
        if (!names.insert(e.name).second)
            t.fail_here("model '" + id + "': endpoint name '" + e.name + "' is used twice");
    if (m.upstream_model.empty()) m.upstream_model = id;
    return m;
}

// [server]
Server parse_server(const toml::table& st, const std::string& file, const std::filesystem::path& base) {
    Server server;
    Table t(st, "server", file);
    std::string listen;
    t.str("listen", listen);
    if (!listen.empty()) server.listen = parse_listen(listen, where(file, st.get("listen")->source()));
    t.str("api_key", server.api_key);
    t.boolean("protect_status", server.protect_status);
    t.boolean("allow_public_without_key", server.allow_public_without_key);
    t.integer("max_body_bytes", server.max_body_bytes, 1024, int64_t(1) << 31);
    t.integer("max_body_memory_bytes", server.max_body_memory_bytes, 1024, int64_t(1) << 40);
    t.integer("max_streams", server.max_streams, 1, 65536);
    t.integer("queue", server.queue, 0, 65536);
    t.number("send_timeout_s", server.send_timeout_s, 0.1, 3600);
    t.number("header_timeout_s", server.header_timeout_s, 0.1, 3600);
    t.number("body_timeout_s", server.body_timeout_s, 0.1, 3600);
    t.integer("body_min_rate", server.body_min_rate, 0, int64_t(1) << 40);
    t.number("idle_timeout_s", server.idle_timeout_s, 0.1, 86400);
    t.integer("stream_threads", server.stream_threads, 1, 64);
    t.number("drain_timeout_s", server.drain_timeout_s, 0, 86400);
    std::string trace;
    t.str("trace_file", trace);
    if (!trace.empty()) server.trace_file = resolve(base, trace).string();
    t.reject_unknown();
    return server;
}

Config parse(const toml::table& root, const std::string& file, const std::filesystem::path& base) {
    Config cfg;
    Table top(root, "", file);
    top.str("log_level", cfg.log_level);
    if (const toml::table* st = top.subtable("server")) cfg.server = parse_server(*st, file, base);
    if (const toml::table* pt = top.subtable("plugins")) {
        Table t(*pt, "plugins", file);
        std::vector<std::string> dirs, dropins;
        t.strings("dirs", dirs);
        t.strings("dropin_dirs", dropins);
        t.strings("require", cfg.plugins.require);
        std::string runtime;
        t.str("runtime_dir", runtime);
        t.reject_unknown();
        for (auto& d : dirs) cfg.plugins.dirs.push_back(resolve(base, d));
        for (auto& d : dropins) cfg.plugins.dropin_dirs.push_back(resolve(base, d));
        if (!runtime.empty()) cfg.plugins.runtime_dir = resolve(base, runtime);
    }
    if (const toml::table* ut = top.subtable("upstream")) {
        Table t(*ut, "upstream", file);
        t.number("connect_timeout_s", cfg.upstream.connect_timeout_s, 0.05, 600);
        t.number("retry_window_s", cfg.upstream.retry_window_s, 0, 86400);
        t.number("keepalive_s", cfg.upstream.keepalive_s, 0.05, 3600);
        t.number("idle_timeout_s", cfg.upstream.idle_timeout_s, 1, 86400);
        t.number("head_timeout_s", cfg.upstream.head_timeout_s, 0.05, 86400);
        t.number("liveness_after_s", cfg.upstream.liveness_after_s, 0, 86400);
        t.number("liveness_timeout_s", cfg.upstream.liveness_timeout_s, 0.05, 3600);
        t.number("stall_after_s", cfg.upstream.stall_after_s, 0, 86400);
        t.number("health_interval_s", cfg.upstream.health_interval_s, 0.05, 3600);
        std::string frag;
        t.str("endpoint_fragments", frag);
        if (!frag.empty()) cfg.upstream.endpoint_fragments = resolve(base, frag);
        t.reject_unknown();
    }
    if (const toml::table* wt = top.subtable("warmup")) {
        Table t(*wt, "warmup", file);
        t.boolean("enabled", cfg.warmup.enabled);
        std::string state;
        t.str("state_file", state);
        if (!state.empty()) cfg.warmup.state_file = resolve(base, state).string();
        t.integer("max_prefixes", cfg.warmup.max_prefixes, 0, 100000);
        t.number("slot_save_interval_s", cfg.warmup.slot_save_interval_s, 0.05, 86400);
        t.number("quiet_s", cfg.warmup.quiet_s, 0, 3600);
        t.reject_unknown();
    }
    if (const toml::table* ct = top.subtable("controller")) {
        // Validated by the controller plugin; the host only adds where relative paths start.
        cfg.controller_json = to_json(*ct);
    }
    if (const toml::table* mt = top.subtable("models")) {
        // In the order the file lists them (TOML tables iterate by key): the first is the
        // default model of tools like `pulse codex`.
        std::vector<std::pair<std::pair<uint32_t, uint32_t>, Model>> ordered;
        for (const auto& [id, node] : *mt) {
            if (!node.is_table())
                throw ConfigError(where(file, node.source()) + ": 'models." + std::string(id.str()) +
                                  "' must be a table: [models.\"" + std::string(id.str()) + "\"]");
            ordered.emplace_back(std::make_pair(node.source().begin.line, node.source().begin.column),
                                 parse_model(std::string(id.str()), *node.as_table(), file, base));
        }
        std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        for (auto& [pos, m] : ordered) cfg.models.push_back(std::move(m));
    }
    top.reject_unknown();
    static const std::set<std::string> levels = {"trace", "debug", "info", "warn", "error", "off"};
    if (!levels.count(cfg.log_level))
        throw ConfigError(file + ": log_level '" + cfg.log_level + "' is not one of trace, debug, info, warn, error, off");
    return cfg;
}

}  // namespace

bool Listen::is_loopback() const {
    if (host == "localhost" || host == "::1") return true;
    in_addr a{};
    if (inet_pton(AF_INET, host.c_str(), &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
    return false;
}

Listen parse_listen(std::string_view text, const std::string& context) {
    Listen l;
    std::string_view host, port;
    if (!text.empty() && text.front() == '[') {
        auto close = text.find(']');
        if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
            throw ConfigError(context + ": listen address '" + std::string(text) + "' must look like [::1]:8800");
        host = text.substr(1, close - 1);
        port = text.substr(close + 2);
    } else {
        auto colon = text.rfind(':');
        if (colon == std::string_view::npos || text.find(':') != colon)
            throw ConfigError(context + ": listen address '" + std::string(text) +
                              "' must be HOST:PORT (IPv6 in brackets: [::1]:8800)");
        host = text.substr(0, colon);
        port = text.substr(colon + 1);
    }
    if (host.empty()) throw ConfigError(context + ": listen address '" + std::string(text) + "' has no host");
    int p = 0;
    for (char c : port) {
        if (c < '0' || c > '9' || p > 65535) {
            p = -1;
            break;
        }
        p = p * 10 + (c - '0');
    }
    // Port 0 asks the OS for a free port (tests); the log line then names the real one.
    if (port.empty() || p < 0 || p > 65535)
        throw ConfigError(context + ": listen port '" + std::string(port) + "' must be 0-65535");
    l.host = std::string(host);
    l.port = static_cast<uint16_t>(p);
    return l;
}

const Model* Config::find_model(std::string_view id) const {
    for (const auto& m : models)
        if (m.id == id) return &m;
    return nullptr;
}

Config load_string(std::string_view text, const std::string& name, const std::filesystem::path& base_dir) {
    try {
        return parse(toml_reader::parse_string(text, name), name, base_dir);
    } catch (const toml_reader::Error& e) {
        throw ConfigError(e.what());
    }
}

Config load_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError(path.string() + ": cannot read the config file (" + std::strerror(errno) + ")");
    std::ostringstream ss;
    ss << in.rdbuf();
    auto abs = std::filesystem::absolute(path);
    Config cfg = load_string(ss.str(), path.string(), abs.parent_path());
    cfg.source = abs;
    return cfg;
}

namespace {
std::string_view trim_spaces(std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
}
}  // namespace

void apply_env(Config& cfg, Getenv getenv_fn) {
    if (const char* v = getenv_fn("PULSE_QWEN_BACKENDS"); v && *v) {
        // "MODEL: name=url,name=url": the endpoints, in failover order, of the model named. The
        // model may be left out only while exactly one model uses profile "qwen38".
        std::string_view rest(v), named;
        if (auto colon = rest.find(':'); colon != std::string_view::npos) {
            std::string_view head = rest.substr(0, colon);
            const bool is_url_scheme = colon + 1 < rest.size() && rest[colon + 1] == '/';
            if (head.find('=') == std::string_view::npos && !is_url_scheme) {
                named = trim_spaces(head);
                rest = rest.substr(colon + 1);
            }
        }
        std::vector<Endpoint> eps;
        size_t idx = 0;
        while (!rest.empty()) {
            auto comma = rest.find(',');
            std::string_view item = trim_spaces(rest.substr(0, comma));
            rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
            if (item.empty()) continue;
            Endpoint e;
            auto eq = item.find('=');
            // "name=url"; a bare url gets a generated name. '=' inside a URL query is not used.
            if (eq != std::string_view::npos && item.substr(0, eq).find("://") == std::string_view::npos) {
                e.name = std::string(item.substr(0, eq));
                e.url = std::string(item.substr(eq + 1));
            } else {
                e.url = std::string(item);
            }
            if (e.name.empty()) e.name = "ep" + std::to_string(idx);
            bool ok = e.url.rfind("http://", 0) == 0 || (e.url.rfind("plugin://", 0) == 0 && e.url.size() > 9);
            if (!ok)
                throw ConfigError("PULSE_QWEN_BACKENDS: '" + std::string(item) +
                                  "' must be name=http://host:port/v1 (MODEL: name=url,name=url in failover order)");
            eps.push_back(std::move(e));
            ++idx;
        }
        if (eps.empty()) throw ConfigError("PULSE_QWEN_BACKENDS is set but lists no endpoint");
        std::vector<Model*> qwen;
        for (auto& m : cfg.models)
            if (m.profile == "qwen38") qwen.push_back(&m);
        Model* target = nullptr;
        if (!named.empty()) {
            for (auto* m : qwen)
                if (m->id == named) target = m;
            if (!target)
                throw ConfigError("PULSE_QWEN_BACKENDS names model '" + std::string(named) + "', which is not a model on profile \"qwen38\" in " +
                                  cfg.source.string());
        } else if (qwen.size() == 1) {
            target = qwen[0];
        } else if (qwen.empty()) {
            throw ConfigError("PULSE_QWEN_BACKENDS is set but no model uses profile \"qwen38\" in " + cfg.source.string());
        } else {
            std::string ids;
            for (auto* m : qwen) ids += (ids.empty() ? "" : ", ") + m->id;
            throw ConfigError("PULSE_QWEN_BACKENDS names no model and " + std::to_string(qwen.size()) + " models use profile \"qwen38\" (" + ids +
                              "): write PULSE_QWEN_BACKENDS=\"MODEL: name=url,name=url\"");
        }
        target->endpoints = eps;
        cfg.env_overrides.push_back("PULSE_QWEN_BACKENDS: the endpoints of model '" + target->id + "'");
    }
    if (const char* v = getenv_fn("PULSE_GATEWAY_API_KEY"); v && *v) cfg.server.api_key = v;
    if (const char* v = getenv_fn("PULSE_GATEWAY_TRACE_FILE"); v && *v) cfg.server.trace_file = v;
    if (const char* v = getenv_fn("PULSE_GATEWAY_WARMUP_STATE_FILE"); v && *v) cfg.warmup.state_file = v;
    if (const char* v = getenv_fn("PULSE_PLUGIN_DIRS"); v && *v) {
        cfg.plugins.dirs.clear();
        std::string_view rest(v);
        while (!rest.empty()) {
            auto colon = rest.find(':');
            std::string_view d = rest.substr(0, colon);
            rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
            if (!d.empty()) cfg.plugins.dirs.push_back(std::filesystem::absolute(std::string(d)).lexically_normal());
        }
    }
}

namespace {
void merge_fragments(Config& cfg);
}

void apply_fragments(Config& cfg) {
    try {
        merge_fragments(cfg);
    } catch (const toml_reader::Error& e) {
        throw ConfigError(e.what());
    }
}

namespace {
void merge_fragments(Config& cfg) {
    const auto& dir = cfg.upstream.endpoint_fragments;
    std::error_code ec;
    if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (e.path().extension() == ".toml" && e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
        const std::string file = f.string();
        const toml::table root = toml_reader::parse_file(f);
        Table top(root, "", file);
        const toml::array* eps = top.array("endpoints");
        top.reject_unknown();
        if (!eps) continue;
        for (size_t i = 0; i < eps->size(); ++i) {
            const toml::table* et = eps->get(i)->as_table();
            if (!et) throw ConfigError(where(file, eps->get(i)->source()) + ": 'endpoints' entries must be tables");
            Table t(*et, "endpoints[" + std::to_string(i) + "]", file);
            std::string upstream_model;
            Endpoint e;
            t.str("upstream_model", upstream_model);
            t.str("name", e.name);
            t.str("url", e.url);
            t.reject_unknown();
            if (upstream_model.empty() || e.name.empty() || e.url.empty())
                t.fail_here("'upstream_model', 'name' and 'url' are required");
            check_url(t, *et->get("url"), e.url);
            bool matched = false;
            for (auto& m : cfg.models) {
                if (m.upstream_model != upstream_model) continue;
                matched = true;
                auto same = std::find_if(m.endpoints.begin(), m.endpoints.end(),
                                         [&](const Endpoint& x) { return x.name == e.name || x.url == e.url; });
                if (same == m.endpoints.end()) m.endpoints.push_back(e);
                else if (same->name == e.name) *same = e;
            }
            if (!matched)
                cfg.warnings.push_back(file + ": endpoint '" + e.name + "' is for upstream model '" + upstream_model +
                                       "', which no configured model serves; ignored");
        }
    }
}
}  // namespace

void validate(const Config& cfg) {
    const std::string file = cfg.source.empty() ? std::string("config") : cfg.source.string();
    if (!cfg.server.listen.is_loopback() && cfg.server.api_key.empty() && !cfg.server.allow_public_without_key)
        throw ConfigError(file + ": server.listen = " + cfg.server.listen.host + ":" +
                          std::to_string(cfg.server.listen.port) +
                          " is not a loopback address and no API key is set; set server.api_key (or "
                          "PULSE_GATEWAY_API_KEY), or set server.allow_public_without_key = true to accept the risk");
    std::set<std::string> ids;
    for (const auto& m : cfg.models)
        if (!ids.insert(m.id).second) throw ConfigError(file + ": model '" + m.id + "' is defined twice");
}

}  // namespace pulse::config
