#!/usr/bin/env bash
# End to end with the real Codex CLI through a full outage of every server endpoint: the model's
# only server (a fake vLLM) answers the first turn with an apply_patch call and is then killed;
# the rest of the task is served by the model's last-resort endpoint, the in-process decoder
# (decoder://, the random-weight demo model). Codex must finish: exit 0, hello.txt with the
# patched content, and the gateway must say where the later turns went (log, metric).
#   codex_outage_e2e.sh PULSE_EXE FAKE_VLLM PLUGIN_DIR SOURCE_ROOT
set -euo pipefail
pulse=$(realpath "$1") fake=$(realpath "$2") plugins=$(realpath "$3") src=$(realpath "$4")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_codex
enter_netns "$@"

cat > "$work/script.json" <<'JSON'
{"split": 7, "turns": [
  {"tool_calls": [{"name": "apply_patch",
                   "arguments": {"input": "*** Begin Patch\n*** Add File: hello.txt\n+hello from pulse\n*** End Patch\n"}}]}
]}
JSON
start_fake "$work/script.json"
pulse_config_head 0
cat >> "$work/pulse.toml" <<TOML
[upstream]
health_interval_s = 0.2
connect_timeout_s = 1
retry_window_s = 60
[models."qwen3.8-flash-next"]
profile = "qwen38"
context_window = 65536
[[models."qwen3.8-flash-next".endpoints]]
name = "server"
url = "http://127.0.0.1:$fport/v1"
[[models."qwen3.8-flash-next".endpoints]]
name = "local"
url = "decoder://$work/pulse-demo.gguf"
last_resort = true
[models."qwen3.8-flash-next".endpoints.options]
make_demo = true
[models."qwen3.8-flash-next".sampling]
temperature = 0.7
max_output_tokens = 2048
[models."qwen3.8-flash-next".profile_options]
thinking = "off"
TOML
launch_pulse

# The outage: the server goes away as soon as it has answered the first turn.
fake_pid=${pids[0]}
( for _ in $(seq 1 3000); do
    grep -q '^{"served":1' "$work/requests.jsonl" 2>/dev/null && { kill -9 "$fake_pid"; echo killed > "$work/killed"; break; }
    sleep 0.02
  done ) &
pids+=($!)

mkdir -p "$work/home" "$work/codex-home" "$work/project"
cd "$work/project"
codex_exec 0 "Create hello.txt saying hello from pulse."

[ -f "$work/killed" ] || fail "the server was never taken down"
[ "$rc" -eq 0 ] || fail "codex exited $rc"
[ -f hello.txt ] || fail "hello.txt was not created"
[ "$(cat hello.txt)" = "hello from pulse" ] || fail "hello.txt holds '$(cat hello.txt)'"
grep -q 'endpoint=server outcome=completed' "$work/pulse.log" || fail "the server did not serve the first turn"
grep -q 'served by the last-resort endpoint local: every other endpoint is down' "$work/pulse.log" \
  || fail "no turn went to the last resort"
grep -q 'endpoint=local outcome=completed' "$work/pulse.log" || fail "the last resort completed no turn"
grep -q 'Reconnecting' "$work/codex.err" && fail "codex had to reconnect"
echo "codex outage e2e ($("$codex" --version 2>/dev/null | head -n1)): ok — server down after turn 1, the local decoder finished the task, codex exit 0, hello.txt correct"
