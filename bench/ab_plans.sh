#!/usr/bin/env bash
# A/B of Nano-shape plans on the GPU machine, in one call: the ceilings,
# then each plan's decode steps (nfrun bench --random-weights), the plans in
# turn, ROUNDS times, so that drift between runs shows up in both.
# Usage (the device tool provides $OUT; CARRY as bench/prepare_gpu_bench.sh
# makes it, with the extra plans compiled into CARRY/plans; PREFILL, e.g.
# 1024,8192, adds prefill of prompts of those lengths):
#   OUT=/dir ROUNDS=2 bash bench/ab_plans.sh CARRY 1,8 nano-bf16 nano-bf16-skinny1
set -uo pipefail
carry=$(cd "$1" && pwd)
batches=$2
shift 2
mkdir -p "$OUT"
bash scripts/gpu_check.sh unpack "$carry" || exit 1 # plans/*.nfb.xz
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
python3 bench/make_nano_shape.py /tmp/nano > /dev/null
python3 bench/hf_baseline.py /tmp/nano --ceilings-only --out "$OUT/ceilings.json"
read -r copy matmul < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['ceilings']; print(c['copy_bytes_per_s'], c['bf16_matmul_flops'])" "$OUT/ceilings.json")
echo "copy $copy" | tee "$OUT/ab.md"
for round in $(seq "${ROUNDS:-2}"); do
  for plan in "$@"; do
    echo "== $plan (round $round)" | tee -a "$OUT/ab.md"
    "$carry/bin/nfrun" bench "$carry/plans/$plan.nfb" --backend cuda \
      --random-weights --seed 1 --batch "$batches" --context 1024 \
      --prefill "${PREFILL:-}" --steps 32 --copy-bandwidth "$copy" \
      --matmul-rate "$matmul" 2>&1 | tee -a "$OUT/ab.md"
  done
done
