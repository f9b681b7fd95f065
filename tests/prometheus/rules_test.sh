#!/usr/bin/env bash
# The shipped alerting rules and dashboard: promtool checks the rules and runs their unit tests
# (pulse-rules-test.yml: each alert fires on its input series and stays quiet on its neighbours);
# then every metric that a rule or a dashboard panel names must be in the /metrics of a real
# gateway that has served a request (check_metric_names.py, which is shown to catch a wrong name).
# usage: rules_test.sh PULSE_EXE FAKE_VLLM PLUGIN_DIR SOURCE_ROOT
set -euo pipefail
pulse=$1 fake=$2 plugins=$3 src=$4
here=$(cd "$(dirname "$0")" && pwd)
promtool=${PULSE_PROMTOOL:-$(command -v promtool || true)}
if [ -z "$promtool" ] || [ ! -x "$promtool" ]; then
  echo "promtool not found (PULSE_PROMTOOL); run the suite with tools/dev test, which provides it"
  [ "${PULSE_REQUIRE_E2E:-0}" = 1 ] && exit 1
  exit 77
fi
# shellcheck source=../e2e/lib.sh
. "$src/tests/e2e/lib.sh"
enter_netns "$@"

"$promtool" check rules "$src/config/prometheus/pulse-rules.yml" || fail "promtool check rules"
(cd "$here" && "$promtool" test rules pulse-rules-test.yml) || fail "promtool test rules"

# A request that waits 1 s for its first token (keepalives every 0.3 s) brings every series the
# gateway only creates when it first has something to count.
cat > "$work/script.json" <<'JSON'
{"turns": [{"first_delay_ms": 1000, "content": "fine", "usage": {"prompt_tokens": 50, "completion_tokens": 1, "cached_tokens": 32}}]}
JSON
start_fake "$work/script.json"
start_pulse_config 0
printf '[models."qwen3.8-flash-next".policy]\nname = "static"\n[models."qwen3.8-flash-next".policy.options]\nbudgets = { low = 1024 }\n[upstream]\nkeepalive_s = 0.3\n' >> "$work/pulse.toml"
launch_pulse
body=$(curl -sS -m 20 "http://127.0.0.1:$gport/v1/responses" -H 'Content-Type: application/json' \
  -d '{"model":"qwen3.8-flash-next","input":"hi","stream":true}')
case "$body" in *response.completed*) ;; *) fail "the request did not complete: $body" ;; esac
curl -sS -m 10 "http://127.0.0.1:$gport/metrics" > "$work/metrics.txt"
"$promtool" check metrics < "$work/metrics.txt" || fail "promtool check metrics"
python3 "$here/check_metric_names.py" "$work/metrics.txt" "$src/config/prometheus/pulse-rules.yml" "$src/config/grafana/pulse-dashboard.json" \
  || fail "a rule or panel names a metric the gateway does not expose"
# The check itself must catch a wrong name.
echo '{"panels":[{"targets":[{"expr":"rate(pulse_requests_totl[5m])"}]}]}' > "$work/bad.json"
if python3 "$here/check_metric_names.py" "$work/metrics.txt" "$work/bad.json" > "$work/bad.out"; then
  fail "check_metric_names.py accepted pulse_requests_totl"
fi
grep -q "pulse_requests_totl is not in" "$work/bad.out" || fail "unexpected checker output: $(cat "$work/bad.out")"
echo "rules, rule tests, dashboard and metric names: ok"
