#!/usr/bin/env bash
# nfrun serve on the GPU machine, from a carry made by
# bench/prepare_gpu_bench.sh:
#   throughput  bench/serve_bench.py on pydoc-moe (concurrency 1, 8, 32),
#               for this carry's nfrun, then for each other build in
#               CARRY/ab/<name>/{bin,lib} (an A/B in one call);
#   join        bench/serve_load.py: 32 streams while 8K-token prompts join,
#               with chunked prefill (the default 2048 tokens a step) and
#               without (65536), on pydoc-moe and on the Nano-shape plan
#               (bf16 inputs when the carry has it, random weights);
#   prefix      bench/serve_load.py --mode prefix, with prefix caching and
#               without, on pydoc-moe and on the Nano-shape plan: multi-turn
#               chat (4 conversations of 8 turns, 1,024 new tokens a turn)
#               and a shared 2,048-token system prompt (64 requests at once).
#
#   OUT=<dir> bash bench/run_serve_bench.sh CARRY [throughput,join,prefix]
#
# PREFIX_PLANS (default "pydoc-moe nano"), PREFIX_SHARED=0 (no shared-
# prompt runs) and PREFIX_CACHING (default "--enable-prefix-caching
# --no-enable-prefix-caching") narrow the prefix part; PREFIX_TIMEOUT
# (default 150 s) bounds each run (the Nano shape's random weights take
# minutes to make).
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CARRY="${1:-build-gpu-carry}"
case "$CARRY" in /*) ;; *) CARRY="$REPO/$CARRY" ;; esac
PARTS="${2:-throughput,join}"
OUT="${OUT:?set OUT to the results directory}"
mkdir -p "$OUT"
bash "$REPO/scripts/gpu_check.sh" unpack "$CARRY" || exit 1
lib="$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
pydoc="$REPO/examples/pydoc-moe"

# A load run cut by its timeout leaves its server (and the GPU memory it
# holds) behind: end it before the next one starts.
reap() {
  pkill -TERM -f "$CARRY/bin/nfrun serve" 2>/dev/null || return 0
  for _ in $(seq 60); do
    pgrep -f "$CARRY/bin/nfrun serve" > /dev/null || return 0
    sleep 1
  done
  pkill -KILL -f "$CARRY/bin/nfrun serve"
  sleep 2
}

if [[ ",$PARTS," == *,throughput,* ]]; then
  for dir in "$CARRY" "$CARRY"/ab/*/; do
    dir="${dir%/}"
    name="this carry"
    [ "$dir" = "$CARRY" ] || name="${dir##*/}"
    echo "nfrun: $name" | tee -a "$OUT/serve-throughput.md"
    LD_LIBRARY_PATH="$dir/lib:$lib" timeout 120 python3 \
      "$REPO/bench/serve_bench.py" "$dir/bin/nfrun" \
      "$CARRY/plans/pydoc-moe.nfb" --weights "$pydoc" --backend cuda \
      >> "$OUT/serve-throughput.md" 2>&1
  done
fi

if [[ ",$PARTS," == *,join,* ]]; then
  export LD_LIBRARY_PATH="$lib"
  for tokens in 2048 65536; do
    timeout 100 python3 "$REPO/bench/serve_load.py" "$CARRY/bin/nfrun" \
      "$CARRY/plans/pydoc-moe.nfb" --streams 32 --joins 4 \
      --join-tokens 8000 --max-tokens 512 --label "pydoc-moe, $tokens" -- \
      --backend cuda --weights "$pydoc" --max-num-batched-tokens "$tokens" \
      >> "$OUT/serve-join.md" 2>&1
  done
  nano=nano-bf16
  [ -f "$CARRY/plans/$nano.nfb" ] || nano=nano
  for tokens in 2048 65536; do
    [ -f "$CARRY/plans/$nano.nfb" ] || continue
    timeout 200 python3 "$REPO/bench/serve_load.py" "$CARRY/bin/nfrun" \
      "$CARRY/plans/$nano.nfb" --streams 32 --joins 4 \
      --join-tokens 8000 --max-tokens 256 --label "$nano, $tokens" -- \
      --backend cuda --random-weights --max-num-batched-tokens "$tokens" \
      >> "$OUT/serve-join.md" 2>&1
  done
fi
if [[ ",$PARTS," == *,prefix,* ]]; then
  export LD_LIBRARY_PATH="$lib"
  nano=nano-bf16
  [ -f "$CARRY/plans/$nano.nfb" ] || nano=nano
  for plan in ${PREFIX_PLANS:-pydoc-moe nano}; do
    [ "$plan" = nano ] && plan="$nano"
    [ -f "$CARRY/plans/$plan.nfb" ] || continue
    weights=(--weights "$pydoc")
    [ "$plan" = pydoc-moe ] || weights=(--random-weights)
    for caching in ${PREFIX_CACHING:---enable-prefix-caching --no-enable-prefix-caching}; do
      # Multi-turn chat: 8 turns of 1,024 new tokens and a 64-token reply
      # each (the 8th turn has ~8K tokens of history).
      timeout "${PREFIX_TIMEOUT:-150}" python3 "$REPO/bench/serve_load.py" "$CARRY/bin/nfrun" \
        "$CARRY/plans/$plan.nfb" --mode prefix --streams 4 --turns 8 \
        --join-tokens 0 --suffix-tokens 1024 --max-tokens 64 \
        --label "$plan, $caching" -- --backend cuda "${weights[@]}" \
        "$caching" >> "$OUT/serve-prefix.md" 2>&1
      reap
      [ "${PREFIX_SHARED:-1}" = 0 ] && continue
      # A shared system prompt: 2,048 tokens, 64 requests at once.
      timeout "${PREFIX_TIMEOUT:-150}" python3 "$REPO/bench/serve_load.py" "$CARRY/bin/nfrun" \
        "$CARRY/plans/$plan.nfb" --mode prefix --streams 64 --turns 1 \
        --join-tokens 2048 --suffix-tokens 64 --max-tokens 32 \
        --label "$plan, $caching" -- --backend cuda "${weights[@]}" \
        --max-batch 64 "$caching" >> "$OUT/serve-prefix.md" 2>&1
      reap
    done
  done
fi
cat "$OUT"/serve-*.md
