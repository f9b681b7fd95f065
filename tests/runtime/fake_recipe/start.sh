#!/bin/bash
# Test double of the single-Spark recipe's start.sh: reads .env like the real one, writes
# vLLM-style log lines to fake-vllm.log, and starts fake_vllm on 127.0.0.1:$PORT in the
# background. fake.conf (written by the test) sets FAKE_VLLM (the binary), FAKE_VARIANT and
# FAKE_MEMINFO. Variants: ok, start_fails, never_ready, wrong_model, wrong_max_len,
# missing_proof, no_kv_line, memory_never_freed (see stop.sh).
set -u
cd "$(dirname "$0")"
set -a; . ./.env; set +a
. ./fake.conf
variant=${FAKE_VARIANT:-ok}
echo "start $(date +%s.%N)" >> calls.log
log=fake-vllm.log
: > "$log"
if [ "$variant" = start_fails ]; then
  echo "ValueError: No available memory for the cache blocks. Try increasing gpu_memory_utilization" | tee -a "$log"
  exit 1
fi
served=$SERVED_MODEL_NAME
len=${YARN_MAX_MODEL_LEN:-$MAX_MODEL_LEN}
[ "$variant" = wrong_model ] && served=some-other-model
[ "$variant" = wrong_max_len ] && len=131072
k=$MTP_NUM_SPECULATIVE_TOKENS
[ "$variant" = missing_proof ] && k=$((k + 1))
spec=None
[ "$k" -gt 0 ] && spec="SpeculativeConfig(method='mtp', model='/models/qwen38', num_spec_tokens=$k)"
{
  echo "INFO 11-29 10:00:01 [api_server.py:1805] vLLM API server version 0.26.0"
  echo "INFO 11-29 10:00:01 [utils.py:326] non-default args: {'model': '/models/qwen38', 'max_model_len': $len, 'max_num_seqs': $MAX_NUM_SEQS, 'served_model_name': ['$served']}"
  echo "INFO 11-29 10:00:09 [core.py:74] Initializing a V1 LLM engine (v0.26.0) with config: model='/models/qwen38', speculative_config=$spec, max_seq_len=$len, served_model_name=$served"
  echo "INFO 11-29 10:04:40 [gpu_worker.py:298] Available KV cache memory: 16.02 GiB"
  [ "$variant" = no_kv_line ] || echo "INFO 11-29 10:04:40 [kv_cache_utils.py:1087] GPU KV cache size: 1,048,576 tokens"
  echo "INFO 11-29 10:09:12 [api_server.py:1847] Starting vLLM API server 0 on http://0.0.0.0:$PORT"
  echo "INFO:     Application startup complete."
} >> "$log"
# Memory the server holds: MemAvailable drops while it runs.
[ -n "${FAKE_MEMINFO:-}" ] && printf 'MemTotal:       127600000 kB\nMemAvailable:    20971520 kB\n' > "$FAKE_MEMINFO"
[ "$variant" = never_ready ] && exit 0
setsid "$FAKE_VLLM" --script fake-script.json --port "$PORT" --served-name "$served" --max-model-len "$len" \
  --record fake-requests.jsonl >> "$log" 2>&1 < /dev/null &
echo $! > fake-vllm.pid
echo "$! , VLLM::EngineCore" > fake-gpu-apps
exit 0
