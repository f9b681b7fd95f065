#!/usr/bin/env bash
# End to end with the real Codex CLI against the demo model served in-process by the decoder
# backend (no other server): `pulse codex` -> `pulse serve` -> decoder:// (random weights,
# written on first start by make_demo). Codex must accept the turn: exit 0, a completed
# response logged. The content is random by design.
#   codex_demo_e2e.sh PULSE_EXE PLUGIN_DIR
set -euo pipefail
pulse=$(realpath "$1") plugins=$(realpath "$2")
fake=/dev/null
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_codex
enter_netns "$@"

pulse_config_head 0
cat >> "$work/pulse.toml" <<TOML
[models."pulse-demo"]
profile = "qwen38"
context_window = 65536
demo = true
reasoning_output = "summary"
[[models."pulse-demo".endpoints]]
name = "demo"
url = "decoder://$work/pulse-demo.gguf"
[models."pulse-demo".endpoints.options]
make_demo = true
[models."pulse-demo".sampling]
temperature = 0.7
top_p = 0.95
top_k = 20
max_output_tokens = 2048
[models."pulse-demo".profile_options]
thinking = "off"
TOML
launch_pulse
grep -q 'RANDOM weights' "$work/pulse.log" || fail "the demo model was not announced as random"

mkdir -p "$work/home" "$work/codex-home" "$work/project"
cd "$work/project"
rc=0
HOME="$work/home" CODEX_HOME="$work/codex-home" XDG_RUNTIME_DIR="$work" timeout 240 \
  env -u PULSE_GATEWAY_API_KEY -u PULSE_CONFIG "$pulse" codex --model pulse-demo --gateway "http://127.0.0.1:$gport" --codex "$codex" -- \
  exec --skip-git-repo-check "Say hello." > "$work/codex.out" 2> "$work/codex.err" || rc=$?
[ "$rc" -eq 0 ] || fail "codex exited $rc"
grep -q 'model=pulse-demo endpoint=demo outcome=completed' "$work/pulse.log" || fail "no completed response from the decoder"
echo "codex demo e2e: ok — codex exit 0 against the in-process decoder (random weights)"
