#!/usr/bin/env bash
# A frozen llama-server against a busy one, with real llama-server processes (built from source
# by tools/dev) and Pulse's default liveness settings (upstream.liveness_after_s = 8,
# liveness_timeout_s = 4; head_timeout_s stays at 300):
#   1. a prefill of one to two minutes (6,600 tokens into the 332.7M synthetic model on one thread,
#      its context raised to 8,192) completes untouched: it reports its progress batch by batch
#      (return_progress, shown on /status.json), and upstream.stall_after_s (20 s here, over a
#      batch's ~5 s) never cuts a prefill that progresses;
#   2. SIGSTOP in the middle of such a prefill: the request is served by the second endpoint
#      within 15 s of the stop, not after head_timeout_s;
#   3. SIGSTOP in the middle of an answer: the response is resumed on the second endpoint within
#      15 s of the stop, not after idle_timeout_s.
#
# usage: llama_server_frozen.sh PULSE_EXE PLUGIN_DIR MAKE_SYNTHETIC
# Needs PULSE_LLAMA_SERVER and PULSE_LLAMA_TEMPLATE (tools/dev sets both); else SKIP.
set -euo pipefail
pulse=$(realpath "$1") plugins=$(realpath "$2") make_synthetic=$(realpath "$3")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_llama_server
enter_netns "$@"

# The slow server: the 332.7M-parameter synthetic model, one thread, 512-token batches (a
# cancelled prefill is dropped at the next batch's end). --ignore-eos keeps its answers going
# until the token limit. The fast second server: the tiny model.
"$make_synthetic" --bench Q8_0 "$work/bench.gguf" > /dev/null
"$make_synthetic" --tiny "$work/tiny.gguf"
bias=()
for t in $(seq 128 255); do bias+=(--logit-bias "$t-inf"); done  # no invalid UTF-8 from random weights
slow_port=$(free_port) fast_port=$(free_port)
"$server" -m "$work/bench.gguf" --host 127.0.0.1 --port "$slow_port" --jinja --chat-template-file "$template" \
  -c 8192 --override-kv qwen35.context_length=int:8192 -np 1 -t 1 -b 512 -ub 512 --ignore-eos --seed 1 "${bias[@]}" > "$work/slow.log" 2>&1 &
slow_pid=$!
pids+=($slow_pid)
"$server" -m "$work/tiny.gguf" --host 127.0.0.1 --port "$fast_port" --jinja --chat-template-file "$template" \
  -c 4096 -np 2 -t 1 --seed 1 "${bias[@]}" > "$work/fast.log" 2>&1 &
pids+=($!)
wait_healthy "$slow_port" "the slow llama-server"
wait_healthy "$fast_port" "the fast llama-server"

pulse_config_head 0
cat >> "$work/pulse.toml" <<TOML
[upstream]
retry_window_s = 60
health_interval_s = 1
stall_after_s = 20
[models.solo]
profile = "llamacpp"
[[models.solo.endpoints]]
name = "slow"
url = "http://127.0.0.1:$slow_port/v1"
[models.pair]
profile = "llamacpp"
[[models.pair.endpoints]]
name = "slow"
url = "http://127.0.0.1:$slow_port/v1"
[[models.pair.endpoints]]
name = "fast"
url = "http://127.0.0.1:$fast_port/v1"
TOML
launch_pulse

python3 - "http://127.0.0.1:$gport" "http://127.0.0.1:$slow_port" "$slow_pid" "$work/pulse.log" <<'PY' || fail "frozen-backend checks failed"
import http.client, json, os, signal, sys, time, urllib.request
gateway, slow, slow_pid, pulse_log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
failures = []
def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok: failures.append(what)

def stream(model, prompt, max_tokens, on_first_output=None, timeout=240):
    """Streams one response; returns (terminal type, seconds since the start, text)."""
    host, port = gateway.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    body = {"model": model, "input": prompt, "stream": True, "store": False, "max_output_tokens": max_tokens, "reasoning": {"effort": "none"}}
    c.request("POST", "/v1/responses", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    t0, terminal, text, fired = time.time(), None, "", False
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: "): continue
        e = json.loads(line[6:])
        if e["type"].endswith(".delta"):
            text += e.get("delta", "")
            if on_first_output and not fired:
                fired = True
                on_first_output()
        if e["type"] in ("response.completed", "response.incomplete", "response.failed"):
            terminal = e["type"]
            break
    c.close()
    return terminal, time.time() - t0, text

def idle(timeout=300):
    """Waits until the slow server has no task in progress (a cancelled one ends at a batch's end)."""
    until = time.time() + timeout
    while time.time() < until:
        try:
            with urllib.request.urlopen(slow + "/slots", timeout=5) as r:
                if not any(s.get("is_processing") for s in json.loads(r.read())): return True
        except OSError:
            pass
        time.sleep(0.5)
    return False

def log():
    return open(pulse_log).read()

# 1. A long prefill is busy, not frozen: it completes on the only endpoint.
long_prompt = " ".join(f"w{i}" for i in range(1500))   # about 6,600 tokens: 65 s here
progress = []  # (processed, total) seen on /status.json while the prefill runs
watching = [True]
def watch():
    while watching[0]:
        try:
            with urllib.request.urlopen(gateway + "/status.json", timeout=5) as r:
                for q in json.loads(r.read()).get("requests", []):
                    if "prefill" in q: progress.append((q["prefill"]["processed"], q["prefill"]["total"]))
        except OSError:
            pass
        time.sleep(1)
import threading
watcher = threading.Thread(target=watch)
watcher.start()
terminal, took, _ = stream("solo", long_prompt, 4)
watching[0] = False
watcher.join()
print(f"long prefill: {terminal} after {took:.1f} s; progress seen: {progress[:3]} ... {progress[-3:]}", flush=True)
check(len({p for p, _ in progress}) >= 3, f"the status page showed the prefill advancing ({len(progress)} readings)")
check(all(t > 6000 for _, t in progress), "the status page showed the prompt's whole size")
check("stalled" not in log(), "a progressing prefill was not taken for a stalled one (stall_after_s = 20)")
check(terminal in ("response.completed", "response.incomplete"), f"a {took:.0f} s prefill completed ({terminal})")
check(took > 30, f"the prefill took long enough to be asked about several times ({took:.1f} s; liveness_after_s is 8)")
check("stopped answering" not in log(), "a busy llama-server was not taken for a frozen one")

# 2. SIGSTOP in the middle of a prefill.
check(idle(), "slow server idle before the mid-prefill stop")
stopped_at = []
def stop_later():
    time.sleep(3)
    stopped_at.append(time.time())
    os.kill(slow_pid, signal.SIGSTOP)
threading.Thread(target=stop_later).start()
terminal, took, text = stream("pair", " ".join(f"w{i}" for i in range(500)), 8)
after_stop = time.time() - stopped_at[0]
os.kill(slow_pid, signal.SIGCONT)
print(f"mid-prefill SIGSTOP: {terminal} {after_stop:.1f} s after the stop", flush=True)
check(terminal in ("response.completed", "response.incomplete"), f"served by the second endpoint after a mid-prefill SIGSTOP ({terminal})")
check(after_stop < 15, f"within 15 s of the stop ({after_stop:.1f} s; head_timeout_s is 300)")
check("the backend stopped answering (frozen?)" in log(), "the log says the backend was frozen")

# 3. SIGSTOP in the middle of an answer.
check(idle(), "slow server idle before the mid-answer stop")
stopped_at.clear()
def stop_now():
    stopped_at.append(time.time())
    os.kill(slow_pid, signal.SIGSTOP)
before = log().count("resuming the response after")
terminal, took, text = stream("pair", "tell me a story", 200, on_first_output=stop_now)
after_stop = time.time() - stopped_at[0] if stopped_at else -1
os.kill(slow_pid, signal.SIGCONT)
print(f"mid-answer SIGSTOP: {terminal} {after_stop:.1f} s after the stop, {len(text)} characters", flush=True)
check(bool(stopped_at), "the slow server started answering")
check(terminal in ("response.completed", "response.incomplete"), f"resumed after a mid-answer SIGSTOP ({terminal})")
check(0 <= after_stop < 15, f"within 15 s of the stop ({after_stop:.1f} s; idle_timeout_s is 300)")
check(log().count("resuming the response after") > before, "the log says the response was resumed")
sys.exit(1 if failures else 0)
PY
echo "frozen-backend checks passed"
