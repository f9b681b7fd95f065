#!/usr/bin/env bash
# Request framing, Pulse against llhttp (Node's strict HTTP parser): http_framing_differential.mjs
# sends the same bytes to both and compares the verdicts. Runs in a private network namespace.
# usage: http_framing_differential.sh PULSE_EXE FAKE_VLLM PLUGIN_DIR
set -euo pipefail
pulse=$1 fake=$2 plugins=$3
here=$(cd "$(dirname "$0")" && pwd)
command -v node >/dev/null || { echo "node not found; run the suite with tools/dev test, which installs it"; [ "${PULSE_REQUIRE_E2E:-0}" = 1 ] && exit 1; exit 77; }
# shellcheck source=lib.sh
. "$here/lib.sh"
enter_netns "$@"
echo '{"turns": [{"content": "unused"}]}' > "$work/script.json"
start_fake "$work/script.json"
start_pulse
echo "node $(node --version), llhttp $(node -p process.versions.llhttp)"
timeout 120 node "$here/http_framing_differential.mjs" "$gport" || fail "Pulse and llhttp disagree on request framing"
