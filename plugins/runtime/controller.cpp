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
#include "args/args.h"
#include "http/client.h"
#include "node_scripts.h"
#include "nodes.h"

namespace pulse::runtime {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using scripts::kNoRecipeDir;
using scripts::lines_of;
using scripts::section;

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

// What every command shares: the settings, the output and the run log, loading the catalog
// and the nodes, running node scripts, and the gateway this host reaches.
struct Session {
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
        RunResult r = t.run(scripts::meminfo(n), 30);
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
};

// What `up` will do: the profile, the node, the rendered .env and what the server must show.
struct UpPlan {
    const Profile* profile = nullptr;
    Node node;
    Rendered rendered;
    std::string port, served, max_model_len, endpoint_url, backup;
    std::vector<std::string> proofs;  // regexes with values substituted
};

// The family's proof regexes and the profile's, with its values substituted.
std::vector<std::string> proofs_for(const Profile& p, const Rendered& r) {
    std::vector<std::string> out = p.family->proofs;
    for (const auto& pr : p.proofs) out.push_back(expand_proof(pr, r.values));
    return out;
}

std::string bullet_list(const std::vector<std::string>& items) {
    std::string s;
    for (const auto& f : items) s += "\n        " + f;
    return s;
}

std::string toml_quote(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
    }
    return o + "\"";
}

// The gateway's endpoint fragment for the node's server (`origin`: who wrote it, when).
std::string fragment_text(const UpPlan& plan, const std::string& origin) {
    return "# Written by " + origin + "; `pulse model down --node " + plan.node.name + "` removes it.\n"
           "[[endpoints]]\n"
           "upstream_model = " + toml_quote(plan.served) + "\nname = " + toml_quote(plan.node.name) +
           "\nurl = " + toml_quote(plan.endpoint_url) + "\n";
}
// The last profile the node served well, from its state file ("" when none).
std::string previous_profile(const fs::path& state_dir, const Node& n) {
    std::ifstream in(state_dir / "nodes" / (n.name + ".json"));
    std::string text((std::istreambuf_iterator<char>(in)), {});
    rapidjson::Document d;
    d.Parse(text.c_str());
    return d.IsObject() ? json_str(d, "last_good_profile") : std::string();
}

// The node state file's text after an `up` ended (`status` "up" or "failed").
std::string state_json(const fs::path& state_dir, const UpPlan& plan, const std::string& status, const std::string& backup,
                       const std::string& kv, const std::vector<std::string>& proven) {
    rapidjson::StringBuffer b;
    rapidjson::PrettyWriter<rapidjson::StringBuffer> w(b);
    auto kv_s = [&](const char* k, const std::string& v) {
        w.Key(k);
        w.String(v.c_str(), static_cast<rapidjson::SizeType>(v.size()));
    };
    std::string last_good = status == "up" ? plan.profile->qualified() : previous_profile(state_dir, plan.node);
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

// --dry-run: the .env and every step's script as `up` would run them; nothing is run or written.
int print_dry_run(Session& s, const UpPlan& plan) {
    const Profile& p = *plan.profile;
    const Node& n = plan.node;
    auto t = s.transports(n);
    std::string o = "DRY RUN: pulse model up " + p.qualified() + " --node " + n.name + " (nothing is run, no file is written)\n";
    o += "node " + n.name + ": recipe " + n.recipe_dir + ", steps run with: " + t->describe() + "\n\n";
    o += "=== the .env that step 3 writes (" + n.recipe_dir + "/.env) ===\n" + plan.rendered.text + "\n";
    auto step = [&](const std::string& title, const std::string& script) { o += "=== " + title + " ===\n" + script + "\n"; };
    step("step 1/6 preflight (read-only; the lock is " + (s.settings.state_dir / "locks" / (n.name + ".lock")).string() + ")",
         scripts::preflight(p, n, plan.rendered));
    step("step 2/6 stop the old server (timeout " + fmt("%.0f", n.stop_timeout_s) + " s)", scripts::stop(&p, n));
    step("step 2/6 then, every " + fmt("%g", n.poll_interval_s) + " s until MemAvailable >= " + fmt("%.1f", n.memory_threshold_gib) +
             " GiB (timeout " + fmt("%.0f", n.memory_timeout_s) + " s)",
         scripts::meminfo(n));
    step("step 3/6 write the .env, keeping a backup", scripts::write_env(n, plan.rendered.text, plan.backup));
    step("step 4/6 start the recipe (detached)", scripts::start(p, n));
    step("step 4/6 then, every " + fmt("%g", n.poll_interval_s) + " s until /v1/models answers 200 (timeout " +
             fmt("%.0f", n.ready_timeout_s) + " s)",
         scripts::models_probe(n, plan.port, true));
    std::string checks = "served model '" + plan.served + "'" + (plan.max_model_len.empty() ? "" : ", max_model_len " + plan.max_model_len) +
                         ", KV cache line /" + p.family->kv_cache_pattern + "/";
    for (const auto& pr : plan.proofs) checks += ", /" + pr + "/";
    step("step 5/6 verify (" + checks + ") in the server log", scripts::server_log(p, n));
    std::string frag = s.fragment_path(n).empty() ? std::string("(the gateway has no upstream.endpoint_fragments: nothing)")
                                                : s.fragment_path(n).string();
    o += "=== step 6/6 publish (here, not on the node) ===\n";
    o += "write " + (s.settings.state_dir / "nodes" / (n.name + ".json")).string() + "\n";
    o += "write " + frag + ":\n" + fragment_text(plan, "(dry run)") + "\n";
    o += "curl -X POST " + s.gateway_url(n) + "/admin/reload\n\n";
    o += "=== on failure in step 4 or 5 ===\n" + scripts::stop(&p, n) + scripts::restore_env(n, plan.backup);
    s.out(o);
    return kOk;
}

// `pulse model up`: the plan from the profile and the node, then six steps, each said as it
// runs and logged with its scripts; a failure after the .env is written rolls back.
class UpCommand {
public:
    explicit UpCommand(Session& s) : s_(s) {}

    int up(const Args& a) {
        int rc = kOk;
        auto cat = s_.catalog(rc);
        if (!cat) return rc;
        UpPlan plan;
        try {
            plan.profile = &cat->find(a.profile);
        } catch (const std::exception& e) {
            return s_.out(std::string(e.what()) + "\n"), kUsage;
        }
        const Profile& p = *plan.profile;
        if (!p.render_only.empty())
            return s_.out("profile " + p.qualified() + " is render-only: " + p.render_only + "\n`pulse model render " + p.qualified() +
                       "` prints it; `up` will not start it.\n"),
                   kUsage;
        auto n = s_.node(a.node, rc);
        if (!n) return rc;
        plan.node = *n;
        const std::string origin = "pulse model up " + p.qualified() + " --node " + n->name + " at " + utc_stamp("%Y-%m-%dT%H:%M:%SZ");
        plan.rendered = render(p, n->paths, origin);
        if (!plan.rendered.unresolved.empty()) {
            std::string list;
            for (const auto& u : plan.rendered.unresolved) list += (list.empty() ? "" : ", ") + u;
            return s_.out(s_.settings.nodes_file.string() + ": node " + n->name + " has no [paths] entry for " + list + "\n"), kBadConfig;
        }
        if (auto bad = check_values(p, plan.rendered); !bad.empty()) {
            for (const auto& b : bad) s_.out(b + "\n");
            return kBadConfig;
        }
        plan.port = plan.rendered.get(p.family->port_key);
        plan.served = plan.rendered.get(p.family->served_model_key);
        for (const auto& k : p.family->max_model_len_keys)
            if (plan.max_model_len.empty()) plan.max_model_len = plan.rendered.get(k);
        plan.endpoint_url = "http://" + n->host + ":" + plan.port + "/v1";
        plan.backup = ".env.pulse-backup-" + utc_stamp("%Y%m%dT%H%M%SZ");
        plan.proofs = proofs_for(p, plan.rendered);
        if (a.dry_run) return print_dry_run(s_, plan);
        return run_up(plan);
    }

private:


    struct StepTimer {
        Session& impl;
        Clock::time_point start = Clock::now();
        StepTimer(Session& i, int k, const std::string& title) : impl(i) { impl.say("[" + std::to_string(k) + "/6] " + title); }
        int ok(const std::string& note = "") {
            impl.say("      ok (" + fmt("%.1f", seconds_since(start)) + " s)" + (note.empty() ? "" : ": " + note));
            return kOk;
        }
        int fail(const std::string& why) {
            impl.say("      FAILED (" + fmt("%.1f", seconds_since(start)) + " s): " + why);
            return kFailed;
        }
    };


    // What one `up` run carries from step to step.
    struct UpRun {
        const UpPlan& plan;
        Transport& t;
        std::string backup;       // the previous .env's backup on the node ("" = there was none)
        std::string models_body;  // /v1/models once it answered
        std::string kv_tokens;    // the KV cache size the server's log reports
        std::vector<std::string> proven;  // the proof lines found in its log
    };

    int run_up(const UpPlan& plan) {
        const Node& n = plan.node;
        NodeLock lock(s_.settings.state_dir / "locks" / (n.name + ".lock"));
        if (!lock.held()) return s_.locked(n.name, lock);
        s_.open_log(n);
        auto t = s_.transports(n);
        s_.say("pulse model up " + plan.profile->qualified() + " --node " + n.name + ": recipe " + n.recipe_dir + " via " + t->describe());
        s_.say("run log: " + (s_.settings.state_dir / "logs" / (n.name + ".log")).string());
        UpRun u{plan, *t, {}, {}, {}, {}};
        for (auto step : {&UpCommand::up_preflight, &UpCommand::up_stop, &UpCommand::up_write_env, &UpCommand::up_start, &UpCommand::up_verify, &UpCommand::up_publish})
            if (int rc = (this->*step)(u); rc != kOk) return rc;
        s_.say(n.name + " serves " + plan.served + " (profile " + plan.profile->qualified() + ") at " + plan.endpoint_url);
        return kOk;
    }

    // 1. preflight (read-only)
    int up_preflight(UpRun& u) {
        StepTimer st(s_, 1, "preflight");
        RunResult r = s_.run(u.t, "preflight", scripts::preflight(*u.plan.profile, u.plan.node, u.plan.rendered), 60);
        if (!r.spawn_error.empty() || r.timed_out || r.exit_code == 255)
            return st.fail(s_.describe_failure(r, 60) + "\n" + tail_lines(r.output, 5, "        "));
        const scripts::PreflightReport rep = scripts::read_preflight(r.output, r.exit_code, *u.plan.profile, u.plan.node);
        for (const auto& note : rep.notes) s_.say("      " + note);
        if (!rep.problems.empty())
            return st.fail(std::to_string(rep.problems.size()) + " problem" + (rep.problems.size() == 1 ? "" : "s") + bullet_list(rep.problems));
        return st.ok();
    }

    // 2. stop the old server, wait for memory
    int up_stop(UpRun& u) {
        const Node& n = u.plan.node;
        StepTimer st(s_, 2, "stop the old server, wait for MemAvailable >= " + fmt("%.1f", n.memory_threshold_gib) + " GiB");
        RunResult r = s_.run(u.t, "stop", scripts::stop(u.plan.profile, n), n.stop_timeout_s);
        for (const auto& l : lines_of(tail_lines(r.output, 5, ""))) s_.say("      stop: " + l);
        if (!r.ok()) return st.fail("stop script: " + s_.describe_failure(r, n.stop_timeout_s) + "; the .env is unchanged");
        auto t0 = Clock::now();
        for (int poll = 0;; ++poll) {
            auto gib = s_.mem_available(u.t, n);
            double el = seconds_since(t0);
            std::string now = gib ? fmt("%.1f GiB", *gib) : std::string("unreadable");
            if (gib && *gib >= n.memory_threshold_gib) {
                s_.say("      MemAvailable " + now + " after " + fmt("%.0f", el) + " s");
                return st.ok();
            }
            if (!gib && poll == 0) return st.fail("cannot read MemAvailable from " + n.meminfo + " on the node; the .env is unchanged");
            s_.say("      waiting for memory: " + fmt("%.0f", el) + " s, MemAvailable " + now + " (need " + fmt("%.1f", n.memory_threshold_gib) + ")");
            if (el >= n.memory_timeout_s)
                return st.fail("MemAvailable stayed below " + fmt("%.1f", n.memory_threshold_gib) + " GiB for " + fmt("%.0f", n.memory_timeout_s) +
                               " s (last " + now + "): something still holds memory; find it before starting a server (the .env is unchanged)");
            std::this_thread::sleep_for(std::chrono::duration<double>(n.poll_interval_s));
        }
    }

    // 3. write the .env with a backup
    int up_write_env(UpRun& u) {
        const Node& n = u.plan.node;
        StepTimer st(s_, 3, "write " + n.recipe_dir + "/.env");
        RunResult r = s_.run(u.t, "write .env", scripts::write_env(n, u.plan.rendered.text, u.plan.backup), 60);
        if (!r.ok()) return st.fail(s_.describe_failure(r, 60) + "\n" + tail_lines(r.output, 5, "        "));
        for (const auto& l : lines_of(r.output))
            if (l.rfind("BACKUP ", 0) == 0) u.backup = u.plan.backup, s_.say("      previous .env kept as " + l.substr(7));
        if (u.backup.empty()) s_.say("      there was no .env before");
        return st.ok();
    }

    // 4. start and wait for /v1/models
    int up_start(UpRun& u) {
        const Node& n = u.plan.node;
        StepTimer st(s_, 4, "start the recipe, wait for /v1/models on port " + u.plan.port);
        RunResult r = s_.run(u.t, "start", scripts::start(*u.plan.profile, n), n.start_timeout_s);
        if (!r.ok())
            return rollback(u, st.fail("start: " + s_.describe_failure(r, n.start_timeout_s) + "\n" + tail_lines(r.output, 5, "        ")));
        auto t0 = Clock::now();
        for (;;) {
            const scripts::ProbeAnswer a = scripts::read_probe(s_.run(u.t, "ready probe", scripts::models_probe(n, u.plan.port, true), 30).output);
            double el = seconds_since(t0);
            if (a.code == "200") {
                u.models_body = a.body;
                s_.say("      /v1/models answered 200 after " + fmt("%.0f", el) + " s");
                return st.ok();
            }
            if (!a.start_exit.empty() && a.start_exit != "0")
                return rollback(u, st.fail("start script exited with " + a.start_exit + "; its last lines:\n" + a.log_tail));
            if (el >= n.ready_timeout_s)
                return rollback(u, st.fail("/v1/models did not answer 200 within " + fmt("%.0f", n.ready_timeout_s) + " s (last: HTTP " +
                                           (a.code.empty() ? "?" : a.code) + ")"));
            s_.say("      waiting for the server: " + fmt("%.0f", el) + " s, /v1/models: " +
                (a.code == "000" || a.code.empty() ? std::string("not listening yet") : "HTTP " + a.code));
            std::this_thread::sleep_for(std::chrono::duration<double>(n.poll_interval_s));
        }
    }

    // 5. verify: the served model and its window, the KV cache line and the proofs in its log
    int up_verify(UpRun& u) {
        const UpPlan& plan = u.plan;
        StepTimer st(s_, 5, "verify");
        std::vector<std::string> fails;
        rapidjson::Document d;
        d.Parse(u.models_body.c_str());
        const rapidjson::Value* entry = nullptr;
        std::string ids;
        if (!d.HasParseError() && d.IsObject() && d.HasMember("data") && d["data"].IsArray())
            for (const auto& m : d["data"].GetArray()) {
                ids += (ids.empty() ? "" : ", ") + json_str(m, "id");
                if (json_str(m, "id") == plan.served) entry = &m;
            }
        if (!entry) {
            fails.push_back("served model: expected '" + plan.served + "', /v1/models lists " + (ids.empty() ? "(nothing)" : ids));
        } else {
            s_.say("      served model " + plan.served);
            if (!plan.max_model_len.empty()) {
                auto it = entry->FindMember("max_model_len");
                std::string got = it != entry->MemberEnd() && it->value.IsInt64() ? std::to_string(it->value.GetInt64()) : "(absent)";
                if (got != plan.max_model_len) fails.push_back("max_model_len: expected " + plan.max_model_len + ", the server reports " + got);
                else s_.say("      max_model_len " + got);
            }
        }
        RunResult lr = s_.run(u.t, "server log", scripts::server_log(*plan.profile, plan.node), 120);
        if (!lr.ok()) fails.push_back("could not read the server log: " + s_.describe_failure(lr, 120));
        else verify_log(u, lr.output, fails);
        if (!fails.empty())
            return rollback(u, st.fail(std::to_string(fails.size()) + " check" + (fails.size() == 1 ? "" : "s") + " failed" + bullet_list(fails)));
        return st.ok();
    }

    // The server's log: its KV cache line, and every proof line the profile asks for.
    void verify_log(UpRun& u, const std::string& log_text, std::vector<std::string>& fails) {
        const Family& fam = *u.plan.profile->family;
        std::smatch m;
        if (std::regex_search(log_text, m, std::regex(fam.kv_cache_pattern))) {
            u.kv_tokens = m[1].str();
            u.kv_tokens.erase(std::remove(u.kv_tokens.begin(), u.kv_tokens.end(), ','), u.kv_tokens.end());
            s_.say("      KV cache: " + m[0].str());
        } else {
            fails.push_back("no KV cache line (/" + fam.kv_cache_pattern + "/) in the server log");
        }
        for (const auto& pr : u.plan.proofs) {
            if (std::regex_search(log_text, m, std::regex(pr))) {
                u.proven.push_back(m[0].str());
                s_.say("      proof: " + m[0].str());
            } else {
                fails.push_back("proof line /" + pr + "/ not found in the server log");
            }
        }
    }

    // 6. publish: the node state, the gateway's endpoint fragment, a reload
    int up_publish(UpRun& u) {
        const UpPlan& plan = u.plan;
        const Node& n = plan.node;
        StepTimer st(s_, 6, "publish");
        std::string err;
        fs::path sp = s_.settings.state_dir / "nodes" / (n.name + ".json");
        if (!write_file_atomic(sp, state_json(s_.settings.state_dir, plan, "up", u.backup, u.kv_tokens, u.proven), 0644, err))
            return st.fail("node state: " + err + " (the server is up and verified)");
        s_.say("      node state " + sp.string());
        fs::path fp = s_.fragment_path(n);
        if (fp.empty()) {
            s_.say("      the gateway config has no upstream.endpoint_fragments; add this endpoint by hand:\n" + fragment_text(plan, "hand"));
            return st.ok();
        }
        if (!write_file_atomic(fp, fragment_text(plan, "pulse model up " + plan.profile->qualified() + " at " + utc_stamp("%Y-%m-%dT%H:%M:%SZ")), 0644, err))
            return st.fail("gateway fragment: " + err + " (the server is up and verified)");
        s_.say("      gateway fragment " + fp.string() + " (" + plan.endpoint_url + ")");
        s_.reload_gateway(n);
        // Let the gateway probe it once so the operator sees its view.
        std::string view;
        for (int i = 0; i < 20; ++i) {
            view = s_.gateway_view(n, plan.endpoint_url);
            if (view.rfind("healthy", 0) == 0 || view.rfind("gateway not reachable", 0) == 0) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
        }
        s_.say("      gateway view: " + view);
        return st.ok();
    }

    // Stop what was started, put the previous .env back, withdraw the endpoint. Returns `rc`.
    int rollback(UpRun& u, int rc) {
        Transport& t = u.t;
        const UpPlan& plan = u.plan;
        const std::string& backup = u.backup;
        const Node& n = plan.node;
        s_.say("rolling back:");
        RunResult s = s_.run(t, "rollback stop", scripts::stop(plan.profile, n), n.stop_timeout_s);
        s_.say(std::string("      stopped the server started with ") + plan.profile->qualified() +
            (s.ok() ? "" : " (stop script: " + s_.describe_failure(s, n.stop_timeout_s) + ")"));
        RunResult r = s_.run(t, "restore .env", scripts::restore_env(n, backup), 60);
        if (r.ok()) {
            s_.say(backup.empty() ? "      removed the new .env (there was none before)"
                               : "      restored " + n.recipe_dir + "/.env from " + backup);
        } else {
            s_.say("      COULD NOT restore the .env (" + s_.describe_failure(r, 60) + "): restore " + n.recipe_dir + "/" + backup + " by hand");
        }
        std::string err;
        write_file_atomic(s_.settings.state_dir / "nodes" / (n.name + ".json"), state_json(s_.settings.state_dir, plan, "failed", backup, "", {}), 0644, err);
        fs::path fp = s_.fragment_path(n);
        std::error_code ec;
        if (!fp.empty() && fs::remove(fp, ec)) {
            s_.say("      withdrew the gateway endpoint " + fp.string());
            s_.reload_gateway(n);
        }
        std::string prev = previous_profile(s_.settings.state_dir, n);
        s_.say("      the node serves nothing now" + (prev.empty() ? std::string(".") : "; `pulse model up " + prev + " --node " + n.name + "` brings the previous profile back."));
        return rc;
    }



    Session& s_;
};

}  // namespace

struct Controller::Impl : Session {
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
        RunResult r = run(*t, "stop", scripts::stop(nullptr, *n), n->stop_timeout_s);
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
        RunResult r = t->run(scripts::models_probe(*n, port, false), 30);
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
    if (*up) return UpCommand(*impl_).up(a);
    if (*down) return impl_->down(a);
    if (*status) return impl_->status(a);
    return pulse::args::usage_error(model, "missing command", to);
}

}  // namespace pulse::runtime
