#!/usr/bin/env bash
# Builds the libFuzzer targets of test/fuzz (clang, ASan + UBSan) in
# ./build-fuzz and fuzzes each for SECONDS (default 60; 0: the seeds only),
# one after another:
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]     # e.g. 600 plan tokenizer
#
# Targets are the nf_add_fuzzer names (test/fuzz/CMakeLists.txt); none given:
# all. The repository's seeds (test/fuzz/corpus/<target>) are only read: new
# inputs go to build-fuzz/fuzz/<target>/corpus, which later runs continue
# from, and crashes to build-fuzz/fuzz/<target>/crash-*. NF_FUZZ_MERGE=1
# then adds the inputs that reach new coverage to the repository's seeds
# (libFuzzer -merge=1). Prints executions and crashes per target; exits 1
# if any target crashed. Environment: NF_FUZZ_BUILD_DIR (build-fuzz),
# NF_JOBS (build jobs), NF_FUZZ_ARGS (extra libFuzzer flags).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
build=${NF_FUZZ_BUILD_DIR:-build-fuzz}
jobs=${NF_JOBS:-$(nproc)}

if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DNF_BUILD_COMPILER=OFF -DNF_BUILD_TESTS=OFF -DNF_BUILD_FUZZERS=ON
fi
cmake --build "$build" -j "$jobs" --target nf-fuzzers

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$build"/bin/nf-fuzz-*; do
    targets+=("${f##*/nf-fuzz-}")
  done
fi

# Inputs libFuzzer kept as failures (crash-, leak-, timeout-, oom-*).
artifacts() {
  find "$1" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' \
    -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l
}

summary=()
failed=0
for t in "${targets[@]}"; do
  bin="$build/bin/nf-fuzz-$t"
  seeds="test/fuzz/corpus/$t"
  work="$build/fuzz/$t"
  if [ ! -x "$bin" ] || [ ! -d "$seeds" ]; then
    echo "fuzz.sh: unknown target '$t' (no $bin or $seeds)" >&2
    exit 2
  fi
  mkdir -p "$work/corpus"
  dict=()
  if [ -f "test/fuzz/$t.dict" ]; then
    dict=("-dict=test/fuzz/$t.dict")
  fi
  before=$(artifacts "$work")
  echo "fuzz.sh: $t for ${seconds}s"
  start=$(date +%s)
  # The first corpus directory receives new inputs: the work copy, never
  # the repository's seeds. -timeout: an input running 25 s is a hang.
  # 0 seconds: run the seeds only (libFuzzer reads -max_total_time=0 as
  # "no limit").
  limit=(-max_total_time="$seconds")
  if [ "$seconds" -eq 0 ]; then
    limit=(-runs=0)
  fi
  rc=0
  "$bin" "${limit[@]}" -timeout=25 -print_final_stats=1 \
    -artifact_prefix="$work/" "${dict[@]}" ${NF_FUZZ_ARGS:-} \
    "$work/corpus" "$seeds" >"$work/log" 2>&1 || rc=$?
  elapsed=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  crashes=$(($(artifacts "$work") - before))
  if [ "$rc" -ne 0 ]; then
    failed=1
    echo "fuzz.sh: $t FAILED (exit $rc); the end of $work/log:" >&2
    tail -40 "$work/log" >&2
  fi
  if [ "${NF_FUZZ_MERGE:-0}" = 1 ] && [ "$rc" -eq 0 ]; then
    "$bin" -merge=1 "$seeds" "$work/corpus" >>"$work/log" 2>&1
  fi
  summary+=("$(printf '%-18s %12s execs %6ss  exit %-3s  %s new failing input(s)' \
    "$t" "${execs:-?}" "$elapsed" "$rc" "$crashes")")
done

echo "fuzz.sh: summary ($(nproc) cores, $(uname -m))"
printf '  %s\n' "${summary[@]}"
exit "$failed"
