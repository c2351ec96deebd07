#!/usr/bin/env bash
# CUPTI timelines of decode steps on the GPU machine: for each plan, the
# kernels of its last decode steps at one batch size, as CSV
# (bench/tools/cupti_trace.cpp) and as each kernel's increment of the step
# (bench/tools/timeline_increments.py).
# Usage (the device tool provides $OUT; CARRY as bench/prepare_gpu_bench.sh
# makes it, already unpacked by bench/ab_plans.sh or gpu_check.sh unpack):
#   OUT=/dir bash bench/trace_step.sh CARRY BATCH plan...
set -uo pipefail
carry=$(cd "$1" && pwd)
batch=$2
shift 2
cuda=${CUDA_HOME:-/usr/local/cuda}
bash scripts/gpu_check.sh unpack "$carry" || exit 1
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
so=/tmp/cupti_trace.so
g++ -O2 -shared -fPIC -I"$cuda/include" bench/tools/cupti_trace.cpp \
  -L"$cuda/lib64" -lcupti -o "$so" -DKERNEL_RECORD=CUpti_ActivityKernel10 ||
  exit 1
export LD_LIBRARY_PATH="$cuda/lib64:$cuda/extras/CUPTI/lib64:$LD_LIBRARY_PATH"
for plan in "$@"; do
  csv="$OUT/trace-$plan-b$batch.csv"
  CUDA_INJECTION64_PATH="$so" NF_TRACE_CSV="$csv" \
    "$carry/bin/nfrun" bench "$carry/plans/$plan.nfb" --backend cuda \
    --random-weights --seed 1 --batch "$batch" --context 1024 --prefill "" \
    --steps 8 > /dev/null 2>&1 || echo "trace of $plan failed"
  python3 bench/tools/timeline_increments.py "$csv" |
    tee "$OUT/timeline-$plan-b$batch.txt"
  xz -f "$csv"
done
