#!/usr/bin/env bash
# End-to-end with the real Codex CLI: `codex exec` -> `pulse serve` -> a fake backend scripted
# to (1) call apply_patch to create a file, (2) run a shell command through Codex's exec tool,
# (3) answer. Asserts that Codex exits 0, the file exists with the expected content, the
# command's output reached the model, and the answer is printed.
#
# Everything runs inside a private network namespace (unshare -n, lo up): Codex, the gateway
# and the backend can reach each other on 127.0.0.1 and nothing else.
#
# usage: codex_e2e.sh PULSE_EXE FAKE_VLLM PLUGIN_DIR SOURCE_ROOT [PROFILE] [FLAVOR] [MODE]
#   PROFILE: translation profile under test (qwen38 | llamacpp); FLAVOR: fake backend dialect.
#   MODE "kill9": the gateway runs under a supervisor loop (like systemd Restart=) and is
#   killed with SIGKILL while the first request is in flight; Codex's retry must still
#   complete the turn.
#   MODE "launcher": Codex is started through `pulse codex` (no -c flags of ours) instead.
#   MODE "goal" (Codex 0.171 and later): the model first calls create_goal; Codex then sends
#   the goal back as a function_call_output that answers no call (agent/goal_objective).
# The Codex binary comes from $PULSE_CODEX (tools/dev installs the pinned version), or from
# $PULSE_CODEX_NEWEST (the newest release) when PULSE_CODEX_USE=newest.
set -euo pipefail
pulse=$(realpath "$1") fake=$(realpath "$2") plugins=$(realpath "$3") src=$(realpath "$4")
profile=${5:-qwen38} flavor=${6:-vllm} mode=${7:-normal}

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_codex
enter_netns "$@"

first_delay=0
[ "$mode" = kill9 ] && first_delay=3000
# The fake picks a turn by how many tool messages a request carries; the goal's two (the
# create_goal output and the goal context) skip turn 1.
goal_turns=""
[ "$mode" = goal ] && goal_turns='{"tool_calls": [{"name": "create_goal", "arguments": {"objective": "Create hello.txt saying hello from pulse"}}]},
  {"content": "unused"},'
cat > "$work/script.json" <<JSON
{"split": 7, "turns": [ $goal_turns
  {"reasoning": "The user wants a file. I will create it with apply_patch.", "first_delay_ms": $first_delay,
   "tool_calls": [{"name": "apply_patch",
                   "arguments": {"input": "*** Begin Patch\n*** Add File: hello.txt\n+hello from pulse\n*** End Patch\n"}}]},
  {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": "cat hello.txt", "yield_time_ms": 2000}}]},
  {"content": "Created hello.txt; it says: hello from pulse"}
]}
JSON
start_fake "$work/script.json"
retries=1
if [ "$mode" = kill9 ]; then
  retries=5
  # A fixed port, so the restarted gateway is where Codex reconnects.
  gport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  start_pulse_config "$gport"
  ( while [ ! -f "$work/stop" ]; do
      env -u PULSE_PLUGIN_DIRS -u PULSE_QWEN_BACKENDS -u PULSE_GATEWAY_API_KEY PULSE_LOG_TIMESTAMPS=0 \
        "$pulse" serve --config "$work/pulse.toml" >> "$work/pulse.log" 2>&1 &
      echo $! > "$work/pulse.pid"
      wait $! || true
      sleep 0.2
    done ) &
  pids+=($!)
  wait_port "$work/pulse.log" 'listening on http://127\.0\.0\.1:[0-9]+' >/dev/null || fail "pulse did not start"
  # Kill -9 the gateway once the first request reached the (slow) backend.
  ( for _ in $(seq 1 500); do
      [ -s "$work/requests.jsonl" ] && { kill -9 "$(cat "$work/pulse.pid")"; echo killed > "$work/killed"; break; }
      sleep 0.02
    done ) &
  pids+=($!)
else
  start_pulse
fi

mkdir -p "$work/home" "$work/codex-home" "$work/project"
cd "$work/project"
rc=0
prompt="Create hello.txt saying hello from pulse, then show its content."
if [ "$mode" = launcher ]; then
  HOME="$work/home" CODEX_HOME="$work/codex-home" XDG_RUNTIME_DIR="$work" timeout 180 \
    env -u PULSE_GATEWAY_API_KEY -u PULSE_CONFIG "$pulse" codex --gateway "http://127.0.0.1:$gport" --codex "$codex" -- \
    exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox "$prompt" \
    > "$work/codex.out" 2> "$work/codex.err" || rc=$?
else
  codex_exec "$retries" "$prompt"
fi

[ "$rc" -eq 0 ] || fail "codex exited $rc"
[ -f hello.txt ] || fail "hello.txt was not created"
[ "$(cat hello.txt)" = "hello from pulse" ] || fail "hello.txt holds '$(cat hello.txt)'"
grep -q "Created hello.txt; it says: hello from pulse" "$work/codex.out" || fail "the answer was not printed"
touch "$work/stop"
requests=$(grep -vc '^{"served"' "$work/requests.jsonl" || true)
if [ "$mode" = kill9 ]; then
  [ -f "$work/killed" ] || fail "the gateway was never killed"
  starts=$(grep -c 'listening on' "$work/pulse.log")
  [ "$starts" -ge 2 ] || fail "the gateway did not restart (started $starts times)"
  [ "$requests" -ge 4 ] || fail "expected the first turn to be retried (>= 4 backend requests), saw $requests"
elif [ "$mode" = goal ]; then
  [ "$requests" -eq 4 ] || fail "expected 4 backend requests (goal, patch, exec, answer), saw $requests"
  grep -q '"name":"agent__goal_objective"' "$work/requests.jsonl" || fail "the goal context did not reach the model as a tool result"
else
  [ "$requests" -eq 3 ] || fail "expected 3 backend requests (patch, exec, answer), saw $requests"
fi
# The exec tool's output went back to the model in the third request.
tail -n 2 "$work/requests.jsonl" | head -n 1 | grep -q 'hello from pulse' || fail "the command output did not reach the model"
grep -q 'outcome=completed' "$work/pulse.log" || fail "pulse logged no completed response"
echo "codex e2e ($("$codex" --version 2>/dev/null | head -n1), $profile, $mode): ok — codex exit 0, hello.txt created, command output returned, answer printed"
