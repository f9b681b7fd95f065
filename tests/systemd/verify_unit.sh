#!/usr/bin/env bash
# `systemd-analyze verify` of the installed unit: install into a staging root (meson install
# --destdir) and verify the unit there, with its ExecStart resolved inside the stage.
set -euo pipefail
build_root=$1
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not installed (tools/dev installs the systemd package)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
meson install -C "$build_root" --no-rebuild --quiet --destdir "$work/stage" >/dev/null
unit=$(find "$work/stage" -name pulse-gateway.service -path '*systemd/system*' | head -n1)
[ -n "$unit" ] || { echo "FAIL: pulse-gateway.service not installed"; exit 1; }
exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
[ -x "$work/stage$exe" ] || { echo "FAIL: ExecStart $exe is not installed in the stage"; exit 1; }
# Verify a copy whose ExecStart points into the stage (the rest resolves against this system).
mkdir -p "$work/units"
sed "s|^ExecStart=$exe|ExecStart=$work/stage$exe|" "$unit" > "$work/units/pulse-gateway.service"
# Its Documentation=man:pulse(1) is looked up with man(1): the staged pages are what it must find.
man_dir=$(dirname "$(find "$work/stage" -type d -path '*/man/man1' | head -n1)")
out=$(MANPATH=$man_dir systemd-analyze verify "$work/units/pulse-gateway.service" 2>&1) || { echo "$out"; echo "FAIL: systemd-analyze verify"; exit 1; }
# verify prints warnings without failing; treat any line about our unit as a failure.
if grep -q "pulse-gateway.service" <<<"$out"; then echo "$out"; echo "FAIL: systemd-analyze reported problems"; exit 1; fi
grep -q '^Type=notify' "$unit" && grep -q '^WatchdogSec=' "$unit" && grep -q '^NoNewPrivileges=yes' "$unit" \
  || { echo "FAIL: unit lacks Type=notify / WatchdogSec / hardening"; exit 1; }
echo "systemd-analyze verify $(basename "$unit"): ok"
