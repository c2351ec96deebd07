#!/usr/bin/env bash
# KV-cache storage modes on the Nemotron-3-Nano-30B-A3B shape, on the GPU
# machine, in one go:
#   1. the device-to-device copy bandwidth (the decode roofline);
#   2. for each plan CARRY/plans/nano-bf16-kv{f32,bf16,fp8,tiered}.nfb (bf16
#      GEMM inputs, `nfc compile --kv-cache-dtype=...`; tiered: fp8 with
#      --kv-hot-window=128): decode tok/s at contexts 8K and 32K, batch 1
#      and 32 (`nfrun bench --random-weights`);
#   3. for those plans and CARRY/plans/nano-{fp8,int4}-kvbf16.nfb (FP8 and
#      int4 weights), when present: the KV pages a load at
#      --gpu-memory-utilization 0.9 gets, and
#      from them and `nfrun inspect`'s per-sequence costs the 8K-context
#      sequences that fit (their recurrent state and KV pages; the compiled
#      slots' state counts as room, since --max-sequences sets them):
#        N = (tokens x KV a token + slots x state) / (state + 8192 x KV a token)
# Results: $OUT/kv_modes.md (the bench tables) and $OUT/kv_room.md.
# Usage: OUT=/dir bash bench/kv_modes.sh CARRY  (bench/prepare_kv_modes.sh
# makes CARRY)
set -uo pipefail
carry=$(cd "$1" && pwd)
bash scripts/gpu_check.sh unpack "$carry" || exit 1 # plans/*.nfb.xz
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
nfrun="$carry/bin/nfrun"
python3 bench/make_nano_shape.py /tmp/nano > /dev/null
python3 bench/hf_baseline.py /tmp/nano --ceilings-only --out "$OUT/ceilings.json"
copy=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ceilings']['copy_bytes_per_s'])" "$OUT/ceilings.json")
echo "ceilings: copy $copy B/s"

: > "$OUT/kv_modes.md"
{
  echo "| plan | GPU memory utilization | KV pages | tokens of context | slots | state a sequence (B) | KV a token (B) | 8K-context sequences that fit |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
} > "$OUT/kv_room.md"
room() { # plan-name bench-output
  local plan="$1" out="$2" line cost
  line=$(grep -m1 '^KV cache at gpu memory utilization' "$out") || return 0
  cost=$("$nfrun" inspect "$carry/plans/$plan.nfb" | grep -m1 'per sequence:')
  python3 - "$plan" "$line" "$cost" >> "$OUT/kv_room.md" <<'EOF'
import re, sys
plan, line, cost = sys.argv[1:]
u, pages, tokens, slots = re.search(
    r"utilization ([0-9.]+): (\d+) pages, (\d+) tokens of context in all, (\d+) sequence", line).groups()
state, kv = map(int, re.search(r"(\d+) B of recurrent state, (\d+) B of KV", cost).groups())
tokens, slots = int(tokens), int(slots)
n = (tokens * kv + slots * state) // (state + 8192 * kv)
print(f"| {plan} | {u} | {pages} | {tokens} | {slots} | {state} | {kv} | {n} |")
EOF
}

for kv in f32 bf16 fp8 tiered; do
  plan=nano-bf16-kv$kv
  [ -f "$carry/plans/$plan.nfb" ] || continue
  for ctx in 8192 32768; do
    echo "plan: $plan.nfb, context $ctx" | tee -a "$OUT/kv_modes.md"
    extra=()
    [ "$ctx" = 32768 ] && extra=(--gpu-memory-utilization 0.9)
    "$nfrun" bench "$carry/plans/$plan.nfb" --backend cuda --random-weights \
      --seed 1 --batch 1,32 --context "$ctx" --prefill "" --steps 16 \
      --copy-bandwidth "$copy" "${extra[@]}" > "$OUT/$plan-$ctx.txt" 2>&1
    cat "$OUT/$plan-$ctx.txt" >> "$OUT/kv_modes.md"
    [ "$ctx" = 32768 ] && room "$plan" "$OUT/$plan-$ctx.txt"
  done
done
for plan in nano-fp8-kvbf16 nano-int4-kvbf16; do
  [ -f "$carry/plans/$plan.nfb" ] || continue
  "$nfrun" bench "$carry/plans/$plan.nfb" --backend cuda \
    --random-weights --seed 1 --batch 1 --context 1024 --prefill "" \
    --steps 4 --gpu-memory-utilization 0.9 > "$OUT/$plan.txt" 2>&1
  room "$plan" "$OUT/$plan.txt"
done
cat "$OUT/kv_room.md"
