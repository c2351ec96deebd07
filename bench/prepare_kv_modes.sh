#!/usr/bin/env bash
# Prepares, on the development machine (MLIR, NVRTC; no GPU needed), the
# directory that bench/kv_modes.sh runs from on the GPU machine: the
# binaries and the Nemotron-3-Nano-30B-A3B-shape plans of each KV storage
# mode (bf16 GEMM inputs): nano-bf16-kv{f32,bf16,fp8,tiered} (tiered: fp8
# with a 128-position bf16 hot window), nano-fp8-kvbf16 (FP8 weights) and
# nano-int4-kvbf16 (int4 weights in groups of 64, make_nano_shape.py --int4),
# which bench/ab_plans.sh also compares with nano-bf16-kvbf16.
#
#   bash bench/prepare_kv_modes.sh [CARRY]     (default: build-gpu-kv)
#
# Then carry CARRY (about 26 MB) to the GPU machine and run there:
#   OUT=<dir> bash bench/kv_modes.sh CARRY
# A cold kernel cache takes about 4 minutes of NVRTC for the first plan on
# the 2-core machine; the others reuse most of its modules.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CARRY="${1:-build-gpu-kv}"
case "$CARRY" in /*) ;; *) CARRY="$REPO/$CARRY" ;; esac
build="${NF_BUILD_DIR:-$REPO/build}"
nfc="$build/bin/nfc"
ninja -C "$build" -j"${NF_JOBS:-2}" nfc nfrun nf
rm -rf "$CARRY"
mkdir -p "$CARRY/bin" "$CARRY/lib" "$CARRY/plans"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(--target=cuda --matmul-inputs=bf16 --max-tokens 8192
  --max-sequences 64 --print-kernel-cache-stats)
python3 "$REPO/bench/make_nano_shape.py" "$work/nano" > /dev/null
"$nfc" import "$work/nano" -o "$work/nano.mlir"
for kv in bf16 fp8 f32; do
  "$nfc" compile "$work/nano.mlir" "${common[@]}" --kv-cache-dtype=$kv \
    -o "$CARRY/plans/nano-bf16-kv$kv.nfb"
done
"$nfc" compile "$work/nano.mlir" "${common[@]}" --kv-cache-dtype=fp8 \
  --kv-hot-window=128 -o "$CARRY/plans/nano-bf16-kvtiered.nfb"
python3 "$REPO/bench/make_nano_shape.py" "$work/nano-fp8" --fp8 > /dev/null
"$nfc" import "$work/nano-fp8" -o "$work/nano-fp8.mlir"
"$nfc" compile "$work/nano-fp8.mlir" "${common[@]}" \
  -o "$CARRY/plans/nano-fp8-kvbf16.nfb" # bf16 cache: --kv-cache-dtype=auto
python3 "$REPO/bench/make_nano_shape.py" "$work/nano-int4" --int4 > /dev/null
"$nfc" import "$work/nano-int4" -o "$work/nano-int4.mlir"
"$nfc" compile "$work/nano-int4.mlir" "${common[@]}" \
  -o "$CARRY/plans/nano-int4-kvbf16.nfb"
bash "$REPO/scripts/gpu_check.sh" runtime "$CARRY" # nfrun, libraries
bash "$REPO/scripts/gpu_check.sh" pack "$CARRY"
du -sh "$CARRY"
