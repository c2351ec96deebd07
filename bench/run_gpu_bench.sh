#!/usr/bin/env bash
# The Nemotron-3-Nano-30B-A3B-shape benchmark on the GPU machine, in one go:
#   1. the ceilings (device-to-device copy bandwidth, bf16 matmul rate),
#   2. nfrun bench on the plan with seeded random weights (and the bf16
#      plan's decode with sampling, --sample: greedy, and temperature 1
#      alone, the OpenAI API's default),
#   3. Hugging Face transformers on the same shape (bench/hf_baseline.py).
# Usage (the device tool provides $OUT; CARRY holds bin/nfrun, lib/libnf.so*,
# plans/nano.nfb and optionally plans/nano-bf16.nfb and nano-fp8.nfb, prepared as
# docs/performance.md says):
#   OUT=/dir bash bench/run_gpu_bench.sh CARRY [hf batches]
set -uo pipefail
carry=$(cd "$1" && pwd)
hf_batches=${2:-1,8,32,64}
bash scripts/gpu_check.sh unpack "$carry" || exit 1 # plans/*.nfb.xz
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
python3 bench/make_nano_shape.py /tmp/nano > /dev/null
python3 bench/hf_baseline.py /tmp/nano --ceilings-only --out "$OUT/ceilings.json"
read -r copy matmul < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['ceilings']; print(c['copy_bytes_per_s'], c['bf16_matmul_flops'])" "$OUT/ceilings.json")
echo "ceilings: copy $copy B/s, bf16 matmul $matmul FLOP/s"
# The plan compiled with the default exact GEMM inputs, and (when present)
# the one compiled with --matmul-inputs=bf16 and the one with FP8 weights.
: > "$OUT/nf_bench.md"
for plan in nano nano-bf16 nano-fp8; do
  [ -f "$carry/plans/$plan.nfb" ] || continue
  echo "plan: $plan.nfb" | tee -a "$OUT/nf_bench.md"
  "$carry/bin/nfrun" bench "$carry/plans/$plan.nfb" --backend cuda --random-weights \
    --seed 1 --batch 1,8,32,64 --context 1024 --prefill 1024,8192 --steps 32 \
    --copy-bandwidth "$copy" --matmul-rate "$matmul" 2>&1 | tee -a "$OUT/nf_bench.md"
done
# Decode as generate and serve run it: each step samples its tokens (from
# the device's top lists: greedy by the logits, temperature 1 by its
# Gumbel-max keys) and feeds them back.
if [ -f "$carry/plans/nano-bf16.nfb" ]; then
  for sampling in "" "--temperature 1"; do
    echo "plan: nano-bf16.nfb, sampling (nfrun bench --sample $sampling)" | tee -a "$OUT/nf_bench.md"
    # shellcheck disable=SC2086
    "$carry/bin/nfrun" bench "$carry/plans/nano-bf16.nfb" --backend cuda --random-weights \
      --seed 1 --batch 1,8,32,64 --context 1024 --prefill "" --steps 32 --sample $sampling \
      --copy-bandwidth "$copy" 2>&1 | tee -a "$OUT/nf_bench.md"
  done
fi
PYTHONUNBUFFERED=1 python3 bench/hf_baseline.py /tmp/nano --batches "$hf_batches" \
  --out "$OUT/hf_baseline.json" 2>&1 | grep -v -i "warn\|falling back" | tee "$OUT/hf_baseline.log"
