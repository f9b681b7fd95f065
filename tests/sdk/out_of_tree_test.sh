#!/usr/bin/env bash
# Installs the SDK into a staging root (meson install --destdir), builds the example backend
# OUT OF TREE with nothing but `pkg-config pulse-sdk` (both with meson and with a plain c++
# command line), and checks that `pulse plugins` loads both builds' result.
set -euo pipefail
build_root=$1 source_root=$2 pulse=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

meson install -C "$build_root" --no-rebuild --quiet --destdir "$work/stage" >/dev/null
pcfile=$(find "$work/stage" -name pulse-sdk.pc | head -n1)
[ -n "$pcfile" ] || { echo "FAIL: pulse-sdk.pc not installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pcfile")
export PKG_CONFIG_SYSROOT_DIR="$work/stage"
echo "pkg-config --cflags pulse-sdk: $(pkg-config --cflags pulse-sdk)"

# 1. meson, from a copy of the example (nothing of the Pulse tree is visible to it)
cp -r "$source_root/sdk/examples/echo-backend" "$work/src"
meson setup "$work/build" "$work/src" >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; exit 1; }
meson compile -C "$work/build" >"$work/compile.log" 2>&1 || { cat "$work/compile.log"; exit 1; }

# 2. a plain compiler line
mkdir -p "$work/plugins-cc"
c++ -std=c++17 -shared -fPIC $(pkg-config --cflags pulse-sdk) "$work/src/echo_backend.cpp" \
    $(pkg-config --libs pulse-sdk) -o "$work/plugins-cc/example_echo.so"

# Exactly one exported pulse_ symbol: the entry.
exported=$(nm -D --defined-only "$work/build/example_echo.so" | awk '{print $3}' | grep '^pulse_' || true)
[ "$exported" = "pulse_plugin_entry_v1" ] || { echo "FAIL: exported pulse_ symbols: $exported"; exit 1; }

for dir in "$work/build" "$work/plugins-cc"; do
    mkdir -p "$work/site-$(basename "$dir")"
    plugdir="$work/site-$(basename "$dir")/plugins"
    mkdir -p "$plugdir"
    install -m 0755 "$dir/example_echo.so" "$plugdir/"
    printf '[plugins]\ndirs = ["plugins"]\ndropin_dirs = []\nrequire = ["pulse.example.echo"]\n' \
        > "$work/site-$(basename "$dir")/pulse.toml"
    out=$(env -u PULSE_PLUGIN_DIRS "$pulse" plugins --config "$work/site-$(basename "$dir")/pulse.toml")
    echo "$out"
    grep -Eq '^pulse\.example\.echo +backend +1\.0\.0 +1\.0 +loaded .*backend example-echo' <<<"$out" \
        || { echo "FAIL: example plugin built in $dir did not load"; exit 1; }
done
# A whole Responses turn through the out-of-tree build, next to the shipped qwen38 profile.
site="$work/site-serve"
mkdir -p "$site/plugins"
install -m 0755 "$work/build/example_echo.so" "$build_root/plugins/qwen38.so" "$site/plugins/"
cat > "$site/pulse.toml" <<'TOML'
[server]
listen = "127.0.0.1:0"
[plugins]
dirs = ["plugins"]
dropin_dirs = []
[models.echo]
profile = "qwen38"
[[models.echo.endpoints]]
url = "plugin://example-echo"
TOML
env -u PULSE_PLUGIN_DIRS -u PULSE_QWEN_BACKENDS -u PULSE_GATEWAY_API_KEY "$pulse" serve --config "$site/pulse.toml" 2> "$site/log" &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null; rm -rf "$work"' EXIT
port=
for _ in $(seq 1 500); do
  port=$(grep -oE 'listening on http://127\.0\.0\.1:[0-9]+' "$site/log" | grep -oE '[0-9]+$' || true)
  [ -n "$port" ] && break
  sleep 0.02
done
[ -n "$port" ] || { cat "$site/log"; echo "FAIL: pulse serve did not start"; exit 1; }
answer=$(python3 - "$port" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/responses",
    data=json.dumps({"model": "echo", "input": "built out of tree", "stream": False}).encode(),
    headers={"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=20))
print(r["status"], r["output"][0]["content"][0]["text"])
PY
)
[ "$answer" = "completed echo: built out of tree" ] || { cat "$site/log"; echo "FAIL: got '$answer'"; exit 1; }
echo "Responses turn through the out-of-tree plugin: $answer"
echo "out-of-tree SDK build: ok"
