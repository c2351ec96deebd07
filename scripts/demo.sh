#!/usr/bin/env bash
# The main job: install dependencies, build, import the bundled demo model
# (examples/pydoc-moe) and print it in the nf dialect.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
mkdir -p build/demo
build/bin/nfc import examples/pydoc-moe -o build/demo/pydoc-moe.mlir
echo "== build/demo/pydoc-moe.mlir (first lines) =="
grep -v 'nf.weight stacked' build/demo/pydoc-moe.mlir | head -n 40
echo "== $(grep -c '^ *%' build/demo/pydoc-moe.mlir) ops; full model in build/demo/pydoc-moe.mlir =="
