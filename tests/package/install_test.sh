#!/usr/bin/env bash
# The amd64 packages as a site gets them, in a fresh minimal Debian 12 root (debootstrap
# --variant=minbase from Debian's archive; tools/dev package-test caches it as a tarball):
#   install with apt-get, so a dependency the package fails to declare fails here;
#   the service user, the conffiles, the unit (enabled; systemd-analyze verify);
#   `pulse plugins` and `pulse serve` run as the service user, answering /health and a turn of a
#     model served in-process (the decoder backend, the demo model's table);
#   upgrade from the previous package over an edited config (kept; the new one as .dpkg-dist);
#   remove (config and user kept), purge (config, state and user gone);
#   the SDK package: its header and pkg-config file.
# usage: install_test.sh DEB_DIR ROOT_TARBALL
set -euo pipefail
debs=$(cd "$1" && pwd) base=$2
work=$(mktemp -d)
root=$work/root
serve_pid=
cleanup() {
  [ -z "$serve_pid" ] || kill "$serve_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
step() { printf '== %s\n' "$*"; }
fail() { echo "FAIL: $*"; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

new=$(ls "$debs"/pulse-gateway_*_amd64.deb)
dev=$(ls "$debs"/pulse-gateway-dev_*_amd64.deb)
version=$(dpkg-deb -f "$new" Version)

# The previous package: this one as version ~prev, with a different default config (as a release
# that changed it), so the upgrade meets a conffile both the site and the package changed.
step "making the previous package ($version~prev)"
mkdir -p "$work/prev"
dpkg-deb -R "$new" "$work/prev/pkg"
sed -i "s/^Version: .*/Version: $version~prev/" "$work/prev/pkg/DEBIAN/control"
echo "# (the previous release's default)" >>"$work/prev/pkg/etc/pulse-gateway/pulse.toml"
(cd "$work/prev/pkg" && find etc usr lib -type f ! -path 'etc/*' -print0 2>/dev/null | sort -z | xargs -0 md5sum >DEBIAN/md5sums)
dpkg-deb --root-owner-group -b "$work/prev/pkg" "$work/prev/pulse-gateway_${version}~prev_amd64.deb" >/dev/null
prev=$work/prev/pulse-gateway_${version}~prev_amd64.deb

mkdir -p "$root"
tar -xf "$base" -C "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/debs"
cp "$new" "$dev" "$prev" "$root/debs/"
# A command in the root (tools/in-root: its own /proc and /dev; a background one's PID is $!).
in_root_cmd=("$(dirname "${BASH_SOURCE[0]}")/../../tools/in-root" "$root" DEBIAN_FRONTEND=noninteractive)
in_root() { "${in_root_cmd[@]}" "$@"; }
apt_in_root() { in_root apt-get -q -y -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@"; }

step "apt-get install ./pulse-gateway (previous)"
apt_in_root update >/dev/null
apt_in_root install --no-install-recommends "/debs/$(basename "$prev")" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "install"; }
in_root getent passwd pulse-gateway >/dev/null || fail "the system user pulse-gateway was not created"
for f in /etc/pulse-gateway/pulse.toml /etc/pulse-gateway/nodes.toml; do
  grep -qx "$f" "$root/var/lib/dpkg/info/pulse-gateway.conffiles" || fail "$f is not a conffile"
done
[ -d "$root/etc/pulse-gateway/plugins.d" ] || fail "the drop-in directory /etc/pulse-gateway/plugins.d is missing"
unit=$(cd "$root" && ls lib/systemd/system/pulse-gateway.service usr/lib/systemd/system/pulse-gateway.service 2>/dev/null | head -n1)
[ -n "$unit" ] || fail "pulse-gateway.service is not installed"
[ -L "$root/etc/systemd/system/multi-user.target.wants/pulse-gateway.service" ] || fail "the unit is not enabled"
for page in pulse pulse-bench pulse-decoder pulse-device-check; do
  [ -f "$root/usr/share/man/man1/$page.1.gz" ] || fail "the manual page $page(1) is not installed"
done
if in_root sh -c 'command -v systemd-analyze' >/dev/null; then
  # The unit's Documentation=man:pulse(1) is looked up by running man(1), which a minimal root
  # may not have (its page is checked above).
  man_check=()
  in_root sh -c 'command -v man' >/dev/null || man_check=(--man=no)
  out=$(in_root systemd-analyze verify "${man_check[@]}" "/$unit" 2>&1) || { echo "$out"; fail "systemd-analyze verify"; }
  ! grep -q pulse-gateway <<<"$out" || { echo "$out"; fail "systemd-analyze verify reported problems"; }
  echo "systemd-analyze verify /$unit: ok"
fi

step "pulse plugins, as the service user"
as_user_cmd=(setpriv --reuid=pulse-gateway --regid=pulse-gateway --clear-groups --reset-env)
as_user() { in_root "${as_user_cmd[@]}" "$@"; }
out=$(as_user pulse plugins --config /etc/pulse-gateway/pulse.toml 2>&1) || { echo "$out"; fail "pulse plugins"; }
echo "$out"
for id in pulse.translation.qwen38 pulse.translation.llamacpp pulse.backend.decoder; do
  grep -q "^$id .* loaded" <<<"$out" || fail "plugin $id is not loaded"
done
! grep -Eq ' (skipped|failed|rejected)' <<<"$out" || fail "a plugin row is not loaded"

step "pulse serve, as the service user: /health and a turn of a model served in-process"
port=$(free_port)
install -d -m 0700 "$root/var/lib/pulse-gateway"
in_root chown pulse-gateway:pulse-gateway /var/lib/pulse-gateway
{ sed "s/^listen = .*/listen = \"127.0.0.1:$port\"/" "$root/etc/pulse-gateway/pulse.toml"; echo
  cat "$root/usr/share/pulse-gateway/examples/demo-model.toml"; } >"$root/tmp/serve.toml"
"${in_root_cmd[@]}" "${as_user_cmd[@]}" pulse serve --config /tmp/serve.toml >"$work/serve.log" 2>&1 &
serve_pid=$!  # pulse itself (a function run in the background would be a subshell)
serve_turn "$port" "$serve_pid"
[ -f "$root/var/lib/pulse-gateway/pulse-demo.gguf" ] || fail "the demo model was not written to the state directory"
echo "turn: HTTP 200, a response; the served model's file in /var/lib/pulse-gateway"
uid=$(in_root id -u pulse-gateway)
grep -Eq "^Uid:[[:space:]]+$uid[[:space:]]+$uid[[:space:]]" "/proc/$serve_pid/status" || fail "pulse serve does not run as pulse-gateway (uid $uid)"
kill "$serve_pid"
wait "$serve_pid" 2>/dev/null || true
! kill -0 "$serve_pid" 2>/dev/null || fail "pulse serve did not stop"
serve_pid=

step "upgrade to $version over an edited config"
echo '# edited by the site' >>"$root/etc/pulse-gateway/pulse.toml"
edited=$(sha1sum <"$root/etc/pulse-gateway/pulse.toml")
apt_in_root install --no-install-recommends "/debs/$(basename "$new")" "/debs/$(basename "$dev")" >"$work/upgrade.log" 2>&1 \
  || { cat "$work/upgrade.log"; fail "upgrade"; }
[ "$(in_root dpkg-query -W -f='${Version}' pulse-gateway)" = "$version" ] || fail "not upgraded to $version"
[ "$(sha1sum <"$root/etc/pulse-gateway/pulse.toml")" = "$edited" ] || fail "the upgrade overwrote the edited config"
[ -f "$root/etc/pulse-gateway/pulse.toml.dpkg-dist" ] || fail "the new default config is not beside it as pulse.toml.dpkg-dist"
echo "edited config kept; the new default is pulse.toml.dpkg-dist"
[ -f "$root/usr/include/pulse-gateway/pulse/plugin.h" ] && grep -q '^plugin_cflags=' "$root"/usr/lib/x86_64-linux-gnu/pkgconfig/pulse-sdk.pc \
  || fail "the SDK package lacks its header or pkg-config file"

step "remove: config and user kept"
apt_in_root remove pulse-gateway-dev pulse-gateway >"$work/remove.log" 2>&1 || { cat "$work/remove.log"; fail "remove"; }
[ ! -e "$root/usr/bin/pulse" ] || fail "/usr/bin/pulse is still there"
[ -f "$root/etc/pulse-gateway/pulse.toml" ] || fail "remove took the config"
in_root getent passwd pulse-gateway >/dev/null || fail "remove took the user"

step "purge: config, state and user gone"
apt_in_root purge pulse-gateway >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "purge"; }
[ ! -e "$root/etc/pulse-gateway" ] || { ls -la "$root/etc/pulse-gateway"; fail "purge left /etc/pulse-gateway"; }
[ ! -e "$root/var/lib/pulse-gateway" ] || fail "purge left /var/lib/pulse-gateway"
! in_root getent passwd pulse-gateway >/dev/null || fail "purge left the user"
echo "package install test: ok"
