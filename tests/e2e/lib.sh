# Shared set-up for the end-to-end scripts: a private network namespace, a fake backend and
# `pulse serve` on ephemeral loopback ports, cleanup on exit. Source it after setting
# pulse, fake, plugins (paths) and optionally profile/flavor.

# The Codex CLI under test, in $codex: $PULSE_CODEX (the pinned version tools/dev installs), or
# $PULSE_CODEX_NEWEST (the newest release) when PULSE_CODEX_USE=newest. Missing: the test is
# skipped (exit 77, reported as SKIP, never as a pass), or fails when PULSE_REQUIRE_E2E=1.
require_codex() {
  codex=${PULSE_CODEX:-}
  [ "${PULSE_CODEX_USE:-}" = newest ] && codex=${PULSE_CODEX_NEWEST:-}
  if [ -z "$codex" ] || [ ! -x "$codex" ]; then
    echo "codex CLI not found (PULSE_CODEX='$codex'); run the suite with tools/dev test, which installs it"
    [ "${PULSE_REQUIRE_E2E:-0}" = 1 ] && exit 1
    exit 77
  fi
}

# The llama-server under test, in $server and $template: $PULSE_LLAMA_SERVER and
# $PULSE_LLAMA_TEMPLATE (tools/dev builds the server from source and sets both). Missing: SKIP
# (exit 77), or a failure when PULSE_REQUIRE_E2E=1.
require_llama_server() {
  server=${PULSE_LLAMA_SERVER:-} template=${PULSE_LLAMA_TEMPLATE:-}
  if [ -z "$server" ] || [ ! -x "$server" ] || [ ! -f "$template" ]; then
    echo "llama-server not found (PULSE_LLAMA_SERVER='$server'); run the suite with tools/dev test, which builds it"
    [ "${PULSE_REQUIRE_E2E:-0}" = 1 ] && exit 1
    exit 77
  fi
}

# Re-executes the calling script inside a private network namespace with only lo up.
enter_netns() {
  if [ -z "${PULSE_IN_NETNS:-}" ]; then
    rm -rf "$work"  # exec skips the exit trap; the re-executed script makes its own
    exec unshare -n env PULSE_IN_NETNS=1 "$0" "$@"
  fi
  ip link set lo up
}

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  # What a supervisor loop started (the gateway in kill9 mode, restarted fakes) is not in pids:
  # each writes its current pid to a file, read once the loops above are stopped.
  for f in "$work"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log "$work"/*.out "$work"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -n 60 "$f"; }; done
  exit 1
}

# wait_port LOGFILE REGEX: prints the port at the end of the first match (bounded: 10 s).
wait_port() {
  local port
  for _ in $(seq 1 500); do
    port=$(grep -oE "$2" "$1" 2>/dev/null | grep -oE '[0-9]+$' | head -n1 || true)
    [ -n "$port" ] && { echo "$port"; return 0; }
    sleep 0.02
  done
  return 1
}

# free_port: a loopback port nobody listens on right now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_healthy PORT WHAT: waits (bounded: 30 s) until GET /health on PORT answers 200 (a
# llama-server loaded its model), else fails naming WHAT.
wait_healthy() {
  for _ in $(seq 1 1500); do curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0; sleep 0.02; done
  fail "$2 did not start"
}

# start_fake SCRIPT_JSON_FILE: sets fport.
start_fake() {
  "$fake" --script "$1" --port 0 --record "$work/requests.jsonl" --flavor "${flavor:-vllm}" > "$work/fake.log" 2>&1 &
  pids+=($!)
  fport=$(wait_port "$work/fake.log" 'listening on 127\.0\.0\.1:[0-9]+') || fail "fake backend did not start"
}

# pulse_config_head PORT: the plugin dir ($work/plugins, the build's plugins) and the start of
# $work/pulse.toml (listen address, plugin dirs); the caller appends its models.
pulse_config_head() {
  mkdir -p "$work/plugins"
  install -m 0755 "$plugins"/*.so "$work/plugins/"
  cat > "$work/pulse.toml" <<TOML
[server]
listen = "127.0.0.1:$1"
[plugins]
dirs = ["plugins"]
dropin_dirs = []
runtime_dir = "$work/run"
TOML
}

# start_pulse_config PORT: writes $work/pulse.toml (model qwen3.8-flash-next on
# ${profile:-qwen38} against the fake) and the plugin dir.
start_pulse_config() {
  pulse_config_head "$1"
  cat >> "$work/pulse.toml" <<TOML
[models."qwen3.8-flash-next"]
profile = "${profile:-qwen38}"
[[models."qwen3.8-flash-next".endpoints]]
name = "fake"
url = "http://127.0.0.1:$fport/v1"
TOML
}

# launch_pulse: the gateway on $work/pulse.toml (none of the caller's Pulse environment), log
# in $work/pulse.log; sets gport.
launch_pulse() {
  env -u PULSE_PLUGIN_DIRS -u PULSE_QWEN_BACKENDS -u PULSE_GATEWAY_API_KEY PULSE_LOG_TIMESTAMPS=0 \
    "$pulse" serve --config "$work/pulse.toml" > "$work/pulse.log" 2>&1 &
  pids+=($!)
  gport=$(wait_port "$work/pulse.log" 'listening on http://127\.0\.0\.1:[0-9]+') || fail "pulse did not start"
}

# start_pulse: config on an ephemeral port, then the gateway; sets gport.
start_pulse() {
  start_pulse_config 0
  launch_pulse
}

# codex_exec RETRIES PROMPT: `codex exec` in the current directory against the gateway on
# $gport (provider "pulse", the shipped model catalog, model qwen3.8-flash-next), output in
# $work/codex.out and codex.err; sets rc.
codex_exec() {
  rc=0
  HOME="$work/home" CODEX_HOME="$work/codex-home" timeout 240 "$codex" exec \
    --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox \
    -c model_provider=pulse \
    -c "model_providers.pulse={name=\"pulse\",base_url=\"http://127.0.0.1:$gport/v1\",wire_api=\"responses\",request_max_retries=$1,stream_max_retries=$1}" \
    -c "model_catalog_json=\"$src/config/codex/model-catalog.json\"" \
    -m qwen3.8-flash-next \
    "$2" \
    > "$work/codex.out" 2> "$work/codex.err" || rc=$?
}
