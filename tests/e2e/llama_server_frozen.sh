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
#      15 s of the stop, not after idle_timeout_s;
#   4. the engine alone stops in the middle of a prefill (ptrace stops the one thread that
#      computes, with -t 1 the one burning CPU; its HTTP threads go on answering): no more
#      progress while the liveness probe is answered — a stall, served by the second endpoint
#      within stall_after_s (20 s) of the last progress.
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
# until the token limit. The fast second server: the tiny model. f32: the slowest synthetic
# layout, the one these timings were set with.
"$make_synthetic" --bench f32 "$work/bench.gguf" > /dev/null
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
[warmup]
enabled = false  # no replays after a recovery: the slow server is idle when a step starts
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

def logged(text, more_than, timeout=10):
    """Waits until the log holds `text` more than `more_than` times. A response's record line is
    written by its request thread after the stream loop has sent the client the terminal event,
    so the client can read the log before the line is there."""
    until = time.time() + timeout
    while time.time() < until and log().count(text) <= more_than:
        time.sleep(0.1)
    return log().count(text) > more_than

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
# 4. The engine stops, its HTTP side does not.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000
def busiest_thread():
    """The thread that computes: with -t 1 the one burning CPU during a prefill."""
    def cpu():
        out = {}
        for tid in os.listdir(f"/proc/{slow_pid}/task"):
            try:
                f = open(f"/proc/{slow_pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                out[int(tid)] = int(f[11]) + int(f[12])  # utime + stime
            except OSError:
                pass
        return out
    a = cpu()
    time.sleep(1)
    b = cpu()
    return max(b, key=lambda t: b[t] - a.get(t, 0))
engine = []
def stop_engine():
    """Stops that thread only: a thread is traced alone, the others (HTTP) run on."""
    tid = busiest_thread()
    if libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
        raise OSError(ctypes.get_errno(), "ptrace(PTRACE_SEIZE) on llama-server: " + os.strerror(ctypes.get_errno()))
    libc.ptrace(PTRACE_INTERRUPT, tid, None, None)
    os.waitpid(tid, WALL)  # in its ptrace stop now
    engine.append(tid)
def resume_engine():
    for tid in engine: libc.ptrace(PTRACE_DETACH, tid, None, None)
def slow_healthy(timeout=120):
    """Waits until the gateway counts the slow endpoint healthy again (step 3 froze it)."""
    until = time.time() + timeout
    while time.time() < until:
        try:
            with urllib.request.urlopen(gateway + "/health", timeout=5) as r:
                eps = [e for m in json.loads(r.read())["models"] for e in m["endpoints"] if e["name"] == "slow"]
                if eps and all(e["state"] == "healthy" for e in eps): return True
        except (OSError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    return False
check(slow_healthy(), "the gateway counts the slow endpoint healthy again")
check(idle(), "slow server idle before the engine stop")
stopped_at.clear()
before_frozen, before_stalled = log().count("stopped answering"), log().count("prefill stalled at")
# The request streams on a thread of its own: ptrace binds the tracee to the tracing thread,
# which must live until it lets go (a tracer thread that ends detaches, and the engine runs on).
result = []
asker = threading.Thread(target=lambda: result.append(stream("pair", " ".join(f"w{i}" for i in range(350)), 8)))
served_fast = log().count("model=pair endpoint=fast")
t_start = time.time()
asker.start()
time.sleep(2)  # into the prefill (and a second to find the computing thread)
try:
    stop_engine()
    stopped_at.append(time.time())
except OSError as e:
    print(f"cannot stop the engine thread: {e}", flush=True)
asker.join(120)
resume_engine()
terminal, took, text = result[0] if result else (None, 0, "")
after_stop = t_start + took - stopped_at[0] if stopped_at else -1
print(f"engine stopped mid-prefill: {terminal} {after_stop:.1f} s after the stop", flush=True)
check(bool(stopped_at), "the engine thread was stopped (ptrace)")
check(terminal in ("response.completed", "response.incomplete"), f"served by the second endpoint after the engine stopped ({terminal})")
check(logged("model=pair endpoint=fast", served_fast), "the second endpoint served it")
check(0 <= after_stop < 24, f"within stall_after_s (20 s) of the last progress ({after_stop:.1f} s after the stop)")
check(log().count("prefill stalled at") > before_stalled, "the log says the prefill stalled")
check(log().count("stopped answering") == before_frozen, "the server, still answering, was not taken for a frozen one")
check(idle(), "slow server idle after the engine went on")
sys.exit(1 if failures else 0)
PY
echo "frozen-backend checks passed"
