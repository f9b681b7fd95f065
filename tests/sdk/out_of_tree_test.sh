#!/usr/bin/env bash
# The SDK as a plugin author gets it: installs the build into a staging root (meson install
# --destdir, which must not rebuild anything), then, with nothing but what was installed,
# copies the installed template project (a C and a C++ backend) out of the stage, builds it
# with its own meson.build and runs its own test (a real `pulse serve`, turns through each
# backend, a clean stop), installs its plugins into the staged plugin directory, and builds
# both sources once more with a plain compiler line and serves a turn through each.
set -euo pipefail
build_root=$1 source_root=$2 pulse=$3
work=$(mktemp -d)
serve_pid=
trap '[ -n "$serve_pid" ] && kill $serve_pid 2>/dev/null; rm -rf "$work"' EXIT

# 1. The install itself: nothing is recompiled or relinked (the build is current).
stamp() { find "$build_root/core" "$build_root/plugins" "$build_root/tools/pulse-bench" -maxdepth 1 -type f -perm -u+x -printf '%p %T@\n' | sort; }
before=$(stamp)
meson install -C "$build_root" --destdir "$work/stage" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
if grep -Eq '(Compiling|Linking) ' "$work/install.log" || [ "$before" != "$(stamp)" ]; then
  grep -E '(Compiling|Linking|Generating) ' "$work/install.log" | head -n 20
  echo "FAIL: meson install rebuilt part of a current build"
  exit 1
fi
echo "meson install: nothing rebuilt"

pcfile=$(find "$work/stage" -name pulse-sdk.pc | head -n1)
[ -n "$pcfile" ] || { echo "FAIL: pulse-sdk.pc not installed"; exit 1; }
template=$(find "$work/stage" -type d -path '*/share/pulse/template' | head -n1)
[ -n "$template" ] && [ -x "$template/tests/serve_test.sh" ] && [ -f "$template/src/shout_backend.c" ] \
  && [ -f "$template/src/echo_backend.cpp" ] || { echo "FAIL: the template project is not installed in share/pulse/template"; exit 1; }
# A staged install: the .pc names the final prefix; the sysroot maps it into the stage (pkgconf
# 1.8 maps the plugindir and dropindir variables too).
export PKG_CONFIG_PATH=$(dirname "$pcfile") PKG_CONFIG_SYSROOT_DIR="$work/stage"
echo "pkg-config --cflags pulse-sdk: $(pkg-config --cflags pulse-sdk)"
case "$(pkg-config --cflags pulse-sdk)" in
  *"-I$work/stage/"*) ;;
  *) echo "FAIL: the include path does not point into the staged install"; exit 1 ;;
esac
case "$(pkg-config --variable=plugindir pulse-sdk)" in
  "$work/stage/"*/pulse/plugins) ;;
  *) echo "FAIL: plugindir $(pkg-config --variable=plugindir pulse-sdk) is not in the stage"; exit 1 ;;
esac
# The installed config reads the drop-ins where the SDK says they are.
dropins=$(pkg-config --variable=dropindir pulse-sdk)
staged_config=$(find "$work/stage" -name pulse.toml -path '*/pulse/pulse.toml' | head -n1)
grep -q "^dropin_dirs = \[\"${dropins#"$work/stage"}\"\]" "$staged_config" \
  || { echo "FAIL: $staged_config does not read the drop-ins from ${dropins#"$work/stage"}"; grep dropin_dirs "$staged_config"; exit 1; }

# 2. The template project, copied out of the stage as an author would: its own meson build and
# its own test (a real pulse serve with both plugins, turns through each, a clean stop).
cp -r "$template" "$work/my-backend"
meson setup "$work/my-backend-build" "$work/my-backend" >"$work/template.setup.log" 2>&1 || { cat "$work/template.setup.log"; exit 1; }
PULSE="$pulse" meson test -C "$work/my-backend-build" --print-errorlogs >"$work/template.test.log" 2>&1 \
  || { cat "$work/template.test.log"; echo "FAIL: the template project's own test"; exit 1; }
grep -q "template plugins: ok" "$work/my-backend-build/meson-logs/testlog.txt" || { cat "$work/template.test.log"; exit 1; }
echo "template project: built from the stage, its test passed"
# Its plugins install into the staged plugin directory.
meson install -C "$work/my-backend-build" >"$work/template.install.log" 2>&1 || { cat "$work/template.install.log"; exit 1; }
[ -f "$(pkg-config --variable=plugindir pulse-sdk)/example_shout.so" ] || { echo "FAIL: the template's install_dir is not the staged plugindir"; exit 1; }

# 4. A whole Responses turn through each compiler-line build.
site="$work/site-serve"
mkdir -p "$site/plugins"
# 3. A plain compiler line each, as the sources' comments show.
c++ -std=c++17 -Wall -Wextra -Werror -shared -fPIC $(pkg-config --cflags pulse-sdk) "$template/src/echo_backend.cpp" \
  $(pkg-config --libs pulse-sdk) -o "$site/plugins/example_echo.so"
cc -std=c11 -Wall -Wextra -Werror -shared -fPIC $(pkg-config --cflags pulse-sdk) "$template/src/shout_backend.c" \
  $(pkg-config --libs pulse-sdk) -o "$site/plugins/example_shout.so"
install -m 0755 "$build_root/plugins/qwen38.so" "$site/plugins/"
chmod 0755 "$site/plugins/"*.so
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
[models.shout]
profile = "qwen38"
[[models.shout.endpoints]]
url = "plugin://example-shout"
options = { words_per_chunk = 2 }
TOML
env -u PULSE_PLUGIN_DIRS -u PULSE_QWEN_BACKENDS -u PULSE_GATEWAY_API_KEY "$pulse" serve --config "$site/pulse.toml" 2> "$site/log" &
serve_pid=$!
port=
for _ in $(seq 1 500); do
  port=$(grep -oE 'listening on http://127\.0\.0\.1:[0-9]+' "$site/log" | grep -oE '[0-9]+$' || true)
  [ -n "$port" ] && break
  sleep 0.02
done
[ -n "$port" ] || { cat "$site/log"; echo "FAIL: pulse serve did not start"; exit 1; }
python3 - "$port" <<'PY' || { cat "$site/log"; exit 1; }
import json, sys, urllib.request
port = sys.argv[1]
def turn(model, stream):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/responses",
        data=json.dumps({"model": model, "input": "built out of tree", "stream": stream}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        if not stream:
            body = json.load(r)
            return body["status"], body["output"][0]["content"][0]["text"], body["usage"]
        text, status, usage = "", None, None
        for line in r.read().decode().splitlines():
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if ev["type"] == "response.output_text.delta":
                text += ev["delta"]
            if ev["type"] == "response.completed":
                status, usage = ev["response"]["status"], ev["response"]["usage"]
        return status, text, usage
for model, want in (("echo", "echo: built out of tree"), ("shout", "BUILT OUT OF TREE")):
    for stream in (False, True):
        status, text, usage = turn(model, stream)
        if (status, text) != ("completed", want):
            sys.exit(f"FAIL: {model} stream={stream}: got {status!r} {text!r}, want {want!r}")
        print(f"Responses turn through the out-of-tree {model} plugin (stream={stream}): {text} (usage {usage['input_tokens']} in, {usage['output_tokens']} out)")
# The C example's usage chunk (choices: []) reaches the client: 2 chunks of 2 words for 3 words.
if turn("shout", False)[2]["output_tokens"] != 2:
    sys.exit("FAIL: the C example's usage chunk did not reach the response's usage")
PY
echo "out-of-tree SDK build: ok"
