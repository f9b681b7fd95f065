// `pulse continuity`: the Codex hook command that keeps a task's state across compaction, and
// the commands people use to look at that state (docs/CODEX.md, "Task continuity").
#pragma once

#include <string>
#include <vector>

namespace pulse::cli {

// argv after "continuity": hook | show SESSION | clear SESSION | list | hooks-json. Returns the exit code.
int cmd_continuity(const std::vector<std::string>& args, const std::string& self_exe);

// The Codex hook events the continuity hook listens to.
const std::vector<std::string>& continuity_events();

}  // namespace pulse::cli
