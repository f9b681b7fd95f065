// Task continuity across Codex's context compaction (docs/CODEX.md, "Task continuity").
//
// Codex runs `pulse continuity hook` on its lifecycle hooks with the event as JSON on stdin.
// The hook keeps, per Codex session and outside the model's context, what a long task must not
// forget — the user's requests, the files changed, the commands run and their exit codes, the
// model's last words of each turn — and after a compaction (SessionStart with source
// "compact") hands it back to the next model turn as additionalContext.
//
// One JSON file per session under state_dir(), 0600 in a 0700 directory, bounded in size;
// concurrent hook processes of one session serialise on a lock file beside it and replace the
// state file atomically.
#pragma once

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pulse::continuity {

// Bad hook input: the message says what was wrong. The hook reports it on stderr and still
// exits 0, so a broken hook never blocks the user's task.
struct HookError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Limits {
    size_t state_bytes = 64 * 1024;   // the state file, at most
    size_t context_chars = 6000;      // the additionalContext handed back
    size_t goals = 8, files = 64, commands = 24, notes = 12;
    // Kept sessions, pruned when a session starts: none untouched for longer than max_age, and
    // at most max_sessions (the least recently updated go first).
    std::chrono::seconds max_age{std::chrono::hours(24 * 30)};
    size_t max_sessions = 500;
};

// $XDG_STATE_HOME/pulse-gateway/continuity, else ~/.local/state/pulse-gateway/continuity.
std::filesystem::path state_dir();

// Codex session ids are UUIDs; anything outside [A-Za-z0-9_-]{1,128} is refused (it names a file).
bool valid_session_id(std::string_view id);

// One hook call. Returns what to print on stdout (empty for most events; the additionalContext
// JSON for SessionStart after a compaction). Throws HookError for input it cannot use.
std::string handle_hook(std::string_view input, const std::filesystem::path& dir, const Limits& limits = {});

// The task state of `session` as the model is given it, or nullopt if none is recorded.
std::optional<std::string> render(const std::filesystem::path& dir, const std::string& session, const Limits& limits = {});

// Deletes the state of `session`; false if there was none.
bool clear(const std::filesystem::path& dir, const std::string& session);

// Deletes every session state not updated within `older_than`, then the least recently updated
// beyond `keep` sessions. Returns how many were deleted. A session being written is skipped.
size_t prune(const std::filesystem::path& dir, std::chrono::seconds older_than, size_t keep = SIZE_MAX);
// Deletes every session's state; returns how many.
size_t clear_all(const std::filesystem::path& dir);

struct SessionInfo {
    std::string id, cwd, updated;
};
std::vector<SessionInfo> list(const std::filesystem::path& dir);

// The files an apply_patch input touches, in order, as "path: added|updated|deleted|moved to X".
std::vector<std::pair<std::string, std::string>> patch_files(std::string_view patch);

}  // namespace pulse::continuity
