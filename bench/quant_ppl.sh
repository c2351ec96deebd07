#!/usr/bin/env bash
# Perplexity of a quantised checkpoint read in place (not copied: the
# models are too large for the repository), on the CPU backend, under the
# model card's protocol: `nfrun eval-ppl --windows 16` (stride 512, the first
# 16 windows of eval.txt, no BOS).
#
#   bench/quant_ppl.sh [MODEL_DIR] [BUILD_DIR] [NFC_COMPILE_OPTIONS...]
#
# MODEL_DIR defaults to ../shared/models/pydoc-moe-fp8-modelopt, whose
# README gives the float32 reference under the same protocol (W8A8 static
# 89.1446, weights only 88.9584, the bf16 original 88.2715). Options after
# BUILD_DIR go to nfc compile: compile-time quantisation of the bf16
# pydoc-moe, e.g. `bench/quant_ppl.sh ../shared/models/pydoc-moe build
# --weights=int4 --quantize=all`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-$here/../shared/models/pydoc-moe-fp8-modelopt}
build=${2:-$here/build}
shift $(($# < 2 ? $# : 2))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/bin/nfc" import "$model" -o "$work/m.mlir"
"$build/bin/nfc" compile "$work/m.mlir" -o "$work/m.nfb" "$@" 2>/dev/null
echo "model: $model${*:+ (nfc compile $*)}"
"$build/bin/nfrun" eval-ppl "$work/m.nfb" --text "$model/eval.txt" --windows 16 2>/dev/null
