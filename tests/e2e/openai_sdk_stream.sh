#!/usr/bin/env bash
# Runs openai_sdk_stream.mjs (the official openai npm SDK) against pulse + the fake backend,
# inside a private network namespace.
# usage: openai_sdk_stream.sh PULSE_EXE FAKE_VLLM PLUGIN_DIR
set -euo pipefail
pulse=$1 fake=$2 plugins=$3
here=$(cd "$(dirname "$0")" && pwd)
modules=${PULSE_NODE_MODULES:-}
if [ -z "$modules" ] || [ ! -d "$modules/openai" ] || [ ! -d "$modules/openai7" ]; then
  echo "openai npm SDK not found (PULSE_NODE_MODULES='$modules'); run the suite with tools/dev test, which installs it"
  [ "${PULSE_REQUIRE_E2E:-0}" = 1 ] && exit 1
  exit 77
fi
# shellcheck source=lib.sh
. "$here/lib.sh"
enter_netns "$@"

cat > "$work/script.json" <<'JSON'
{"turns": [{"content": "Running it now.", "tool_calls": [{"name": "exec_command", "arguments": {"cmd": "ls -la"}}]}]}
JSON
start_fake "$work/script.json"
start_pulse
# Node resolves `openai` from the script's directory upwards: run a copy next to the modules.
cp "$here/openai_sdk_stream.mjs" "$modules/../openai_sdk_stream.$$.mjs"
trap 'rm -f "$modules/../openai_sdk_stream.$$.mjs"; cleanup' EXIT
for pkg in openai openai7; do
  version=$(node -p "require('$modules/$pkg/package.json').version")
  timeout 120 node "$modules/../openai_sdk_stream.$$.mjs" "http://127.0.0.1:$gport/v1" qwen3.8-flash-next "$pkg" > "$work/node.out" 2>&1 \
    || { cat "$work/node.out"; fail "the openai SDK $version check failed"; }
  echo "openai SDK $version:"
  cat "$work/node.out"
done
