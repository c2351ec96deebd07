#!/usr/bin/env bash
# Session 17: CUPTI timelines of the final bf16 plan (TMA wide linears) at batch 32 and 64.
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/c && tar xJf .gpucarry/carryC.tar.xz -C /tmp/c
C=/tmp/c/build-gpu-carry
export LD_LIBRARY_PATH=$C/lib
CUDA=/usr/local/cuda
g++ -O2 -shared -fPIC -I$CUDA/include bench/tools/cupti_trace.cpp -L$CUDA/lib64 -lcupti \
  -o /tmp/cupti_trace.so -DKERNEL_RECORD=CUpti_ActivityKernel10 2>> $OUT/trace.log
for b in 32 64; do
  CUDA_INJECTION64_PATH=/tmp/cupti_trace.so NF_TRACE_CSV=/tmp/trace_b$b.csv \
    $C/bin/nfrun bench $C/plans/nano-bf16.nfb --backend cuda --random-weights --seed 1 --batch $b \
    --context 1024 --prefill 1024 --steps 16 >> $OUT/trace.log 2>&1
done
python3 bench/tools/timeline_increments.py /tmp/trace_b32.csv /tmp/trace_b64.csv > $OUT/timeline_increments.txt 2>&1
