#include "controller.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <rapidjson/document.h>
#include <rapidjson/prettywriter.h>
#include <rapidjson/stringbuffer.h>

#include "catalog.h"
#include "env_file.h"
#include "args/args.h"
#include "http/client.h"
#include "nodes.h"

namespace pulse::runtime {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* const kFooter =
    "exit codes: 0 ok, 1 a step failed, 2 usage, 3 invalid profiles/nodes, 5 node locked\n";

namespace {

std::string fmt(const char* f, double v) {
    char b[64];
    std::snprintf(b, sizeof b, f, v);
    return b;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string utc_stamp(const char* f) {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char b[64];
    std::strftime(b, sizeof b, f, &tm);
    return b;
}

std::vector<std::string> lines_of(const std::string& s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) {
        if (!l.empty() && l.back() == '\r') l.pop_back();
        out.push_back(l);
    }
    return out;
}

// The text between "BEGIN" and "END" marker lines in a script's output.
std::string section(const std::string& out, const std::string& begin, const std::string& end) {
    std::string r;
    bool in = false;
    for (const auto& l : lines_of(out)) {
        if (l == begin) in = true;
        else if (l == end) in = false;
        else if (in) r += l + "\n";
    }
    return r;
}

std::string tail_lines(const std::string& s, size_t n, const std::string& indent) {
    auto ls = lines_of(s);
    std::string o;
    for (size_t i = ls.size() > n ? ls.size() - n : 0; i < ls.size(); ++i) o += indent + ls[i] + "\n";
    return o;
}

std::string json_str(const rapidjson::Value& v, const char* key) {
    if (!v.IsObject()) return {};
    auto it = v.FindMember(key);
    return it != v.MemberEnd() && it->value.IsString() ? it->value.GetString() : std::string();
}

bool write_file_atomic(const fs::path& p, const std::string& text, mode_t mode, std::string& err) {
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    fs::path tmp = p;
    tmp += ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return err = tmp.string() + ": " + std::strerror(errno), false;
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ok = ::fsync(fd) == 0 && ok;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), p.c_str()) != 0) return err = p.string() + ": " + std::strerror(errno), false;
    return true;
}

// A per-node lock held for the whole command (flock: released if the process dies).
class NodeLock {
public:
    NodeLock(const fs::path& file) : path_(file) {
        std::error_code ec;
        fs::create_directories(file.parent_path(), ec);
        fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) {
            // Not another command's lock: the state directory cannot be written by this user, or
            // is not there. Said as such, with the way out.
            const int e = errno;
            error_ = "cannot create the lock file " + file.string() + ": " + std::strerror(e);
            if (e == EACCES || e == EPERM || e == EROFS)
                error_ += " (the state directory " + file.parent_path().parent_path().string() +
                          " is not writable by this user: run as its owner, e.g. `sudo -u pulse-gateway pulse model ...`, or give "
                          "--state-dir DIR)";
            else if (e == ENOENT)
                error_ += " (the state directory could not be created" + (ec ? ": " + ec.message() : std::string()) + "; give --state-dir DIR)";
            return;
        }
        if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
            char buf[512] = {0};
            ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
            std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown holder";
            while (!holder.empty() && holder.back() == '\n') holder.pop_back();
            error_ = "held by " + holder;
            contended_ = true;
            ::close(fd_);
            fd_ = -1;
            return;
        }
        // Who holds it, for the message a second command prints (best effort: the lock is the flock).
        std::string me = "pid " + std::to_string(::getpid()) + " since " + utc_stamp("%Y-%m-%dT%H:%M:%SZ") + "\n";
        if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);
    }
    ~NodeLock() {
        if (fd_ >= 0) ::close(fd_);
    }
    bool held() const { return fd_ >= 0; }
    bool contended() const { return contended_; }  // another command holds it (else: it could not be created)
    const std::string& error() const { return error_; }

private:
    fs::path path_;
    int fd_ = -1;
    bool contended_ = false;
    std::string error_;
};

struct Args {
    std::string profile;  // render, up
    std::string node, nodes_file, profiles_dir, state_dir;
    bool dry_run = false;
};

}  // namespace

struct Controller::Impl {
    Settings settings;
    Print print;
    TransportFactory transports;
    std::ofstream log;  // the run log of the node being worked on

    void out(const std::string& s) { print(s); }
    void logline(const std::string& s) {
        if (log.is_open()) log << s << (s.empty() || s.back() != '\n' ? "\n" : "") << std::flush;
    }
    void say(const std::string& s) {
        out(s + "\n");
        logline(s);
    }

    // ---- loading --------------------------------------------------------------------------
    std::optional<Catalog> catalog(int& rc) {
        try {
            return Catalog::load(settings.profiles_dir);
        } catch (const std::exception& e) {
            out(std::string("invalid profiles:\n") + e.what() + "\n");
            rc = kBadConfig;
            return std::nullopt;
        }
    }
    std::optional<Node> node(const std::string& name, int& rc) {
        try {
            return load_nodes(settings.nodes_file).find(name);
        } catch (const std::exception& e) {
            out(std::string(e.what()) + "\n");
            rc = kBadConfig;
            return std::nullopt;
        }
    }

    // ---- scripts ----------------------------------------------------------------------------
    static constexpr int kNoRecipeDir = 90;  // a node script's exit when the recipe directory is not there
    static std::string prologue(const Node& n) {
        return "set -u\ncd -- " + shell_quote(n.recipe_dir) + " || { echo \"FAIL recipe directory " + n.recipe_dir +
               " is missing or not accessible\"; exit " + std::to_string(kNoRecipeDir) + "; }\n";
    }
    static std::string first_word(const std::string& cmd) { return cmd.substr(0, cmd.find(' ')); }

    std::string preflight_script(const Profile& p, const Node& n, const Rendered& r) const {
        std::string s = prologue(n);
        s += "echo \"OK recipe directory $PWD\"\n";
        for (const std::string* c : {&p.family->start_command, &p.family->stop_command}) {
            std::string f = shell_quote(first_word(*c));
            s += "if [ -x " + f + " ]; then echo \"OK " + first_word(*c) + " is executable\"; else echo \"FAIL " + first_word(*c) +
                 " is missing or not executable\"; fi\n";
        }
        s += "if [ -f .env.sample ]; then echo SAMPLE_BEGIN; cat .env.sample; echo; echo SAMPLE_END; fi\n";
        for (const auto& [key, path] : paths_to_check(p, n, r))
            s += "if [ -e " + shell_quote(path) + " ]; then echo \"OK path " + key + " exists\"; else echo \"FAIL path " + key + "=" +
                 path + " does not exist on the node\"; fi\n";
        s += "echo GPU_BEGIN\n{ " + n.gpu_apps_command + "\n} 2>&1 | head -n 50\necho GPU_END\n";
        std::string own = n.own_pids_command.empty() ? p.family->own_pids_command : n.own_pids_command;
        if (!own.empty())
            s += "echo OWN_BEGIN\n( if [ -f .env ]; then set -a; . ./.env; set +a; fi\n" + own + "\n) 2>/dev/null | head -n 200\necho OWN_END\n";
        return s;
    }
    // Path-typed keys and the node paths the profile uses, each must exist on the node.
    static std::vector<std::pair<std::string, std::string>> paths_to_check(const Profile& p, const Node& n, const Rendered& r) {
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& [k, v] : r.values) {
            const KeySpec* spec = p.family->key(k);
            if (spec && spec->type == KeyType::path && !v.empty()) out.emplace_back(k, v);
        }
        std::set<std::string> used;
        for (const auto& e : p.env.entries) {
            std::string v = e.value;
            for (size_t pos = v.find("{{"); pos != std::string::npos; pos = v.find("{{", pos + 2)) {
                size_t close = v.find("}}", pos);
                if (close == std::string::npos) break;
                used.insert(v.substr(pos + 2, close - pos - 2));
            }
        }
        for (const auto& u : used)
            if (auto it = n.paths.find(u); it != n.paths.end()) out.emplace_back("paths." + u, it->second);
        return out;
    }
    static std::string stop_script(const Profile* p, const Node& n) {
        return prologue(n) + (p ? p->family->stop_command : std::string("./stop.sh")) + "\n";
    }
    static std::string meminfo_script(const Node& n) {
        return "awk '/^MemAvailable:/ {print $2; found = 1} END {if (!found) exit 1}' " + shell_quote(n.meminfo) + "\n";
    }
    static std::string write_script(const Node& n, const std::string& env_text, const std::string& backup) {
        std::string eof = "PULSE_ENV_EOF";
        while (env_text.find(eof) != std::string::npos) eof += "_";
        return "set -eu\ncd -- " + shell_quote(n.recipe_dir) +
               "\numask 077\n"
               "if [ -e .env ]; then cp -p .env " + shell_quote(backup) + " && echo \"BACKUP $PWD/" + backup +
               "\"; else echo NOBACKUP; fi\n"
               "cat > .env.pulse-new <<'" + eof + "'\n" + env_text + eof + "\n"
               "mv -f .env.pulse-new .env\necho \"WROTE $PWD/.env\"\n";
    }
    static std::string start_script(const Profile& p, const Node& n) {
        return prologue(n) +
               "rm -f .pulse-start.rc\n"
               "nohup setsid bash -c " + shell_quote(p.family->start_command + "; echo $? > .pulse-start.rc") +
               " > .pulse-start.log 2>&1 < /dev/null &\n"
               "echo \"STARTED pid $! (output in $PWD/.pulse-start.log)\"\n";
    }
    static std::string models_probe(const Node& n, const std::string& port, bool start_state) {
        std::string s = prologue(n) +
                        "body=$(curl -sS -m 5 -w '\\n%{http_code}' " + shell_quote("http://127.0.0.1:" + port + "/v1/models") +
                        " 2>&1) || true\n"
                        "code=${body##*$'\\n'}\n"
                        "echo \"HTTP $code\"\n"
                        "if [ \"$code\" = 200 ]; then echo BODY_BEGIN; printf '%s\\n' \"${body%$'\\n'*}\"; echo BODY_END; fi\n";
        if (start_state)
            s += "if [ -f .pulse-start.rc ]; then rc=$(cat .pulse-start.rc); echo \"START_EXIT $rc\"; "
                 "if [ \"$rc\" != 0 ]; then tail -n 15 .pulse-start.log | sed 's/^/LOG /'; fi; fi\n";
        return s;
    }
    std::string log_script(const Profile& p, const Node& n) const {
        std::string cmd = n.log_command.empty() ? p.family->log_command : n.log_command;
        return prologue(n) + "set -a; . ./.env; set +a\n{ " + cmd + "\n} 2>&1 | tail -n 20000\n";
    }
    static std::string restore_script(const Node& n, const std::string& backup) {
        std::string s = "set -eu\ncd -- " + shell_quote(n.recipe_dir) + "\n";
        if (backup.empty()) return s + "rm -f .env\necho \"REMOVED $PWD/.env (there was none before)\"\n";
        return s + "cp -p " + shell_quote(backup) + " .env\necho \"RESTORED $PWD/.env from " + backup + "\"\n";
    }

    // ---- running -----------------------------------------------------------------------------
    RunResult run(Transport& t, const std::string& what, const std::string& script, double timeout_s) {
        logline("--- " + what + " via " + t.describe() + " (timeout " + fmt("%.0f", timeout_s) + " s)\n" + script);
        RunResult r = t.run(script, timeout_s);
        logline("--- exit " + std::to_string(r.exit_code) + (r.timed_out ? " (timed out)" : "") +
                (r.spawn_error.empty() ? "" : " (" + r.spawn_error + ")") + "\n" + r.output);
        return r;
    }
    static std::string describe_failure(const RunResult& r, double timeout_s) {
        if (!r.spawn_error.empty()) return "could not run: " + r.spawn_error;
        if (r.timed_out) return "timed out after " + fmt("%.0f", timeout_s) + " s";
        if (r.exit_code == 255) return "exit 255 (ssh could not connect or authenticate: " + tail_lines(r.output, 1, "") + ")";
        if (r.exit_code == kNoRecipeDir)  // the prologue's own verdict: the node answered, its directory is the problem
            for (const auto& l : lines_of(r.output))
                if (l.rfind("FAIL ", 0) == 0) return l.substr(5);
        return "exit " + std::to_string(r.exit_code);
    }

    // MemAvailable in GiB, or nullopt.
    std::optional<double> mem_available(Transport& t, const Node& n) {
        RunResult r = t.run(meminfo_script(n), 30);
        if (!r.ok()) return std::nullopt;
        try {
            return std::stod(r.output) / (1024.0 * 1024.0);
        } catch (...) {
            return std::nullopt;
        }
    }

    // ---- gateway -------------------------------------------------------------------------------
    std::string gateway_url(const Node& n) const { return n.gateway_url.empty() ? settings.gateway.url : n.gateway_url; }
    fs::path fragment_path(const Node& n) const {
        return settings.gateway.endpoint_fragments.empty() ? fs::path() : fs::path(settings.gateway.endpoint_fragments) / (n.name + ".toml");
    }
    // From this host (not the node): the gateway runs here or is reached from here. The
    // project's HTTP client, so a missing curl cannot break `pulse model`.
    http::Answer gateway_call(const Node& n, const std::string& method, const std::string& path) {
        http::Request req;
        req.method = method;
        req.target = path;
        if (settings.gateway.api_key.empty()) req.fields.emplace_back("X-Pulse-Client", "pulse-model");
        else req.fields.emplace_back("Authorization", "Bearer " + settings.gateway.api_key);
        return http::fetch(gateway_url(n), req, http::Timeouts::all(5));
    }
    void reload_gateway(const Node& n) {
        const http::Answer a = gateway_call(n, "POST", "/admin/reload");
        if (a.status == 202) say("      gateway at " + gateway_url(n) + ": reload requested");
        else if (a.status == 0)
            say("      gateway at " + gateway_url(n) + " not reachable (" + a.error.substr(0, 200) +
                "); it reads the fragment when it starts, or reload it with SIGHUP");
        else say("      gateway at " + gateway_url(n) + " refused the reload: HTTP " + std::to_string(a.status) + " " + a.body.substr(0, 200));
    }
    // The gateway's view of this node's endpoint: "healthy on model X", "down: ...", or why unknown.
    std::string gateway_view(const Node& n, const std::string& url) {
        const http::Answer a = gateway_call(n, "GET", "/health");
        if (a.status == 0) return "gateway not reachable at " + gateway_url(n);
        rapidjson::Document d;
        d.Parse(a.body.c_str());
        if (d.HasParseError() || !d.IsObject() || !d.HasMember("models") || !d["models"].IsArray())
            return "gateway answered HTTP " + std::to_string(a.status) + " without a health document";
        std::string found;
        for (const auto& m : d["models"].GetArray()) {
            if (!m.IsObject() || !m.HasMember("endpoints") || !m["endpoints"].IsArray()) continue;
            for (const auto& e : m["endpoints"].GetArray())
                if (json_str(e, "name") == n.name || json_str(e, "url") == url)
                    found += (found.empty() ? "" : "; ") + json_str(e, "state") + " on model " + json_str(m, "id") +
                             (json_str(e, "last_error").empty() ? "" : " (" + json_str(e, "last_error") + ")");
        }
        return found.empty() ? "not configured in the gateway" : found;
    }

    // ---- commands ------------------------------------------------------------------------------
    int profiles() {
        int rc = kOk;
        auto cat = catalog(rc);
        if (!cat) return rc;
        size_t w = 7;
        for (const auto& p : cat->profiles()) w = std::max(w, p.qualified().size());
        std::string o = "PROFILE" + std::string(w - 7 + 2, ' ') + "DESCRIPTION\n";
        for (const auto& p : cat->profiles())
            o += p.qualified() + std::string(w - p.qualified().size() + 2, ' ') + p.description +
                 (p.render_only.empty() ? "" : " [render only]") + "\n";
        if (cat->profiles().empty()) o += "(no profiles in " + settings.profiles_dir.string() + ")\n";
        out(o);
        return kOk;
    }

    int render_cmd(const Args& a) {
        int rc = kOk;
        auto cat = catalog(rc);
        if (!cat) return rc;
        const Profile* p;
        try {
            p = &cat->find(a.profile);
        } catch (const std::exception& e) {
            return out(std::string(e.what()) + "\n"), kUsage;
        }
        std::map<std::string, std::string> paths;
        if (!a.node.empty()) {
            auto n = node(a.node, rc);
            if (!n) return rc;
            paths = n->paths;
        }
        Rendered r = render(*p, paths, "pulse model render " + p->qualified() + (a.node.empty() ? "" : " --node " + a.node));
        if (!r.unresolved.empty()) {
            std::string list;
            for (const auto& u : r.unresolved) list += (list.empty() ? "" : ", ") + u;
            if (!a.node.empty())
                return out(settings.nodes_file.string() + ": node " + a.node + " has no [paths] entry for " + list + "\n"), kBadConfig;
            out("# NOTE: site paths not filled in (pass --node N to take them from the nodes file): " + list + "\n");
        }
        out(r.text);
        return kOk;
    }

    struct Plan {
        const Profile* profile = nullptr;
        Node node;
        Rendered rendered;
        std::string port, served, max_model_len, endpoint_url, backup;
        std::vector<std::string> proofs;  // regexes with values substituted
    };

    std::vector<std::string> proofs_for(const Profile& p, const Rendered& r) const {
        std::vector<std::string> out = p.family->proofs;
        for (const auto& pr : p.proofs) out.push_back(expand_proof(pr, r.values));
        return out;
    }

    int up(const Args& a) {
        int rc = kOk;
        auto cat = catalog(rc);
        if (!cat) return rc;
        Plan plan;
        try {
            plan.profile = &cat->find(a.profile);
        } catch (const std::exception& e) {
            return out(std::string(e.what()) + "\n"), kUsage;
        }
        const Profile& p = *plan.profile;
        if (!p.render_only.empty())
            return out("profile " + p.qualified() + " is render-only: " + p.render_only + "\n`pulse model render " + p.qualified() +
                       "` prints it; `up` will not start it.\n"),
                   kUsage;
        auto n = node(a.node, rc);
        if (!n) return rc;
        plan.node = *n;
        const std::string origin = "pulse model up " + p.qualified() + " --node " + n->name + " at " + utc_stamp("%Y-%m-%dT%H:%M:%SZ");
        plan.rendered = render(p, n->paths, origin);
        if (!plan.rendered.unresolved.empty()) {
            std::string list;
            for (const auto& u : plan.rendered.unresolved) list += (list.empty() ? "" : ", ") + u;
            return out(settings.nodes_file.string() + ": node " + n->name + " has no [paths] entry for " + list + "\n"), kBadConfig;
        }
        if (auto bad = check_values(p, plan.rendered); !bad.empty()) {
            for (const auto& b : bad) out(b + "\n");
            return kBadConfig;
        }
        plan.port = plan.rendered.get(p.family->port_key);
        plan.served = plan.rendered.get(p.family->served_model_key);
        for (const auto& k : p.family->max_model_len_keys)
            if (plan.max_model_len.empty()) plan.max_model_len = plan.rendered.get(k);
        plan.endpoint_url = "http://" + n->host + ":" + plan.port + "/v1";
        plan.backup = ".env.pulse-backup-" + utc_stamp("%Y%m%dT%H%M%SZ");
        plan.proofs = proofs_for(p, plan.rendered);
        if (a.dry_run) return dry_run(plan);
        return run_up(plan);
    }

    int dry_run(const Plan& plan) {
        const Profile& p = *plan.profile;
        const Node& n = plan.node;
        auto t = transports(n);
        std::string o = "DRY RUN: pulse model up " + p.qualified() + " --node " + n.name + " (nothing is run, no file is written)\n";
        o += "node " + n.name + ": recipe " + n.recipe_dir + ", steps run with: " + t->describe() + "\n\n";
        o += "=== the .env that step 3 writes (" + n.recipe_dir + "/.env) ===\n" + plan.rendered.text + "\n";
        auto step = [&](const std::string& title, const std::string& script) { o += "=== " + title + " ===\n" + script + "\n"; };
        step("step 1/6 preflight (read-only; the lock is " + (settings.state_dir / "locks" / (n.name + ".lock")).string() + ")",
             preflight_script(p, n, plan.rendered));
        step("step 2/6 stop the old server (timeout " + fmt("%.0f", n.stop_timeout_s) + " s)", stop_script(&p, n));
        step("step 2/6 then, every " + fmt("%g", n.poll_interval_s) + " s until MemAvailable >= " + fmt("%.1f", n.memory_threshold_gib) +
                 " GiB (timeout " + fmt("%.0f", n.memory_timeout_s) + " s)",
             meminfo_script(n));
        step("step 3/6 write the .env, keeping a backup", write_script(n, plan.rendered.text, plan.backup));
        step("step 4/6 start the recipe (detached)", start_script(p, n));
        step("step 4/6 then, every " + fmt("%g", n.poll_interval_s) + " s until /v1/models answers 200 (timeout " +
                 fmt("%.0f", n.ready_timeout_s) + " s)",
             models_probe(n, plan.port, true));
        std::string checks = "served model '" + plan.served + "'" + (plan.max_model_len.empty() ? "" : ", max_model_len " + plan.max_model_len) +
                             ", KV cache line /" + p.family->kv_cache_pattern + "/";
        for (const auto& pr : plan.proofs) checks += ", /" + pr + "/";
        step("step 5/6 verify (" + checks + ") in the server log", log_script(p, n));
        std::string frag = fragment_path(n).empty() ? std::string("(the gateway has no upstream.endpoint_fragments: nothing)")
                                                    : fragment_path(n).string();
        o += "=== step 6/6 publish (here, not on the node) ===\n";
        o += "write " + (settings.state_dir / "nodes" / (n.name + ".json")).string() + "\n";
        o += "write " + frag + ":\n" + fragment_text(plan, "(dry run)") + "\n";
        o += "curl -X POST " + gateway_url(n) + "/admin/reload\n\n";
        o += "=== on failure in step 4 or 5 ===\n" + stop_script(&p, n) + restore_script(n, plan.backup);
        out(o);
        return kOk;
    }

    std::string fragment_text(const Plan& plan, const std::string& origin) const {
        return "# Written by " + origin + "; `pulse model down --node " + plan.node.name + "` removes it.\n"
               "[[endpoints]]\n"
               "upstream_model = " + toml_quote(plan.served) + "\nname = " + toml_quote(plan.node.name) +
               "\nurl = " + toml_quote(plan.endpoint_url) + "\n";
    }
    static std::string toml_quote(const std::string& s) {
        std::string o = "\"";
        for (char c : s) {
            if (c == '"' || c == '\\') o += '\\';
            o += c;
        }
        return o + "\"";
    }

    struct StepTimer {
        Impl& impl;
        Clock::time_point start = Clock::now();
        StepTimer(Impl& i, int k, const std::string& title) : impl(i) { impl.say("[" + std::to_string(k) + "/6] " + title); }
        int ok(const std::string& note = "") {
            impl.say("      ok (" + fmt("%.1f", seconds_since(start)) + " s)" + (note.empty() ? "" : ": " + note));
            return kOk;
        }
        int fail(const std::string& why) {
            impl.say("      FAILED (" + fmt("%.1f", seconds_since(start)) + " s): " + why);
            return kFailed;
        }
    };

    bool open_log(const Node& n) {
        std::error_code ec;
        fs::create_directories(settings.state_dir / "logs", ec);
        log.open(settings.state_dir / "logs" / (n.name + ".log"), std::ios::app);
        if (log.is_open()) logline("=== " + utc_stamp("%Y-%m-%dT%H:%M:%SZ"));
        return log.is_open();
    }

    // The answer when a node's lock was not taken: another command has it (exit 5), or this
    // user cannot create it (exit 1, the reason said as it is).
    int locked(const std::string& node, const NodeLock& lock) {
        if (lock.contended()) return out("node " + node + " is locked by another `pulse model` command (" + lock.error() + ")\n"), kLocked;
        return out("node " + node + ": " + lock.error() + "\n"), kFailed;
    }

    int run_up(const Plan& plan) {
        const Profile& p = *plan.profile;
        const Node& n = plan.node;
        NodeLock lock(settings.state_dir / "locks" / (n.name + ".lock"));
        if (!lock.held()) return locked(n.name, lock);
        open_log(n);
        auto t = transports(n);
        say("pulse model up " + p.qualified() + " --node " + n.name + ": recipe " + n.recipe_dir + " via " + t->describe());
        say("run log: " + (settings.state_dir / "logs" / (n.name + ".log")).string());

        // 1. preflight (read-only)
        {
            StepTimer st(*this, 1, "preflight");
            RunResult r = run(*t, "preflight", preflight_script(p, n, plan.rendered), 60);
            if (!r.spawn_error.empty() || r.timed_out || r.exit_code == 255)
                return st.fail(describe_failure(r, 60) + "\n" + tail_lines(r.output, 5, "        "));
            std::vector<std::string> fails;
            for (const auto& l : lines_of(r.output)) {
                if (l.rfind("OK ", 0) == 0) say("      " + l.substr(3));
                else if (l.rfind("FAIL ", 0) == 0) fails.push_back(l.substr(5));
            }
            if (r.exit_code == 90 && fails.empty()) fails.push_back("recipe directory " + n.recipe_dir + " is not accessible");
            if (r.output.find("SAMPLE_BEGIN") != std::string::npos) {
                auto sample = sample_keys(section(r.output, "SAMPLE_BEGIN", "SAMPLE_END"));
                std::set<std::string> in_sample(sample.begin(), sample.end()), in_profile;
                std::string missing, unknown;
                for (const auto& e : p.env.entries) {
                    in_profile.insert(e.key);
                    const KeySpec* spec = p.family->key(e.key);
                    if (!in_sample.count(e.key) && !(spec && !spec->in_sample)) unknown += (unknown.empty() ? "" : ", ") + e.key;
                }
                for (const auto& k : sample)
                    if (!in_profile.count(k)) missing += (missing.empty() ? "" : ", ") + k;
                if (!missing.empty()) fails.push_back("keys of the recipe's .env.sample missing from " + p.file.string() + ": " + missing);
                if (!unknown.empty()) fails.push_back("keys in " + p.file.string() + " that the recipe's .env.sample does not have: " + unknown);
                if (missing.empty() && unknown.empty())
                    say("      profile keys match the recipe's .env.sample (" + std::to_string(sample.size()) + " keys)");
            } else {
                say("      no .env.sample in the recipe: key completeness not checked");
            }
            std::set<std::string> own;
            for (const auto& l : lines_of(section(r.output, "OWN_BEGIN", "OWN_END"))) {
                auto f = l.find_first_not_of(" \t");
                if (f != std::string::npos) own.insert(l.substr(f, l.find_first_of(" \t,", f) - f));
            }
            int others = 0;
            for (const auto& l : lines_of(section(r.output, "GPU_BEGIN", "GPU_END"))) {
                auto f = l.find_first_not_of(" \t");
                if (f == std::string::npos) continue;
                std::string pid = l.substr(f, l.find_first_of(" \t,", f) - f);
                if (own.count(pid)) say("      GPU: " + l + " belongs to this recipe's server (stopped in step 2)");
                else ++others, fails.push_back("another process is using the GPU: " + l + " (stop it first)");
            }
            if (others == 0) say("      GPU: no other server running");
            if (!fails.empty()) {
                std::string why;
                for (const auto& f : fails) why += "\n        " + f;
                return st.fail(std::to_string(fails.size()) + " problem" + (fails.size() == 1 ? "" : "s") + why);
            }
            st.ok();
        }
        // 2. stop the old server, wait for memory
        {
            StepTimer st(*this, 2, "stop the old server, wait for MemAvailable >= " + fmt("%.1f", n.memory_threshold_gib) + " GiB");
            RunResult r = run(*t, "stop", stop_script(&p, n), n.stop_timeout_s);
            for (const auto& l : lines_of(tail_lines(r.output, 5, ""))) say("      stop: " + l);
            if (!r.ok()) return st.fail("stop script: " + describe_failure(r, n.stop_timeout_s) + "; the .env is unchanged");
            auto t0 = Clock::now();
            for (int poll = 0;; ++poll) {
                auto gib = mem_available(*t, n);
                double el = seconds_since(t0);
                std::string now = gib ? fmt("%.1f GiB", *gib) : std::string("unreadable");
                if (gib && *gib >= n.memory_threshold_gib) {
                    say("      MemAvailable " + now + " after " + fmt("%.0f", el) + " s");
                    break;
                }
                if (!gib && poll == 0) return st.fail("cannot read MemAvailable from " + n.meminfo + " on the node; the .env is unchanged");
                say("      waiting for memory: " + fmt("%.0f", el) + " s, MemAvailable " + now + " (need " +
                    fmt("%.1f", n.memory_threshold_gib) + ")");
                if (el >= n.memory_timeout_s)
                    return st.fail("MemAvailable stayed below " + fmt("%.1f", n.memory_threshold_gib) + " GiB for " +
                                   fmt("%.0f", n.memory_timeout_s) + " s (last " + now +
                                   "): something still holds memory; find it before starting a server (the .env is unchanged)");
                std::this_thread::sleep_for(std::chrono::duration<double>(n.poll_interval_s));
            }
            st.ok();
        }
        // 3. write the .env with a backup
        std::string backup;
        {
            StepTimer st(*this, 3, "write " + n.recipe_dir + "/.env");
            RunResult r = run(*t, "write .env", write_script(n, plan.rendered.text, plan.backup), 60);
            if (!r.ok()) return st.fail(describe_failure(r, 60) + "\n" + tail_lines(r.output, 5, "        "));
            for (const auto& l : lines_of(r.output))
                if (l.rfind("BACKUP ", 0) == 0) backup = plan.backup, say("      previous .env kept as " + l.substr(7));
            if (backup.empty()) say("      there was no .env before");
            st.ok();
        }
        // 4. start and wait for /v1/models
        std::string models_body;
        {
            StepTimer st(*this, 4, "start the recipe, wait for /v1/models on port " + plan.port);
            RunResult r = run(*t, "start", start_script(p, n), n.start_timeout_s);
            if (!r.ok()) return rollback(*t, plan, backup, st.fail("start: " + describe_failure(r, n.start_timeout_s) + "\n" + tail_lines(r.output, 5, "        ")));
            auto t0 = Clock::now();
            for (;;) {
                RunResult pr = run(*t, "ready probe", models_probe(n, plan.port, true), 30);
                double el = seconds_since(t0);
                std::string code;
                std::string start_exit;
                std::string log_tail;
                for (const auto& l : lines_of(pr.output)) {
                    if (l.rfind("HTTP ", 0) == 0) code = l.substr(5);
                    else if (l.rfind("START_EXIT ", 0) == 0) start_exit = l.substr(11);
                    else if (l.rfind("LOG ", 0) == 0) log_tail += "        " + l.substr(4) + "\n";
                }
                if (code == "200") {
                    models_body = section(pr.output, "BODY_BEGIN", "BODY_END");
                    say("      /v1/models answered 200 after " + fmt("%.0f", el) + " s");
                    break;
                }
                if (!start_exit.empty() && start_exit != "0")
                    return rollback(*t, plan, backup, st.fail("start script exited with " + start_exit + "; its last lines:\n" + log_tail));
                if (el >= n.ready_timeout_s)
                    return rollback(*t, plan, backup,
                                    st.fail("/v1/models did not answer 200 within " + fmt("%.0f", n.ready_timeout_s) + " s (last: HTTP " +
                                            (code.empty() ? "?" : code) + ")"));
                say("      waiting for the server: " + fmt("%.0f", el) + " s, /v1/models: " +
                    (code == "000" || code.empty() ? std::string("not listening yet") : "HTTP " + code));
                std::this_thread::sleep_for(std::chrono::duration<double>(n.poll_interval_s));
            }
            st.ok();
        }
        // 5. verify
        std::string kv_tokens;
        std::vector<std::string> proven;
        {
            StepTimer st(*this, 5, "verify");
            std::vector<std::string> fails;
            rapidjson::Document d;
            d.Parse(models_body.c_str());
            const rapidjson::Value* entry = nullptr;
            std::string ids;
            if (!d.HasParseError() && d.IsObject() && d.HasMember("data") && d["data"].IsArray())
                for (const auto& m : d["data"].GetArray()) {
                    ids += (ids.empty() ? "" : ", ") + json_str(m, "id");
                    if (json_str(m, "id") == plan.served) entry = &m;
                }
            if (!entry) fails.push_back("served model: expected '" + plan.served + "', /v1/models lists " + (ids.empty() ? "(nothing)" : ids));
            else {
                say("      served model " + plan.served);
                if (!plan.max_model_len.empty()) {
                    auto it = entry->FindMember("max_model_len");
                    std::string got = it != entry->MemberEnd() && it->value.IsInt64() ? std::to_string(it->value.GetInt64()) : "(absent)";
                    if (got != plan.max_model_len) fails.push_back("max_model_len: expected " + plan.max_model_len + ", the server reports " + got);
                    else say("      max_model_len " + got);
                }
            }
            RunResult lr = run(*t, "server log", log_script(p, n), 120);
            if (!lr.ok()) fails.push_back("could not read the server log: " + describe_failure(lr, 120));
            else {
                std::smatch m;
                std::regex kv(p.family->kv_cache_pattern);
                if (std::regex_search(lr.output, m, kv)) {
                    kv_tokens = m[1].str();
                    kv_tokens.erase(std::remove(kv_tokens.begin(), kv_tokens.end(), ','), kv_tokens.end());
                    say("      KV cache: " + m[0].str());
                } else {
                    fails.push_back("no KV cache line (/" + p.family->kv_cache_pattern + "/) in the server log");
                }
                for (const auto& pr : plan.proofs) {
                    if (std::regex_search(lr.output, m, std::regex(pr))) {
                        proven.push_back(m[0].str());
                        say("      proof: " + m[0].str());
                    } else {
                        fails.push_back("proof line /" + pr + "/ not found in the server log");
                    }
                }
            }
            if (!fails.empty()) {
                std::string why;
                for (const auto& f : fails) why += "\n        " + f;
                return rollback(*t, plan, backup, st.fail(std::to_string(fails.size()) + " check" + (fails.size() == 1 ? "" : "s") + " failed" + why));
            }
            st.ok();
        }
        // 6. publish
        {
            StepTimer st(*this, 6, "publish");
            std::string err;
            std::string state = state_json(plan, "up", backup, kv_tokens, proven);
            fs::path sp = settings.state_dir / "nodes" / (n.name + ".json");
            if (!write_file_atomic(sp, state, 0644, err)) return st.fail("node state: " + err + " (the server is up and verified)");
            say("      node state " + sp.string());
            fs::path fp = fragment_path(n);
            if (fp.empty()) {
                say("      the gateway config has no upstream.endpoint_fragments; add this endpoint by hand:\n" + fragment_text(plan, "hand"));
            } else {
                if (!write_file_atomic(fp, fragment_text(plan, "pulse model up " + p.qualified() + " at " + utc_stamp("%Y-%m-%dT%H:%M:%SZ")), 0644, err))
                    return st.fail("gateway fragment: " + err + " (the server is up and verified)");
                say("      gateway fragment " + fp.string() + " (" + plan.endpoint_url + ")");
                reload_gateway(n);
                // Let the gateway probe it once so the operator sees its view.
                std::string view;
                for (int i = 0; i < 20; ++i) {
                    view = gateway_view(n, plan.endpoint_url);
                    if (view.rfind("healthy", 0) == 0 || view.rfind("gateway not reachable", 0) == 0) break;
                    std::this_thread::sleep_for(std::chrono::milliseconds(250));
                }
                say("      gateway view: " + view);
            }
            st.ok();
        }
        say(n.name + " serves " + plan.served + " (profile " + p.qualified() + ") at " + plan.endpoint_url);
        return kOk;
    }

    // Stop what was started, put the previous .env back, withdraw the endpoint. Returns `rc`.
    int rollback(Transport& t, const Plan& plan, const std::string& backup, int rc) {
        const Node& n = plan.node;
        say("rolling back:");
        RunResult s = run(t, "rollback stop", stop_script(plan.profile, n), n.stop_timeout_s);
        say(std::string("      stopped the server started with ") + plan.profile->qualified() +
            (s.ok() ? "" : " (stop script: " + describe_failure(s, n.stop_timeout_s) + ")"));
        RunResult r = run(t, "restore .env", restore_script(n, backup), 60);
        if (r.ok()) {
            say(backup.empty() ? "      removed the new .env (there was none before)"
                               : "      restored " + n.recipe_dir + "/.env from " + backup);
        } else {
            say("      COULD NOT restore the .env (" + describe_failure(r, 60) + "): restore " + n.recipe_dir + "/" + backup + " by hand");
        }
        std::string err;
        write_file_atomic(settings.state_dir / "nodes" / (n.name + ".json"), state_json(plan, "failed", backup, "", {}), 0644, err);
        fs::path fp = fragment_path(n);
        std::error_code ec;
        if (!fp.empty() && fs::remove(fp, ec)) {
            say("      withdrew the gateway endpoint " + fp.string());
            reload_gateway(n);
        }
        std::string prev = previous_profile(n);
        say("      the node serves nothing now" + (prev.empty() ? std::string(".") : "; `pulse model up " + prev + " --node " + n.name + "` brings the previous profile back."));
        return rc;
    }

    std::string previous_profile(const Node& n) const {
        std::ifstream in(settings.state_dir / "nodes" / (n.name + ".json"));
        std::string text((std::istreambuf_iterator<char>(in)), {});
        rapidjson::Document d;
        d.Parse(text.c_str());
        return d.IsObject() ? json_str(d, "last_good_profile") : std::string();
    }

    std::string state_json(const Plan& plan, const std::string& status, const std::string& backup, const std::string& kv,
                           const std::vector<std::string>& proven) const {
        rapidjson::StringBuffer b;
        rapidjson::PrettyWriter<rapidjson::StringBuffer> w(b);
        auto kv_s = [&](const char* k, const std::string& v) {
            w.Key(k);
            w.String(v.c_str(), static_cast<rapidjson::SizeType>(v.size()));
        };
        std::string last_good = status == "up" ? plan.profile->qualified() : previous_profile(plan.node);
        w.StartObject();
        kv_s("node", plan.node.name);
        kv_s("status", status);
        kv_s("profile", plan.profile->qualified());
        kv_s("profile_file", plan.profile->file.string());
        kv_s("last_good_profile", last_good);
        kv_s("served_model", plan.served);
        kv_s("max_model_len", plan.max_model_len);
        kv_s("endpoint", plan.endpoint_url);
        kv_s("recipe_dir", plan.node.recipe_dir);
        kv_s("env_backup", backup);
        kv_s("kv_cache_tokens", kv);
        kv_s("updated_at", utc_stamp("%Y-%m-%dT%H:%M:%SZ"));
        w.Key("proof_lines");
        w.StartArray();
        for (const auto& p : proven) w.String(p.c_str());
        w.EndArray();
        w.EndObject();
        return std::string(b.GetString()) + "\n";
    }

    int down(const Args& a) {
        int rc = kOk;
        auto n = node(a.node, rc);
        if (!n) return rc;
        NodeLock lock(settings.state_dir / "locks" / (n->name + ".lock"));
        if (!lock.held()) return locked(n->name, lock);
        open_log(*n);
        auto t = transports(*n);
        auto t0 = Clock::now();
        say("pulse model down --node " + n->name + ": recipe " + n->recipe_dir + " via " + t->describe());
        RunResult r = run(*t, "stop", stop_script(nullptr, *n), n->stop_timeout_s);
        for (const auto& l : lines_of(tail_lines(r.output, 5, ""))) say("      stop: " + l);
        if (!r.ok()) return say("FAILED: stop script: " + describe_failure(r, n->stop_timeout_s)), kFailed;
        auto gib = mem_available(*t, *n);
        say("stopped in " + fmt("%.1f", seconds_since(t0)) + " s; MemAvailable " + (gib ? fmt("%.1f GiB", *gib) : std::string("unreadable")));
        fs::path fp = fragment_path(*n);
        std::error_code ec;
        if (!fp.empty() && fs::remove(fp, ec)) {
            say("withdrew the gateway endpoint " + fp.string());
            reload_gateway(*n);
        }
        // Keep the node state's profile (it is what `status` reports as last used), mark it down.
        fs::path sp = settings.state_dir / "nodes" / (n->name + ".json");
        std::ifstream in(sp);
        std::string text((std::istreambuf_iterator<char>(in)), {});
        rapidjson::Document d;
        d.Parse(text.c_str());
        if (d.IsObject()) {
            if (d.HasMember("status")) d["status"].SetString("down", d.GetAllocator());
            rapidjson::StringBuffer b;
            rapidjson::PrettyWriter<rapidjson::StringBuffer> w(b);
            d.Accept(w);
            std::string err;
            write_file_atomic(sp, std::string(b.GetString()) + "\n", 0644, err);
        }
        return kOk;
    }

    int status(const Args& a) {
        int rc = kOk;
        auto n = node(a.node, rc);
        if (!n) return rc;
        auto t = transports(*n);
        std::ifstream in(settings.state_dir / "nodes" / (n->name + ".json"));
        std::string text((std::istreambuf_iterator<char>(in)), {});
        rapidjson::Document st;
        st.Parse(text.c_str());
        bool have_state = !st.HasParseError() && st.IsObject();
        std::string port = "8888";
        std::string endpoint;
        if (have_state) {
            endpoint = json_str(st, "endpoint");
            auto colon = endpoint.rfind(':');
            if (colon != std::string::npos) port = endpoint.substr(colon + 1, endpoint.find('/', colon) - colon - 1);
        }
        std::string o = "node      " + n->name + " (" + (n->local() ? "local" : n->ssh) + ", recipe " + n->recipe_dir + ")\n";
        RunResult r = t->run(models_probe(*n, port, false), 30);
        std::string code;
        for (const auto& l : lines_of(r.output))
            if (l.rfind("HTTP ", 0) == 0) code = l.substr(5);
        bool up = code == "200";
        std::string models;
        if (up) {
            rapidjson::Document d;
            std::string body = section(r.output, "BODY_BEGIN", "BODY_END");
            d.Parse(body.c_str());
            if (!d.HasParseError() && d.IsObject() && d.HasMember("data") && d["data"].IsArray())
                for (const auto& m : d["data"].GetArray()) {
                    models += (models.empty() ? "" : ", ") + json_str(m, "id");
                    if (m.HasMember("max_model_len") && m["max_model_len"].IsInt64())
                        models += " (max_model_len " + std::to_string(m["max_model_len"].GetInt64()) + ")";
                }
        }
        o += "server    " + std::string(up ? "up" : "down") + " on port " + port +
             (up ? "" : r.ok() ? " (/v1/models: " + (code == "000" || code.empty() ? std::string("not listening") : "HTTP " + code) + ")"
                               : r.exit_code == kNoRecipeDir ? " (" + describe_failure(r, 30) + ")"
                                                             : " (node not reachable: " + describe_failure(r, 30) + ")") + "\n";
        if (up) o += "model     " + models + "\n";
        if (have_state)
            o += "profile   " + json_str(st, "profile") + " (state " + json_str(st, "status") + ", updated " + json_str(st, "updated_at") + ")\n";
        else o += "profile   unknown (no node state: not brought up by `pulse model up`)\n";
        auto gib = mem_available(*t, *n);
        o += "memory    MemAvailable " + (gib ? fmt("%.1f GiB", *gib) : std::string("unreadable")) + "\n";
        o += "gateway   " + (endpoint.empty() ? std::string("no endpoint recorded") : gateway_view(*n, endpoint)) + "\n";
        out(o);
        return up ? kOk : kFailed;
    }
};

Controller::Controller(Settings settings, Print out, TransportFactory transports) : impl_(std::make_shared<Impl>()) {
    impl_->settings = std::move(settings);
    impl_->print = std::move(out);
    impl_->transports = std::move(transports);
}

int Controller::command(const std::vector<std::string>& args) {
    Args a;
    CLI::App model{"Runtime controller: the node's model server, brought up from a runtime profile.", "pulse model"};
    pulse::args::style(model);
    model.footer(kFooter);
    model.require_subcommand(0, 1);
    model.add_option("--nodes", a.nodes_file, "the nodes file (default: [controller] nodes)")->option_text("FILE");
    model.add_option("--profiles", a.profiles_dir, "the runtime profile directory")->option_text("DIR");
    model.add_option("--state-dir", a.state_dir, "node state, run logs and locks")->option_text("DIR");
    auto node = [&](CLI::App* c, bool required) {
        CLI::Option* o = c->add_option("--node", a.node, "the node (its [paths] fill in the site paths)")->option_text("N");
        if (required) o->required();
    };
    CLI::App* profiles = model.add_subcommand("profiles", "the runtime profiles, one line each");
    CLI::App* render = model.add_subcommand("render", "the .env the profile produces (site paths from --node)");
    render->add_option("PROFILE", a.profile, "a runtime profile (`pulse model profiles`)")->type_name("")->required();
    node(render, false);
    CLI::App* up = model.add_subcommand(
        "up", "stop the node's server, write the .env, start, verify, publish the endpoint to the gateway");
    up->add_option("PROFILE", a.profile, "a runtime profile (`pulse model profiles`)")->type_name("")->required();
    node(up, true);
    up->add_flag("--dry-run", a.dry_run, "print the .env and every step's script; run and write nothing");
    CLI::App* down = model.add_subcommand("down", "stop the node's server and withdraw its endpoint");
    node(down, true);
    CLI::App* status = model.add_subcommand("status", "server up?, model, profile, MemAvailable, gateway view");
    node(status, true);
    CLI::App* help = model.add_subcommand("help", "this help");

    const pulse::args::Output to{[this](const std::string& t) { impl_->out(t); }, [this](const std::string& t) { impl_->out(t); }};
    if (auto exit = pulse::args::parse(model, args, to)) return *exit;
    if (*help) return impl_->out(model.help()), kOk;
    if (!a.nodes_file.empty()) impl_->settings.nodes_file = a.nodes_file;
    if (!a.profiles_dir.empty()) impl_->settings.profiles_dir = a.profiles_dir;
    if (!a.state_dir.empty()) impl_->settings.state_dir = a.state_dir;
    if (*profiles) return impl_->profiles();
    if (*render) return impl_->render_cmd(a);
    if (*up) return impl_->up(a);
    if (*down) return impl_->down(a);
    if (*status) return impl_->status(a);
    return pulse::args::usage_error(model, "missing command", to);
}

}  // namespace pulse::runtime
