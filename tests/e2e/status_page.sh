#!/usr/bin/env bash
# The status page (GET /, /status.json) in a real browser — Debian's chromium driven by
# puppeteer-core (status_page.mjs) — against the gateway and two fake backends, all inside a
# private network namespace: no console error, no request to another origin, an endpoint going
# down and back, a stream's phase, a resume, each on the page within 2 s; a screenshot is left
# at SCREENSHOT (default: the build's test-artifacts/status-page.png).
# usage: status_page.sh PULSE_EXE FAKE_VLLM PLUGIN_DIR [SCREENSHOT]
set -euo pipefail
pulse=$1 fake=$2 plugins=$3
shot=${4:-$(dirname "$(dirname "$pulse")")/test-artifacts/status-page.png}
here=$(cd "$(dirname "$0")" && pwd)
modules=${PULSE_NODE_MODULES:-} chromium=${PULSE_CHROMIUM:-}
if [ -z "$modules" ] || [ ! -d "$modules/puppeteer-core" ] || [ -z "$chromium" ] || [ ! -x "$chromium" ]; then
  echo "puppeteer-core or chromium not found (PULSE_NODE_MODULES='$modules', PULSE_CHROMIUM='$chromium'); run the suite with tools/dev test, which installs them"
  [ "${PULSE_REQUIRE_E2E:-0}" = 1 ] && exit 1
  exit 77
fi
# shellcheck source=lib.sh
. "$here/lib.sh"
enter_netns "$@"

cat > "$work/script.json" <<'JSON'
{"turns": [
  {"content": "A short answer.", "usage": {"prompt_tokens": 120, "completion_tokens": 4, "cached_tokens": 64}},
  {"match": "SLOW-ONE", "first_delay_ms": 2500, "delay_ms": 250,
   "content": "one two three four five six seven eight nine ten eleven twelve",
   "usage": {"prompt_tokens": 900, "completion_tokens": 12, "cached_tokens": 640}},
  {"match": "RESUME-ME", "reasoning": "Let me think about it.", "delay_ms": 40,
   "content": "alpha beta gamma delta epsilon zeta eta theta iota kappa", "die_after": 4, "die": "drop"}
]}
JSON
# a is killed and restarted by status_page.mjs (disowned: its kill is no news here).
"$fake" --script "$work/script.json" --port 0 > "$work/fake_a.log" 2>&1 &
apid=$! && pids+=($apid) && disown $apid
aport=$(wait_port "$work/fake_a.log" 'listening on 127\.0\.0\.1:[0-9]+') || fail "fake a did not start"
"$fake" --script "$work/script.json" --port 0 > "$work/fake_b.log" 2>&1 &
pids+=($!)
bport=$(wait_port "$work/fake_b.log" 'listening on 127\.0\.0\.1:[0-9]+') || fail "fake b did not start"
pulse_config_head 0
cat >> "$work/pulse.toml" <<TOML
[upstream]
health_interval_s = 0.5
retry_window_s = 10
[models."qwen3.8-flash-next"]
profile = "qwen38"
[[models."qwen3.8-flash-next".endpoints]]
name = "a"
url = "http://127.0.0.1:$aport/v1"
[[models."qwen3.8-flash-next".endpoints]]
name = "b"
url = "http://127.0.0.1:$bport/v1"
# The in-process decoder (random-weight demo model): its engine report is on the page too.
[models.demo]
profile = "qwen38"
[[models.demo.endpoints]]
name = "local"
url = "decoder://$work/demo.gguf"
[models.demo.endpoints.options]
make_demo = true
[models.demo.profile_options]
thinking = "off"
TOML
launch_pulse
mkdir -p "$(dirname "$shot")"
# Node resolves packages from PULSE_NODE_MODULES (createRequire in the script).
GATEWAY="http://127.0.0.1:$gport" CHROMIUM="$chromium" FAKE="$fake" FAKE_SCRIPT="$work/script.json" FAKE_A_PORT="$aport" \
  FAKE_A_PID="$apid" SCREENSHOT="$shot" HOME="$work/home" timeout 120 node "$here/status_page.mjs" > "$work/node.out" 2>&1 \
  || { cat "$work/node.out"; fail "the status page check failed"; }
cat "$work/node.out"
