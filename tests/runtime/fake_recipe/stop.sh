#!/bin/bash
# Test double of the recipe's stop.sh: stops fake_vllm and frees the (fake) memory, unless
# FAKE_VARIANT=memory_never_freed or stop_fails.
set -u
cd "$(dirname "$0")"
. ./fake.conf
echo "stop $(date +%s.%N)" >> calls.log
[ "${FAKE_VARIANT:-ok}" = stop_fails ] && { echo "Error response from daemon: cannot stop container"; exit 1; }
if [ -f fake-vllm.pid ]; then
  pid=$(cat fake-vllm.pid)
  kill "$pid" 2>/dev/null
  # Gone, or a zombie nobody reaps (no init in some containers): stopped either way.
  for _ in $(seq 1 100); do
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)
    [ -z "$state" ] || [ "$state" = Z ] && break
    sleep 0.05
  done
  kill -9 "$pid" 2>/dev/null
  rm -f fake-vllm.pid fake-gpu-apps
  echo "vllm-fn-tp1 stopped"
else
  echo "no container vllm-fn-tp1"
fi
if [ -n "${FAKE_MEMINFO:-}" ] && [ "${FAKE_VARIANT:-ok}" != memory_never_freed ]; then
  printf 'MemTotal:       127600000 kB\nMemAvailable:   120000000 kB\n' > "$FAKE_MEMINFO"
fi
exit 0
