#!/usr/bin/env bash
# The real Codex CLI completes a tool-calling turn through Pulse (llamacpp profile) against a real
# llama-server built from source: `codex exec` -> `pulse serve` -> llama-server serving the
# scripted model (synthetic.h: write_scripted_model), whose weights are set so that greedy
# decoding calls exec_command to write hello.txt first and, once the tool's result is in the
# prompt, answers. Everything the turn needs is real: Codex's own request (its tools, its
# prompt), llama-server's chat template, tool-call parser and grammar, Codex running the
# command. Asserts Codex exits 0, the file holds what the command wrote, the answer is printed,
# and the two model requests (call, answer) completed upstream.
#
# Runs inside a private network namespace (unshare -n, lo up).
# usage: codex_llama_server_e2e.sh PULSE_EXE PLUGIN_DIR MAKE_SYNTHETIC SOURCE_ROOT
# Needs PULSE_LLAMA_SERVER and PULSE_LLAMA_TEMPLATE (tools/dev sets both) and the Codex CLI
# (PULSE_CODEX, or PULSE_CODEX_NEWEST with PULSE_CODEX_USE=newest); else SKIP.
set -euo pipefail
pulse=$(realpath "$1") plugins=$(realpath "$2") make_synthetic=$(realpath "$3") src=$(realpath "$4")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_llama_server
require_codex
enter_netns "$@"

# The call in the Qwen3.5 template's XML tool-call format, which llama-server parses.
call=$'<tool_call>\n<function=exec_command>\n<parameter=cmd>\necho hello from pulse > hello.txt\n</parameter>\n</function>\n</tool_call>'
answer="Created hello.txt with the command; it says: hello from pulse"
"$make_synthetic" --scripted "$work/model.gguf" "$call" "$answer"
lport=$(free_port)
"$server" -m "$work/model.gguf" --host 127.0.0.1 --port "$lport" --jinja --chat-template-file "$template" \
  -c 65536 -np 1 -t 2 --seed 1 > "$work/llama.log" 2>&1 &
pids+=($!)
wait_healthy "$lport" "llama-server"

fport=$lport
profile=llamacpp
start_pulse_config 0
cat >> "$work/pulse.toml" <<TOML
[models."qwen3.8-flash-next".profile_options]
thinking = "off"
TOML
# PULSE_TOKEN_RESUME=1: the same turn with resume = "tokens", where the server renders the prompt
# (/apply-template) and Pulse parses the raw completion's tool call itself.
[ "${PULSE_TOKEN_RESUME:-0}" = 1 ] && echo 'resume = "tokens"' >> "$work/pulse.toml"
launch_pulse

mkdir -p "$work/home" "$work/codex-home" "$work/project"
cd "$work/project"
codex_exec 1 "Create hello.txt saying hello from pulse."
[ "$rc" -eq 0 ] || fail "codex exited $rc"
[ -f hello.txt ] || fail "hello.txt was not created (the tool call did not run)"
[ "$(cat hello.txt)" = "hello from pulse" ] || fail "hello.txt holds '$(cat hello.txt)'"
grep -qF "$answer" "$work/codex.out" || fail "the answer was not printed"
completed=$(grep -c 'outcome=completed' "$work/pulse.log" || true)
[ "$completed" -ge 2 ] || fail "expected at least 2 completed responses (the call, the answer), saw $completed"
if [ "${PULSE_TOKEN_RESUME:-0}" = 1 ]; then
  prepared=$(curl -s "http://127.0.0.1:$gport/metrics" | sed -n 's/^pulse_prepared_requests_total{.*outcome="ok"} \([0-9]*\)$/\1/p')
  [ "${prepared:-0}" -ge 2 ] || fail "the requests did not go out as raw completions (prepared: '${prepared:-none}')"
fi
echo "codex through llama-server ($("$codex" --version 2>/dev/null | head -n1)): ok — codex exit 0, exec_command ran, hello.txt written, answer printed ($completed responses)"
