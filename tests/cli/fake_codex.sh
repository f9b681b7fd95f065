#!/bin/sh
# A stand-in for the Codex CLI: records its arguments (one per line), the API-key variable and
# the catalog file it was pointed at, next to $FAKE_CODEX_OUT. Exits with $FAKE_CODEX_EXIT.
out="$FAKE_CODEX_OUT"
: > "$out"
for a in "$@"; do printf '%s\n' "$a" >> "$out"; done
printf 'PULSE_GATEWAY_API_KEY=%s\n' "${PULSE_GATEWAY_API_KEY:-}" > "$out.env"
for a in "$@"; do
  case "$a" in
    model_catalog_json=*) f=${a#model_catalog_json=}; f=${f#\"}; f=${f%\"}; cp "$f" "$out.catalog" ;;
  esac
done
exit "${FAKE_CODEX_EXIT:-0}"
