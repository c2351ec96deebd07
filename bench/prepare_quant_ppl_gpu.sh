#!/usr/bin/env bash
# Prepares, on the development machine, the directory that
# bench/quant_ppl_gpu.sh runs from on the GPU machine: nfrun and its
# libraries, a copy of ../shared/models/pydoc-moe-fp8-modelopt (12 MB: the
# model is not in the repository, and the GPU machine has no ../shared) and
# CUDA plans (sm_90) of
#   modelopt        the ModelOpt FP8 checkpoint (W8A8 static);
#   pydoc-moe       the bf16 original (examples/pydoc-moe), exact;
#   pydoc-moe-int4  the original with every projection int4 at compile time
#                   (groups of 128; codes in pydoc-moe-int4.weights.safetensors).
#
#   bash bench/prepare_quant_ppl_gpu.sh [CARRY] [MODEL_DIR]
#     (defaults: build-gpu-ppl, ../shared/models/pydoc-moe-fp8-modelopt)
# then, in one device call (carry=["CARRY"]):
#   OUT=<dir> bash bench/quant_ppl_gpu.sh CARRY
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CARRY="${1:-build-gpu-ppl}"
case "$CARRY" in /*) ;; *) CARRY="$REPO/$CARRY" ;; esac
model="${2:-$REPO/../shared/models/pydoc-moe-fp8-modelopt}"
build="${NF_BUILD_DIR:-$REPO/build}"
nfc="$build/bin/nfc"
ninja -C "$build" -j"${NF_JOBS:-2}" nfc nfrun nf
rm -rf "$CARRY"
mkdir -p "$CARRY/bin" "$CARRY/lib" "$CARRY/plans" "$CARRY/modelopt"
cp "$model"/*.json "$model/model.safetensors" "$model/eval.txt" \
  "$model/README.md" "$CARRY/modelopt/"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
compile() { # name checkpoint [nfc compile options]
  local name="$1" dir="$2"
  shift 2
  "$nfc" import "$dir" -o "$work/$name.mlir"
  "$nfc" compile "$work/$name.mlir" -o "$CARRY/plans/$name.nfb" \
    --target=cuda:sm_90 "$@"
}
compile modelopt "$CARRY/modelopt"
compile pydoc-moe "$REPO/examples/pydoc-moe"
compile pydoc-moe-int4 "$REPO/examples/pydoc-moe" --weights=int4 --quantize=all
bash "$REPO/scripts/gpu_check.sh" runtime "$CARRY" # nfrun, libraries
bash "$REPO/scripts/gpu_check.sh" pack "$CARRY"
xz -T0 -6 -f "$CARRY/modelopt/model.safetensors" # 12.4 -> 9.7 MB
du -sh "$CARRY"
