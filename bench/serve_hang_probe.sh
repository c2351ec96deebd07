#!/usr/bin/env bash
# Whether nfrun serve answers prompts of N token ids (GPU machine, a carry
# made by scripts/gpu_check.sh prepare): starts CARRY/bin/nfrun serve on
# CARRY/plans/PLAN.nfb with --random-weights, no prefix caching and
# --max-num-batched-tokens CHUNK, sends REQS (default 1) completions of N
# tokens (max_tokens 2) one at a time, and appends "LABEL: ok <s>" or
# "LABEL: FAIL/hang" to $OUT/summary.txt. On a hang it adds the GPU's
# utilisation, and with NF_CUDA_TRACE=1 among the ENV the last launches
# started (the kernel that did not finish is the last).
#
#   OUT=<dir> [REQS=n] bench/serve_hang_probe.sh CARRY PLAN N CHUNK TIMEOUT \
#     LABEL [ENV=VALUE ...]
set -uo pipefail
OUT="${OUT:?set OUT to the results directory}"
CARRY=$1 PLAN=$2 N=$3 CHUNK=$4 TMO=$5 LABEL=$6; shift 6
port=$((8100 + RANDOM % 500))
log="$OUT/$LABEL.log"
env "$@" LD_LIBRARY_PATH="$CARRY/lib" "$CARRY/bin/nfrun" serve "$CARRY/plans/$PLAN.nfb" \
  --random-weights --no-enable-prefix-caching --max-num-batched-tokens "$CHUNK" \
  --port $port > "$log" 2>&1 &
pid=$!
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  kill -0 $pid 2>/dev/null || break
  sleep 1
done
for req in $(seq "${REQS:-1}"); do
  body=$(python3 -c "import json, sys; n, s = int(sys.argv[1]), int(sys.argv[2])
print(json.dumps({'model': 'm', 'prompt': list(range(s, s + n)), 'max_tokens': 2}))" \
    "$N" $((100 * req)))
  t0=$(date +%s.%N)
  if curl -sf -m "$TMO" -H 'Content-Type: application/json' -d "$body" \
    "http://127.0.0.1:$port/v1/completions" > /dev/null; then
    echo "$LABEL: ok $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s" |
      tee -a "$OUT/summary.txt"
  else
    echo "$LABEL: FAIL/hang after $TMO s" | tee -a "$OUT/summary.txt"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader \
      >> "$OUT/summary.txt" 2>&1
    break
  fi
done
kill -9 $pid 2> /dev/null # a hung server cannot stop in its grace period
wait $pid 2> /dev/null
grep "^nf trace" "$log" | tail -5 >> "$OUT/summary.txt"
rm -f "$log"
sleep 2
