// Task continuity (core/continuity): the hook's record of a Codex session and what it hands
// back after a compaction. Hook inputs are shaped as Codex 0.169/0.171 sends them (docs/CODEX.md).
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rapidjson/document.h>

#include "continuity/continuity.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace pulse::continuity;
using pulse::test::read_file;
using pulse::test::TempDir;

namespace {

const std::string kSession = "01a23229-9f83-7662-b9ff-359f78e2fee7";

std::string event(const std::string& name, const std::string& fields, const std::string& session = kSession) {
    return R"({"session_id":")" + session + R"(","cwd":"/work/project","hook_event_name":")" + name +
           R"(","model":"qwen3.8-flash-next","permission_mode":"bypassPermissions")" + (fields.empty() ? "" : "," + fields) + "}";
}

std::string json_quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out + "\"";
}

std::string patch_event(const std::string& patch, const std::string& id) {
    return event("PostToolUse", R"("tool_name":"apply_patch","tool_input":{"command":)" + json_quote(patch) +
                                    R"(},"tool_response":"Success.","tool_use_id":")" + id + R"(","turn_id":"t1")");
}

std::string shell_event(const std::string& cmd, const std::string& id) {
    return event("PostToolUse", R"("tool_name":"Bash","tool_input":{"command":)" + json_quote(cmd) + R"(},"tool_response":"out","tool_use_id":")" +
                                    id + R"(","turn_id":"t1")");
}

// The additionalContext of a SessionStart hook output.
std::string context_of(const std::string& out) {
    rapidjson::Document d;
    d.Parse(out.c_str());
    REQUIRE_MESSAGE(d.IsObject(), out);
    CHECK(std::string(d["hookSpecificOutput"]["hookEventName"].GetString()) == "SessionStart");
    return d["hookSpecificOutput"]["additionalContext"].GetString();
}

}  // namespace

TEST_CASE("a session's requests, files, commands and turn ends come back after a compaction, newest first") {
    TempDir tmp;
    const fs::path dir = tmp / "state";
    // Codex's transcript, where the exit code of a shell call is (the hook input has only its output).
    auto transcript = tmp.write("rollout.jsonl",
                                R"({"type":"response_item","payload":{"type":"function_call_output","call_id":"call_b","output":"Chunk ID: 1\nProcess exited with code 2\nOutput:\nls: cannot access"}})"
                                "\n");
    const std::string tp = R"("transcript_path":")" + transcript.string() + "\"";
    CHECK(handle_hook(event("SessionStart", tp + R"(,"source":"startup")"), dir).empty());  // nothing to hand back yet
    CHECK(handle_hook(event("UserPromptSubmit", tp + R"(,"prompt":"Create hello.txt saying hello","turn_id":"t1")"), dir).empty());
    handle_hook(patch_event("*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** Update File: src/a.c\n@@\n-x\n+y\n*** End Patch\n", "call_a"), dir);
    handle_hook(shell_event("cat hello.txt && ls /nope", "call_b"), dir);
    handle_hook(patch_event("*** Begin Patch\n*** Update File: old.txt\n*** Move to: new.txt\n@@\n-a\n+b\n*** End Patch\n", "call_c"), dir);
    handle_hook(event("Stop", R"("last_assistant_message":"Created hello.txt.","turn_id":"t1")"), dir);
    handle_hook(event("UserPromptSubmit", R"("prompt":"Now add a README","turn_id":"t2")"), dir);
    handle_hook(event("PreCompact", R"("trigger":"auto","turn_id":"t2")"), dir);
    handle_hook(event("PostCompact", R"("trigger":"auto","turn_id":"t2")"), dir);

    std::string ctx = context_of(handle_hook(event("SessionStart", tp + R"(,"source":"compact")"), dir));
    CAPTURE(ctx);
    CHECK(ctx.find("Codex session " + kSession + ", 1 compaction so far") != std::string::npos);
    CHECK(ctx.find("do not start over") != std::string::npos);
    // Newest first within each section.
    CHECK(ctx.find("- Now add a README") < ctx.find("- Create hello.txt saying hello"));
    CHECK(ctx.find("- old.txt: moved to new.txt") < ctx.find("- hello.txt: added"));
    CHECK(ctx.find("- src/a.c: updated") != std::string::npos);
    CHECK(ctx.find("- `cat hello.txt && ls /nope` exited 2") != std::string::npos);
    CHECK(ctx.find("the context was compacted (auto)") < ctx.find("a turn ended with: Created hello.txt."));
    // The same text for people, and the session is listed.
    CHECK(render(dir, kSession) == ctx);
    auto sessions = list(dir);
    REQUIRE(sessions.size() == 1);
    CHECK(sessions[0].id == kSession);
    CHECK(sessions[0].cwd == "/work/project");
    // Private: the directory 0700, the state file 0600.
    struct stat st{};
    REQUIRE(::stat(dir.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
    REQUIRE(::stat((dir / (kSession + ".json")).c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(clear(dir, kSession));
    CHECK_FALSE(clear(dir, kSession));
    CHECK_FALSE(render(dir, kSession).has_value());
}

TEST_CASE("after a compaction with nothing recorded the hook hands nothing back; events it does not record change nothing") {
    TempDir tmp;
    CHECK(handle_hook(event("SessionStart", R"("source":"compact")"), tmp.path()).empty());
    CHECK(handle_hook(event("PermissionRequest", R"("tool_name":"Bash")"), tmp.path()).empty());
    CHECK_FALSE(fs::exists(tmp / (kSession + ".json")));
}

TEST_CASE("bad hook input is refused with a message that says what is wrong") {
    TempDir tmp;
    CHECK_THROWS_WITH_AS(handle_hook("not json", tmp.path()), "the hook input is not a JSON object", HookError);
    CHECK_THROWS_WITH_AS(handle_hook("[1,2]", tmp.path()), "the hook input is not a JSON object", HookError);
    CHECK_THROWS_WITH_AS(handle_hook(R"({"session_id":"abc"})", tmp.path()), "the hook input has no hook_event_name", HookError);
    // A session id names a file: nothing outside [A-Za-z0-9_-] gets near the file system.
    CHECK_THROWS_WITH_AS(handle_hook(event("UserPromptSubmit", R"("prompt":"x")", "../../etc/passwd"), tmp.path()),
                         doctest::Contains("no usable session_id ('../../etc/passwd')"), HookError);
    CHECK_THROWS_AS(handle_hook(event("UserPromptSubmit", R"("prompt":"x")", ""), tmp.path()), HookError);
    CHECK(fs::is_empty(tmp.path()));
    // A state file that is not JSON (a crash mid-write cannot cause it: writes are atomic) is started over.
    tmp.write(kSession + ".json", "{garbage");
    handle_hook(event("UserPromptSubmit", R"("prompt":"again")"), tmp.path());
    CHECK(render(tmp.path(), kSession)->find("- again") != std::string::npos);
}

TEST_CASE("the state is bounded: the file stays under its limit, the newest entries stay, long text is clipped") {
    TempDir tmp;
    Limits limits;
    limits.state_bytes = 16 * 1024;
    for (int i = 0; i < 300; ++i) {
        handle_hook(shell_event("make target-" + std::to_string(i) + " " + std::string(400, 'x'), "call_" + std::to_string(i)), tmp.path(), limits);
        handle_hook(event("UserPromptSubmit", R"("prompt":"request )" + std::to_string(i) + " " + std::string(3000, 'y') + "\""), tmp.path(), limits);
    }
    CHECK(fs::file_size(tmp / (kSession + ".json")) <= limits.state_bytes);
    std::string ctx = *render(tmp.path(), kSession, limits);
    CHECK(ctx.size() <= limits.context_chars + 3);  // + the ellipsis
    CHECK(ctx.find("make target-299") != std::string::npos);  // the newest command
    CHECK(ctx.find("make target-0 ") == std::string::npos);
    CHECK(ctx.find("- request 299") != std::string::npos);
    CHECK(ctx.find("- request 200") == std::string::npos);  // 8 requests kept
}

TEST_CASE("concurrent hook processes of one session lose no event") {
    TempDir tmp;
    Limits limits;
    limits.commands = 1000;
    limits.state_bytes = 1 << 20;
    const int procs = 8, each = 25;
    std::vector<pid_t> kids;
    for (int p = 0; p < procs; ++p) {
        pid_t pid = ::fork();
        if (pid == 0) {
            int rc = 0;
            for (int i = 0; i < each; ++i) {
                try {
                    handle_hook(shell_event("echo " + std::to_string(p) + "-" + std::to_string(i), "c" + std::to_string(p * 100 + i)), tmp.path(),
                                limits);
                } catch (...) {
                    rc = 1;
                }
            }
            ::_exit(rc);
        }
        kids.push_back(pid);
    }
    for (pid_t k : kids) {
        int status = 0;
        REQUIRE(::waitpid(k, &status, 0) == k);
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
    }
    rapidjson::Document d;
    d.Parse(read_file(tmp / (kSession + ".json")).c_str());
    REQUIRE(d.IsObject());
    CHECK(d["commands"].Size() == procs * each);
}

TEST_CASE("patch_files: the files an apply_patch input touches") {
    auto f = patch_files("*** Begin Patch\r\n*** Add File: a b.txt\r\n+x\r\n*** Delete File: gone.c\n*** Update File: m.c\n*** Move to: n.c\n*** End Patch\n");
    REQUIRE(f.size() == 3);
    CHECK(f[0] == std::make_pair(std::string("a b.txt"), std::string("added")));
    CHECK(f[1] == std::make_pair(std::string("gone.c"), std::string("deleted")));
    CHECK(f[2] == std::make_pair(std::string("m.c"), std::string("moved to n.c")));
    CHECK(patch_files("no patch here").empty());
}
