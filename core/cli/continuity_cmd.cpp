#include "cli/continuity_cmd.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <iostream>

#include <rapidjson/prettywriter.h>
#include <rapidjson/stringbuffer.h>

#include "continuity/continuity.h"

namespace pulse::cli {

namespace {

const char* kFooter =
    "Keeps a Codex task's state (the user's requests, files changed, commands run and their exit\n"
    "codes, how each turn ended) outside the model context, and gives it back to the model after\n"
    "Codex compacts the conversation. `pulse codex` installs it for its run.\n"
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

}  // namespace

const std::vector<std::string>& continuity_events() {
    static const std::vector<std::string> events = {"SessionStart", "UserPromptSubmit", "PostToolUse", "PreCompact", "PostCompact", "Stop"};
    return events;
}

CLI::App* add_continuity_command(CLI::App& pulse, ContinuityArgs& a) {
    CLI::App* cmd = pulse.add_subcommand("continuity", "hook|show|clear|list|prune: Codex task state kept across context compaction");
    cmd->footer(kFooter);
    cmd->require_subcommand(1);
    auto session_id = [](const std::string& id) -> std::string {
        return continuity::valid_session_id(id) ? "" : "'" + id + "' is not a Codex session id";
    };
    a.hook = cmd->add_subcommand("hook", "the Codex hook command: reads one hook event (JSON) on stdin");
    a.hook->allow_extras();  // Codex passes none; the hook never fails Codex over its arguments
    a.show = cmd->add_subcommand("show", "print the task state of a Codex session as the model gets it");
    a.show->add_option("SESSION", a.session, "a Codex session id")->type_name("")->required()->check(session_id);
    a.clear = cmd->add_subcommand("clear", "forget a session's task state (--all: every session's)");
    CLI::Option* one = a.clear->add_option("SESSION", a.session, "a Codex session id")->type_name("")->check(session_id);
    CLI::Option* all = a.clear->add_flag("--all", a.all, "every session's")->excludes(one);
    a.clear->require_option(1);
    (void)all;
    a.list = cmd->add_subcommand("list", "the sessions with a recorded state, newest first");
    a.prune = cmd->add_subcommand("prune", "forget sessions not updated for AGE, then all but the N most recent");
    a.prune->add_option("--older-than", a.older_than, "e.g. 7d, 12h, 30m or 90s")
        ->option_text("AGE")
        ->required()
        ->check([](const std::string& v) -> std::string { return parse_age(v) ? "" : "wants an age like 7d, 12h, 30m or 90s"; });
    a.prune->add_option("--keep", a.keep, "keep at most the N most recent")->option_text("N");
    a.hooks_json = cmd->add_subcommand("hooks-json", "print a hooks.json that installs the hook for plain `codex`");
    return cmd;
}

int cmd_continuity(const ContinuityArgs& a, const std::string& self_exe) {
    if (*a.hook) {
        // Whatever happens, Codex goes on: a hook that failed prints why and exits 0.
        try {
            std::string out = continuity::handle_hook(read_stdin(16 << 20), continuity::state_dir());
            std::fwrite(out.data(), 1, out.size(), stdout);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "pulse continuity: %s (the task goes on without it)\n", e.what());
        }
        return 0;
    }
    if (*a.clear && a.all) {
        std::printf("cleared %zu sessions\n", continuity::clear_all(continuity::state_dir()));
        return 0;
    }
    if (*a.prune) {
        std::printf("pruned %zu sessions\n", continuity::prune(continuity::state_dir(), *parse_age(a.older_than), a.keep));
        return 0;
    }
    if (*a.clear) {
        if (continuity::clear(continuity::state_dir(), a.session)) return 0;
        std::fprintf(stderr, "pulse continuity: no task state recorded for session %s\n", a.session.c_str());
        return 1;
    }
    if (*a.show) {
        auto text = continuity::render(continuity::state_dir(), a.session);
        if (!text) {
            std::fprintf(stderr, "pulse continuity: no task state recorded for session %s\n", a.session.c_str());
            return 1;
        }
        std::fputs(text->c_str(), stdout);
        return 0;
    }
    if (*a.list) {
        for (const auto& s : continuity::list(continuity::state_dir()))
            std::printf("%s  %s  %s\n", s.id.c_str(), s.updated.c_str(), s.cwd.c_str());
        return 0;
    }
    // hooks-json: every event on this binary's hook command.
    rapidjson::StringBuffer buf;
    rapidjson::PrettyWriter<rapidjson::StringBuffer> w(buf);
    const std::string command = self_exe + " continuity hook";
    w.StartObject();
    w.Key("hooks");
    w.StartObject();
    for (const auto& event : continuity_events()) {
        w.Key(event.c_str());
        w.StartArray();
        w.StartObject();
        w.Key("hooks");
        w.StartArray();
        w.StartObject();
        w.Key("type");
        w.String("command");
        w.Key("command");
        w.String(command.c_str(), static_cast<rapidjson::SizeType>(command.size()));
        w.Key("timeout");
        w.Int(10);
        w.EndObject();
        w.EndArray();
        w.EndObject();
        w.EndArray();
    }
    w.EndObject();
    w.EndObject();
    std::printf("%s\n", buf.GetString());
    return 0;
}

}  // namespace pulse::cli
