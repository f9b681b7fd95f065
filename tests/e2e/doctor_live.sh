#!/usr/bin/env bash
# `pulse doctor` against what users run: real llama-servers (built from source by tools/dev,
# serving the synthetic model) started well and started wrong (a per-slot context too small for
# a Codex turn, no --jinja, a template that ignores tools), and the fake vLLM with the right and
# a wrong served model name; then a config whose context_window the server cannot take, checked
# with the gateway running (the turn through Pulse), the catalog written with the real window.
#
# usage: doctor_live.sh PULSE_EXE PLUGIN_DIR MAKE_SYNTHETIC FAKE_VLLM
# Needs PULSE_LLAMA_SERVER and PULSE_LLAMA_TEMPLATE (tools/dev sets both); else SKIP.
set -euo pipefail
pulse=$(realpath "$1") plugins=$(realpath "$2") make_synthetic=$(realpath "$3") fake=$(realpath "$4")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_llama_server
enter_netns "$@"

"$make_synthetic" --tiny "$work/model.gguf"
# Random weights: invalid UTF-8 byte tokens banned (llama-server's parser rejects them).
bias=()
for t in $(seq 128 255); do bias+=(--logit-bias "$t-inf"); done
start_server() {  # NAME ARGS...: sets port_NAME
  local name=$1 port
  shift
  port=$(free_port)
  "$server" -m "$work/model.gguf" --host 127.0.0.1 --port "$port" -t 1 --seed 1 "${bias[@]}" "$@" > "$work/llama-$name.log" 2>&1 &
  pids+=($!)
  wait_healthy "$port" "llama-server $name"
  printf -v "port_$name" '%s' "$port"
}
# A template that renders the conversation and ignores the tools, as many hand-written ones do.
cat > "$work/no-tools.jinja" <<'JINJA'
{%- for message in messages -%}
{{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
JINJA
# The synthetic model says it was trained on 4096 tokens, and llama-server caps -c there: the
# file's claim is raised (a random-weight model has no real limit) so a slot can hold a Codex turn.
long=(--override-kv qwen35.context_length=int:32768)
start_server good --jinja --chat-template-file "$template" -c 32768 -np 1 "${long[@]}"
start_server tiny --jinja --chat-template-file "$template" -c 4096 -np 4
start_server nojinja -c 32768 -np 1 "${long[@]}"
start_server notools --jinja --chat-template-file "$work/no-tools.jinja" -c 32768 -np 1 "${long[@]}"
echo '{"turns":[{"content":"hello"}]}' > "$work/fake.json"
"$fake" --script "$work/fake.json" --port 0 --served-name qwen3.8-flash-next --max-model-len 262144 > "$work/fake.log" 2>&1 &
pids+=($!)
vport=$(wait_port "$work/fake.log" 'listening on 127\.0\.0\.1:[0-9]+') || fail "the fake vLLM did not start"

doctor() {  # NAME ARGS...: runs pulse doctor, output in $work/doctor-NAME.out, exit in rc
  local name=$1
  shift
  rc=0
  timeout 120 env -u PULSE_CONFIG "$pulse" doctor "$@" > "$work/doctor-$name.out" 2>&1 || rc=$?
  out=$(cat "$work/doctor-$name.out")
}
expect() {  # NAME PATTERN: the report says it
  grep -qE -- "$2" "$work/doctor-$1.out" || fail "doctor $1: expected /$2/ in:
$(cat "$work/doctor-$1.out")"
}

doctor good "http://127.0.0.1:$port_good/v1"
[ "$rc" = 0 ] || fail "doctor on a well-started llama-server exited $rc:
$out"
expect good 'INFO  server +llama-server b[0-9]+-[0-9a-f]+, 1 slot of 32768 tokens'
expect good 'PASS  context window +32768 tokens per slot'
expect good 'PASS  template renders tools +a tool-call turn with two parallel calls'
expect good 'PASS  prefix cache +[0-9]+ of [0-9]+ prompt tokens cached on the repeat'
expect good 'PASS  prefill speed +[0-9]+ tokens/s'
expect good 'PASS  reasoning separated'
expect good '0 failures'

doctor tiny "http://127.0.0.1:$port_tiny/v1"
[ "$rc" = 1 ] || fail "doctor on a 1024-token-per-slot server exited $rc"
expect tiny 'FAIL  context window +1024 tokens per slot \(-c divided by -np 4\): a Codex first turn alone is ~11000 tokens'
expect tiny 'fix: start llama-server with -c 262144'
# The tool-call turn does not fit 1024 tokens: said so, not blamed on the template.
expect tiny 'WARN  template renders tools +not checked: the tool-call turn does not fit the server.s context'

doctor nojinja "http://127.0.0.1:$port_nojinja/v1"
[ "$rc" = 1 ] || fail "doctor on a server without --jinja exited $rc"
expect nojinja 'FAIL  template renders tools +the chat template does not render tools'
expect nojinja 'fix: start llama-server with --jinja'

doctor notools "http://127.0.0.1:$port_notools/v1"
[ "$rc" = 1 ] || fail "doctor on a template without tools exited $rc"
expect notools 'FAIL  template renders tools +the chat template does not render tools \(the rendered prompt has no tool in it\)'

doctor vllm --model qwen3.8-flash-next "http://127.0.0.1:$vport/v1"
[ "$rc" = 0 ] || fail "doctor on the fake vLLM serving the model exited $rc:
$out"
expect vllm "PASS  model served +the server lists 'qwen3.8-flash-next'"
expect vllm 'PASS  context window +262144 tokens'

doctor vllm-wrong --model Qwen/Qwen3.8-Flash-Next "http://127.0.0.1:$vport/v1"
[ "$rc" = 1 ] || fail "doctor on the fake vLLM serving another name exited $rc"
expect vllm-wrong "FAIL  model served +the server does not list 'Qwen/Qwen3.8-Flash-Next' \(it serves 'qwen3.8-flash-next'\)"
expect vllm-wrong 'fix: start vLLM with --served-model-name Qwen/Qwen3.8-Flash-Next'
expect vllm-wrong 'upstream_model = "qwen3.8-flash-next"'

# A config that claims a larger window than the server takes, the gateway running.
gport=$(free_port)
pulse_config_head "$gport"
cat >> "$work/pulse.toml" <<TOML
[models.local]
profile = "llamacpp"
context_window = 65536
[[models.local.endpoints]]
name = "good"
url = "http://127.0.0.1:$port_good/v1"
TOML
launch_pulse
echo '{"old": true}' > "$work/catalog.json"
doctor config --config "$work/pulse.toml" --write-catalog "$work/catalog.json"
[ "$rc" = 1 ] || fail "doctor on a config with too large a context_window exited $rc:
$out"
expect config 'model local, endpoint good'
expect config 'FAIL  context window +the config says 65536 but the server takes 32768 per slot'
expect config 'PASS  turn through Pulse +one Codex-shaped turn of .local. through http://127\.0\.0\.1:[0-9]+: (completed|incomplete)'
expect config '\[models\.local\] context_window = 32768'
expect config "catalog: wrote $work/catalog.json for 'local' with context_window 32768"
grep -q '"context_window":32768' "$work/catalog.json" || fail "the catalog does not carry the server's window: $(cat "$work/catalog.json")"
grep -q '"old": true' "$work/catalog.json.bak" || fail "the previous catalog was not kept as catalog.json.bak"
# The same as JSON, for scripts.
doctor json --config "$work/pulse.toml" --json
[ "$rc" = 1 ] || fail "doctor --json exited $rc"
python3 - "$work/doctor-json.out" <<'PY' || fail "doctor --json: $(cat "$work/doctor-json.out")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["failures"] == 1, r["failures"]
ep = r["endpoints"][0]
assert ep["context_window"] == 32768 and ep["endpoint"] == "good", ep
verdicts = {c["check"]: c["verdict"] for c in ep["checks"]}
assert verdicts["context window"] == "fail" and verdicts["template renders tools"] == "pass", verdicts
assert r["gateway"][0]["verdict"] == "pass", r["gateway"]
assert "[models.local] context_window = 32768" in r["config_changes"], r["config_changes"]
PY
# Nothing listening: a failure that says so, exit 1.
doctor dead "http://127.0.0.1:$(free_port)/v1"
[ "$rc" = 1 ] || fail "doctor on a dead port exited $rc"
expect dead 'FAIL  reachable'
echo "PASS: pulse doctor against real llama-servers and the fake vLLM"
