#!/usr/bin/env bash
# Builds nf and runs every test: GoogleTest unit tests and the lit suite;
# the runtime's tests again under the sanitizers; then every fuzz target for
# a bounded time (docs/reliability.md).
# NF_FUZZ_SECONDS: seconds per fuzz target (default 20; 0 replays the seed
# corpora only).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${NF_JOBS:-$(nproc)}
bash scripts/install-deps.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$jobs"

# The runtime's unit and integration tests (the MLIR-free build, on the
# plans the build above compiled) under ASan + UBSan + LeakSanitizer.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNF_BUILD_COMPILER=OFF -DNF_SANITIZE=ON \
  -DNF_INTEGRATION_PLAN_DIR="$PWD/build/test/integration/plans"
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$PWD/test/lsan.supp" \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"

# The fuzz targets (clang, libFuzzer, ASan + UBSan): each fuzzed for
# NF_FUZZ_SECONDS, then every seed corpus replayed as ctest tests.
NF_JOBS=$jobs bash scripts/fuzz.sh "${NF_FUZZ_SECONDS:-20}"
ctest --test-dir build-fuzz --output-on-failure -j "$jobs"
