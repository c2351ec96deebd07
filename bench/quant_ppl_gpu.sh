#!/usr/bin/env bash
# Perplexity of quantised pydoc-moe plans on the CUDA backend and, in the
# same run, on the CPU backend, under the model card's protocol
# (`nfrun eval-ppl --windows 16`; bench/quant_ppl.sh is the CPU-only
# version). The ModelOpt README's figures: W8A8 static 89.1446, weights
# only 88.9584, bf16 original 88.2715.
#   OUT=<dir> bash bench/quant_ppl_gpu.sh CARRY   (bench/prepare_quant_ppl_gpu.sh)
# Results: $OUT/quant_ppl.md.
set -uo pipefail
carry=$(cd "$1" && pwd)
bash scripts/gpu_check.sh unpack "$carry" || exit 1
m="$carry/modelopt/model.safetensors"
[ -f "$m" ] || python3 -c "import lzma, shutil, sys
with lzma.open(sys.argv[1]) as f, open(sys.argv[2], 'wb') as o: shutil.copyfileobj(f, o)" "$m.xz" "$m" || exit 1
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
nfrun="$carry/bin/nfrun"
{
  echo "| plan | backend | perplexity (16 windows) |"
  echo "| --- | --- | ---: |"
} > "$OUT/quant_ppl.md"
run() { # plan weights-dir text backend
  local out
  out=$("$nfrun" eval-ppl "$carry/plans/$1.nfb" --weights "$2" --text "$3" \
    --windows 16 --backend "$4" 2>&1)
  echo "$out" > "$OUT/$1-$4.txt"
  echo "| $1 | $4 | $(echo "$out" | grep -io 'perplexity[^0-9]*[0-9.]*' | grep -o '[0-9.]*$' | tail -1) |" >> "$OUT/quant_ppl.md"
}
for backend in cuda cpu; do
  run modelopt "$carry/modelopt" "$carry/modelopt/eval.txt" "$backend"
  run pydoc-moe examples/pydoc-moe examples/pydoc-moe/eval.txt "$backend"
  run pydoc-moe-int4 examples/pydoc-moe examples/pydoc-moe/eval.txt "$backend"
done
cat "$OUT/quant_ppl.md"
