#!/usr/bin/env bash
# Configures and builds nf in ./build (Ninja, Release). Extra arguments go to
# the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${NF_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
