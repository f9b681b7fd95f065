#!/usr/bin/env bash
# End to end with the real Codex CLI started by `pulse codex` (which installs the continuity
# hooks for its run): a three-step task in which Codex compacts its context half way. The fake
# backend answers turn 1 with apply_patch, turn 2 with a shell command that fails, and reports
# usage past the auto-compaction limit there; Codex then compacts (the fake writes the summary)
# and asks again. The first request after the compaction must carry the task state the hook
# recorded — the user's request, the file changed, the command and its exit code — and the
# task must then complete.
#   codex_continuity_e2e.sh PULSE_EXE FAKE_VLLM PLUGIN_DIR SOURCE_ROOT
set -euo pipefail
pulse=$(realpath "$1") fake=$(realpath "$2") plugins=$(realpath "$3") src=$(realpath "$4")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_codex
enter_netns "$@"

# Turns by the number of tool results in the request; the compaction request and the one after
# it by their text. Usage is scripted: turn 2 reports 9000 prompt tokens, past the limit (5000).
cat > "$work/script.json" <<'JSON'
{"split": 7, "turns": [
  {"usage": {"prompt_tokens": 1000, "completion_tokens": 10},
   "tool_calls": [{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\n*** Add File: hello.txt\n+hello from pulse\n*** End Patch\n"}}]},
  {"usage": {"prompt_tokens": 9000, "completion_tokens": 10},
   "tool_calls": [{"name": "exec_command", "arguments": {"cmd": "cat hello.txt && ls /no-such-dir", "yield_time_ms": 2000}}]},
  {"usage": {"prompt_tokens": 1000, "completion_tokens": 10}, "content": "unused"},
  {"match": "CONTEXT CHECKPOINT COMPACTION", "usage": {"prompt_tokens": 1000, "completion_tokens": 10},
   "content": "SUMMARY-7f3a: a file was created and a listing failed."},
  {"match": "SUMMARY-7f3a", "usage": {"prompt_tokens": 1200, "completion_tokens": 10},
   "content": "Done: hello.txt says hello from pulse"}
]}
JSON
start_fake "$work/script.json"
pulse_config_head 0
cat >> "$work/pulse.toml" <<TOML
[models."qwen3.8-flash-next"]
profile = "qwen38"
# pulse codex sets model_auto_compact_token_limit to 90 % of this: 5000.
context_window = 5556
[[models."qwen3.8-flash-next".endpoints]]
url = "http://127.0.0.1:$fport/v1"
TOML
launch_pulse

mkdir -p "$work/home" "$work/codex-home" "$work/project"
cd "$work/project"
rc=0
prompt="Create hello.txt saying hello from pulse, then list the files."
HOME="$work/home" CODEX_HOME="$work/codex-home" XDG_RUNTIME_DIR="$work" XDG_STATE_HOME="$work/state" timeout 180 \
  env -u PULSE_GATEWAY_API_KEY -u PULSE_CONFIG "$pulse" codex --gateway "http://127.0.0.1:$gport" --codex "$codex" -- \
  exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox "$prompt" \
  > "$work/codex.out" 2> "$work/codex.err" || rc=$?

[ "$rc" -eq 0 ] || fail "codex exited $rc"
[ "$(cat hello.txt 2>/dev/null)" = "hello from pulse" ] || fail "hello.txt is missing or wrong"
grep -q "Done: hello.txt says hello from pulse" "$work/codex.out" || fail "the task did not complete"
grep -q 'CONTEXT CHECKPOINT COMPACTION' "$work/requests.jsonl" || fail "codex never compacted"
# The first request after the compaction: the one that carries the summary.
# (awk reads the file itself: a `| head` would SIGPIPE the writer and, with pipefail, this script)
after=$(awk '!/^[{]"served"/ && /SUMMARY-7f3a/ { print; exit }' "$work/requests.jsonl")
[ -n "$after" ] || fail "no request after the compaction"
for want in 'Task state recorded by Pulse' 'Create hello.txt saying hello from pulse, then list the files.' \
            'hello.txt: added' 'cat hello.txt && ls /no-such-dir` exited 2' '1 compaction so far'; do
  grep -qF -- "$want" <<<"$after" || fail "the request after the compaction lacks: $want"
done
# Before the compaction nothing was handed back (SessionStart at startup has nothing to give).
first=$(awk '!/^[{]"served"/ { print; exit }' "$work/requests.jsonl")
grep -q 'Task state recorded by Pulse' <<<"$first" && fail "the first request already carried a task state"
sessions=$(HOME="$work/home" XDG_STATE_HOME="$work/state" "$pulse" continuity list | wc -l)
[ "$sessions" -eq 1 ] || fail "expected one recorded session, found $sessions"
mode=$(stat -c %a "$work/state/pulse-gateway/continuity"/*.json)
[ "$mode" = 600 ] || fail "the state file is mode $mode"
echo "codex continuity e2e ($("$codex" --version 2>/dev/null | head -n1)): ok — compaction forced, the next request carried the goal, the changed file and the failed command's exit code, task completed"
