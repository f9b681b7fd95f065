#include "nodes.h"

#include <set>

#include <toml++/toml.h>

namespace pulse::runtime {

namespace {

struct Reader {
    const std::string& file;
    std::vector<std::string>& errors;

    std::string at(const toml::node& n) const { return file + ":" + std::to_string(n.source().begin.line); }

    void str(const toml::table& t, const char* key, std::string& out) const {
        const toml::node* n = t.get(key);
        if (!n) return;
        if (auto v = n->value<std::string>()) out = *v;
        else errors.push_back(at(*n) + ": '" + key + "' must be a string");
    }
    void num(const toml::table& t, const char* key, double& out, double lo, double hi) const {
        const toml::node* n = t.get(key);
        if (!n) return;
        auto v = n->value<double>();
        if (!v) return errors.push_back(at(*n) + ": '" + key + "' must be a number");
        if (*v < lo || *v > hi)
            return errors.push_back(at(*n) + ": '" + key + "' = " + std::to_string(*v) + " is out of range; allowed " +
                                    std::to_string(lo) + " to " + std::to_string(hi));
        out = *v;
    }
    void fill(const toml::table& t, Node& n) const {
        static const std::set<std::string> allowed = {
            "ssh", "ssh_options", "host", "recipe_dir", "gateway_url", "paths", "memory_threshold_gib",
            "memory_timeout_s", "stop_timeout_s", "start_timeout_s", "ready_timeout_s", "poll_interval_s", "meminfo",
            "gpu_apps_command", "own_pids_command", "log_command"};
        for (const auto& [k, v] : t)
            if (!allowed.count(std::string(k.str()))) {
                std::string list;
                for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
                errors.push_back(at(v) + ": unknown key '" + std::string(k.str()) + "'; allowed: " + list);
            }
        str(t, "ssh", n.ssh);
        str(t, "host", n.host);
        str(t, "recipe_dir", n.recipe_dir);
        str(t, "gateway_url", n.gateway_url);
        str(t, "meminfo", n.meminfo);
        str(t, "gpu_apps_command", n.gpu_apps_command);
        str(t, "own_pids_command", n.own_pids_command);
        str(t, "log_command", n.log_command);
        num(t, "memory_threshold_gib", n.memory_threshold_gib, 0, 1 << 20);
        num(t, "memory_timeout_s", n.memory_timeout_s, 0, 86400);
        num(t, "stop_timeout_s", n.stop_timeout_s, 1, 86400);
        num(t, "start_timeout_s", n.start_timeout_s, 1, 86400);
        num(t, "ready_timeout_s", n.ready_timeout_s, 0.1, 86400);
        num(t, "poll_interval_s", n.poll_interval_s, 0.01, 3600);
        if (const toml::node* o = t.get("ssh_options")) {
            const toml::array* a = o->as_array();
            if (!a) errors.push_back(at(*o) + ": 'ssh_options' must be an array of strings");
            else {
                n.ssh_options.clear();
                for (const auto& e : *a)
                    if (auto s = e.value<std::string>()) n.ssh_options.push_back(*s);
                    else errors.push_back(at(e) + ": 'ssh_options' must be an array of strings");
            }
        }
        if (const toml::node* p = t.get("paths")) {
            const toml::table* pt = p->as_table();
            if (!pt) errors.push_back(at(*p) + ": 'paths' must be a table of name = \"/absolute/path\"");
            else
                for (const auto& [k, v] : *pt) {
                    auto s = v.value<std::string>();
                    if (!s || s->empty() || (*s)[0] != '/')
                        errors.push_back(at(v) + ": paths." + std::string(k.str()) + " must be an absolute path string");
                    else n.paths[std::string(k.str())] = *s;
                }
        }
    }
};

}  // namespace

const Node& Nodes::find(std::string_view name) const {
    for (const auto& n : nodes)
        if (n.name == name) return n;
    std::string list;
    for (const auto& n : nodes) list += (list.empty() ? "" : ", ") + n.name;
    throw NodesError(file.string() + ": no node '" + std::string(name) + "'; defined: " + (list.empty() ? "(none)" : list));
}

Nodes load_nodes(const std::filesystem::path& path) {
    Nodes out;
    out.file = path;
    const std::string file = path.string();
    toml::table root;
    try {
        root = toml::parse_file(file);
    } catch (const toml::parse_error& e) {
        std::string why(e.description());
        if (!std::filesystem::exists(path)) why = "file not found (create it from config/nodes.toml, or pass --nodes FILE)";
        throw NodesError(file + ":" + std::to_string(e.source().begin.line) + ": " + why);
    }
    std::vector<std::string> errors;
    Reader r{file, errors};
    for (const auto& [k, v] : root)
        if (k.str() != "defaults" && k.str() != "nodes")
            errors.push_back(r.at(v) + ": unknown table '" + std::string(k.str()) + "'; allowed: [defaults], [nodes.NAME]");
    Node defaults;
    if (const toml::table* d = root["defaults"].as_table()) r.fill(*d, defaults);
    if (const toml::table* ns = root["nodes"].as_table()) {
        for (const auto& [k, v] : *ns) {
            Node n = defaults;
            n.name = std::string(k.str());
            const toml::table* t = v.as_table();
            if (!t) {
                errors.push_back(r.at(v) + ": nodes." + n.name + " must be a table");
                continue;
            }
            r.fill(*t, n);
            if (n.recipe_dir.empty() || n.recipe_dir[0] != '/')
                errors.push_back(r.at(v) + ": nodes." + n.name + ".recipe_dir is required (an absolute path on the node)");
            if (n.ssh.empty()) errors.push_back(r.at(v) + ": nodes." + n.name + ".ssh must be \"local\" or an ssh target");
            if (n.host.empty()) errors.push_back(r.at(v) + ": nodes." + n.name + ".host must not be empty");
            out.nodes.push_back(std::move(n));
        }
    }
    if (!errors.empty()) {
        std::string msg;
        for (const auto& e : errors) msg += (msg.empty() ? "" : "\n") + e;
        throw NodesError(msg);
    }
    return out;
}

}  // namespace pulse::runtime
