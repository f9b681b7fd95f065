#!/usr/bin/env bash
# Loads the plugins this project built into a real `pulse serve` (next to the installed qwen38
# translation profile), checks that each exports only its entry point, and sends Responses
# turns through each backend, streamed and not, checking the answers.
#   usage: serve_test.sh SHOUT_SO ECHO_SO PROFILE_DIR     (PULSE: the pulse binary, default `pulse`)
set -euo pipefail
shout=$1 echo_so=$2 profiles=$3
pulse=${PULSE:-pulse}
command -v "$pulse" >/dev/null || { echo "serve_test: no pulse binary (set PULSE or put pulse on PATH)"; exit 1; }
[ -f "$profiles/qwen38.so" ] || { echo "serve_test: no qwen38.so in $profiles (the installed Pulse plugin directory)"; exit 1; }
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

# A plugin exports exactly one symbol of its own: the entry.
for so in "$shout" "$echo_so"; do
  exported=$(nm -D --defined-only "$so" | awk '{print $3}' | grep '^pulse_' || true)
  [ "$exported" = "pulse_plugin_entry_v1" ] || { echo "FAIL: $so exports: $exported"; exit 1; }
done

mkdir -p "$work/plugins"
install -m 0755 "$shout" "$echo_so" "$profiles/qwen38.so" "$work/plugins/"
cat > "$work/pulse.toml" <<TOML
[server]
listen = "127.0.0.1:0"
[plugins]
dirs = ["plugins"]
dropin_dirs = []
runtime_dir = "$work/run"
require = ["pulse.example.shout", "pulse.example.echo"]
[models.shout]
profile = "qwen38"
[[models.shout.endpoints]]
url = "plugin://example-shout"
options = { words_per_chunk = 2 }
[models.echo]
profile = "qwen38"
[[models.echo.endpoints]]
url = "plugin://example-echo"
TOML
env -u PULSE_PLUGIN_DIRS -u PULSE_QWEN_BACKENDS -u PULSE_GATEWAY_API_KEY "$pulse" serve --config "$work/pulse.toml" 2> "$work/log" &
pid=$!
port=
for _ in $(seq 1 500); do
  port=$(grep -oE 'listening on http://127\.0\.0\.1:[0-9]+' "$work/log" | grep -oE '[0-9]+$' || true)
  [ -n "$port" ] && break
  sleep 0.02
done
[ -n "$port" ] || { cat "$work/log"; echo "FAIL: pulse serve did not start"; exit 1; }

python3 - "$port" <<'PY' || { cat "$work/log"; exit 1; }
import json, sys, urllib.request
port = sys.argv[1]
def turn(model, stream):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/responses",
        data=json.dumps({"model": model, "input": "hello from the template", "stream": stream}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        if not stream:
            body = json.load(r)
            return body["status"], body["output"][0]["content"][0]["text"], body["usage"]
        text, status, usage = "", None, None
        for line in r.read().decode().splitlines():
            if line.startswith("data: "):
                ev = json.loads(line[6:])
                if ev["type"] == "response.output_text.delta": text += ev["delta"]
                if ev["type"] == "response.completed": status, usage = ev["response"]["status"], ev["response"]["usage"]
        return status, text, usage
for model, want in (("shout", "HELLO FROM THE TEMPLATE"), ("echo", "echo: hello from the template")):
    for stream in (False, True):
        status, text, usage = turn(model, stream)
        if (status, text) != ("completed", want):
            sys.exit(f"FAIL: {model} (stream={stream}): got {status!r} {text!r}, want {want!r}")
        print(f"{model} (stream={stream}): {text} (usage: {usage['input_tokens']} in, {usage['output_tokens']} out)")
# The backend's usage chunk (choices: []) is the response's usage: the C backend sends 2 chunks
# of 2 words for these 4 words.
if turn("shout", False)[2]["output_tokens"] != 2:
    sys.exit("FAIL: the C backend's usage chunk did not reach the response's usage")
PY
# A clean stop: the plugins' instances go before their deinit, and pulse exits 0.
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || { cat "$work/log"; echo "FAIL: pulse serve exited $rc after SIGTERM"; exit 1; }
echo "template plugins: ok"
