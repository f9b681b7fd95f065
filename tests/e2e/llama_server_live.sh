#!/usr/bin/env bash
# The llamacpp profile against a real llama-server (built from source by tools/dev), serving a
# synthetic qwen35 model the project writes (random weights: the answers are noise, the
# protocol is real). Checks what the fake llama-server claims too: the real server refuses two
# trailing assistant messages and answers an image with a 500 when it has no vision projector.
#
# The continuation rules mid-stream resume relies on (and fake_vllm reproduces), and the
# per-request reasoning budget, are checked against it directly and through Pulse.
#
# usage: llama_server_live.sh PULSE_EXE PLUGIN_DIR MAKE_SYNTHETIC FAKE_VLLM
# Needs PULSE_LLAMA_SERVER and PULSE_LLAMA_TEMPLATE (tools/dev sets both); else SKIP.
set -euo pipefail
pulse=$(realpath "$1") plugins=$(realpath "$2") make_synthetic=$(realpath "$3") fake=$(realpath "$4")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_llama_server
enter_netns "$@"

"$make_synthetic" --tiny "$work/model.gguf"
lport=$(free_port)
# Byte tokens 128..255 are UTF-8 continuation/lead bytes: random weights would emit invalid
# UTF-8, which llama-server's output parser rejects. Banned.
# And the quote (byte token 34) is made likely, so that JSON strings written under a grammar end
# within a few tokens instead of running to the token limit.
bias=(--logit-bias 34+6)
for t in $(seq 128 255); do bias+=(--logit-bias "$t-inf"); done
"$server" -m "$work/model.gguf" --host 127.0.0.1 --port "$lport" --jinja --chat-template-file "$template" \
  -c 4096 -np 1 -t 2 --seed 1 "${bias[@]}" > "$work/llama.log" 2>&1 &
pids+=($!)
wait_healthy "$lport" "llama-server"
# A second server that can save its slots (--slot-save-path): its cache survives a restart.
sport=$(free_port)
mkdir -p "$work/slots"
start_saving_server() {
  "$server" -m "$work/model.gguf" --host 127.0.0.1 --port "$sport" --jinja --chat-template-file "$template" \
    -c 4096 -np 1 -t 2 --seed 1 --slot-save-path "$work/slots" "${bias[@]}" >> "$work/llama-saving.log" 2>&1 &
  saving_pid=$!
  pids+=($saving_pid)
  wait_healthy "$sport" "the saving llama-server"
}
start_saving_server
# A third that saves two slots, to come back with one (-np 2, then -np 1).
xport=$(free_port)
mkdir -p "$work/slots2"
start_shrinking_server() {
  "$server" -m "$work/model.gguf" --host 127.0.0.1 --port "$xport" --jinja --chat-template-file "$template" \
    -c 4096 -np "$1" -t 1 --seed 1 --slot-save-path "$work/slots2" "${bias[@]}" >> "$work/llama-shrinking.log" 2>&1 &
  shrinking_pid=$!
  pids+=($shrinking_pid)
  wait_healthy "$xport" "the shrinking llama-server"
}
start_shrinking_server 2
# A fourth that writes nothing but newlines, which its output parser trims from reasoning: tokens
# that make no delta, as the end of a thinking block is.
nport=$(free_port)
"$server" -m "$work/model.gguf" --host 127.0.0.1 --port "$nport" --jinja --chat-template-file "$template" \
  -c 1024 -np 1 -t 1 --seed 1 --logit-bias 10+100 > "$work/llama-newlines.log" 2>&1 &
pids+=($!)
wait_healthy "$nport" "the newline llama-server"
# A fake llama-server that dies four deltas into every answer it starts: mid-stream resume must
# continue those answers on the real server.
cat > "$work/dying.json" <<'JSON'
{"turns": [{"content": "The quick brown fox jumps over the lazy dog.", "die_after": 4}]}
JSON
"$fake" --script "$work/dying.json" --port 0 --flavor llamacpp > "$work/dying.log" 2>&1 &
pids+=($!)
dport=$(wait_port "$work/dying.log" 'listening on 127\.0\.0\.1:[0-9]+') || fail "the dying fake did not start"
fport=$lport
profile=llamacpp
start_pulse_config 0
cat >> "$work/pulse.toml" <<TOML
[models.resumable]
profile = "llamacpp"
[[models.resumable.endpoints]]
name = "dying"
url = "http://127.0.0.1:$dport/v1"
[[models.resumable.endpoints]]
name = "real"
url = "http://127.0.0.1:$lport/v1"
[models.newlines]
profile = "llamacpp"
[[models.newlines.endpoints]]
name = "newlines"
url = "http://127.0.0.1:$nport/v1"
[models.shrinking]
profile = "llamacpp"
[[models.shrinking.endpoints]]
name = "shrinking"
url = "http://127.0.0.1:$xport/v1"
[models.saving]
profile = "llamacpp"
[[models.saving.endpoints]]
name = "saving"
url = "http://127.0.0.1:$sport/v1"
[upstream]
health_interval_s = 0.2
[warmup]
enabled = true
state_file = "$work/warmup.json"
slot_save_interval_s = 0.2
TOML
launch_pulse
base="http://127.0.0.1:$gport/v1"

python3 - "$base" "http://127.0.0.1:$lport/v1" "$work/pulse.log" <<'PY' || fail "live llama-server checks failed"
import json, sys, time, urllib.request, urllib.error
base, llama = sys.argv[1], sys.argv[2]
failures = []
def check(ok, what):
    if not ok: failures.append(what)

def post(url, body, timeout=60):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:  # a timeout or a reset: the check that asked fails with it
        return 0, f"no answer: {e}"

def sse(text):
    events = []
    for block in text.split("\n\n"):
        data = [l[6:] for l in block.split("\n") if l.startswith("data: ")]
        if data: events.append(json.loads("\n".join(data)))
    return events

req = {"model": "qwen3.8-flash-next", "store": False, "max_output_tokens": 16}

# Streaming: a well-formed event sequence with exactly one terminal event.
st, body = post(base + "/responses", dict(req, input="hello", stream=True))
ev = sse(body)
check(st == 200, f"stream status {st}")
check([e["sequence_number"] for e in ev] == list(range(len(ev))), "sequence numbers")
check(ev and ev[0]["type"] == "response.created", "first event")
terminal = [e for e in ev if e["type"] in ("response.completed", "response.incomplete", "response.failed")]
check(len(terminal) == 1 and terminal[0] is ev[-1], "one terminal event, last")
check(terminal and terminal[0]["type"] != "response.failed", f"stream failed: {body[-400:]}")

# Non-streaming, reasoning on and off (enable_thinking through the chat template).
st, body = post(base + "/responses", dict(req, input="think about it", reasoning={"effort": "high"}))
r = json.loads(body) if st == 200 else {"output": [], "usage": {"output_tokens_details": {"reasoning_tokens": 0}}, "status": "?"}
check(st == 200 and r["status"] in ("completed", "incomplete"), f"non-streaming: {st} {body[:300]}")
check(any(o["type"] == "reasoning" for o in r.get("output", [])), "reasoning on: no reasoning item")
check(r["usage"]["output_tokens_details"]["reasoning_tokens"] > 0, "reasoning tokens not counted (llama-server reports none)")
st, body = post(base + "/responses", dict(req, input="answer directly", reasoning={"effort": "none"}))
r = json.loads(body)
check(st == 200 and not any(o["type"] == "reasoning" for o in r.get("output", [])), f"reasoning off: {body[:300]}")

# Forced tool calls: llama-server does not enforce "required" with this template and refuses a
# named tool_choice object, so Pulse's schema (response_format) is what forces the call.
tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
         {"type": "custom", "name": "apply_patch", "description": "edit files"}]
for choice, want in (("required", None), ({"type": "function", "name": "exec_command"}, "function_call"),
                     ({"type": "custom", "name": "apply_patch"}, "custom_tool_call")):
    st, body = post(base + "/responses", dict(req, input="do it", max_output_tokens=300, reasoning={"effort": "none"}, tools=tools, tool_choice=choice))
    r = json.loads(body) if st == 200 else {}
    calls = [o for o in r.get("output", []) if o["type"] in ("function_call", "custom_tool_call")]
    check(st == 200 and r.get("status") == "completed" and len(calls) >= 1, f"tool_choice {choice}: {st} {body[:300]}")
    if calls and want:
        check(calls[0]["type"] == want, f"tool_choice {choice}: a {calls[0]['type']}")
    if calls and calls[0]["type"] == "function_call":
        check(isinstance(json.loads(calls[0]["arguments"]), dict) and calls[0]["call_id"], f"call arguments {calls[0]}")
    if calls and calls[0]["type"] == "custom_tool_call":
        check(calls[0]["input"].startswith("*** Begin Patch"), f"apply_patch input {calls[0]['input']!r}")

# The prefix cache, reported end to end: the same prompt again is served from cache.
long_input = "Please read this project and tell me what it does. " * 8
post(base + "/responses", dict(req, input=long_input))
st, body = post(base + "/responses", dict(req, input=long_input))
r = json.loads(body)
cached, total = r["usage"]["input_tokens_details"]["cached_tokens"], r["usage"]["input_tokens"]
check(st == 200 and cached > 0 and cached >= total - 8, f"cached_tokens on a repeat: {cached} of {total}")

# Two trailing assistant messages: the real server refuses them; through Pulse they are one.
history = [{"role": "user", "content": "hi"},
           {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi from"}]},
           {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi from pulse"}]}]
st, body = post(llama + "/chat/completions", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                                                           {"role": "assistant", "content": "b"}], "max_tokens": 4})
check(st == 400 and "2 or more assistant messages" in body, f"llama-server on two trailing assistant messages: {st} {body[:200]}")
st, body = post(base + "/responses", dict(req, input=history))
check(st == 200, f"capture-09 history through Pulse: {st} {body[:300]}")

# An image without a vision projector: the real server's 500, and Pulse's quick 400.
image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="}
st, body = post(llama + "/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "what"},
    {"type": "image_url", "image_url": {"url": image["image_url"]}}]}], "max_tokens": 4})
check(st == 500 and "image input is not supported" in body, f"llama-server on an image: {st} {body[:200]}")
t0 = time.time()
st, body = post(base + "/responses", dict(req, input=[{"role": "user", "content": [{"type": "input_text", "text": "what is this"}, image]}]), timeout=20)
check(st == 400 and "takes no images" in body and time.time() - t0 < 5, f"image through Pulse: {st} {body[:200]}")

# Continuing an assistant message, as mid-stream resume asks (and fake_vllm reproduces).
def deltas(body):
    out = []
    for e in (json.loads(l[6:]) for b in body.split("\n\n") for l in b.split("\n") if l.startswith("data: ") and l[6:] != "[DONE]"):
        if e.get("choices"): out.append(e["choices"][0]["delta"])
    return out
chat = {"model": "m", "stream": True, "max_tokens": 8, "temperature": 0, "chat_template_kwargs": {"enable_thinking": True}}
partial = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]
st, body = post(llama + "/chat/completions", dict(chat, messages=partial))
first = next((d.get("content") for d in deltas(body) if d.get("content")), "")
check(st == 200 and first.startswith("The answer is"), f"implicit prefill: the first delta repeats the prefill ({st} {first!r})")
st, body = post(llama + "/chat/completions", dict(chat, messages=partial, continue_final_message=True, add_generation_prompt=False))
first = next((d.get("content") for d in deltas(body) if d.get("content")), "")
check(st == 200 and first and not first.startswith("The answer is"), f"continue_final_message: no repeat ({st} {first!r})")
st, body = post(llama + "/chat/completions", dict(chat, messages=partial, continue_final_message=True))
check(st == 400 and "Cannot set both add_generation_prompt and continue_final_message" in body, f"both flags: {st} {body[:200]}")
thinking = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]
st, body = post(llama + "/chat/completions", dict(chat, messages=thinking, continue_final_message=True, add_generation_prompt=False))
ds = deltas(body)
check(st == 200 and any(d.get("reasoning_content") for d in ds) and not any(d.get("content") for d in ds[:3]),
      f"a reasoning-only message is continued inside its reasoning: {st} {ds[:4]}")
# Through Pulse: an answer cut four deltas in on the dying endpoint goes on on the real server.
st, body = post(base + "/responses", {"model": "resumable", "store": False, "stream": True, "max_output_tokens": 8,
                                      "reasoning": {"effort": "none"}, "input": "go"})
ev = sse(body)
text = "".join(e["delta"] for e in ev if e["type"] == "response.output_text.delta")
check(st == 200 and ev and ev[-1]["type"] in ("response.completed", "response.incomplete"), f"resumed response: {st} {body[-300:]}")
check(text.startswith("The quick brown fox ") and not text[len("The quick brown fox "):].startswith("The quick"),
      f"resumed text: the fake's words once, then the real server's continuation: {text!r}")
check([e["sequence_number"] for e in ev] == list(range(len(ev))), "resumed response: sequence numbers")
# The limit covers both attempts: the real server is asked for the 4 tokens left, not 8 more.
usage = ev[-1]["response"]["usage"] if ev else {"output_tokens": -1}
check(0 < usage["output_tokens"] <= 8, f"resumed response within max_output_tokens 8: {usage}")
if ev and ev[-1]["type"] == "response.incomplete":
    check(usage["output_tokens"] == 8, f"cut at the limit: 8 output tokens, {usage}")

# A reasoning budget (reasoning.budget_tokens) is enforced by the real server.
def reasoning_tokens(extra):
    st, body = post(base + "/responses", dict(req, input="think", max_output_tokens=40, reasoning=dict({"effort": "high"}, **extra)))
    r = json.loads(body) if st == 200 else {"usage": {"output_tokens_details": {"reasoning_tokens": -1}}}
    return st, r["usage"]["output_tokens_details"]["reasoning_tokens"]
st, free = reasoning_tokens({})
st2, capped = reasoning_tokens({"budget_tokens": 3})
check(st == 200 and st2 == 200 and free > 10 and 0 < capped <= 4, f"reasoning budget 3: {capped} reasoning tokens (without: {free})")

# Reasoning tokens are tokens, not deltas: a server whose tokens make no delta (newlines, trimmed
# from reasoning) still spends them. Cut off while thinking, every token was reasoning (0 were
# counted before: one per delta). Thinking off, none is.
st, body = post(base + "/responses", dict(req, model="newlines", input="think", max_output_tokens=12, reasoning={"effort": "high"}))
u = json.loads(body)["usage"] if st == 200 else {}
check(st == 200 and u.get("output_tokens") == 12 and u["output_tokens_details"]["reasoning_tokens"] == 12,
      f"reasoning tokens of an answer cut off while thinking: {st} {u or body[:200]}")
st, body = post(base + "/responses", dict(req, model="newlines", input="answer", max_output_tokens=12, reasoning={"effort": "none"}))
u = json.loads(body)["usage"] if st == 200 else {}
check(st == 200 and u.get("output_tokens") == 12 and u["output_tokens_details"]["reasoning_tokens"] == 0,
      f"reasoning tokens with thinking off: {st} {u or body[:200]}")

# Back-to-back requests: llama-server closes its end after each stream although it announces
# keep-alive. A pooled connection it closed is seen (EOF) and not sent on: no resend, no warning
# (29 of 30 requests were sent twice before).
for i in range(10):
    post(base + "/responses", dict(req, input=f"again {i}", stream=True))
check("had closed the pooled connection" not in open(sys.argv[3]).read(), "requests sent on connections llama-server had closed")

health = json.loads(urllib.request.urlopen(base.replace("/v1", "") + "/health", timeout=10).read())
check(all(e["state"] == "healthy" for m in health["models"] if m["id"] != "resumable" for e in m["endpoints"]), f"endpoint marked down: {health}")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("live llama-server checks: ok")
PY
# Slot persistence: after a turn the gateway has the server save its slot; after a restart it
# loads it back and replays the conversation. On this hybrid model (Gated DeltaNet layers) the
# loaded slot alone is worth nothing to the next turn: its recurrent state is saved at the end of
# the last answer, cannot be rewound, and the next prompt re-renders that answer (the template
# drops its empty thinking block), so the next turn found 0 cached tokens although the log said
# "restored". The replay rebuilds the conversation with the server's checkpoints; the next turn
# then reuses nearly all of its history, and the gateway reports what it found.
python3 - "http://127.0.0.1:$gport" "$work" <<'PY2' || fail "slot persistence"
import json, sys, time, urllib.request, subprocess
base, work = sys.argv[1], sys.argv[2]
def post(body):
    r = urllib.request.urlopen(urllib.request.Request(base + "/v1/responses", json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=60)
    return json.load(r)
history = [{"role": "user", "content": "Please read this project and tell me what it does, file by file, with care. " * 4}]
turn = {"model": "saving", "store": False, "max_output_tokens": 8, "reasoning": {"effort": "none"}, "prompt_cache_key": "conv-saved"}
r = post(dict(turn, input=history))
answer = "".join(c["text"] for o in r["output"] if o["type"] == "message" for c in o["content"])
json.dump(history + [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]},
                     {"role": "user", "content": "and then?"}], open(work + "/turn2.json", "w"))
PY2
for _ in $(seq 1 250); do [ -s "$work/slots/pulse-saving-slot0.bin" ] && break; sleep 0.02; done
[ -s "$work/slots/pulse-saving-slot0.bin" ] || fail "the gateway did not have llama-server save its slot"
kill "$saving_pid"; wait "$saving_pid" 2>/dev/null || true
for _ in $(seq 1 250); do curl -s "http://127.0.0.1:$gport/health" | grep -q '"name":"saving","url":"[^"]*","state":"down"' && break; sleep 0.02; done
start_saving_server
for _ in $(seq 1 500); do grep -q "endpoint saving: 1 warm requests completed" "$work/pulse.log" && break; sleep 0.02; done
grep -q "endpoint saving is back: loaded 1 of 1 saved slots" "$work/pulse.log" || fail "the saved slot was not loaded after the restart"
grep -q "endpoint saving: 1 warm requests completed; their [0-9]* prompt tokens found 0 cached" "$work/pulse.log" \
  || fail "the replay after the restore did not report what the loaded slot held (nothing, on this hybrid model)"
python3 - "http://127.0.0.1:$gport" "$work" <<'PY2' || fail "the next turn after the restart"
import json, sys, urllib.request
base, work = sys.argv[1], sys.argv[2]
body = {"model": "saving", "store": False, "max_output_tokens": 4, "reasoning": {"effort": "none"}, "prompt_cache_key": "conv-saved",
        "input": json.load(open(work + "/turn2.json"))}
r = json.load(urllib.request.urlopen(urllib.request.Request(base + "/v1/responses", json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=60))
u = r["usage"]
cached, total = u["input_tokens_details"]["cached_tokens"], u["input_tokens"]
print(f"the next turn after the restart: {cached} of {total} prompt tokens cached")
if cached < total * 0.8:
    sys.exit(f"the next turn after the restart found {cached} of {total} prompt tokens cached")
PY2
grep -q "endpoint saving: the first request since it came back found [1-9][0-9]* of its [0-9]* prompt tokens cached" "$work/pulse.log" \
  || fail "the first request after the restart was not reported with what it found cached"
metrics=$(curl -s "http://127.0.0.1:$gport/metrics")
grep -q 'pulse_recovery_first_requests_total{endpoint="saving",cache="hit"} 1' <<< "$metrics" \
  || fail "pulse_recovery_first_requests_total does not count the hit"
grep -q "endpoint ep0 cannot save its slots\|endpoint fake cannot save its slots" "$work/pulse.log" \
  || fail "a server without --slot-save-path was not reported as unable to save"

# Two slots saved, the server back with one: only the slot it has is restored (restoring slot 1
# was answered 501 and logged as a failure).
shrink_prompt='{"model":"shrinking","store":false,"max_output_tokens":4,"input":"Please read this project and tell me what it does, file by file, with care."}'
curl -sf "http://127.0.0.1:$gport/v1/responses" -H 'Content-Type: application/json' -d "$shrink_prompt" > /dev/null || fail "turn on the shrinking server"
for _ in $(seq 1 250); do [ -s "$work/slots2/pulse-shrinking-slot1.bin" ] && break; sleep 0.02; done
[ -s "$work/slots2/pulse-shrinking-slot1.bin" ] || fail "the gateway did not have llama-server save both slots"
kill "$shrinking_pid"; wait "$shrinking_pid" 2>/dev/null || true
for _ in $(seq 1 250); do curl -s "http://127.0.0.1:$gport/health" | grep -q '"name":"shrinking","url":"[^"]*","state":"down"' && break; sleep 0.02; done
start_shrinking_server 1
# (Slot 0 itself is refused too, with a 400: a slot file keeps its slot's context size, 2,048
# tokens under -np 2, and the one slot now has 4,096. That is llama-server's rule; it is logged.)
for _ in $(seq 1 500); do grep -q "endpoint shrinking: restoring slot 0\|endpoint shrinking is back: loaded" "$work/pulse.log" && break; sleep 0.02; done
grep -q "endpoint shrinking came back with 1 slots, 2 were saved: restoring the first 1" "$work/pulse.log" || fail "the shrinking server's slot count was not noticed"
! grep -q "endpoint shrinking: restoring slot 1 failed" "$work/pulse.log" || fail "a slot the restarted server does not have was asked for"

# A restart of the single-slot server (-np 1): the gateway sees it go and come back, and replays
# its recorded prefixes once it is quiet (a real request arriving meanwhile stops the replay at
# the server's next prompt batch, as on a server with more slots: llama_server_warmup.sh).
kill "${pids[0]}"
wait "${pids[0]}" 2>/dev/null || true
for _ in $(seq 1 250); do curl -s "http://127.0.0.1:$gport/health" | grep -q '"state":"down"' && break; sleep 0.02; done
"$server" -m "$work/model.gguf" --host 127.0.0.1 --port "$lport" --jinja --chat-template-file "$template" \
  -c 4096 -np 1 -t 2 --seed 1 "${bias[@]}" >> "$work/llama.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 1000); do grep -q "endpoint \(fake\|real\): [1-9][0-9]* warm requests completed" "$work/pulse.log" && break; sleep 0.02; done
grep -q "endpoint \(fake\|real\): [1-9][0-9]* warm requests completed" "$work/pulse.log" \
  || fail "the single-slot llama-server got no replay after its restart"
echo "llama-server live ($("$server" --version 2>&1 | grep -m1 version || true)): ok"
