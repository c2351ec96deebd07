#!/usr/bin/env bash
# Builds nf and runs every test: GoogleTest unit tests and the lit suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "${NF_JOBS:-$(nproc)}"
