#include "node_scripts.h"

#include <sstream>

#include "env_file.h"

namespace pulse::runtime::scripts {
namespace {

std::string prologue(const Node& n) {
    return "set -u\ncd -- " + shell_quote(n.recipe_dir) + " || { echo \"FAIL recipe directory " + n.recipe_dir +
           " is missing or not accessible\"; exit " + std::to_string(kNoRecipeDir) + "; }\n";
}

std::string first_word(const std::string& cmd) { return cmd.substr(0, cmd.find(' ')); }

// The first field of a process line ("PID rest" or "PID, rest").
std::string first_field(const std::string& line) {
    auto f = line.find_first_not_of(" \t");
    if (f == std::string::npos) return {};
    return line.substr(f, line.find_first_of(" \t,", f) - f);
}

}  // namespace

std::string preflight(const Profile& p, const Node& n, const Rendered& r) {
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

std::vector<std::pair<std::string, std::string>> paths_to_check(const Profile& p, const Node& n, const Rendered& r) {
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

std::string stop(const Profile* p, const Node& n) { return prologue(n) + (p ? p->family->stop_command : std::string("./stop.sh")) + "\n"; }

std::string meminfo(const Node& n) {
    return "awk '/^MemAvailable:/ {print $2; found = 1} END {if (!found) exit 1}' " + shell_quote(n.meminfo) + "\n";
}

std::string write_env(const Node& n, const std::string& env_text, const std::string& backup) {
    std::string eof = "PULSE_ENV_EOF";
    while (env_text.find(eof) != std::string::npos) eof += "_";
    return "set -eu\ncd -- " + shell_quote(n.recipe_dir) +
           "\numask 077\n"
           "if [ -e .env ]; then cp -p .env " + shell_quote(backup) + " && echo \"BACKUP $PWD/" + backup +
           "\"; else echo NOBACKUP; fi\n"
           "cat > .env.pulse-new <<'" + eof + "'\n" + env_text + eof + "\n"
           "mv -f .env.pulse-new .env\necho \"WROTE $PWD/.env\"\n";
}

std::string start(const Profile& p, const Node& n) {
    return prologue(n) +
           "rm -f .pulse-start.rc\n"
           "nohup setsid bash -c " + shell_quote(p.family->start_command + "; echo $? > .pulse-start.rc") +
           " > .pulse-start.log 2>&1 < /dev/null &\n"
           "echo \"STARTED pid $! (output in $PWD/.pulse-start.log)\"\n";
}

std::string models_probe(const Node& n, const std::string& port, bool start_state) {
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

std::string server_log(const Profile& p, const Node& n) {
    std::string cmd = n.log_command.empty() ? p.family->log_command : n.log_command;
    return prologue(n) + "set -a; . ./.env; set +a\n{ " + cmd + "\n} 2>&1 | tail -n 20000\n";
}

std::string restore_env(const Node& n, const std::string& backup) {
    std::string s = "set -eu\ncd -- " + shell_quote(n.recipe_dir) + "\n";
    if (backup.empty()) return s + "rm -f .env\necho \"REMOVED $PWD/.env (there was none before)\"\n";
    return s + "cp -p " + shell_quote(backup) + " .env\necho \"RESTORED $PWD/.env from " + backup + "\"\n";
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

PreflightReport read_preflight(const std::string& output, int exit_code, const Profile& p, const Node& n) {
    PreflightReport rep;
    for (const auto& l : lines_of(output)) {
        if (l.rfind("OK ", 0) == 0) rep.notes.push_back(l.substr(3));
        else if (l.rfind("FAIL ", 0) == 0) rep.problems.push_back(l.substr(5));
    }
    if (exit_code == kNoRecipeDir && rep.problems.empty()) rep.problems.push_back("recipe directory " + n.recipe_dir + " is not accessible");
    // The profile's keys against the recipe's .env.sample, both ways.
    if (output.find("SAMPLE_BEGIN") != std::string::npos) {
        auto sample = sample_keys(section(output, "SAMPLE_BEGIN", "SAMPLE_END"));
        std::set<std::string> in_sample(sample.begin(), sample.end()), in_profile;
        std::string missing, unknown;
        for (const auto& e : p.env.entries) {
            in_profile.insert(e.key);
            const KeySpec* spec = p.family->key(e.key);
            if (!in_sample.count(e.key) && !(spec && !spec->in_sample)) unknown += (unknown.empty() ? "" : ", ") + e.key;
        }
        for (const auto& k : sample)
            if (!in_profile.count(k)) missing += (missing.empty() ? "" : ", ") + k;
        if (!missing.empty()) rep.problems.push_back("keys of the recipe's .env.sample missing from " + p.file.string() + ": " + missing);
        if (!unknown.empty()) rep.problems.push_back("keys in " + p.file.string() + " that the recipe's .env.sample does not have: " + unknown);
        if (missing.empty() && unknown.empty())
            rep.notes.push_back("profile keys match the recipe's .env.sample (" + std::to_string(sample.size()) + " keys)");
    } else {
        rep.notes.push_back("no .env.sample in the recipe: key completeness not checked");
    }
    // GPU processes other than the recipe's own server's stop the run.
    std::set<std::string> own;
    for (const auto& l : lines_of(section(output, "OWN_BEGIN", "OWN_END")))
        if (auto pid = first_field(l); !pid.empty()) own.insert(pid);
    int others = 0;
    for (const auto& l : lines_of(section(output, "GPU_BEGIN", "GPU_END"))) {
        std::string pid = first_field(l);
        if (pid.empty()) continue;
        if (own.count(pid)) rep.notes.push_back("GPU: " + l + " belongs to this recipe's server (stopped in step 2)");
        else ++others, rep.problems.push_back("another process is using the GPU: " + l + " (stop it first)");
    }
    if (others == 0) rep.notes.push_back("GPU: no other server running");
    return rep;
}

ProbeAnswer read_probe(const std::string& output) {
    ProbeAnswer a;
    for (const auto& l : lines_of(output)) {
        if (l.rfind("HTTP ", 0) == 0) a.code = l.substr(5);
        else if (l.rfind("START_EXIT ", 0) == 0) a.start_exit = l.substr(11);
        else if (l.rfind("LOG ", 0) == 0) a.log_tail += "        " + l.substr(4) + "\n";
    }
    if (a.code == "200") a.body = section(output, "BODY_BEGIN", "BODY_END");
    return a;
}

}  // namespace pulse::runtime::scripts
