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
trap 'rm -rf "$work"' EXIT

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
template=$(find "$work/stage" -type d -path '*/share/pulse-gateway/template' | head -n1)
[ -n "$template" ] && [ -x "$template/tests/serve_test.sh" ] && [ -f "$template/src/shout_backend.c" ] \
  && [ -f "$template/src/echo_backend.cpp" ] || { echo "FAIL: the template project is not installed in share/pulse-gateway/template"; exit 1; }
# A staged install: the .pc names the final prefix; the sysroot maps it into the stage (pkgconf
# 1.8 maps the plugindir and dropindir variables too).
export PKG_CONFIG_PATH=$(dirname "$pcfile") PKG_CONFIG_SYSROOT_DIR="$work/stage"
echo "pkg-config --cflags pulse-sdk: $(pkg-config --cflags pulse-sdk)"
case "$(pkg-config --cflags pulse-sdk)" in
  *"-I$work/stage/"*) ;;
  *) echo "FAIL: the include path does not point into the staged install"; exit 1 ;;
esac
case "$(pkg-config --variable=plugindir pulse-sdk)" in
  "$work/stage/"*/pulse-gateway/plugins) ;;
  *) echo "FAIL: plugindir $(pkg-config --variable=plugindir pulse-sdk) is not in the stage"; exit 1 ;;
esac
# The installed config reads the drop-ins where the SDK says they are.
dropins=$(pkg-config --variable=dropindir pulse-sdk)
staged_config=$(find "$work/stage" -name pulse.toml -path '*/pulse-gateway/pulse.toml' | head -n1)
grep -q "^dropin_dirs = \[\"${dropins#"$work/stage"}\"\]" "$staged_config" \
  || { echo "FAIL: $staged_config does not read the drop-ins from ${dropins#"$work/stage"}"; grep dropin_dirs "$staged_config"; exit 1; }
# An install over an edited configuration keeps it, and puts the new default beside it.
echo '# edited by the site' >>"$staged_config"
edited=$(sha1sum <"$staged_config")
meson install -C "$build_root" --no-rebuild --destdir "$work/stage" >"$work/install2.log" 2>&1 || { cat "$work/install2.log"; exit 1; }
[ "$(sha1sum <"$staged_config")" = "$edited" ] || { echo "FAIL: a second meson install overwrote the edited $staged_config"; exit 1; }
[ -f "$staged_config.dist" ] && ! grep -q 'edited by the site' "$staged_config.dist" \
  || { echo "FAIL: the new default is not beside the edited config as pulse.toml.dist"; exit 1; }
echo "meson install over an edited config: kept, new default in pulse.toml.dist"

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
# 3. A plain compiler line each, as the sources' comments show, served by the template's test.
mkdir -p "$work/cc"
c++ -std=c++17 -Wall -Wextra -Werror -shared -fPIC $(pkg-config --cflags pulse-sdk) $(pkg-config --variable=plugin_cflags pulse-sdk) "$template/src/echo_backend.cpp" \
  $(pkg-config --libs pulse-sdk) -o "$work/cc/example_echo.so"
cc -std=c11 -Wall -Wextra -Werror -shared -fPIC $(pkg-config --cflags pulse-sdk) $(pkg-config --variable=plugin_cflags pulse-sdk) "$template/src/shout_backend.c" \
  $(pkg-config --libs pulse-sdk) -o "$work/cc/example_shout.so"
PULSE="$pulse" "$template/tests/serve_test.sh" "$work/cc/example_shout.so" "$work/cc/example_echo.so" "$(pkg-config --variable=plugindir pulse-sdk)" \
  || { echo "FAIL: the compiler-line builds"; exit 1; }
echo "out-of-tree SDK build: ok"
