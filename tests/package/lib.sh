# What both package tests do with a `pulse serve` they started (sourced; needs $work and fail).

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# serve_turn PORT PID: waits (bounded, 60 s) for any answer on /health (503 while a model is
# degraded: the packaged config's vLLM endpoint is down here), checks that it lists the demo
# model, then asks it for eight tokens: HTTP 200 and a response, "completed" (an end token) or
# "incomplete" (the limit). $work/serve.log is the server's log.
serve_turn() {
  local port=$1 pid=$2
  for _ in $(seq 1 600); do
    [ "$(curl -s -o "$work/health.json" -w '%{http_code}' "http://127.0.0.1:$port/health")" != 000 ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; fail "pulse serve exited"; }
    sleep 0.1
  done
  grep -q '"id":"pulse-demo"' "$work/health.json" || { cat "$work/serve.log"; fail "/health does not list the model"; }
  local code
  code=$(curl -s -m 120 -o "$work/turn.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"model":"pulse-demo","input":"hello","stream":false,"store":false,"max_output_tokens":8}' "http://127.0.0.1:$port/v1/responses")
  [ "$code" = 200 ] && grep -Eq '"object":"response".*"status":"(completed|incomplete)"' "$work/turn.json" \
    || { cat "$work/turn.json" "$work/serve.log"; fail "the turn (HTTP $code)"; }
}
