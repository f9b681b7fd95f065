#include "cli/continuity_cmd.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <iostream>

#include "continuity/continuity.h"

namespace pulse::cli {

namespace {

const char* kHelp =
    "usage: pulse continuity <command>\n"
    "\n"
    "Keeps a Codex task's state (the user's requests, files changed, commands run and their exit\n"
    "codes, how each turn ended) outside the model context, and gives it back to the model after\n"
    "Codex compacts the conversation. `pulse codex` installs it for its run.\n"
    "\n"
    "commands:\n"
    "  hook            the Codex hook command: reads one hook event (JSON) on stdin\n"
    "  show SESSION    print the task state of a Codex session as the model gets it\n"
    "  clear SESSION   forget a session's task state (clear --all: every session's)\n"
    "  list            the sessions with a recorded state, newest first\n"
    "  prune --older-than AGE [--keep N]\n"
    "                  forget sessions not updated for AGE (e.g. 7d, 12h, 30m), then all but the\n"
    "                  N most recent\n"
    "  hooks-json      print a hooks.json that installs the hook for plain `codex`\n"
    "\n"
    "The state lives in $XDG_STATE_HOME/pulse-gateway/continuity (default ~/.local/state/pulse-gateway/continuity),\n"
    "one file per session, mode 0600. When a session starts, states not updated for 30 days are\n"
    "deleted, and all but the 500 most recent. The hook never blocks Codex: bad input is reported\n"
    "on stderr and it exits 0.\n";

// "7d", "12h", "30m", "45s" (or plain seconds) -> seconds; nullopt if it is none of those.
std::optional<std::chrono::seconds> parse_age(const std::string& s) {
    if (s.empty()) return std::nullopt;
    size_t used = 0;
    long long n = 0;
    try {
        n = std::stoll(s, &used);
    } catch (const std::exception&) {
        return std::nullopt;
    }
    if (n < 0) return std::nullopt;
    const std::string unit = s.substr(used);
    const long long mult = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : 0;
    if (!mult) return std::nullopt;
    return std::chrono::seconds(n * mult);
}

// Reads stdin, at most `cap` bytes (a hook event is small; a runaway writer must not fill memory).
std::string read_stdin(size_t cap) {
    std::string in;
    char buf[65536];
    for (ssize_t n; (n = ::read(0, buf, sizeof buf)) > 0;) {
        in.append(buf, static_cast<size_t>(n));
        if (in.size() > cap) throw continuity::HookError("the hook input is larger than " + std::to_string(cap >> 20) + " MiB");
    }
    return in;
}

std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\', out += c;
        else if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            out += b;
        } else out += c;
    }
    return out + "\"";
}

}  // namespace

const std::vector<std::string>& continuity_events() {
    static const std::vector<std::string> events = {"SessionStart", "UserPromptSubmit", "PostToolUse", "PreCompact", "PostCompact", "Stop"};
    return events;
}

int cmd_continuity(const std::vector<std::string>& args, const std::string& self_exe) {
    const std::string sub = args.empty() ? "" : args[0];
    if (sub == "--help" || sub == "-h" || sub == "help") return std::fputs(kHelp, stdout), 0;
    for (const auto& a : args)  // Codex runs the hook with no arguments: an option is a person asking
        if (a == "--help" || a == "-h") return std::fputs(kHelp, stdout), 0;
    if (sub == "hook") {
        // Whatever happens, Codex goes on: a hook that failed prints why and exits 0.
        try {
            std::string out = continuity::handle_hook(read_stdin(16 << 20), continuity::state_dir());
            std::fwrite(out.data(), 1, out.size(), stdout);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "pulse continuity: %s (the task goes on without it)\n", e.what());
        }
        return 0;
    }
    if (sub == "clear" && args.size() == 2 && args[1] == "--all") {
        std::printf("cleared %zu sessions\n", continuity::clear_all(continuity::state_dir()));
        return 0;
    }
    if (sub == "prune") {
        std::optional<std::chrono::seconds> age;
        size_t keep = SIZE_MAX;
        for (size_t i = 1; i < args.size(); ++i) {
            if (args[i] == "--older-than" && i + 1 < args.size()) {
                age = parse_age(args[++i]);
                if (!age) return std::fprintf(stderr, "pulse continuity: --older-than wants an age like 7d, 12h, 30m or 90s\n"), 2;
            } else if (args[i] == "--keep" && i + 1 < args.size()) {
                try {
                    keep = static_cast<size_t>(std::stoull(args[++i]));
                } catch (const std::exception&) {
                    return std::fprintf(stderr, "pulse continuity: --keep wants a count\n"), 2;
                }
            } else {
                return std::fprintf(stderr, "pulse continuity: unexpected argument '%s' to prune\n%s", args[i].c_str(), kHelp), 2;
            }
        }
        if (!age) return std::fprintf(stderr, "pulse continuity: prune needs --older-than AGE\n%s", kHelp), 2;
        std::printf("pruned %zu sessions\n", continuity::prune(continuity::state_dir(), *age, keep));
        return 0;
    }
    if ((sub == "show" || sub == "clear") && args.size() == 2) {
        if (!continuity::valid_session_id(args[1])) {
            std::fprintf(stderr, "pulse continuity: '%s' is not a Codex session id\n", args[1].c_str());
            return 2;
        }
        if (sub == "clear") {
            if (continuity::clear(continuity::state_dir(), args[1])) return 0;
            std::fprintf(stderr, "pulse continuity: no task state recorded for session %s\n", args[1].c_str());
            return 1;
        }
        auto text = continuity::render(continuity::state_dir(), args[1]);
        if (!text) {
            std::fprintf(stderr, "pulse continuity: no task state recorded for session %s\n", args[1].c_str());
            return 1;
        }
        std::fputs(text->c_str(), stdout);
        return 0;
    }
    if (sub == "list" && args.size() == 1) {
        for (const auto& s : continuity::list(continuity::state_dir()))
            std::printf("%s  %s  %s\n", s.id.c_str(), s.updated.c_str(), s.cwd.c_str());
        return 0;
    }
    if (sub == "hooks-json" && args.size() == 1) {
        std::string cmd = json_string(self_exe + " continuity hook");
        std::string out = "{\n  \"hooks\": {\n";
        const auto& ev = continuity_events();
        for (size_t i = 0; i < ev.size(); ++i)
            out += "    \"" + ev[i] + "\": [{\"hooks\": [{\"type\": \"command\", \"command\": " + cmd + ", \"timeout\": 10}]}]" +
                   (i + 1 < ev.size() ? ",\n" : "\n");
        out += "  }\n}\n";
        std::fputs(out.c_str(), stdout);
        return 0;
    }
    std::fprintf(stderr, "pulse continuity: %s\n%s", sub.empty() ? "missing command" : ("unexpected arguments to '" + sub + "'").c_str(), kHelp);
    return 2;
}

}  // namespace pulse::cli
