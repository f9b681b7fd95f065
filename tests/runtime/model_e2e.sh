#!/bin/bash
# `pulse model up` end to end, as an operator runs it: a running `pulse serve` whose only
# configured endpoint is dead; `pulse model up best --node test` brings the fake recipe's server
# up, verifies it and publishes it; the gateway then answers a Responses turn from it. Then
# status, and down withdraws it again. Loopback only; every wait is bounded.
#   model_e2e.sh PULSE_EXE FAKE_VLLM PLUGIN_BUILD_DIR SOURCE_ROOT
set -euo pipefail
pulse=$1 fake_vllm=$2 plugins=$3 src=$4
work=$(mktemp -d)
serve_pid=
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
  [ -f "$work/recipe/fake-vllm.pid" ] && kill "$(cat "$work/recipe/fake-vllm.pid")" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; echo "--- gateway log:" >&2; cat "$work/serve.log" >&2 || true; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

node_port=$(free_port)
gw_port=$(free_port)
dead_port=$(free_port)
cp -r "$src/tests/runtime/fake_recipe" "$work/recipe"
mkdir -p "$work/profiles" "$work/plugins" "$work/frags"
cp -r "$src/profiles/qwen38" "$work/profiles/"
sed -i "s/^PORT='8888'/PORT='$node_port'/" "$work/profiles/qwen38/"*.env
cp "$plugins"/qwen38.so "$plugins"/recipe.so "$work/plugins/"
printf "MemTotal: 127600000 kB\nMemAvailable: 120000000 kB\n" > "$work/meminfo"
echo weights > "$work/mtp.safetensors"
cat > "$work/recipe/fake.conf" <<CONF
FAKE_VLLM='$fake_vllm'
FAKE_VARIANT='ok'
FAKE_MEMINFO='$work/meminfo'
CONF
cat > "$work/nodes.toml" <<NODES
[nodes.test]
ssh = "local"
recipe_dir = "$work/recipe"
host = "127.0.0.1"
meminfo = "$work/meminfo"
poll_interval_s = 0.1
ready_timeout_s = 20
gpu_apps_command = "cat fake-gpu-apps 2>/dev/null || true"
own_pids_command = "cat fake-vllm.pid 2>/dev/null"
log_command = "cat fake-vllm.log"
[nodes.test.paths]
mtp_head_shard = "$work/mtp.safetensors"
NODES
cat > "$work/pulse.toml" <<TOML
[server]
listen = "127.0.0.1:$gw_port"
[plugins]
dirs = ["plugins"]
dropin_dirs = []
runtime_dir = "run"
[upstream]
retry_window_s = 0
health_interval_s = 0.2
endpoint_fragments = "frags"
[controller]
nodes = "nodes.toml"
profiles = "profiles"
state_dir = "state"
[models."qwen3.8-flash-next"]
profile = "qwen38"
[[models."qwen3.8-flash-next".endpoints]]
name = "configured"
url = "http://127.0.0.1:$dead_port/v1"
TOML
chmod 700 "$work/plugins"

env -u PULSE_PLUGIN_DIRS "$pulse" serve --config "$work/pulse.toml" > "$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 100); do grep -q "listening on" "$work/serve.log" && break; sleep 0.1; done
grep -q "listening on" "$work/serve.log" || fail "gateway did not start"

turn() {
  curl -sS -m 20 "http://127.0.0.1:$gw_port/v1/responses" -H 'Content-Type: application/json' \
    -d '{"model":"qwen3.8-flash-next","stream":false,"store":false,"input":"hi"}'
}
if turn | grep -q '"status":"completed"'; then fail "a turn completed before any node was up"; fi

up_out=$(env -u PULSE_PLUGIN_DIRS "$pulse" model up best --node test --config "$work/pulse.toml" 2>&1) || { echo "$up_out"; fail "pulse model up failed"; }
echo "$up_out"
grep -q "gateway at http://127.0.0.1:$gw_port: reload requested" <<<"$up_out" || fail "up did not ask the gateway to reload"
grep -q "gateway view: healthy on model qwen3.8-flash-next" <<<"$up_out" || fail "the gateway does not see the node as healthy"

answer=$(turn)
grep -q 'hello from the node' <<<"$answer" || { echo "$answer"; fail "the gateway did not route the turn to the node"; }
echo "turn through the gateway: ok"

status_out=$(env -u PULSE_PLUGIN_DIRS "$pulse" model status --node test --config "$work/pulse.toml" 2>&1) || { echo "$status_out"; fail "status"; }
echo "$status_out"
grep -q "profile   qwen38/best (state up" <<<"$status_out" || fail "status does not name the profile"
grep -q "gateway   healthy on model qwen3.8-flash-next" <<<"$status_out" || fail "status does not show the gateway's view"

down_out=$(env -u PULSE_PLUGIN_DIRS "$pulse" model down --node test --config "$work/pulse.toml" 2>&1) || { echo "$down_out"; fail "down"; }
echo "$down_out"
if [ -e "$work/frags/test.toml" ]; then fail "down left the fragment"; fi
for _ in $(seq 1 50); do grep -q "configuration generation 3 is serving" "$work/serve.log" && break; sleep 0.1; done
grep -q "configuration generation 3 is serving" "$work/serve.log" || fail "the gateway did not reload after down"
if turn | grep -q 'hello from the node'; then fail "the gateway still routes to a node that is down"; fi
echo "PASS"
