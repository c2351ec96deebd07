#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, in one go (issue 5).
#
#   scripts/gpu_check.sh prepare [CARRY]   here: build, compile plans, copy
#   scripts/gpu_check.sh run [CARRY]       on the GPU machine; results in $OUT
#   scripts/gpu_check.sh pack|unpack [CARRY]  plans to / from .nfb.xz
#   scripts/gpu_check.sh runtime [CARRY]      nfrun and its libraries only
#
# CARRY (default: build-gpu-carry, under the repository root) holds what the
# GPU machine cannot make itself: it has nvcc 13, CMake, ninja and PyTorch
# but no MLIR (so no nfc) and no network.
#
# --- Preparing the carry directory (development machine, MLIR installed) ---
# `prepare` does exactly this:
#  1. Build the binaries (the existing build tree, its options unchanged):
#       ninja -C build nfc nfrun nf nf-cuda-tests nf_fake_cuda
#  2. Compile every plan the checks use for CUDA (sm_90 cubins + PTX):
#       nfc import test/data/fixtures/<m> -o <m>.mlir     (and examples/pydoc-moe)
#       nfc compile <m>.mlir -o CARRY/plans/<m>.nfb --target=cuda:sm_90
#     for m in tiny-hybrid tiny-hybrid-bf16 tiny-nano tiny-dense tiny-latent
#     pydoc-moe, plus two variants of tiny-hybrid:
#       tiny-hybrid-small  ... --target=cuda:sm_90 --max-tokens 16 --max-sequences 2
#       tiny-hybrid-topk   ... --target=cuda:sm_90 --expert-policy topk
#     and pydoc-moe with bf16 matmul inputs, its grids also sized for 4 SMs
#     (the kernel variants that only Nano-sized layers take on 132 SMs):
#       pydoc-moe-bf16     ... --target=cuda:sm_90 --matmul-inputs=bf16
#       pydoc-moe-bf16-sm4 ... the same with NF_CUDA_SM_COUNT=4
#     and tiny-nano and tiny-hybrid-bf16 with every linear weight quantised
#     to FP8 (a scale per output channel; codes beside the plan):
#       tiny-nano-fp8, tiny-hybrid-bf16-fp8 ... --weights=fp8 --quantize=all
#     and tiny-hybrid-bf16-fp8 with bf16 inputs, for sm_90 and for sm_80
#     (whose PTX the GPU then runs: the prefill GEMMs read widened copies):
#       tiny-hybrid-bf16-fp8-bf16in[-sm80] ... --matmul-inputs=bf16
#     and the checkpoints quantised by ModelOpt (static FP8 activations) and
#     llm-compressor (dynamic per-token FP8 activations; W4A16):
#       tiny-nano-fp8-modelopt, tiny-nano-fp8-dynamic, tiny-nano-w4a16
#     and tiny-nano and tiny-hybrid-bf16 with int4 weights (group scales):
#       tiny-nano-int4, tiny-hybrid-bf16-int4 ... --weights=int4 --quantize=all
#     and plans whose KV cache stores bf16 or fp8 (exact; for sm_75, whose
#     PTX runs the warp and tile attention forms; bf16 GEMM inputs):
#       tiny-hybrid-kv{bf16,fp8}[-sm75], pydoc-moe-kv{bf16,fp8},
#       tiny-hybrid-bf16-kvbf16-bf16in ... --kv-cache-dtype=bf16|fp8
#     and tiered caches (fp8, a bf16 hot window of 16 positions):
#       tiny-hybrid-kvtiered[-sm75], pydoc-moe-kvtiered
#     (NF_CUDA_TARGET overrides "cuda:sm_90".)
#  3. Copy build/bin/{nfrun,nf-cuda-tests}, build/lib/libnf.so*,
#     build/lib/libnf_fake_cuda.so, libgomp.so.1 and cpp-httplib (with its
#     brotli libraries) into CARRY/{bin,lib} (binaries stripped), and
#     write CARRY/MANIFEST (commit, date, nfc --version, plan sizes).
#  4. Compress the plans (`pack`: plans/<m>.nfb -> plans/<m>.nfb.xz): the
#     device tool carries at most 64 MiB, and the plans' cubins and PTX,
#     one module per kernel, repeat themselves (the fixtures' 95 MB -> 8,
#     a Nano-shape plan's 92-105 MB -> 1.4). `run` unpacks them first.
# The weights, references and eval text are tracked files of the repository
# and travel with the working tree. CARRY matches build-*/ in .gitignore, so
# name it in the device tool's `carry` argument: carry=["build-gpu-carry"].
#
# --- Running (GPU machine) ---
#   OUT=/some/dir scripts/gpu_check.sh run build-gpu-carry
# (the device tool provides $OUT). Checks, one PASS/FAIL line each in
# $OUT/summary.txt:
#   gtest      nf-cuda-tests with NF_CUDA_REQUIRE=1 (a missing GPU or plan
#              fails): driver loading, backend selection, smoke plans (real
#              device and fake driver), every fixture's prefill and greedy
#              logits within 1e-3 * max(1, max|ref|) of the HF references
#              with the same greedy tokens, batched == one at a time, CUDA ==
#              CPU on the same plan, graph == launches, chunked steps, expert
#              statistics and overrides
#   generate   nfrun generate --backend cuda per fixture against the
#              references (1e-3, same greedy tokens), through libnf.so
#   eval-ppl   nfrun eval-ppl --backend cuda on pydoc-moe: perplexity within
#              0.5% of the CPU's 74.149 (NF_PPL_REF overrides)
#   top-logits nfrun generate on pydoc-moe (bf16 inputs), greedy, top-k 40,
#              temperature 1 alone (lists of Gumbel-max keys) and top-p 0.95
#              (lists with the rows' totals): the same text with the
#              device's top lists as with the rows (NF_CUDA_TOP_LOGITS=0)
#   logprobs   nfrun serve's logprobs / echo / chat logprobs on tiny-hybrid
#              against its reference (1e-4), device top lists off and on
#   fallback   --backend auto without a driver: one "nf: CUDA unavailable"
#              line and CPU results; --backend cuda without one: exit 1
#   fp8        bench/kernels/fp8_check.cu built with nvcc: the kernels' FP8
#              decoders exact on all 256 codes (subnormals included)
#   kernels    (sm_90 only) bench/kernels/ws_gemm_check.cu built with nvcc
#              and -DNF_WS_SKEW_TEST: the warp-specialised wgmma GEMM against
#              an f64 reference, every launch finishing within 10 s while
#              the warps of a consumer warpgroup without rows run out of step
#   speed      (information) pydoc-moe generate tok/s, cuda and cpu
# Logs: $OUT/*.log, gtest XML $OUT/cuda-tests.xml; what a failing gtest case
# said (its first lines) also in $OUT/cuda-tests-failures.txt and the
# summary. Exit status 0 when every check passed.
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
MODE="${1:-}"
CARRY="${2:-build-gpu-carry}"
case "$CARRY" in /*) ;; *) CARRY="$REPO/$CARRY" ;; esac
FIXTURES=(tiny-hybrid tiny-hybrid-bf16 tiny-nano tiny-dense tiny-latent)
PPL_REF="${NF_PPL_REF:-74.149}"

model_dir() {
  if [ "$1" = pydoc-moe ]; then echo "$REPO/examples/pydoc-moe"
  else echo "$REPO/test/data/fixtures/$1"; fi
}

# ---------------------------------------------------------------------------
prepare() {
  local build="${NF_BUILD_DIR:-$REPO/build}"
  local target="${NF_CUDA_TARGET:-cuda:sm_90}"
  set -e
  ninja -C "$build" -j"${NF_JOBS:-2}" nfc nfrun nf nf-cuda-tests nf_fake_cuda
  rm -rf "$CARRY"
  mkdir -p "$CARRY/bin" "$CARRY/lib" "$CARRY/plans" "$CARRY/mlir"
  local nfc="$build/bin/nfc"
  compile() { # name model-dir [extra nfc compile options]
    local name="$1" dir="$2"
    shift 2
    echo "nfc: $name ($target $*)"
    "$nfc" import "$dir" -o "$CARRY/mlir/$name.mlir"
    "$nfc" compile "$CARRY/mlir/$name.mlir" -o "$CARRY/plans/$name.nfb" \
      --target="$target" "$@"
  }
  for m in "${FIXTURES[@]}" pydoc-moe; do
    compile "$m" "$(model_dir "$m")"
  done
  compile tiny-hybrid-small "$(model_dir tiny-hybrid)" --max-tokens 16 \
    --max-sequences 2
  compile tiny-hybrid-topk "$(model_dir tiny-hybrid)" --expert-policy topk
  compile pydoc-moe-bf16 "$(model_dir pydoc-moe)" --matmul-inputs=bf16
  NF_CUDA_SM_COUNT=4 compile pydoc-moe-bf16-sm4 "$(model_dir pydoc-moe)" \
    --matmul-inputs=bf16
  # Weights quantised at compile time (codes in plans/<m>-fp8.weights.safetensors).
  compile tiny-nano-fp8 "$(model_dir tiny-nano)" --weights=fp8 --quantize=all
  compile tiny-hybrid-bf16-fp8 "$(model_dir tiny-hybrid-bf16)" --weights=fp8 \
    --quantize=all
  # The same with bf16 inputs: the sm_90a prefill GEMMs widen the codes as
  # they load them; compiled for sm_80, the GPU runs the PTX, whose GEMMs
  # read the codes widened into scratch (CudaPlans.Fp8CodesWidenedOnLoad...).
  compile tiny-hybrid-bf16-fp8-bf16in "$(model_dir tiny-hybrid-bf16)" \
    --weights=fp8 --quantize=all --matmul-inputs=bf16
  local saved="$target"
  target=cuda:sm_80
  compile tiny-hybrid-bf16-fp8-bf16in-sm80 "$(model_dir tiny-hybrid-bf16)" \
    --weights=fp8 --quantize=all --matmul-inputs=bf16
  target="$saved"
  # KV caches of bf16 and fp8 (CudaKvStoragePlans): exact, exact for sm_75
  # (the PTX's warp and tile forms), head_dim 32; bf16 with bf16 inputs.
  local kv
  for kv in bf16 fp8; do
    compile tiny-hybrid-kv$kv "$(model_dir tiny-hybrid)" --kv-cache-dtype=$kv
    compile pydoc-moe-kv$kv "$(model_dir pydoc-moe)" --kv-cache-dtype=$kv
    target=cuda:sm_75
    compile tiny-hybrid-kv$kv-sm75 "$(model_dir tiny-hybrid)" \
      --kv-cache-dtype=$kv
    target="$saved"
  done
  compile tiny-hybrid-bf16-kvbf16-bf16in "$(model_dir tiny-hybrid-bf16)" \
    --kv-cache-dtype=bf16 --matmul-inputs=bf16
  # Tiered (fp8 with a bf16 hot window of 16 positions: the tests' prompts
  # and steps move pages out of it), exact, for sm_90 and sm_75.
  compile tiny-hybrid-kvtiered "$(model_dir tiny-hybrid)" \
    --kv-cache-dtype=fp8 --kv-hot-window=16
  compile pydoc-moe-kvtiered "$(model_dir pydoc-moe)" \
    --kv-cache-dtype=fp8 --kv-hot-window=16
  target=cuda:sm_75
  compile tiny-hybrid-kvtiered-sm75 "$(model_dir tiny-hybrid)" \
    --kv-cache-dtype=fp8 --kv-hot-window=16
  target="$saved"
  # Checkpoints quantised by ModelOpt and llm-compressor (FP8 activations).
  for m in tiny-nano-fp8-modelopt tiny-nano-fp8-dynamic tiny-nano-w4a16; do
    compile "$m" "$(model_dir "$m")"
  done
  # int4 codes with group scales (codes in plans/<m>-int4.weights.safetensors).
  compile tiny-nano-int4 "$(model_dir tiny-nano)" --weights=int4 --quantize=all
  compile tiny-hybrid-bf16-int4 "$(model_dir tiny-hybrid-bf16)" \
    --weights=int4 --quantize=all
  rm -rf "$CARRY/mlir"
  runtime
  cp "$build/bin/nf-cuda-tests" "$CARRY/bin/"
  cp "$build/lib/libnf_fake_cuda.so" "$CARRY/lib/"
  strip --strip-unneeded "$CARRY/bin/nf-cuda-tests"
  {
    echo "commit: $(git -C "$REPO" rev-parse HEAD 2>/dev/null)"
    echo "dirty: $(git -C "$REPO" status --porcelain 2>/dev/null | wc -l) files"
    echo "date: $(date -u +%FT%TZ)"
    echo "nfc: $("$nfc" --version 2>&1 | head -1)"
    echo "target: $target"
    (cd "$CARRY" && find . -type f -printf '%p %s\n' | sort)
  } > "$CARRY/MANIFEST"
  pack
  set +e
  du -sh "$CARRY"
  echo "carry directory ready: $CARRY (device tool: carry=[\"${CARRY#"$REPO"/}\"])"
}

# nfrun and the libraries it needs on the GPU machine into CARRY/{bin,lib}
# (prepare, and the bench/prepare_*.sh scripts: `gpu_check.sh runtime CARRY`).
runtime() {
  local build="${NF_BUILD_DIR:-$REPO/build}" lib
  mkdir -p "$CARRY/bin" "$CARRY/lib"
  cp "$build/bin/nfrun" "$CARRY/bin/"
  cp -a "$build"/lib/libnf.so* "$CARRY/lib/"
  # Without their symbol tables (1.5 MB less of the device tool's 64 MiB).
  strip --strip-unneeded "$CARRY/bin/nfrun" "$CARRY"/lib/libnf.so.*.*
  # Libraries a stock GPU image may lack: OpenMP, and cpp-httplib with its
  # brotli libraries (nfrun serve). libssl/libcrypto/libz stay the system's:
  # LD_LIBRARY_PATH also reaches python there.
  for lib in $(ldd "$build/bin/nfrun" |
    awk '/libgomp|libcpp-httplib|libbrotli|libprometheus/ {print $3}'); do
    cp -L "$lib" "$CARRY/lib/"
  done
}

# Plans to and from xz (the device tool's carry limit; see prepare).
pack() {
  local p
  for p in "$CARRY"/plans/*.nfb "$CARRY"/plans/*.safetensors; do
    [ -f "$p" ] && xz -T0 -6 -f "$p"
  done
  return 0
}
unpack() {
  local p
  for p in "$CARRY"/plans/*.nfb.xz "$CARRY"/plans/*.safetensors.xz; do
    [ -f "$p" ] || continue
    [ -f "${p%.xz}" ] && continue
    xz -dkc "$p" > "${p%.xz}" 2>/dev/null ||
      python3 -c "import lzma, shutil, sys
with lzma.open(sys.argv[1]) as f, open(sys.argv[2], 'wb') as o: shutil.copyfileobj(f, o)" "$p" "${p%.xz}" ||
      { echo "gpu_check: cannot unpack $p" >&2; return 1; }
  done
}

# ---------------------------------------------------------------------------
FAILED=0
SUMMARY=""

record() { # PASS|FAIL|INFO name detail
  local line
  line="$(printf '%-4s %-10s %s' "$1" "$2" "$3")"
  echo "$line" | tee -a "$SUMMARY"
  [ "$1" = FAIL ] && FAILED=1
  return 0
}

run() {
  OUT="${OUT:?set OUT to the results directory}"
  mkdir -p "$OUT"
  SUMMARY="$OUT/summary.txt"
  : > "$SUMMARY"
  local bin="$CARRY/bin" plans="$CARRY/plans"
  unpack || return 1
  export LD_LIBRARY_PATH="$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$PATH:/usr/local/cuda/bin"
  export NF_TEST_DATA_DIR="$REPO/test/data"
  export NF_EXAMPLES_DIR="$REPO/examples"
  export NF_CUDA_PLAN_DIR="$plans"
  export NF_FAKE_CUDA="$CARRY/lib/libnf_fake_cuda.so"
  unset NF_LIBCUDA

  { nvidia-smi; nvcc --version; cat "$CARRY/MANIFEST"; } > "$OUT/environment.txt" 2>&1
  record INFO gpu "$(nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null | head -1)"

  local missing=""
  for p in "${FIXTURES[@]}" pydoc-moe tiny-hybrid-small tiny-hybrid-topk; do
    [ -f "$plans/$p.nfb" ] || missing="$missing $p"
  done
  if [ -n "$missing" ]; then record FAIL plans "missing:$missing"
  else record PASS plans "all present in $plans"; fi

  # 1. The GoogleTest suite.
  NF_CUDA_REQUIRE=1 "$bin/nf-cuda-tests" \
    --gtest_output="xml:$OUT/cuda-tests.xml" > "$OUT/cuda-tests.log" 2>&1
  local rc=$?
  local tally
  tally="$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/cuda-tests.log" |
    grep -v ' \] [A-Za-z/_]*\.' | tr -s ' ' | tr '\n' ' ')"
  if [ $rc -eq 0 ]; then record PASS gtest "$tally"
  else
    record FAIL gtest "exit $rc: $tally"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/cuda-tests.log" |
      grep -v ' ms)$' | sed 's/, where GetParam.*//; s/^/           /' |
      tee -a "$SUMMARY"
    # What each failing test said (its first lines), in the summary: the
    # one file sure to come back from the device machine.
    awk '/^\[ RUN      \]/ { name = $4; n = 0; delete said; next }
         /^\[       OK \]/ { next }
         /^\[  FAILED  \]/ && name != "" {
           print "           " name ":"
           for (i = 1; i <= n; ++i) print "             " said[i]
           name = ""; next }
         name != "" && n < 8 { said[++n] = substr($0, 1, 300) }' \
      "$OUT/cuda-tests.log" > "$OUT/cuda-tests-failures.txt"
    head -n 120 "$OUT/cuda-tests-failures.txt" | tee -a "$SUMMARY"
  fi
  grep '^\[ cuda \]' "$OUT/cuda-tests.log" > "$OUT/cuda-tests-numbers.txt"

  # 2. nfrun generate against the references (libnf.so, --backend cuda).
  for m in "${FIXTURES[@]}" pydoc-moe; do
    python3 - "$bin/nfrun" "$plans/$m.nfb" "$(model_dir "$m")" \
      > "$OUT/generate-$m.log" 2>&1 <<'EOF'
import os, sys, tempfile
sys.path.insert(0, os.path.join(os.environ["NF_TEST_DATA_DIR"], "..", "lit",
                                "nfrun", "Inputs"))
from check_generate import generate, read_safetensors, max_rel_error
nfrun, plan, model = sys.argv[1:4]
ref = read_safetensors(os.path.join(model, "reference.safetensors"))
prompts = sorted({k.split(".")[0] for k in ref if k.endswith(".tokens")})
worst = 0.0
with tempfile.TemporaryDirectory() as tmp:
    for p in prompts:
        tokens = ref[p + ".tokens"][1]
        steps = len(ref[p + ".greedy_tokens"][1])
        dump = os.path.join(tmp, p + ".safetensors")
        ours, log = generate(nfrun, plan, tokens, steps, dump, "--backend",
                             "cuda", "--weights", model)
        sys.stderr.write(log)
        if "backend: cuda" not in log:
            sys.exit("%s: did not run on the CUDA backend" % p)
        if list(ours["tokens"][1]) != list(ref[p + ".greedy_tokens"][1]):
            sys.exit("%s: greedy tokens differ: %s vs %s" % (
                p, ours["tokens"][1], ref[p + ".greedy_tokens"][1]))
        for mine, theirs in (("prefill_logits", ".prefill_logits"),
                             ("step_logits", ".greedy_logits")):
            if p + theirs not in ref:  # pydoc-moe: greedy tokens only
                continue
            if ours[mine][0] != ref[p + theirs][0]:
                sys.exit("%s: %s shape %s vs %s" % (p, mine, ours[mine][0],
                                                    ref[p + theirs][0]))
            err = max_rel_error(ours[mine][1], ref[p + theirs][1])
            worst = max(worst, err)
            if err > 1e-3:
                sys.exit("%s: %s error %.3g exceeds 1e-3" % (p, mine, err))
print("ok: %d prompts, worst relative error %.2g" % (len(prompts), worst))
EOF
    rc=$?
    if [ $rc -eq 0 ]; then record PASS generate "$m: $(tail -1 "$OUT/generate-$m.log")"
    else record FAIL generate "$m: $(tail -1 "$OUT/generate-$m.log")"; fi
  done

  # 3. Perplexity of pydoc-moe on the GPU.
  local moe="$REPO/examples/pydoc-moe"
  "$bin/nfrun" eval-ppl "$plans/pydoc-moe.nfb" --weights "$moe" \
    --text "$moe/eval.txt" --backend cuda > "$OUT/eval-ppl-cuda.txt" \
    2> "$OUT/eval-ppl-cuda.log"
  rc=$?
  local ppl
  ppl="$(sed -n 's/^perplexity: //p' "$OUT/eval-ppl-cuda.txt")"
  if [ $rc -ne 0 ] || [ -z "$ppl" ]; then
    record FAIL eval-ppl "exit $rc: $(tail -1 "$OUT/eval-ppl-cuda.log")"
  elif grep -q '^backend: cuda' "$OUT/eval-ppl-cuda.txt" &&
    python3 -c "import sys; p, r = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(p / r - 1) >= 0.005)" "$ppl" "$PPL_REF"; then
    record PASS eval-ppl "perplexity $ppl (CPU $PPL_REF, within 0.5%); $(grep -E '^(time|routed)' "$OUT/eval-ppl-cuda.txt" | tr '\n' ';')"
  else
    record FAIL eval-ppl "perplexity $ppl vs CPU $PPL_REF (0.5% allowed)"
  fi

  # 3b. Device top logits: generate draws the same tokens whether the rows'
  # largest logits (greedy and top-k samplers) or a temperature sampler's
  # noisy keys are ranked on the device, or the rows are copied back
  # (NF_CUDA_TOP_LOGITS=0).
  local topOk=1 topDetail=""
  for sampling in "--temperature 0" "--temperature 0.8 --top-k 40 --seed 5" \
    "--temperature 1 --seed 7" "--temperature 0.6 --top-p 0.95 --seed 9"; do
    for env in 1 0; do
      # shellcheck disable=SC2086
      NF_CUDA_TOP_LOGITS=$env "$bin/nfrun" generate "$plans/pydoc-moe-bf16.nfb" \
        --backend cuda --weights "$moe" --prompt "def parse_args(argv):" \
        --max-tokens 96 --ignore-eos $sampling > "$OUT/top-logits-$env.txt" \
        2> "$OUT/top-logits-$env.log" || topOk=0
    done
    if ! cmp -s "$OUT/top-logits-1.txt" "$OUT/top-logits-0.txt" ||
      [ ! -s "$OUT/top-logits-1.txt" ]; then
      topOk=0
    fi
    topDetail+="$sampling: $(grep -o 'decode [0-9.]* tok/s' "$OUT/top-logits-1.log") (rows: $(grep -o 'decode [0-9.]* tok/s' "$OUT/top-logits-0.log")); "
  done
  if [ $topOk -eq 1 ]; then record PASS top-logits "same text; $topDetail"
  else record FAIL top-logits "texts differ or generate failed; $topDetail"; fi

  # 3c. Logprobs on the device: nfrun serve's logprobs and echo against the
  # tiny-hybrid fixture's reference (check_serve_logprobs.py; without the
  # openai client, which the GPU machine lacks), with the rows copied back
  # and with top lists ranked on the device (NF_CUDA_TOP_LOGITS=1: the
  # logprobs then come from the row fetched after the draw).
  local lpOk=1 lpDetail=""
  for env in 0 1; do
    NF_NO_OPENAI=1 NF_CUDA_TOP_LOGITS=$env python3 \
      "$REPO/test/lit/nfrun/Inputs/check_serve_logprobs.py" "$bin/nfrun" \
      "$plans/tiny-hybrid.nfb" "$(model_dir tiny-hybrid)/reference.safetensors" \
      "$plans/pydoc-moe.nfb" "$REPO/test/data/chat_templates/chatml.jinja" \
      --weights "$(model_dir tiny-hybrid)" --chat-weights "$moe" \
      -- --backend cuda > "$OUT/logprobs-$env.log" 2>&1 || lpOk=0
    lpDetail+="NF_CUDA_TOP_LOGITS=$env: $(tail -1 "$OUT/logprobs-$env.log"); "
  done
  if [ $lpOk -eq 1 ]; then record PASS logprobs "$lpDetail"
  else record FAIL logprobs "$lpDetail"; fi

  # 4. Fallback without a driver.
  local toks=1,2,3,4,5
  NF_LIBCUDA=/nonexistent/libcuda.so.1 "$bin/nfrun" generate \
    "$plans/tiny-dense.nfb" --weights "$(model_dir tiny-dense)" \
    --prompt-tokens $toks --max-tokens 4 > "$OUT/fallback-auto.txt" \
    2> "$OUT/fallback-auto.log"
  rc=$?
  "$bin/nfrun" generate "$plans/tiny-dense.nfb" --backend cuda \
    --weights "$(model_dir tiny-dense)" --prompt-tokens $toks --max-tokens 4 \
    > "$OUT/fallback-cuda-ref.txt" 2>> "$OUT/fallback-auto.log"
  NF_LIBCUDA=/nonexistent/libcuda.so.1 "$bin/nfrun" generate \
    "$plans/tiny-dense.nfb" --backend cuda --weights "$(model_dir tiny-dense)" \
    --prompt-tokens $toks --max-tokens 4 >> "$OUT/fallback-auto.log" 2>&1
  local forced=$?
  if [ $rc -eq 0 ] && [ $forced -eq 1 ] &&
    [ "$(grep -c '^nf: CUDA unavailable (' "$OUT/fallback-auto.log")" = 1 ] &&
    grep -q '^backend: cpu' "$OUT/fallback-auto.log" &&
    cmp -s "$OUT/fallback-auto.txt" "$OUT/fallback-cuda-ref.txt"; then
    record PASS fallback "$(grep '^nf: CUDA unavailable' "$OUT/fallback-auto.log")"
  else
    record FAIL fallback "auto exit $rc, forced exit $forced; see fallback-auto.log"
  fi

  # 5. Kernel checks built here with nvcc (sm_90a): the warp-specialised
  # GEMM with the warps of an idle consumer warpgroup out of step.
  local cap
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)"
  if [ "$cap" != "9.0" ]; then
    record INFO kernels "skipped: compute capability ${cap:-unknown}, not 9.0"
  elif ! nvcc -O3 -std=c++17 -arch=sm_90a -I "$REPO/kernels" -DNF_WS_SKEW_TEST \
    "$REPO/bench/kernels/ws_gemm_check.cu" -o "$OUT/ws_gemm_check" \
    > "$OUT/kernels.log" 2>&1; then
    record FAIL kernels "ws_gemm_check does not build; see kernels.log"
  elif timeout 300 "$OUT/ws_gemm_check" >> "$OUT/kernels.log" 2>&1; then
    record PASS kernels "ws_gemm_check (skewed warps): $(grep -c ' ok$' "$OUT/kernels.log") shapes"
  else
    record FAIL kernels "ws_gemm_check: $(grep -v ' ok$' "$OUT/kernels.log" | tail -1)"
  fi
  rm -f "$OUT/ws_gemm_check"

  # 5b. The FP8 decoders, every code.
  if ! nvcc -O3 -std=c++17 -arch=native -I "$REPO/kernels" \
    "$REPO/bench/kernels/fp8_check.cu" -o "$OUT/fp8_check" \
    > "$OUT/fp8.log" 2>&1; then
    record FAIL fp8 "fp8_check does not build; see fp8.log"
  elif timeout 60 "$OUT/fp8_check" >> "$OUT/fp8.log" 2>&1; then
    record PASS fp8 "$(tail -1 "$OUT/fp8.log")"
  else
    record FAIL fp8 "$(tail -1 "$OUT/fp8.log")"
  fi
  rm -f "$OUT/fp8_check"

  # 6. Speed (information only).
  local prompt
  prompt="$(python3 -c "print(','.join(str(i % 200 + 3) for i in range(256)))")"
  for b in cuda cpu; do
    "$bin/nfrun" generate "$plans/pydoc-moe.nfb" --backend $b \
      --weights "$moe" --prompt-tokens "$prompt" --max-tokens 128 \
      --ignore-eos > /dev/null 2> "$OUT/speed-$b.log"
    record INFO speed "$b: $(grep '^prompt' "$OUT/speed-$b.log")"
  done

  echo
  if [ $FAILED -eq 0 ]; then echo "gpu_check: all checks passed" | tee -a "$SUMMARY"
  else echo "gpu_check: FAILED (see $SUMMARY)" | tee -a "$SUMMARY"; fi
  return $FAILED
}

case "$MODE" in
prepare) prepare ;;
run) run ;;
pack) pack ;;
unpack) unpack ;;
runtime) runtime ;;
*)
  sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
