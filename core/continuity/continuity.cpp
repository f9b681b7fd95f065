#include "continuity/continuity.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <regex>
#include <sstream>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace pulse::continuity {
namespace fs = std::filesystem;

namespace {

struct Command {
    std::string cmd, id;
    std::optional<int> exit;
};

struct File {
    std::string path, change;
};

struct State {
    std::string session, cwd, transcript, updated;
    int64_t compactions = 0;
    std::vector<std::string> goals;  // oldest first, as everything here
    std::vector<File> files;
    std::vector<Command> commands;
    std::vector<std::string> log;
    bool empty() const { return goals.empty() && files.empty() && commands.empty() && log.empty(); }
};

std::string now_iso() {
    std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char b[32];
    std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return b;
}

// At most `n` bytes, cut at a UTF-8 character boundary, with an ellipsis when cut.
std::string clip(std::string_view s, size_t n) {
    if (s.size() <= n) return std::string(s);
    size_t cut = n;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    return std::string(s.substr(0, cut)) + "…";
}

std::string one_line(std::string_view s) {
    std::string out(s);
    std::replace(out.begin(), out.end(), '\n', ' ');
    std::replace(out.begin(), out.end(), '\r', ' ');
    return out;
}

std::string str(const rapidjson::Value& o, const char* k) {
    if (!o.IsObject()) return {};
    auto it = o.FindMember(k);
    return it != o.MemberEnd() && it->value.IsString() ? std::string(it->value.GetString(), it->value.GetStringLength()) : std::string();
}

// ---- the state file ----

State parse_state(const std::string& text) {
    State s;
    rapidjson::Document d;
    d.Parse(text.c_str(), text.size());
    if (d.HasParseError() || !d.IsObject()) return s;
    s.session = str(d, "session");
    s.cwd = str(d, "cwd");
    s.transcript = str(d, "transcript");
    s.updated = str(d, "updated");
    if (d.HasMember("compactions") && d["compactions"].IsInt64()) s.compactions = d["compactions"].GetInt64();
    auto strings = [&](const char* k, std::vector<std::string>& out) {
        if (d.HasMember(k) && d[k].IsArray())
            for (const auto& v : d[k].GetArray())
                if (v.IsString()) out.emplace_back(v.GetString(), v.GetStringLength());
    };
    strings("goals", s.goals);
    strings("log", s.log);
    if (d.HasMember("files") && d["files"].IsArray())
        for (const auto& v : d["files"].GetArray()) s.files.push_back({str(v, "path"), str(v, "change")});
    if (d.HasMember("commands") && d["commands"].IsArray())
        for (const auto& v : d["commands"].GetArray()) {
            Command c{str(v, "cmd"), str(v, "id"), std::nullopt};
            if (v.IsObject() && v.HasMember("exit") && v["exit"].IsInt()) c.exit = v["exit"].GetInt();
            s.commands.push_back(std::move(c));
        }
    return s;
}

std::string dump_state(const State& s) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    auto kv = [&](const char* k, const std::string& v) {
        w.Key(k);
        w.String(v.c_str(), static_cast<rapidjson::SizeType>(v.size()));
    };
    w.StartObject();
    kv("session", s.session);
    kv("cwd", s.cwd);
    kv("transcript", s.transcript);
    kv("updated", s.updated);
    w.Key("compactions");
    w.Int64(s.compactions);
    auto strings = [&](const char* k, const std::vector<std::string>& v) {
        w.Key(k);
        w.StartArray();
        for (const auto& x : v) w.String(x.c_str(), static_cast<rapidjson::SizeType>(x.size()));
        w.EndArray();
    };
    strings("goals", s.goals);
    w.Key("files");
    w.StartArray();
    for (const auto& f : s.files) {
        w.StartObject();
        kv("path", f.path);
        kv("change", f.change);
        w.EndObject();
    }
    w.EndArray();
    w.Key("commands");
    w.StartArray();
    for (const auto& c : s.commands) {
        w.StartObject();
        kv("cmd", c.cmd);
        kv("id", c.id);
        if (c.exit) {
            w.Key("exit");
            w.Int(*c.exit);
        }
        w.EndObject();
    }
    w.EndArray();
    strings("log", s.log);
    w.EndObject();
    return {b.GetString(), b.GetSize()};
}

template <class T>
void keep_last(std::vector<T>& v, size_t n) {
    if (v.size() > n) v.erase(v.begin(), v.end() - static_cast<std::ptrdiff_t>(n));
}

// Drops the oldest entries until the serialised state fits (the newest request is kept).
std::string bounded(State& s, const Limits& limits) {
    std::string text = dump_state(s);
    while (text.size() > limits.state_bytes) {
        if (s.log.size() > 1) s.log.erase(s.log.begin());
        else if (s.commands.size() > 1) s.commands.erase(s.commands.begin());
        else if (s.files.size() > 1) s.files.erase(s.files.begin());
        else if (s.goals.size() > 1) s.goals.erase(s.goals.begin());
        else break;  // single entries are clipped on entry; this cannot grow past the limit
        text = dump_state(s);
    }
    return text;
}

// The session's lock, held while its state is read, changed and replaced.
class SessionLock {
public:
    SessionLock(const fs::path& dir, const std::string& session) {
        fs::create_directories(dir);
        fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
        fs::path p = dir / (session + ".lock");
        fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd_ < 0) throw std::runtime_error("cannot open " + p.string() + ": " + std::strerror(errno));
        while (::flock(fd_, LOCK_EX) != 0)
            if (errno != EINTR) throw std::runtime_error("cannot lock " + p.string() + ": " + std::strerror(errno));
    }
    ~SessionLock() {
        if (fd_ >= 0) ::close(fd_);  // releases the lock
    }
    SessionLock(const SessionLock&) = delete;
    SessionLock& operator=(const SessionLock&) = delete;

private:
    int fd_ = -1;
};

std::optional<std::string> read_file(const fs::path& p) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return std::nullopt;
    std::string text;
    char buf[8192];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return text;
}

void write_atomically(const fs::path& p, const std::string& text) {
    fs::path tmp = p;
    tmp += ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) throw std::runtime_error("cannot write " + tmp.string() + ": " + std::strerror(errno));
    ::fchmod(fd, 0600);  // whatever an old file's mode was
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), p.c_str()) != 0) {
        ::unlink(tmp.c_str());
        throw std::runtime_error("cannot replace " + p.string() + ": " + std::strerror(errno));
    }
}

fs::path state_file(const fs::path& dir, const std::string& session) { return dir / (session + ".json"); }

// Exit codes of recorded commands, from Codex's own transcript (the hook input carries only a
// command's output): its function_call_output for the call says "Process exited with code N".
void resolve_exit_codes(State& s) {
    bool pending = std::any_of(s.commands.begin(), s.commands.end(), [](const Command& c) { return !c.exit && !c.id.empty(); });
    if (!pending || s.transcript.empty()) return;
    std::ifstream in(s.transcript, std::ios::binary);
    if (!in) return;
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    const std::streamoff window = 16 << 20;  // the newest 16 MiB: a transcript can be long
    in.seekg(size > window ? size - window : 0);
    static const std::regex exit_re(R"(Process exited with code (-?\d+))");
    std::smatch m;
    for (std::string line; std::getline(in, line);) {
        if (line.find("function_call_output") == std::string::npos) continue;
        for (auto& c : s.commands) {
            if (c.exit || c.id.empty() || line.find("\"call_id\":\"" + c.id + "\"") == std::string::npos) continue;
            if (std::regex_search(line, m, exit_re)) c.exit = std::stoi(m[1]);
        }
    }
}

std::string render_state(State& s, const Limits& limits) {
    resolve_exit_codes(s);
    std::string out = "Task state recorded by Pulse outside the model context (Codex session " + s.session + ", " +
                      std::to_string(s.compactions) + " compaction" + (s.compactions == 1 ? "" : "s") +
                      " so far). Continue this task; do not start over.\n";
    auto section = [&](const std::string& title, std::vector<std::string> lines) {
        if (lines.empty()) return;
        out += "\n" + title + "\n";
        for (const auto& l : lines) {
            if (out.size() + l.size() + 3 > limits.context_chars) {
                out += "- (older entries left out)\n";
                return;
            }
            out += "- " + l + "\n";
        }
    };
    std::vector<std::string> lines;
    for (auto it = s.goals.rbegin(); it != s.goals.rend(); ++it) lines.push_back(clip(one_line(*it), 600));
    section("The user's requests (newest first):", lines);
    lines.clear();
    for (auto it = s.files.rbegin(); it != s.files.rend(); ++it) lines.push_back(it->path + ": " + it->change);
    section("Files changed (newest first):", lines);
    lines.clear();
    for (auto it = s.commands.rbegin(); it != s.commands.rend(); ++it)
        lines.push_back("`" + clip(one_line(it->cmd), 200) + "`" + (it->exit ? " exited " + std::to_string(*it->exit) : std::string()));
    section("Commands run (newest first):", lines);
    lines.clear();
    for (auto it = s.log.rbegin(); it != s.log.rend(); ++it) lines.push_back(clip(one_line(*it), 300));
    section("What happened (newest first):", lines);
    return clip(out, limits.context_chars);
}

std::string session_start_output(const std::string& context) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.StartObject();
    w.Key("hookSpecificOutput");
    w.StartObject();
    w.Key("hookEventName");
    w.String("SessionStart");
    w.Key("additionalContext");
    w.String(context.c_str(), static_cast<rapidjson::SizeType>(context.size()));
    w.EndObject();
    w.EndObject();
    return std::string(b.GetString(), b.GetSize()) + "\n";
}

void note_file(State& s, const std::string& path, const std::string& change) {
    std::erase_if(s.files, [&](const File& f) { return f.path == path; });
    s.files.push_back({path, change});
}

}  // namespace

fs::path state_dir() {
    fs::path base;
    if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x == '/') {
        base = x;
    } else {
        const char* home = std::getenv("HOME");
        if (!home || !*home) throw std::runtime_error("neither XDG_STATE_HOME nor HOME is set: no place for the task state");
        base = fs::path(home) / ".local" / "state";
    }
    // Tasks saved before 0.1 (under .../pulse/) stay where they are, and are found there.
    std::error_code ec;
    if (!fs::exists(base / "pulse-gateway" / "continuity", ec) && fs::is_directory(base / "pulse" / "continuity", ec))
        return base / "pulse" / "continuity";
    return base / "pulse-gateway" / "continuity";
}

bool valid_session_id(std::string_view id) {
    if (id.empty() || id.size() > 128) return false;
    return std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; });
}

std::vector<std::pair<std::string, std::string>> patch_files(std::string_view patch) {
    std::vector<std::pair<std::string, std::string>> out;
    std::istringstream in{std::string(patch)};
    static const std::pair<const char*, const char*> kinds[] = {
        {"*** Add File: ", "added"}, {"*** Update File: ", "updated"}, {"*** Delete File: ", "deleted"}};
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        for (const auto& [prefix, change] : kinds)
            if (line.rfind(prefix, 0) == 0) out.emplace_back(line.substr(std::strlen(prefix)), change);
        if (line.rfind("*** Move to: ", 0) == 0 && !out.empty()) out.back().second = "moved to " + line.substr(13);
    }
    return out;
}

std::string handle_hook(std::string_view input, const fs::path& dir, const Limits& limits) {
    rapidjson::Document d;
    d.Parse(input.data(), input.size());
    if (d.HasParseError() || !d.IsObject()) throw HookError("the hook input is not a JSON object");
    const std::string event = str(d, "hook_event_name"), session = str(d, "session_id");
    if (event.empty()) throw HookError("the hook input has no hook_event_name");
    if (!valid_session_id(session)) throw HookError("the hook input has no usable session_id ('" + clip(session, 60) + "')");

    SessionLock lock(dir, session);
    const fs::path file = state_file(dir, session);
    State s;
    if (auto text = read_file(file)) s = parse_state(*text);
    s.session = session;
    if (auto cwd = str(d, "cwd"); !cwd.empty()) s.cwd = cwd;
    if (auto t = str(d, "transcript_path"); !t.empty()) s.transcript = t;

    std::string out;
    bool changed = true;
    if (event == "SessionStart") {
        changed = false;
        // A new run is when old runs' states are let go: none lives forever.
        prune(dir, limits.max_age, limits.max_sessions);
        if (str(d, "source") == "compact" && !s.empty()) out = session_start_output(render_state(s, limits));
    } else if (event == "UserPromptSubmit") {
        std::string prompt = clip(str(d, "prompt"), 1500);
        if (prompt.empty() || (!s.goals.empty() && s.goals.back() == prompt)) changed = false;
        else s.goals.push_back(prompt);
        keep_last(s.goals, limits.goals);
    } else if (event == "PostToolUse") {
        const std::string tool = str(d, "tool_name");
        const rapidjson::Value* input_v = d.HasMember("tool_input") ? &d["tool_input"] : nullptr;
        std::string command = input_v && input_v->IsObject() ? str(*input_v, "command") : input_v && input_v->IsString() ? input_v->GetString() : "";
        if (tool == "apply_patch") {
            for (const auto& [path, change] : patch_files(command)) note_file(s, clip(path, 300), change);
            keep_last(s.files, limits.files);
        } else if (!command.empty()) {  // Codex's shell tools (exec_command arrives as "Bash")
            s.commands.push_back({clip(command, 500), clip(str(d, "tool_use_id"), 128), std::nullopt});
            keep_last(s.commands, limits.commands);
        } else if (!tool.empty()) {
            s.log.push_back("used the tool " + clip(tool, 100));
        }
    } else if (event == "PreCompact") {
        resolve_exit_codes(s);  // while the transcript still has the outputs near its end
    } else if (event == "PostCompact") {
        ++s.compactions;
        s.log.push_back("the context was compacted (" + (str(d, "trigger").empty() ? std::string("auto") : str(d, "trigger")) + ")");
    } else if (event == "Stop") {
        std::string last = str(d, "last_assistant_message");
        if (last.empty()) changed = false;
        else s.log.push_back("a turn ended with: " + clip(one_line(last), 400));
    } else {
        changed = false;  // an event this hook does not record
    }
    keep_last(s.log, limits.notes);
    if (changed) {
        s.updated = now_iso();
        write_atomically(file, bounded(s, limits));
    }
    return out;
}

std::optional<std::string> render(const fs::path& dir, const std::string& session, const Limits& limits) {
    if (!valid_session_id(session)) return std::nullopt;
    auto text = read_file(state_file(dir, session));
    if (!text) return std::nullopt;
    State s = parse_state(*text);
    if (s.session.empty()) s.session = session;
    return render_state(s, limits);
}

bool clear(const fs::path& dir, const std::string& session) {
    if (!valid_session_id(session)) return false;
    std::error_code ec;
    bool removed = fs::remove(state_file(dir, session), ec);
    fs::remove(dir / (session + ".lock"), ec);
    return removed;
}

size_t prune(const fs::path& dir, std::chrono::seconds older_than, size_t keep) {
    std::error_code ec;
    std::vector<std::pair<fs::file_time_type, fs::path>> files;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        if (e.path().extension() != ".json") continue;
        auto t = fs::last_write_time(e.path(), ec);
        if (!ec) files.emplace_back(t, e.path());
    }
    std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.first > b.first; });  // newest first
    const auto cutoff = fs::file_time_type::clock::now() - older_than;
    size_t removed = 0;
    for (size_t i = 0; i < files.size(); ++i) {
        if (files[i].first >= cutoff && i < keep) continue;
        const fs::path lock = dir / (files[i].second.stem().string() + ".lock");
        int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // a hook is writing it now
            ::close(fd);
            continue;
        }
        if (fs::remove(files[i].second, ec)) ++removed;
        fs::remove(lock, ec);
        if (fd >= 0) ::close(fd);
    }
    return removed;
}

size_t clear_all(const fs::path& dir) {
    size_t n = 0;
    for (const auto& s : list(dir)) n += clear(dir, s.id) ? 1 : 0;
    return n;
}

std::vector<SessionInfo> list(const fs::path& dir) {
    std::vector<SessionInfo> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        if (e.path().extension() != ".json") continue;
        auto text = read_file(e.path());
        if (!text) continue;
        State s = parse_state(*text);
        out.push_back({e.path().stem().string(), s.cwd, s.updated});
    }
    std::sort(out.begin(), out.end(), [](const SessionInfo& a, const SessionInfo& b) { return a.updated > b.updated; });
    return out;
}

}  // namespace pulse::continuity
