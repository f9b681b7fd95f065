#!/usr/bin/env bash
# End-to-end with the real Codex CLI: `codex exec` -> `pulse serve` -> a fake backend scripted
# to (1) call apply_patch to create a file, (2) run a shell command through Codex's exec tool,
# (3) answer. Asserts that Codex exits 0, the file exists with the expected content, the
# command's output reached the model, and the answer is printed.
#
# Everything runs inside a private network namespace (unshare -n, lo up): Codex, the gateway
# and the backend can reach each other on 127.0.0.1 and nothing else.
#
# usage: codex_e2e.sh PULSE_EXE FAKE_VLLM PLUGIN_DIR SOURCE_ROOT [PROFILE] [FLAVOR]
#   PROFILE: translation profile under test (qwen38 | llamacpp); FLAVOR: fake backend dialect.
# The Codex binary comes from $PULSE_CODEX (tools/dev installs the pinned version).
set -euo pipefail
pulse=$1 fake=$2 plugins=$3 src=$4 profile=${5:-qwen38} flavor=${6:-vllm}

codex=${PULSE_CODEX:-}
if [ -z "$codex" ] || [ ! -x "$codex" ]; then
  echo "codex CLI not found (PULSE_CODEX='$codex'); run the suite with tools/dev test, which installs it"
  [ "${PULSE_REQUIRE_E2E:-0}" = 1 ] && exit 1
  exit 77  # meson: skipped (reported as SKIP, never as a pass)
fi

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
enter_netns "$@"

cat > "$work/script.json" <<'JSON'
{"split": 7, "turns": [
  {"reasoning": "The user wants a file. I will create it with apply_patch.",
   "tool_calls": [{"name": "apply_patch",
                   "arguments": {"input": "*** Begin Patch\n*** Add File: hello.txt\n+hello from pulse\n*** End Patch\n"}}]},
  {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": "cat hello.txt", "yield_time_ms": 2000}}]},
  {"content": "Created hello.txt; it says: hello from pulse"}
]}
JSON
start_fake "$work/script.json"
start_pulse

mkdir -p "$work/home" "$work/codex-home" "$work/project"
cd "$work/project"
rc=0
HOME="$work/home" CODEX_HOME="$work/codex-home" timeout 180 "$codex" exec \
  --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox \
  -c model_provider=pulse \
  -c "model_providers.pulse={name=\"pulse\",base_url=\"http://127.0.0.1:$gport/v1\",wire_api=\"responses\",request_max_retries=1,stream_max_retries=1}" \
  -c "model_catalog_json=\"$src/config/codex/model-catalog.json\"" \
  -m qwen3.8-flash-next \
  "Create hello.txt saying hello from pulse, then show its content." \
  > "$work/codex.out" 2> "$work/codex.err" || rc=$?

[ "$rc" -eq 0 ] || fail "codex exited $rc"
[ -f hello.txt ] || fail "hello.txt was not created"
[ "$(cat hello.txt)" = "hello from pulse" ] || fail "hello.txt holds '$(cat hello.txt)'"
grep -q "Created hello.txt; it says: hello from pulse" "$work/codex.out" || fail "the answer was not printed"
requests=$(grep -vc '^{"served"' "$work/requests.jsonl" || true)
[ "$requests" -eq 3 ] || fail "expected 3 backend requests (patch, exec, answer), saw $requests"
# The exec tool's output went back to the model in the third request.
tail -n 2 "$work/requests.jsonl" | head -n 1 | grep -q 'hello from pulse' || fail "the command output did not reach the model"
grep -q 'outcome=completed' "$work/pulse.log" || fail "pulse logged no completed response"
echo "codex e2e ($profile): ok — codex exit 0, hello.txt created, command output returned, answer printed"
