#!/usr/bin/env bash
# The main job: install dependencies, build, import the bundled demo model
# (examples/pydoc-moe), compile it into an execution plan and generate text
# from a few prompts with nfrun.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
mkdir -p build/demo

echo "== nfc import examples/pydoc-moe -> build/demo/pydoc-moe.mlir =="
build/bin/nfc import examples/pydoc-moe -o build/demo/pydoc-moe.mlir
awk '!/nf.weight stacked/ && n++ < 20' build/demo/pydoc-moe.mlir
echo "== $(grep -c '^ *%' build/demo/pydoc-moe.mlir) ops; full model in build/demo/pydoc-moe.mlir =="

echo "== nfc compile build/demo/pydoc-moe.mlir -> build/demo/pydoc-moe.nfb =="
build/bin/nfc compile build/demo/pydoc-moe.mlir -o build/demo/pydoc-moe.nfb

echo "== nfrun inspect build/demo/pydoc-moe.nfb =="
build/bin/nfrun inspect build/demo/pydoc-moe.nfb

# Greedy continuations (the prompt, then the generated text); the tok/s
# line goes to stderr.
prompts=(
  "The Python tutorial"
  "A list comprehension"
  $'def main():\n    '
)
for prompt in "${prompts[@]}"; do
  echo "== nfrun generate --prompt $(printf '%q' "$prompt") --max-tokens 48 =="
  printf '%s' "$prompt"
  build/bin/nfrun generate build/demo/pydoc-moe.nfb --weights examples/pydoc-moe \
    --prompt "$prompt" --max-tokens 48
done

echo "== sampled: --temperature 0.8 --top-p 0.95 --seed 7 =="
printf '%s' "To install a package,"
build/bin/nfrun generate build/demo/pydoc-moe.nfb --weights examples/pydoc-moe \
  --prompt "To install a package," --max-tokens 48 \
  --temperature 0.8 --top-p 0.95 --seed 7
