#!/usr/bin/env bash
# The manual pages as installed: every installed command has a page in man1, each page renders
# with no groff warning, pulse(1) describes every command `pulse --help` lists, and every path
# pulse(1) names under FILES is where this install puts it.
set -euo pipefail
build_root=$1
command -v groff >/dev/null || { echo "groff not installed (tools/dev test installs groff-base)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
meson install -C "$build_root" --no-rebuild --quiet --destdir "$work/stage" >/dev/null
stage=$work/stage
bindir=$(dirname "$(find "$stage" -path '*/bin/pulse' -type f | head -n1)")
mandir=$(find "$stage" -type d -path '*/man/man1' | head -n1)
[ -n "$mandir" ] || { echo "FAIL: no man1 directory installed"; exit 1; }
fail=0
for exe in "$bindir"/*; do
  name=$(basename "$exe")
  page=$mandir/$name.1
  if [ ! -f "$page" ]; then echo "FAIL: $name is installed without a manual page ($page)"; fail=1; continue; fi
  warnings=$(groff -man -ww -z -Tutf8 "$page" 2>&1 || true)
  if [ -n "$warnings" ]; then echo "FAIL: $name.1 does not render cleanly:"; echo "$warnings"; fail=1; fi
  grep -q '@[A-Z]*@' "$page" && { echo "FAIL: $name.1 has an unconfigured @WORD@"; fail=1; }
done
# The commands of `pulse --help` (the words at the start of its command lines), each a tagged
# paragraph of pulse(1)'s COMMANDS section.
rendered=$(MANWIDTH=200 groff -man -Tutf8 -rLL=200n -P-cbou "$mandir/pulse.1" 2>/dev/null)
commands=$(sed -n '/^Subcommands:/,/^$/p' <("$build_root/core/pulse" --help) | sed -n 's/^  \([a-z][a-z-]*\).*/\1/p')
[ "$(wc -l <<<"$commands")" -ge 10 ] || { echo "FAIL: read too few commands from pulse --help: $commands"; exit 1; }
section=$(sed -n '/^COMMANDS/,/^OPTIONS/p' <<<"$rendered")
for c in $commands; do
  grep -Eq "^ {7}([a-z, ]*, )?$c([ ,]|\$)" <<<"$section" || { echo "FAIL: pulse --help lists '$c', pulse(1) does not describe it"; fail=1; }
done
# FILES names this install's paths: each exists in the stage (plugins.d and the state directory
# aside: the first is created empty, the second by systemd's StateDirectory=).
files=$(sed -n '/^FILES/,/^EXIT STATUS/p' <<<"$rendered" | grep -oE '^ {7}/[^ ]+' | tr -d ' ')
[ "$(wc -l <<<"$files")" -ge 6 ] || { echo "FAIL: read too few paths from FILES: $files"; exit 1; }
for f in $files; do
  case $f in
    */pulse.env|/var/lib/*) continue ;;  # the site's optional file; made by systemd
  esac
  [ -e "$stage$f" ] || { echo "FAIL: pulse(1) names $f, which this install does not have"; fail=1; }
done
[ $fail -eq 0 ] || exit 1
echo "manual pages: $(ls "$mandir" | tr '\n' ' ')ok; pulse(1) describes $(wc -w <<<"$commands") commands and $(wc -l <<<"$files") paths"
