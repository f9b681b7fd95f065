#!/usr/bin/env bash
# Token-exact mid-stream resume against real llama-server processes (built from source by
# tools/dev) serving a synthetic qwen35 model (random weights: the text is noise, the tokens and
# the server are real).
#
# Two servers, A then B, behind one model. A greedy answer is first read whole from A; then the
# same request is streamed again, A is killed (SIGKILL) after k deltas and restarted, and Pulse
# resumes the answer on B. With profile option resume = "tokens" the resumed answer must equal the
# uninterrupted one byte for byte, at every kill point, in text (thinking off) and in reasoning
# (thinking on), and usage must count what was generated. With resume = "text" (the partial
# answer re-tokenized) the same kills are run too, and how many differ is reported: the reason
# the token path exists.
#
# usage: llama_server_token_resume.sh PULSE_EXE PLUGIN_DIR MAKE_SYNTHETIC
set -euo pipefail
pulse=$(realpath "$1") plugins=$(realpath "$2") make_synthetic=$(realpath "$3")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_llama_server
enter_netns "$@"

# The 332.7M model in f32: slow enough on one thread (tens of tokens a second) to be killed mid-answer.
"$make_synthetic" --bench f32 "$work/model.gguf" > /dev/null
# Byte tokens 128..255 (UTF-8 pieces) banned, as in llama_server_live.sh: random weights would
# write invalid UTF-8. (A character split across tokens is covered by the unit tests: the token
# record then has a hole and the resume goes by text.) --ignore-eos: answers run to the limit.
bias=()
for t in $(seq 128 255); do bias+=(--logit-bias "$t-inf"); done
serve_args=(-m "$work/model.gguf" --host 127.0.0.1 --jinja --chat-template-file "$template" -c 4096
            --override-kv qwen35.context_length=int:4096 -np 1 -t 1 --ignore-eos --seed 1 "${bias[@]}")
aport=$(free_port) bport=$(free_port)
# The tags of the Qwen format banned too: random weights write them now and then, and a stray
# <tool_call> swallows the rest of an answer (a call never closed), a </think> ends the reasoning.
"$server" "${serve_args[@]}" --port "$bport" > "$work/llama-b.log" 2>&1 &
probe=$!
wait_healthy "$bport" "llama-server B (tag ids)"
tags=$(curl -s "http://127.0.0.1:$bport/tokenize" -d '{"content": "<think></think><tool_call></tool_call><tool_response></tool_response>", "parse_special": true}' |
  python3 -c 'import json, sys; t = json.load(sys.stdin)["tokens"]; assert len(t) == 6, t; print(" ".join(map(str, t)))')
kill "$probe"; wait "$probe" 2>/dev/null || true
for t in $tags; do serve_args+=(--logit-bias "$t-inf"); done
"$server" "${serve_args[@]}" --port "$bport" >> "$work/llama-b.log" 2>&1 &
pids+=($!)
wait_healthy "$bport" "llama-server B"

pulse_config_head 0
cat >> "$work/pulse.toml" <<TOML
[models.tokens]
profile = "llamacpp"
profile_options = { resume = "tokens" }
[[models.tokens.endpoints]]
name = "a"
url = "http://127.0.0.1:$aport/v1"
[[models.tokens.endpoints]]
name = "b"
url = "http://127.0.0.1:$bport/v1"
[models.text]
profile = "llamacpp"
profile_options = { resume = "text" }
[[models.text.endpoints]]
name = "a"
url = "http://127.0.0.1:$aport/v1"
[[models.text.endpoints]]
name = "b"
url = "http://127.0.0.1:$bport/v1"
[upstream]
health_interval_s = 0.2
retry_window_s = 30
TOML
launch_pulse

python3 - "$gport" "$aport" "$work" "$server" "${serve_args[@]}" <<'PY' || fail "token-exact resume checks failed"
import json, os, signal, subprocess, sys, time, urllib.request
gport, aport, work, server = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
serve_args = sys.argv[5:]
base = f"http://127.0.0.1:{gport}/v1"
failures = []
def check(ok, what):
    if not ok: failures.append(what)

a = None
def start_a():
    global a
    a = subprocess.Popen([server, *serve_args, "--port", aport], stdout=open(f"{work}/llama-a.log", "a"), stderr=subprocess.STDOUT)
    for _ in range(300):  # bounded: 30 s
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{aport}/health", timeout=1) as r:
                if r.status == 200: break
        except OSError: pass
        time.sleep(0.1)
    else:
        sys.exit("llama-server A did not come up")
    # Pulse must see it healthy again before the next request goes to it first.
    for _ in range(100):
        with urllib.request.urlopen(f"http://127.0.0.1:{gport}/health", timeout=5) as r:
            h = json.load(r)
        if all(e["state"] == "healthy" for m in h["models"] for e in m["endpoints"]): return
        time.sleep(0.1)
    sys.exit(f"pulse did not see A healthy again: {h}")

def stream(model, body, kill_after=None):
    """Streams a response; with kill_after, SIGKILLs A after that many deltas. Returns
    (text, reasoning, final response, number of deltas seen)."""
    req = urllib.request.Request(base + "/responses", json.dumps(dict(body, model=model, stream=True)).encode(),
                                 {"Content-Type": "application/json"})
    text, reasoning, deltas, final = "", "", 0, None
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode()
            if not line.startswith("data: "): continue
            e = json.loads(line[6:])
            if e["type"] == "response.output_text.delta": text += e["delta"]; deltas += 1
            elif e["type"] in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
                reasoning += e["delta"]; deltas += 1
            elif e["type"] in ("response.completed", "response.incomplete", "response.failed"): final = e["response"]
            if kill_after is not None and deltas == kill_after and a.poll() is None:
                a.send_signal(signal.SIGKILL); a.wait()
    return text, reasoning, final, deltas

limit = 120
cases = [("text", {"input": "write a long answer", "reasoning": {"effort": "none"}}),
         ("reasoning", {"input": "think it through at length", "reasoning": {"effort": "high"}})]
kill_points = [3, 30, 80]
results = {"tokens": 0, "text": 0}
differ = {"tokens": [], "text": []}
start_a()
for name, body in cases:
    body = dict(body, store=False, max_output_tokens=limit, temperature=0)
    for mode in ("tokens", "text"):
        # Each path's own uninterrupted answer (the chat path's parser is llama-server's).
        whole_text, whole_reasoning, whole, n = stream(mode, body)
        check(whole and whole["status"] in ("completed", "incomplete"), f"{name}/{mode}: uninterrupted answer: {whole}")
        check(n > max(kill_points) + 10, f"{name}/{mode}: the uninterrupted answer is too short to kill late ({n} deltas)")
        channel = whole_text if name == "text" else whole_reasoning
        check(len(channel) > 100, f"{name}/{mode}: no {name} in the answer: {channel[:80]!r}")
        for k in kill_points:
            text, reasoning, final, _ = stream(mode, body, kill_after=k)
            start_a()
            results[mode] += 1
            same = (text, reasoning) == (whole_text, whole_reasoning)
            if not same:
                got = text if name == "text" else reasoning
                at = next((i for i, (x, y) in enumerate(zip(got, channel)) if x != y), min(len(got), len(channel)))
                differ[mode].append(f"{name} k={k}: differs at byte {at} of {len(channel)}: {got[max(0, at - 20):at + 30]!r} vs {channel[max(0, at - 20):at + 30]!r}")
            if mode == "tokens":
                check(final and final["status"] == whole["status"], f"{name} k={k}: resumed status {final and final['status']} vs {whole['status']}")
                out = final["usage"]["output_tokens"] if final else -1
                check(out == whole["usage"]["output_tokens"],
                      f"{name} k={k}: output tokens {out} vs {whole['usage']['output_tokens']} uninterrupted")
for d in differ["tokens"]: check(False, "by tokens: " + d)
log = open(f"{work}/pulse.log").read()
check(log.count("by tokens (") >= len(cases) * len(kill_points), "the resume log line does not say 'by tokens'")
check(log.count("by text") >= len(cases) * len(kill_points), "the text model's resumes are not logged 'by text'")
print(f"by tokens: {results['tokens'] - len(differ['tokens'])} of {results['tokens']} resumed answers equal the uninterrupted one")
print(f"by text:   {results['text'] - len(differ['text'])} of {results['text']} equal; differing: " + "; ".join(differ["text"]))
if a.poll() is None: a.kill()
if failures:
    print("\n".join(failures)); sys.exit(1)
PY
echo "PASS: token-exact resume on real llama-server"
