#!/usr/bin/env bash
# Warmup after a restart, against a real llama-server (built from source by tools/dev) serving
# the 332.7M synthetic qwen35 model on two slots (-np 2), two threads, 128-token batches: a
# replay of a recorded 1,100-token prompt takes seconds, as long prompts do on real hardware.
#   1. A real request arriving right after the restart (0.2 s after the gateway saw the server
#      back) finds no replay running: replays wait for warmup.quiet_s without real traffic
#      (before, the replay started at once and the request was batched behind its prefill).
#   2. A real request arriving while a replay runs stops it: the gateway closes the replay's
#      connection and llama-server drops the task at its next batch (the replay streams with
#      return_progress, so the server sees the closed connection after every batch, not only
#      at its once-a-second check). Checked in the server's own log: the replay's slot stops
#      with fewer tokens than its prompt has.
# Prints the real request's time to first token in each case, and on the idle server.
#
# usage: llama_server_warmup.sh PULSE_EXE PLUGIN_DIR MAKE_SYNTHETIC
# Needs PULSE_LLAMA_SERVER and PULSE_LLAMA_TEMPLATE (tools/dev sets both); else SKIP.
set -euo pipefail
pulse=$(realpath "$1") plugins=$(realpath "$2") make_synthetic=$(realpath "$3")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_llama_server
enter_netns "$@"

# The 332.7M model in f32 (the slowest synthetic layout): a prefill long enough to measure warmup by.
"$make_synthetic" --bench f32 "$work/bench.gguf" > /dev/null
bias=()
for t in $(seq 128 255); do bias+=(--logit-bias "$t-inf"); done  # no invalid UTF-8 from random weights
lport=$(free_port)
start_server() {
  "$server" -m "$work/bench.gguf" --host 127.0.0.1 --port "$lport" --jinja --chat-template-file "$template" \
    -c 8192 --override-kv qwen35.context_length=int:8192 -np 2 -t 2 -b 128 -ub 128 --seed 1 "${bias[@]}" >> "$work/llama.log" 2>&1 &
  server_pid=$!
  pids+=($server_pid)
  wait_healthy "$lport" "llama-server"
}
start_server

pulse_config_head 0
cat >> "$work/pulse.toml" <<TOML
[upstream]
health_interval_s = 0.2
[warmup]
enabled = true
[models.m]
profile = "llamacpp"
[[models.m.endpoints]]
name = "llama"
url = "http://127.0.0.1:$lport/v1"
TOML
launch_pulse
base="http://127.0.0.1:$gport"

# ttft KEY: a short streamed request of conversation KEY; prints its time to first token.
ttft() {
  python3 - "$base/v1/responses" "$1" <<'PY'
import json, sys, time, urllib.request
body = {"model": "m", "store": False, "stream": True, "max_output_tokens": 4, "reasoning": {"effort": "none"},
        "prompt_cache_key": sys.argv[2], "input": "hi there"}
t0 = time.time()
first = None
with urllib.request.urlopen(urllib.request.Request(sys.argv[1], json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=120) as r:
    for line in r:
        if first is None and line.startswith(b"data: ") and b'"response.output_text.delta"' in line:
            first = time.time() - t0
print(f"{first if first is not None else -1:.2f}")
PY
}
# From the server's log after line $1: released prints "TASK N" for every slot that stopped (N:
# the tokens it held), launched the tasks that started, in order.
released() { tail -n +"$(($1 + 1))" "$work/llama.log" | { grep -oE 'task [0-9]+ \| stop processing: n_tokens = [0-9]+' || true; } | sed -E 's/task ([0-9]+).*= ([0-9]+)/\1 \2/'; }
launched() { tail -n +"$(($1 + 1))" "$work/llama.log" | { grep -oE 'task [0-9]+ \| processing task' || true; } | grep -oE '[0-9]+' || true; }
state_is() { curl -s "$base/health" | grep -q "\"name\":\"llama\",\"url\":\"[^\"]*\",\"state\":\"$1\""; }

idle=$(ttft idle)
# The conversation to warm: about 1,100 prompt tokens.
long=$(python3 -c 'import json; print(json.dumps({"model": "m", "store": False, "max_output_tokens": 1, "reasoning": {"effort": "none"}, "prompt_cache_key": "conv-a", "input": "Please read this project and tell me what it does. " * 30}))')
curl -sf "$base/v1/responses" -H 'Content-Type: application/json' -d "$long" > /dev/null || fail "the long turn"

# 1. The restart, and a real request 0.2 s after the gateway sees the server back.
kill -9 "$server_pid"; wait "$server_pid" 2>/dev/null || true
for _ in $(seq 1 250); do state_is down && break; sleep 0.02; done
state_is down || fail "the gateway did not see the server go"
mark=$(wc -l < "$work/llama.log")
start_server
for _ in $(seq 1 500); do state_is healthy && break; sleep 0.02; done
sleep 0.2
after_restart=$(ttft conv-b)
first_task=$(launched "$mark" | head -n1)
first_tokens=$(released "$mark" | awk -v t="$first_task" '$1 == t {print $2}' | head -n1)
[ -n "$first_task" ] && [ -n "$first_tokens" ] && [ "$first_tokens" -lt 100 ] \
  || fail "a replay ran before the real request that came 0.2 s after the restart (first task $first_task: $first_tokens tokens)"

# 2. The replay starts once the endpoint is quiet; a real request in the middle of it stops it.
mark=$(wc -l < "$work/llama.log")
replay=""
for _ in $(seq 1 500); do replay=$(launched "$mark" | head -n1); [ -n "$replay" ] && break; sleep 0.02; done
[ -n "$replay" ] || fail "no replay started after the quiet period"
sleep 0.5
mid_replay=$(ttft conv-c)
replay_tokens=""
for _ in $(seq 1 500); do replay_tokens=$(released "$mark" | awk -v t="$replay" '$1 == t {print $2}' | head -n1); [ -n "$replay_tokens" ] && break; sleep 0.02; done
[ -n "$replay_tokens" ] && [ "$replay_tokens" -lt 1000 ] \
  || fail "the replay was not stopped by the real request (its slot stopped at ${replay_tokens:-?} of about 1,100 prompt tokens)"
metrics=$(curl -s "$base/metrics")
grep -q 'pulse_warmup_requests_total{model="m",endpoint="llama",outcome="preempted"} 1' <<< "$metrics" \
  || fail "the replay was not counted as preempted"
echo "time to first token: idle server ${idle}s; 0.2 s after a restart ${after_restart}s; during a replay ${mid_replay}s (the replay stopped at $replay_tokens prompt tokens)"
echo "llama-server warmup: ok"
