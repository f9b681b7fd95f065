#!/usr/bin/env bash
# The arm64 package on a machine that is not arm64 (no binfmt_misc, so no arm64 chroot can run
# maintainer scripts): what can be checked under qemu-user is checked.
#   - its dependencies resolve on Debian 12 arm64: mmdebstrap --variant=extract installs the
#     package's files and, by apt's resolution of its Depends, every library it names into a
#     fresh root (an undeclared dependency then fails below);
#   - the unit and conffiles are where the amd64 package has them;
#   - `pulse plugins` loads every shipped plugin, and `pulse serve` answers /health and a turn of
#     a model served in-process, each aarch64 program run by qemu-aarch64-static -cpu max with
#     the fresh root as its prefix (qemu maps absolute paths into it).
# usage: arm64_test.sh DEB_DIR
set -euo pipefail
debs=$(cd "$1" && pwd)
work=$(mktemp -d)
serve_pid=
cleanup() {
  [ -z "$serve_pid" ] || kill "$serve_pid" 2>/dev/null || true
  # mmdebstrap's file-mirror-automount hook leaves the .deb bind-mounted in the root.
  awk -v w="$work/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
deb=$(ls "$debs"/pulse-gateway_*_arm64.deb)
[ "$(dpkg-deb -f "$deb" Architecture)" = arm64 ] || fail "$deb is not an arm64 package"

echo "== its dependencies, resolved by apt into a fresh Debian 12 arm64 root"
root=$work/root
mmdebstrap --quiet --variant=extract --architectures=arm64 --include="$deb" --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
  bookworm "$root" >"$work/mm.log" 2>&1 \
  || { tail -n 20 "$work/mm.log"; fail "the package's dependencies do not resolve on Debian 12 arm64"; }
[ -x "$root/usr/bin/pulse" ] || fail "pulse is not in the root"
file -b "$root/usr/bin/pulse" 2>/dev/null | grep -q aarch64 || readelf -h "$root/usr/bin/pulse" | grep -q AArch64 || fail "pulse is not an aarch64 program"
[ -f "$root/lib/systemd/system/pulse-gateway.service" ] || fail "the unit is not in /lib/systemd/system"
[ -f "$root/usr/lib/sysusers.d/pulse-gateway.conf" ] || fail "the sysusers.d file is missing"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/pulse-gateway/pulse.toml || fail "pulse.toml is not a conffile"

run() { qemu-aarch64-static -cpu max -L "$root" "$root/usr/bin/pulse" "$@"; }
echo "== pulse plugins (qemu-aarch64)"
out=$(run plugins --config "$root/etc/pulse-gateway/pulse.toml" 2>&1) || { echo "$out"; fail "pulse plugins"; }
echo "$out"
for id in pulse.translation.qwen38 pulse.translation.llamacpp pulse.backend.decoder pulse.controller.recipe pulse.policy; do
  grep -q "^$id .* loaded (/usr/lib/aarch64-linux-gnu/pulse-gateway/plugins/" <<<"$out" || fail "plugin $id is not loaded from the installed directory"
done

echo "== pulse serve (qemu-aarch64): /health and a turn of a model served in-process"
port=$(free_port)
{ sed "s/^listen = .*/listen = \"127.0.0.1:$port\"/" "$root/etc/pulse-gateway/pulse.toml"; echo
  sed "s|decoder:///var/lib/pulse-gateway/|decoder://$work/|" "$root/usr/share/pulse-gateway/examples/demo-model.toml"; } >"$work/serve.toml"
qemu-aarch64-static -cpu max -L "$root" "$root/usr/bin/pulse" serve --config "$work/serve.toml" >"$work/serve.log" 2>&1 &
serve_pid=$!
serve_turn "$port" "$serve_pid"
grep -q "decoder: device cpu" "$work/serve.log" || fail "the decoder did not say its device"
echo "turn: HTTP 200, a response, served by the aarch64 decoder under qemu"
echo "arm64 package test: ok"
