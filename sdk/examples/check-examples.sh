#!/usr/bin/env bash
# Builds each SDK example out of tree against the installed SDK (found with `pkg-config
# pulse-sdk`), once with meson and once with a plain compiler line, checks that each build
# exports exactly one pulse_ symbol (the entry), and loads every build with `pulse plugins`.
#
#   usage: check-examples.sh [PULSE]      PULSE: the pulse binary (default: `pulse` on PATH)
#
# For a staged install (meson install --destdir STAGE), point pkg-config at it first:
#   PKG_CONFIG_PATH=STAGE/PREFIX/LIBDIR/pkgconfig PKG_CONFIG_SYSROOT_DIR=STAGE check-examples.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pulse=${1:-pulse}
pkg-config --exists pulse-sdk || {
  echo "check-examples: pkg-config finds no pulse-sdk (set PKG_CONFIG_PATH to the directory holding pulse-sdk.pc)" >&2
  exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# example dir, language, module name, source, plugin id, backend name
examples=(
  "echo-backend c++ example_echo echo_backend.cpp pulse.example.echo example-echo"
  "c-backend c example_shout shout_backend.c pulse.example.shout example-shout"
)
for row in "${examples[@]}"; do
  read -r dir lang module src id backend <<<"$row"
  cp -r "$here/$dir" "$work/$dir"
  meson setup "$work/$dir-build" "$work/$dir" >"$work/$dir.setup.log" 2>&1 || { cat "$work/$dir.setup.log" >&2; exit 1; }
  meson compile -C "$work/$dir-build" >"$work/$dir.compile.log" 2>&1 || { cat "$work/$dir.compile.log" >&2; exit 1; }
  mkdir -p "$work/$dir-cc"
  if [ "$lang" = c ]; then
    cc -std=c11 -Wall -Wextra -Werror -shared -fPIC $(pkg-config --cflags pulse-sdk) "$work/$dir/$src" \
      $(pkg-config --libs pulse-sdk) -o "$work/$dir-cc/$module.so"
  else
    c++ -std=c++17 -Wall -Wextra -Werror -shared -fPIC $(pkg-config --cflags pulse-sdk) "$work/$dir/$src" \
      $(pkg-config --libs pulse-sdk) -o "$work/$dir-cc/$module.so"
  fi
  for build in meson cc; do
    so="$work/$dir-build/$module.so"
    [ "$build" = cc ] && so="$work/$dir-cc/$module.so"
    exported=$(nm -D --defined-only "$so" | awk '{print $3}' | grep '^pulse_' || true)
    [ "$exported" = "pulse_plugin_entry_v1" ] || { echo "check-examples: $dir ($build) exports: $exported" >&2; exit 1; }
    site="$work/site-$dir-$build"
    mkdir -p "$site/plugins"
    install -m 0755 "$so" "$site/plugins/"
    printf '[plugins]\ndirs = ["plugins"]\ndropin_dirs = []\nrequire = ["%s"]\n' "$id" >"$site/pulse.toml"
    out=$(env -u PULSE_PLUGIN_DIRS "$pulse" plugins --config "$site/pulse.toml") || { echo "$out" >&2; exit 1; }
    grep -Eq "^${id//./\\.} +backend +1\.0\.0 +1\.[0-9]+ +loaded .*backend $backend" <<<"$out" || {
      echo "$out" >&2
      echo "check-examples: $dir built with $build did not load" >&2
      exit 1
    }
    echo "example $dir ($lang, built with $build): loaded as backend $backend"
  done
done
