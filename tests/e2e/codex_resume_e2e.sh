#!/usr/bin/env bash
# End to end with the real Codex CLI through backends that die mid-answer in every turn: two
# fake vLLM servers, each under a restart loop (like systemd Restart=always), each scripted to
# SIGKILL itself a few tokens into every answer it starts (a continuation it is asked for is
# served whole). The task is three turns: apply_patch (the kill falls inside the reasoning),
# exec_command (inside the text before the call), the answer (inside the text). Pulse must
# resume each answer on the other server: Codex, allowed no retries of its own, exits 0 with
# no "Reconnecting", the file holds the patched text, and every kill was resumed.
#   codex_resume_e2e.sh PULSE_EXE FAKE_VLLM PLUGIN_DIR SOURCE_ROOT
set -euo pipefail
pulse=$(realpath "$1") fake=$(realpath "$2") plugins=$(realpath "$3") src=$(realpath "$4")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_codex
enter_netns "$@"

answer="Created hello.txt; it says: hello from pulse"
cat > "$work/script.json" <<JSON
{"split": 7, "turns": [
  {"reasoning": "The user wants a file. I will create it with apply_patch right away.", "die_after": 4, "die": "kill",
   "tool_calls": [{"name": "apply_patch",
                   "arguments": {"input": "*** Begin Patch\n*** Add File: hello.txt\n+hello from pulse\n*** End Patch\n"}}]},
  {"content": "Now I read the file back to check it.", "die_after": 3, "die": "kill",
   "tool_calls": [{"name": "exec_command", "arguments": {"cmd": "cat hello.txt", "yield_time_ms": 2000}}]},
  {"content": "$answer", "die_after": 2, "die": "kill"}
]}
JSON
# supervise NAME PORT: the fake on a fixed port, started again whenever it dies (bounded).
supervise() {
  ( for _ in $(seq 1 50); do
      [ -f "$work/stop" ] && break
      "$fake" --script "$work/script.json" --port "$2" --record "$work/$1.jsonl" > "$work/$1.out" 2>&1 &
      echo $! > "$work/$1.pid"  # the fake itself, which cleanup stops after this loop
      wait $! || true
    done ) &
  pids+=($!)
}
aport=$(free_port) bport=$(free_port)
supervise a "$aport"
supervise b "$bport"
wait_port "$work/a.out" 'listening on 127\.0\.0\.1:[0-9]+' > /dev/null || fail "fake a did not start"
wait_port "$work/b.out" 'listening on 127\.0\.0\.1:[0-9]+' > /dev/null || fail "fake b did not start"

pulse_config_head 0
cat >> "$work/pulse.toml" <<TOML
[upstream]
health_interval_s = 0.2
connect_timeout_s = 1
retry_window_s = 60
[warmup]
enabled = false
[models."qwen3.8-flash-next"]
profile = "qwen38"
context_window = 65536
[[models."qwen3.8-flash-next".endpoints]]
name = "a"
url = "http://127.0.0.1:$aport/v1"
[[models."qwen3.8-flash-next".endpoints]]
name = "b"
url = "http://127.0.0.1:$bport/v1"
TOML
launch_pulse

mkdir -p "$work/home" "$work/codex-home" "$work/project"
cd "$work/project"
codex_exec 0 "Create hello.txt saying hello from pulse, then check it."
touch "$work/stop"

kills=$(cat "$work/a.jsonl" "$work/b.jsonl" 2>/dev/null | grep -c '"died":"kill"' || true)
resumed=$(grep -c 'resuming the response' "$work/pulse.log" || true)
[ "$rc" -eq 0 ] || fail "codex exited $rc"
grep -q 'Reconnecting' "$work/codex.err" && fail "codex had to reconnect"
[ -f hello.txt ] || fail "hello.txt was not created"
[ "$(cat hello.txt)" = "hello from pulse" ] || fail "hello.txt holds '$(cat hello.txt)'"
grep -qF "$answer" "$work/codex.out" || fail "the answer was not printed whole"
[ "$kills" -ge 3 ] || fail "only $kills kills: a turn was not cut"
[ "$resumed" -eq "$kills" ] || fail "$kills kills but $resumed resumed responses"
grep -q 'outcome=failed' "$work/pulse.log" && fail "a response failed"
curl -s "http://127.0.0.1:$gport/metrics" > "$work/metrics.txt" || fail "no /metrics"
metric=$(grep -E '^pulse_resumed_streams_total\{' "$work/metrics.txt" | awk '{s += $2} END {print s + 0}')
[ "$metric" -eq "$kills" ] || fail "pulse_resumed_streams_total says $metric, not $kills"
echo "codex resume e2e ($("$codex" --version 2>/dev/null | head -n1)): ok — $kills answers killed mid-stream (kill -9), $resumed resumed on the other server, codex exit 0 without reconnecting, hello.txt correct"
