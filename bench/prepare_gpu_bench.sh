#!/usr/bin/env bash
# Prepares, on the development machine (MLIR, NVRTC; no GPU needed), the
# directory that bench/run_gpu_bench.sh and scripts/gpu_check.sh run from on
# the GPU machine: the binaries and every plan they use, including the three
# plans of the Nemotron-3-Nano-30B-A3B shape (docs/performance.md): exact,
# bf16 inputs, and FP8 weights with bf16 inputs.
#
#   bash bench/prepare_gpu_bench.sh [CARRY]     (default: build-gpu-carry)
#
# Then carry CARRY to the GPU machine and run there, in one call:
#   OUT=<dir> bash scripts/gpu_check.sh run CARRY
#   OUT=<dir> bash bench/run_gpu_bench.sh CARRY
# The kernel cache ($NF_KERNEL_CACHE, docs/cuda.md) makes a second run after
# a kernel-template change recompile only the modules that use it.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CARRY="${1:-build-gpu-carry}"
case "$CARRY" in /*) ;; *) CARRY="$REPO/$CARRY" ;; esac
build="${NF_BUILD_DIR:-$REPO/build}"
nfc="$build/bin/nfc"
# The fixtures, pydoc-moe (exact and bf16 inputs) and the binaries
# (scripts/gpu_check.sh prepare).
bash "$REPO/scripts/gpu_check.sh" prepare "$CARRY"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$REPO/bench/make_nano_shape.py" "$work/nano" > /dev/null
"$nfc" import "$work/nano" -o "$work/nano.mlir"
for inputs in exact bf16; do
  name=nano
  opts=()
  if [ "$inputs" = bf16 ]; then
    name=nano-bf16
    opts=(--matmul-inputs=bf16)
  fi
  "$nfc" compile "$work/nano.mlir" --target=cuda "${opts[@]}" \
    --max-tokens 8192 --max-sequences 64 -o "$CARRY/plans/$name.nfb" \
    --print-kernel-cache-stats
done
# FP8 weights: every linear projection as FP8 codes with a scale per output
# channel (make_nano_shape.py --fp8), bf16 inputs.
python3 "$REPO/bench/make_nano_shape.py" "$work/nano-fp8" --fp8 > /dev/null
"$nfc" import "$work/nano-fp8" -o "$work/nano-fp8.mlir"
"$nfc" compile "$work/nano-fp8.mlir" --target=cuda --matmul-inputs=bf16 \
  --max-tokens 8192 --max-sequences 64 -o "$CARRY/plans/nano-fp8.nfb" \
  --print-kernel-cache-stats
bash "$REPO/scripts/gpu_check.sh" pack "$CARRY" # 92-105 MB -> ~1.4 each
du -sh "$CARRY"
