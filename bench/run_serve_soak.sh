#!/usr/bin/env bash
# nfrun serve's soak and abuse test at a large scale on the GPU machine
# (test/lit/nfrun/Inputs/serve_soak.py; CI runs it small on the CPU):
#   1. the Nemotron-3-Nano-30B-A3B-shape plan (random weights, no tokenizer:
#      answers compared by token id) under many clients, long prompts fed
#      in chunks beside the decodes;
#   2. pydoc-moe on the GPU, its answers alone checked against nfrun
#      generate.
#
#   OUT=<dir> bash bench/run_serve_soak.sh CARRY [SECONDS] [CLIENTS]
#
# CARRY is made by bench/prepare_gpu_bench.sh (plans nano.nfb, pydoc-moe.nfb).
# Results: $OUT/soak-*.log and one line each in $OUT/soak-summary.txt.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CARRY="${1:-build-gpu-carry}"
case "$CARRY" in /*) ;; *) CARRY="$REPO/$CARRY" ;; esac
SECONDS_EACH="${2:-120}"
CLIENTS="${3:-64}"
OUT="${OUT:?set OUT to the results directory}"
mkdir -p "$OUT"
bash "$REPO/scripts/gpu_check.sh" unpack "$CARRY" || exit 1
export LD_LIBRARY_PATH="$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
soak="$REPO/test/lit/nfrun/Inputs/serve_soak.py"
summary="$OUT/soak-summary.txt"
: > "$summary"
status=0

run() { # name, then serve_soak.py arguments
  local name="$1"
  shift
  if python3 "$soak" "$@" > "$OUT/soak-$name.log" 2>&1; then
    echo "PASS $name: $(tail -1 "$OUT/soak-$name.log")" | tee -a "$summary"
  else
    echo "FAIL $name: $(tail -1 "$OUT/soak-$name.log")" | tee -a "$summary"
    status=1
  fi
}

run nano "$CARRY/bin/nfrun" "$CARRY/plans/nano.nfb" --seconds "$SECONDS_EACH" \
  --clients "$CLIENTS" --max-tokens 32 --long-prompt 6000 --grace 5 -- \
  --backend cuda --random-weights
run pydoc-moe "$CARRY/bin/nfrun" "$CARRY/plans/pydoc-moe.nfb" \
  --seconds "$((SECONDS_EACH / 2))" --clients "$CLIENTS" --max-tokens 32 \
  --long-prompt 2000 --reference generate -- --backend cuda \
  --weights "$REPO/examples/pydoc-moe"
exit $status
