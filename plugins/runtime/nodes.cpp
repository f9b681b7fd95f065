#include "nodes.h"

#include <toml++/toml.h>

#include "toml/reader.h"

namespace pulse::runtime {

namespace {

// One node's table ([defaults] or [nodes.NAME]): every key checked, the problems collected.
void fill(toml_reader::Table& t, Node& n) {
    t.str("ssh", n.ssh);
    t.strings("ssh_options", n.ssh_options);
    t.str("host", n.host);
    t.str("recipe_dir", n.recipe_dir);
    t.str("gateway_url", n.gateway_url);
    t.str("meminfo", n.meminfo);
    t.str("gpu_apps_command", n.gpu_apps_command);
    t.str("own_pids_command", n.own_pids_command);
    t.str("log_command", n.log_command);
    t.number("memory_threshold_gib", n.memory_threshold_gib, 0, 1 << 20);
    t.number("memory_timeout_s", n.memory_timeout_s, 0, 86400);
    t.number("stop_timeout_s", n.stop_timeout_s, 1, 86400);
    t.number("start_timeout_s", n.start_timeout_s, 1, 86400);
    t.number("ready_timeout_s", n.ready_timeout_s, 0.1, 86400);
    t.number("poll_interval_s", n.poll_interval_s, 0.01, 3600);
    if (const toml::table* paths = t.subtable("paths"))
        for (const auto& [k, v] : *paths) {
            auto s = v.value<std::string>();
            if (!s || s->empty() || (*s)[0] != '/')
                t.fail(v, "'" + t.qualified("paths." + std::string(k.str())) + "' must be an absolute path (a string starting with /)");
            else n.paths[std::string(k.str())] = *s;
        }
    t.reject_unknown();
}

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
    try {
        const toml::table root = toml_reader::parse_file(path, "create it from config/nodes.toml, or pass --nodes FILE");
        toml_reader::Problems problems(path.string(), toml_reader::Problems::Mode::collect);
        toml_reader::Table top(root, "", problems);
        Node defaults;
        if (const toml::table* d = top.subtable("defaults")) {
            toml_reader::Table t(*d, "defaults", problems);
            fill(t, defaults);
        }
        if (const toml::table* ns = top.subtable("nodes"))
            for (const auto& [k, v] : *ns) {
                Node n = defaults;
                n.name = std::string(k.str());
                const std::string at = "nodes." + n.name;
                const toml::table* nt = v.as_table();
                if (!nt) {
                    problems.add(v.source(), "'" + at + "' must be a table");
                    continue;
                }
                toml_reader::Table t(*nt, at, problems);
                fill(t, n);
                if (n.recipe_dir.empty() || n.recipe_dir[0] != '/')
                    t.fail_here("'" + at + ".recipe_dir' is required (an absolute path on the node)");
                if (n.ssh.empty()) t.fail_here("'" + at + ".ssh' must be \"local\" or an ssh target");
                if (n.host.empty()) t.fail_here("'" + at + ".host' must not be empty");
                out.nodes.push_back(std::move(n));
            }
        top.reject_unknown();
        problems.throw_if_any();
    } catch (const toml_reader::Error& e) {
        throw NodesError(e.what());
    }
    return out;
}

}  // namespace pulse::runtime
