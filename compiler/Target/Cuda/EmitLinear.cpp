//===- EmitLinear.cpp - linear layers -> CUDA -----------------------------===//
//
// KernelEmitter's linear layers: nf.linear, nf.lm_head and
// nf_moe.latent_proj with the ops their epilogues absorb (split, K/V
// append, decode conv, activation), and emitLinear, which picks the GEMM or
// GEMV strategy (bf16-plane tiles, wgmma, skinny, row, feature-tile and TMA
// variants) for every linear spec, the MoE experts' included. Separate
// because the strategy choice is the largest single part of the generator.
//
//===----------------------------------------------------------------------===//

#include "Target/Cuda/KernelEmitter.h"

namespace nf::codegen::detail {

namespace {

/// The TMA wide variants of dense decode linears (emitTmaLinear): 32
/// features an item, 256-deep K stages, 8 consumer warps; items of 32 rows
/// (steps of up to 32 tokens) in 6 stages, of 64 rows in 3. Their dynamic
/// shared memory (nf::tma_linear_smem), the larger of the two.
struct TmaLinearConfig {
  int64_t rows, stages, warps;
};
constexpr int64_t kTmaMt = 2, kTmaBk = 256;
constexpr TmaLinearConfig kTmaRows32{32, 6, 8}, kTmaRows64{64, 3, 8};
constexpr int64_t tmaLinearSmem(const TmaLinearConfig &c) {
  return 1024 + c.stages * (16 * kTmaMt + c.rows) * kTmaBk * 2 +
         c.warps * kTmaMt * (c.rows / 8) * 128 * 4 + 16 * c.stages;
}
constexpr int64_t kTmaSmem =
    std::max(tmaLinearSmem(kTmaRows32), tmaLinearSmem(kTmaRows64));

} // namespace

void KernelEmitter::emitLinear(const std::string &fn, const LinearSpec &s,
                               const std::string &comment) {
  includes.insert("nf_linear.cuh");
  const std::string spec = fn + "_spec";
  const std::string rowOffset =
      "static_cast<long long>(" + s.rowIndex + ") * " + num(s.K);
  // The bf16-plane path (prefill with bf16 weights): the input rows are
  // split into bf16 planes first (one launch), so the GEMM streams both
  // operands with cp.async (pipelined_mma_tile); input rows stored as bf16
  // by their producer (s.input16) are streamed as they are.
  if (s.path.empty())
    internalError = fn + ": the op has no nf.gemm_paths (nf-cuda-gemm-paths)";
  const bool planes = s.path == kBf16Planes;
  // Quantised codes: the f32 paths, the skinny items (which widen them as
  // they load them) and the plane path (after a launch that widens them),
  // not the wide variants that stream bf16 weights (nf-cuda-gemm-paths,
  // nf-cuda-gemm-variants).
  const bool quantised = !s.rowScales.empty();
  if (quantised && (s.wideVariant == "tma" || s.wideVariant == "feature_tiles"))
    internalError = fn + ": quantised weights on the \"" + s.wideVariant +
                    "\" wide variant";
  const bool stored16 = !s.input16.empty();
  if (stored16 && !planes) // nf-cuda-row-formats promised a plane-path reader
    internalError = fn + " reads bf16 rows but is not a bf16-plane GEMM";
  // Quantised activations: a first launch writes the input rows quantised
  // to FP8 and back to f32 (as the CPU backend does) into scratch, and
  // every path reads those rows instead.
  const bool quantIn = !s.inputQuant.empty();
  if (quantIn && (stored16 || !s.owner))
    internalError = fn + ": FP8 input rows need f32 input rows and an op "
                         "to take scratch from (nf-cuda-row-formats)";
  const int64_t inputRows = maxTokens * s.rowsPerToken;
  const int64_t quantOff =
      quantIn && s.owner ? scratchOf(*s.owner, inputRows * s.K * 4) : 0;
  const std::string input =
      quantIn ? "nf::arena<float>(a, " + num(quantOff) + "ll)" : s.input;
  const int64_t terms = opts.matmulTerms;
  const int64_t planeElems = maxTokens * s.rowsPerToken * s.K;
  const bool splitLaunch = planes && !stored16;
  if (splitLaunch && !s.owner)
    internalError = fn + ": plane GEMM without an op to take scratch from";
  const int64_t planeOff =
      splitLaunch && s.owner ? scratchOf(*s.owner, terms * planeElems * 2) : 0;
  const std::string planePtr =
      stored16 ? s.input16
               : "nf::arena<unsigned short>(a, " + num(planeOff) + "ll)";
  // The plane GEMM of FP8 codes reads them widened to bf16 (exact) by a
  // launch before it, every expert's of a stacked weight, into scratch.
  const bool widen = planes && quantised;
  const int64_t codeCount = s.G * s.N * s.K;
  const int64_t widenOff =
      widen && s.owner ? scratchOf(*s.owner, codeCount * 2) : 0;
  const std::string widened = "nf::arena<nf::bf16>(a, " + num(widenOff) + "ll)";
  // Where the GEMM is the warp-specialised one (nf-cuda-launch-tiles; its
  // conditions are checked below), its sm_90a cubin widens the codes as it
  // loads them, and the widening launch runs only in the PTX for other
  // targets.
  const int64_t wsTile = s.wsTile;
  const bool ws = wsTile > 0;
  const std::string weightType = widen ? "nf::bf16" : s.wtype;
  const std::string weight =
      !widen ? s.weight
      : s.G == 1
          ? widened
          : widened + " + static_cast<long long>(g) * " + num(s.N * s.K) + "ll";
  text << "struct " << spec << " : " << s.groups << " {\n"
       << "  using W = " << weightType << ";\n"
       << "  static constexpr int N = " << s.N << ", K = " << s.K << ";\n"
       << "  __device__ static __forceinline__ const W *weight("
          "nf::Step a, int g) {\n"
       << "    (void)g;\n    return " << weight << ";\n  }\n";
  // The warp-specialised wgmma GEMM (sm_90a) widens the codes as it loads
  // them; the other kernels (the PTX for other targets) read the widened
  // copy.
  if (widen && ws)
    text << "  static constexpr bool kCodesOnLoad = true;\n"
         << "  __device__ static __forceinline__ const nf::fp8e4m3 *codes("
            "nf::Step a, int g) {\n"
         << "    (void)g;\n    return " << s.codes
         << (s.G == 1
                 ? std::string()
                 : " + static_cast<long long>(g) * " + num(s.N * s.K) + "ll")
         << ";\n  }\n";
  if (!s.rowScales.empty())
    text << "  static constexpr bool kRowScales = true;\n"
         << "  __device__ static __forceinline__ const float *row_scales("
            "nf::Step a, int g) {\n"
         << "    (void)g;\n    return " << s.rowScales << ";\n  }\n";
  const bool int4 = s.path == kInt4Rows;
  if (int4 != !s.groupScales.empty())
    internalError = fn + (int4 ? ": the int4 path without group scales"
                               : ": int4 codes off the int4 path");
  if (int4 && (quantIn || stored16))
    internalError = fn + ": the int4 path reads f32 rows, not quantised";
  if (!s.groupScales.empty())
    text << "  static constexpr int kGroupSize = " << s.groupSize << ";\n"
         << "  __device__ static __forceinline__ const float *group_scales("
            "nf::Step a, int g) {\n"
         << "    (void)g;\n    return " << s.groupScales << ";\n  }\n";
  if (stored16)
    text << "  static constexpr bool kRowsBf16 = true;\n";
  else
    text << "  __device__ static __forceinline__ const float *row("
            "nf::Step a, int r) {\n"
         << "    return " << input << " + " << rowOffset << ";\n  }\n";
  // Decode: the bf16 copy (not of FP8-quantised rows).
  const bool x16 = !s.shadow16.empty() && !planes && !quantIn;
  if (x16)
    text << "  __device__ static __forceinline__ const unsigned short *"
            "row16(nf::Step a, int r) {\n"
         << "    return " << s.shadow16 << " + " << rowOffset << ";\n  }\n";
  if (planes)
    text << "  static constexpr long long PLANE = "
         << (stored16 ? int64_t(0) : planeElems) << "ll;\n"
         << "  __device__ static __forceinline__ const unsigned short *"
            "row16(nf::Step a, int r) {\n"
         << "    return " << planePtr << " + " << rowOffset << ";\n  }\n";
  // With a row context, the per-element store computes it only where it
  // is used (the branches that write the K/V cache).
  std::string perElement = s.store;
  for (size_t at; !s.rowCtx.empty() &&
                  (at = perElement.find("[ctx + ")) != std::string::npos;)
    perElement.replace(at, 7, "[" + s.rowCtx + " + ");
  if (!s.store2.empty() && s.N % 2 == 0)
    text << "  static constexpr bool kStore2 = true;\n"
         << "  __device__ static __forceinline__ void store2(nf::Step a, int "
            "r, int n, float v0, float v1) {\n"
         << s.store2 << "  }\n";
  if (s.rowCtx.empty()) {
    text << "  __device__ static __forceinline__ void store(nf::Step "
            "a, int r, int n, float v) {\n"
         << s.store << "  }\n};\n";
  } else {
    text << "  static constexpr bool kRowCtx = true;\n"
         << "  __device__ static __forceinline__ long long row_ctx("
            "nf::Step a, int r) {\n"
         << "    return " << s.rowCtx << ";\n  }\n"
         << "  __device__ static __forceinline__ void store(nf::Step "
            "a, long long ctx, int r, int n, float v) {\n"
         << s.store << "  }\n"
         << "  __device__ static __forceinline__ void store(nf::Step "
            "a, int r, int n, float v) {\n"
         << perElement << "  }\n};\n";
  }
  // The wide variants' spec: the same, but for its store.
  const std::string wideSpec = s.wideStore.empty() ? spec : spec + "_wide";
  if (!s.wideStore.empty())
    text << "struct " << wideSpec << " : " << spec << " {\n"
         << "  __device__ static __forceinline__ void store(nf::Step a, int r, "
            "int n, float v) {\n"
         << s.wideStore << "  }\n};\n";
  if (int4) {
    emitInt4Linear(fn, spec, s, comment);
    return;
  }
  if (quantIn)
    addLaunch(
        fn + "_quantize", gridOf(ceilDiv(inputRows, 8), opts.smCount * 8), 256,
        "  nf::quantize_rows_e4m3<" + num(s.K) + ", " + num(s.rowsPerToken) +
            ">(a, " + s.input + ", " + input + ", " +
            (s.inputQuant == "static" ? s.inputScale : std::string("nullptr")) +
            ");\n",
        comment + ": input rows quantised to FP8 E4M3 (" +
            (s.inputQuant == "static" ? "a static scale" : "a scale per row") +
            ") and back to f32 (codegen scratch at " + num(quantOff) + ")");
  if (planes) {
    if (widen)
      addLaunch(fn + "_widen", elementGrid(ceilDiv(codeCount, 16)), 256,
                std::string(ws ? "#ifndef NF_HAS_WGMMA\n" : "") +
                    "  nf::widen_fp8_codes<" + num(codeCount) + "ll>(" +
                    s.codes + ", " + widened + ");\n" + (ws ? "#endif\n" : ""),
                comment + ": FP8 codes widened to bf16 (codegen scratch at " +
                    num(widenOff) + ")" +
                    (ws ? "; sm_90a: the GEMM widens them as it loads "
                          "them, this launch does nothing"
                        : ""));
    if (splitLaunch)
      addLaunch(fn + "_split", elementGrid(planeElems / 4), 256,
                "  nf::split_rows_bf16<" + num(terms) + ", " + num(s.K) + ", " +
                    num(s.rowsPerToken) + ", " + num(planeElems) + "ll>(a, " +
                    input + ", " + planePtr + ");\n",
                comment + ": input rows split into " + num(terms) +
                    " bf16 plane(s) (codegen scratch at " + num(planeOff) +
                    ")");
    // 128 x 128 tiles; as many blocks as fit on an SM (shared memory). With
    // wgmma the sm_90a cubin runs wgmma_tile and the PTX (other targets)
    // pipelined_mma_tile: the launch gets the larger shared memory of both.
    // Where nf-cuda-launch-tiles gave the GEMM a warp-specialised tile, the
    // sm_90a cubin runs wgmma_ws_gemm instead (128 x TN tiles, one block per
    // SM).
    const int64_t pipeSmem = (terms == 1 ? 4 : 3) * (terms + 1) * 128 * 40 * 2;
    const int64_t wgmmaSmem =
        (terms == 1 ? 5 : 3) * (terms + 1) * 128 * 64 * 2 + 1024;
    const int64_t wsSmem = ws ? shapes::wsGemmSmem(wsTile) : 0;
    if (ws && !(opts.wgmma && terms == 1 &&
                (wsTile == 128 || wsTile == 192 || wsTile == 256) &&
                wsSmem + kStaticSharedAllowance <= opts.maxSharedBytes))
      internalError = fn + ": nf.gemm_ws_tiles " + num(wsTile) +
                      " needs sm_90 targets, one bf16 term and a tile of 128, "
                      "192 or 256 that fits shared memory";
    const int64_t smem = ws           ? std::max(pipeSmem, wsSmem)
                         : opts.wgmma ? std::max(pipeSmem, wgmmaSmem)
                                      : pipeSmem;
    const int64_t perSm = (227 * 1024) / (smem + 1024);
    const int64_t tileN = ws ? wsTile : 128;
    const int64_t tiles =
        (ceilDiv(s.maxRows, 128) + (s.G > 1 ? s.G : 0)) * ceilDiv(s.N, tileN);
    const int64_t gemvBlocks = ceilDiv(s.G * s.N, 8);
    hopperFeatures = hopperFeatures || opts.wgmma;
    std::string sizeChecks = "  static_assert(nf::pipelined_gemm_smem<" +
                             num(terms) + ">() == " + num(pipeSmem) +
                             ", \"shared memory size\");\n";
    if (ws)
      sizeChecks += "  static_assert(nf::wgmma_ws_smem<" + num(wsTile) +
                    ">() == " + num(wsSmem) + ", \"shared memory size\");\n";
    else if (opts.wgmma)
      sizeChecks += "  static_assert(nf::wgmma_gemm_smem<" + num(terms) +
                    ">() == " + num(wgmmaSmem) + ", \"shared memory size\");\n";
    addLaunch(fn,
              gridOf(std::max(tiles, gemvBlocks),
                     int64_t(opts.smCount) * std::max<int64_t>(perSm, 1)),
              ws ? 384 : 256,
              sizeChecks + "  nf::linear<" + spec + ", " + num(terms) +
                  ", true, " + (opts.wgmma ? "true" : "false") + ", " +
                  num(ws ? wsTile : 0) + ">(a);\n",
              comment +
                  (ws ? ": warp-specialised wgmma GEMM on the bf16 plane, "
                        "128 x " +
                            num(wsTile) + " tiles (sm_90a; else mma.sync)"
                   : opts.wgmma ? ": tensor-core tiles on the bf16 planes "
                                  "(wgmma on sm_90a, else mma.sync)"
                                : ": pipelined tensor-core tiles on the bf16 "
                                  "planes"));
    launches.back().sharedBytes = static_cast<uint32_t>(smem);
    return;
  }
  // Decode with bf16 weights: the skinny tensor-core kernel (weights as mma's
  // A operand, K split across a block's warps), which reads each weight byte
  // once at any batch size up to 64 rows per group.
  // Two variants: up to narrowTokens (16 features a block, 4 K
  // steps in flight) and more (32 features a block; with bf16 inputs each
  // warp's next activations staged in shared memory: batch-32 experts 93 ->
  // 79 us a launch, step 11.5 -> 10.9 ms on the H200; exact products keep
  // loads at use: staged, their three terms took the variant from 112 to
  // 154 registers, one block per SM, and batch 32 from 13.3 to 15.0 ms);
  // the plan says which runs for how many tokens. (64 features a block streamed
  // the batch-32 experts 19% faster alone, skinny_sweep.cu with
  // NF_SWEEP_WIDE=1, but made the plan's batch-32 step 10% slower on the H200,
  // bench/results/2026-11-30g/run39-wide64: the generated 32-feature
  // variant takes 111 registers, two blocks per SM, the sweep's more than
  // 128; the 64-feature one 176, one block.)
  if (s.path == kBf16Skinny) {
    if (narrowTokens <= 0) {
      internalError = fn + ": a decode step without nf.skinny_narrow_tokens "
                           "(nf-cuda-gemm-paths)";
      return;
    }
    constexpr int64_t kWarps = 8;
    // Blocks loop over items, so the group scan at their start is paid
    // once (measured on the H200: equal to or faster than a block per item,
    // at batch 1 to 32). Two blocks per SM, three for the narrow variant
    // with bf16 inputs (its registers allow it): that streamed the batch-1
    // expert and in_proj weights 15-22% faster (bench/kernels/skinny_sweep.cu)
    // but slowed batch 64 when the wide variant did the same.
    // (No minimum-blocks launch bound: with one, ptxas spills to reach it,
    // where without one the narrow variant fits three blocks unspilled.)
    const int64_t cap = int64_t(opts.smCount) * 2;
    // The wide variant: nf-cuda-gemm-variants' warps a block, 4 (four
    // blocks an SM) or 8 (two).
    const int64_t kWideWarps = s.wideWarps;
    const bool wide4 = kWideWarps == 4;
    const int64_t kWideCap = int64_t(opts.smCount) * (wide4 ? 4 : 2);
    const int64_t narrowCap =
        opts.matmulTerms == 1 ? int64_t(opts.smCount) * 3 : cap;
    const std::string terms = num(opts.matmulTerms);
    const int64_t narrowRows = std::min(s.maxRows, narrowTokens);
    const int64_t narrowItems =
        (std::min(s.G, narrowRows) + 1) * ceilDiv(s.N, 16);
    const bool wide = wideSteps();
    // One weight (not the routed experts), not run beside the experts.
    const bool dense = s.G == 1 && !s.wideWithExperts;
    // Dynamic shared memory (nf::skinny_smem): the fold's sums and, when
    // staged, the activation ring (the two parts of a co-launch share it).
    // The wide variant reads the input's bf16 copy where it has one (its
    // steps are the ones whose activation reads through L2 rival the
    // weights'); the narrow one reads f32 rows (bf16 rows there slowed
    // batch 1-8 by 2-3%, bench/results/2026-11-30f/run4-decode-rows).
    // rows: an item's rows at most (16, or 32 for wide dense layers whose
    // 16-row items would not all fit on the GPU at once).
    auto variant = [&](const std::string &name, int64_t grid, int64_t mt,
                       int64_t stages, int64_t warps, bool stageX, bool rows16,
                       uint32_t minT, uint32_t maxT, int64_t rows = 16) {
      const int64_t nt = rows / 8;
      const int64_t smem =
          (warps / 2) * mt * nt * 4 * 32 * 4 +
          (stageX ? warps * 2 * nt * (rows16 ? 1 : 2) * 32 * 16 : 0);
      const std::string x = stageX ? "true" : "false";
      const std::string &variantSpec =
          minT > uint32_t(narrowTokens) ? wideSpec : spec;
      std::string tail = rows16 ? ", true" : "";
      if (rows != 16)
        tail = (rows16 ? ", true, " : ", false, ") + num(rows);
      addLaunch(name, static_cast<uint32_t>(grid), 32 * warps,
                "  static_assert(nf::skinny_smem<" + variantSpec + ", " +
                    num(mt) + ", " + num(warps) + ", " + x + tail +
                    ">() == " + num(smem) +
                    ", \"shared memory size\");\n"
                    "  nf::skinny_linear<" +
                    variantSpec + ", " + num(mt) + ", " + num(stages) + ", " +
                    num(warps) + ", " + terms + ", " + x + tail + ">(a);\n",
                comment, minT, maxT, /*bodyWaits=*/true, s.groupsAfterWait);
      launches.back().sharedBytes = static_cast<uint32_t>(smem);
      functions.back().sliceable = true;
    };
    // Steps of one token: row_linear, a warp per item of features on CUDA
    // cores (nf_linear.cuh), three blocks an SM (every step, where steps
    // have one token at most). On the H200, Nano at batch 1: see
    // row_linear's comment.
    const bool row = opts.rowLinear || s.rowOnly;
    if (row) {
      // A rowBody (row_experts_combine) takes the same items.
      const RowItem item = rowItemOf(quantised);
      const int64_t features = item.features;
      addLaunch(
          fn + "_row",
          gridOf(ceilDiv(s.G * ceilDiv(s.N, features), kWarps),
                 int64_t(opts.smCount) * 3),
          32 * kWarps,
          s.rowBody.empty()
              ? "  nf::row_linear<" + spec + ", " + num(item.chunks) +
                    (features > 1 ? ", 1, " + num(features) : "") + ">(a);\n"
              : s.rowBody,
          comment + " (one token: a warp per " +
              (features > 1 ? num(features) + " features)" : "feature)"),
          0, maxTokens > 1 ? 1 : 0, /*bodyWaits=*/true, s.groupsAfterWait);
      functions.back().sliceable = s.rowBody.empty();
      functions.back().minBlocks = static_cast<int>(item.minBlocks);
      if (s.rowOnly)
        return;
    }
    if (!row || maxTokens > 1)
      variant(fn + (row || wide ? "_narrow" : ""),
              gridOf(narrowItems, narrowCap), 1, 4, kWarps, false, false,
              row ? 2 : 0, wide ? uint32_t(narrowTokens) : 0);
    // The wide steps' kernel: nf-cuda-gemm-variants' choice, whose
    // conditions the kernels need are checked here.
    const std::string &wv = s.wideVariant;
    auto require = [&](bool ok, const char *what) {
      if (!ok)
        internalError = fn + ": wide variant \"" + wv + "\" needs " + what;
    };
    if (wide && wv.empty())
      internalError =
          fn + ": the op has no nf.gemm_wide_variants (nf-cuda-gemm-variants)";
    if (wide && kWideWarps != 4 && kWideWarps != 8)
      internalError = fn + ": nf.gemm_wide_warps " + num(kWideWarps) +
                      " is neither 4 nor 8 (nf-cuda-gemm-variants)";
    if (wide && wv == "feature_tiles") {
      require(x16 && s.G == 1, "one weight and the rows' bf16 copy");
      // A block's 8 warps own 16 features each (128 a tile) and share the
      // tile's 32 rows, staged once in shared memory: each weight byte is
      // read once per 32 rows, the rows once per 128 features (skinny items
      // read weights once per 16 rows and rows once per 32 features). The
      // LM head alone on the H200: 32 rows 288 -> 189 us, 64 rows 543 ->
      // 284 (bench/kernels/feature_tile_sweep.cu).
      constexpr int64_t kMt = 1, kNt = 4, kW = 8, kStages = 4, kKp = 8;
      const int64_t items =
          ceilDiv(s.N, kW * kMt * 16) * ceilDiv(s.maxRows, 8 * kNt);
      const int64_t smem = 2 * kKp * 8 * kNt * 64;
      addLaunch(fn + "_wide", gridOf(items, cap), 32 * kW,
                "  static_assert(nf::feature_tile_smem<" + num(kNt) + ", " +
                    num(kKp) + ">() == " + num(smem) +
                    ", \"shared memory size\");\n"
                    "  nf::feature_tile_linear<" +
                    wideSpec + ", " + num(kMt) + ", " + num(kNt) + ", " +
                    num(kW) + ", " + num(kStages) + ", " + num(kKp) + ">(a);\n",
                comment + " (feature tiles of 128, rows staged once)",
                narrowTokens + 1, 0, /*bodyWaits=*/true);
      launches.back().sharedBytes = static_cast<uint32_t>(smem);
    } else if (wide && wv == "tma") {
      require(x16 && dense && opts.hopperOrLater && opts.matmulTerms == 1 &&
                  s.groups == "nf::DenseGroups" && s.weightIndex >= 0 &&
                  s.shadowOffset >= 0 && s.rowIndex == "r" && s.K % 8 == 0 &&
                  kTmaSmem <= opts.maxSharedBytes,
              "one dense weight, the rows' bf16 copy and sm_90");
      // One dense weight read from the rows' bf16 copy: TMA (nf_tma.cuh).
      emitTmaLinear(fn, wideSpec, s, comment);
    } else if (wide && wv == "skinny_rows32") {
      require(dense && wide4 && 2 * ceilDiv(s.N, 32) > kWideCap,
              "a dense weight of more 32-feature items than fit at once");
      // Wide layers whose 16-row items at 32 rows would not all fit on the
      // GPU at once (in_proj: 644 items for 528 blocks): items of up to 32
      // rows, each weight tile read once, in one round of three blocks an
      // SM (142 registers). On the H200, the Nano in_proj alone at 32 rows
      // 28.9 -> 21.9 us, at 64 rows 41.6 -> 36.7
      // (bench/kernels/dense_wide_sweep.cu); the bf16 plan's step at batch
      // 32 7.34 / 7.33 -> 7.23 / 7.20 ms, batch 64 10.88 / 10.80 -> 10.77
      // / 10.71 (bench/results/2026-12-01e/ab-rows32).
      const int64_t items = ceilDiv(s.maxRows, 32) * ceilDiv(s.N, 32);
      variant(fn + "_wide", gridOf(items, int64_t(opts.smCount) * 3), 2, 2,
              kWideWarps, opts.matmulTerms == 1, x16, narrowTokens + 1, 0, 32);
      functions.back().minBlocks = 3;
    } else if (wide) {
      require(wv == "skinny" || wv.empty(), "a kernel (unknown variant)");
      const int64_t items =
          (std::min(s.G, s.maxRows) + ceilDiv(s.maxRows, 16)) *
          ceilDiv(s.N, 32);
      variant(fn + "_wide", gridOf(items, kWideCap), 2, 2, kWideWarps,
              opts.matmulTerms == 1, x16, narrowTokens + 1, 0);
      if (wide4) // 128 registers: ptxas took 140 for the routed experts'
        functions.back().minBlocks = 4; // up (co-launch), three an SM
    }
    return;
  }
  const int64_t nt = ceilDiv(s.N, 64);
  const int64_t tiles = (ceilDiv(s.maxRows, 64) + (s.G > 1 ? s.G : 0)) * nt;
  const int64_t gemvBlocks = ceilDiv(s.G * s.N, 8);
  addLaunch(fn, gridOf(std::max(tiles, gemvBlocks), int64_t(opts.smCount) * 4),
            256,
            "  nf::linear<" + spec + ", " + num(opts.matmulTerms) + ">(a);\n",
            comment);
}

void KernelEmitter::emitInt4Linear(const std::string &fn,
                                   const std::string &spec, const LinearSpec &s,
                                   const std::string &comment) {
  // Items of R rows x 2 features, a warp each (nf_linear_int4.cuh): one row
  // in one-token steps, whose codes stream once; 8 rows in the other decode
  // steps and 16 in prefill, so that each word's codes, dequantised once,
  // serve that many rows (the weights are read again per 8 or 16 rows, from
  // L2 where they fit).
  constexpr int64_t kFeatures = 2, kWarps = 8;
  auto launch = [&](const std::string &name, int64_t rows, uint32_t minT,
                    uint32_t maxT) {
    const int64_t lastRows =
        maxT > 0 ? std::min<int64_t>(s.maxRows, maxT * s.rowsPerToken)
                 : s.maxRows;
    const int64_t items = (std::min(s.G, lastRows) + ceilDiv(lastRows, rows)) *
                          ceilDiv(s.N, kFeatures);
    addLaunch(name, gridOf(ceilDiv(items, kWarps), int64_t(opts.smCount) * 4),
              32 * kWarps,
              "  nf::int4_linear<" + spec + ", " + num(rows) + ", " +
                  num(kFeatures) + ">(a);\n",
              comment + " (int4 codes, groups of " + num(s.groupSize) +
                  ": a warp per " + num(rows) + " row(s) x " + num(kFeatures) +
                  " features)",
              minT, maxT);
  };
  if (phase != "decode") {
    launch(fn, 16, 0, 0);
    return;
  }
  launch(fn + "_row", 1, 0, maxTokens > 1 ? 1 : 0);
  if (maxTokens > 1)
    launch(fn + "_rows", 8, 2, 0);
}

void KernelEmitter::emitTmaLinear(const std::string &fn,
                                  const std::string &spec, const LinearSpec &s,
                                  const std::string &comment) {
  // Weights and rows stream into shared memory by TMA, ~200 KB in flight a
  // block, one block an SM. On the H200 alone (bench/kernels/
  // tma_gemv_sweep.cu), against the register-ring skinny variant: 32 rows
  // out_proj 14.2 -> 8.9 us, in_proj 21.8 -> 18.0, qkv 17.3 -> 11.8; 64 rows
  // 23.0 -> 10.8, 36.9 -> 23.9, 19.8 -> 15.3; the bf16 Nano plan's step at
  // batch 32 7.13 / 7.09 -> 6.86 / 6.83 ms, batch 64 10.76 / 10.70 -> 9.66
  // / 9.72. (Narrow steps keep skinny_linear: on TMA, with the copies
  // written in every step, batch 1 went 3.07 -> 3.14 ms and batch 8 5.02
  // -> 5.14, though out_proj alone at 8 rows took 10.5 -> 8.6 us: a block
  // of ~210 KB of shared memory cannot start on an SM before the launch
  // before it has left, where the skinny blocks fetch weights beside it.)
  includes.insert("nf_tma.cuh");
  const size_t wmap = tensorMap("NF_TENSOR_MAP_WEIGHT", s.weightIndex, 0, s.K,
                                s.N, 16 * kTmaMt);
  const int64_t tiles = ceilDiv(s.N, 16 * kTmaMt);
  auto launch = [&](const std::string &name, const TmaLinearConfig &c,
                    uint32_t minT, uint32_t maxT) {
    const size_t xmap = tensorMap("NF_TENSOR_MAP_ARENA", 0, s.shadowOffset, s.K,
                                  maxTokens, c.rows);
    const int64_t lastRows = maxT > 0 ? int64_t(maxT) : maxTokens;
    const int64_t items = tiles * ceilDiv(lastRows, c.rows);
    const std::string cfg = num(kTmaMt) + ", " + num(kTmaBk) + ", " +
                            num(c.stages) + ", " + num(c.warps) + ", " +
                            num(c.rows);
    addLaunch(name, gridOf(items, opts.smCount), 32 * (c.warps + 1),
              "  static_assert(nf::tma_linear_smem<" + cfg +
                  ">() == " + num(tmaLinearSmem(c)) +
                  ", \"shared memory size\");\n"
                  "  nf::tma_linear<" +
                  spec + ", " + cfg + ">(a, &nf_tensor_maps[" +
                  num(int64_t(wmap)) + "], &nf_tensor_maps[" +
                  num(int64_t(xmap)) + "]);\n",
              comment + " (TMA, items of " + num(c.rows) + " rows)", minT, maxT,
              /*bodyWaits=*/true);
    launches.back().sharedBytes = static_cast<uint32_t>(tmaLinearSmem(c));
  };
  const int64_t split = kTmaRows32.rows;
  launch(fn + "_wide", kTmaRows32, narrowTokens + 1,
         maxTokens > split ? uint32_t(split) : 0);
  if (maxTokens > split)
    launch(fn + "_wide64", kTmaRows64, uint32_t(split + 1), 0);
}

StatusOr<size_t> KernelEmitter::linear(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isAct(in[0]) || !isAct(out[0]))
    return fail(i, "expects (input, weight) -> result, f32 rows");
  auto shape = weightShape(in[1]);
  auto wt = weightType(in[1]);
  if (!wt || shape.size() != 2 || shape[1] != V(in[0]).cols ||
      shape[0] != V(out[0]).cols)
    return fail(i, "weight does not match the input and result");
  LinearSpec s = LinearSpec::of(op, 0, *wt, shape[0], shape[1]);
  s.weight = weightPtr(in[1]);
  setQuantised(s, in[1]);
  s.weightIndex = V(in[1]).weight;
  setInput(s, in[0]);
  s.rowIndex = "r";
  s.maxRows = maxTokens;
  std::string rn = "static_cast<long long>(r) * ";
  std::string label = opCode(op) == OpCode::LmHead       ? "lm_head"
                      : opCode(op) == OpCode::LatentProj ? "latent_proj"
                                                         : "linear";
  // The LM head computes only the rows whose logits the runtime reads
  // (a->logit_rows: the last token of each sequence unless every token's
  // logits are asked for), when nothing else reads its result.
  if (label == "lm_head" && usersOf(out[0]).empty()) {
    s.groups = "nf::LogitRowGroups";
    s.rowIndex = "nf::logit_row(a, r)";
    rn = "static_cast<long long>(nf::logit_row(a, r)) * ";
  }
  std::string comment = opName(op);
  size_t consumed = 1;
  std::string store, store2;
  // With a decode conv fused (below): the split piece it reads, and the
  // store without the conv.
  int convPiece = -1;
  std::string rawStore;
  std::vector<size_t> fused;
  // The ops the epilogue computes: nf-cuda-epilogues' choice.
  auto epi = epilogueOf(i);
  if (!epi)
    return epi.status();
  const std::vector<std::string> &epilogue = *epi;

  // linear + split [+ append]: the epilogue writes the split columns.
  if (!epilogue.empty() && epilogue[0] == "nf.split") {
    if (operands(*ops[i + 1]) != std::vector<int>{out[0]})
      return notInEpilogue(i + 1);
    const PlanOp &sp = *ops[i + 1];
    auto pieces = results(sp);
    auto sizes = listAttr(sp, attr::Sizes);
    if (!sizes || sizes->size() != pieces.size())
      return fail(i + 1, "missing or mismatched 'sizes'");
    int64_t sum = 0;
    for (size_t r = 0; r < pieces.size(); ++r) {
      if (!isAct(pieces[r]) || V(pieces[r]).cols != (*sizes)[r])
        return fail(i + 1,
                    "result " + std::to_string(r) + " does not match its size");
      sum += (*sizes)[r];
    }
    if (sum != s.N)
      return fail(i + 1, "sizes do not sum to the input's columns");
    // K/V rows of a following append, by split piece.
    std::map<int, std::string> cacheOf;
    bool cacheF32 = true; // else bf16 values, stored by nf::kv_put
    if (epilogue.size() == 2 && epilogue[1] == "nf_kv.append") {
      const PlanOp &ap = *ops[i + 2];
      auto ain = operands(ap);
      const PlanStorage *st = storageOf(ap, pl::StorageKind::KVCache);
      if (st && ain.size() == 3 && V(ain[0]).kind == pl::ValueKind::Batch) {
        auto k = std::find(pieces.begin(), pieces.end(), ain[1]);
        auto v = std::find(pieces.begin(), pieces.end(), ain[2]);
        const int64_t row = st->kvHeads * st->headDim;
        if (k != pieces.end() && v != pieces.end() && V(ain[1]).cols == row &&
            V(ain[2]).cols == row &&
            (st->dtype == pl::DType::F32 || st->dtype == pl::DType::BF16)) {
          includes.insert("nf_kv_cache.cuh");
          // The row's cache offset (page table lookups) is the store's
          // row context: GEMM epilogues compute it once per row.
          s.rowCtx = "nf::kv_row_offset<" + num(row) + ", " +
                     num(st->pageSize) + ">(a, r)";
          cacheOf[static_cast<int>(k - pieces.begin())] =
              kvCachePtr(ap, *st, 0);
          cacheOf[static_cast<int>(v - pieces.begin())] =
              kvCachePtr(ap, *st, 1);
          cacheF32 = st->dtype == pl::DType::F32;
          consumed = 3;
          label = "qkv_append";
          comment += " + nf.split + nf_kv.append";
        }
      }
      if (consumed != 3)
        return notInEpilogue(i + 2);
    }
    // A decode conv of a split piece (one token per sequence): the
    // piece's store is the conv of its channel (nf::causal_conv_decode),
    // and the piece itself is stored only if something else reads it.
    std::string convStore;
    if (epilogue.size() == 2 && epilogue[1] == "nf_kv.causal_conv") {
      const PlanOp &cv = *ops[i + 2];
      auto cin = operands(cv), cout = results(cv);
      const PlanStorage *st = storageOf(cv, pl::StorageKind::MambaState);
      auto piece = cin.size() >= 3
                       ? std::find(pieces.begin(), pieces.end(), cin[1])
                       : pieces.end();
      if (st && piece != pieces.end() && (cin.size() == 3 || cin.size() == 4) &&
          cout.size() == 1 && isAct(cout[0]) &&
          V(cin[0]).kind == pl::ValueKind::Batch) {
        const int64_t CD = st->convDim, KW = st->convWindow + 1;
        auto wt = weightType(cin[2]);
        const bool bias = cin.size() == 4;
        auto bt = bias ? weightType(cin[3]) : wt;
        if (wt && bt && V(cin[1]).cols == CD && V(cout[0]).cols == CD &&
            weightNumel(cin[2]) == CD * KW &&
            (!bias || weightNumel(cin[3]) == CD)) {
          includes.insert("nf_mamba.cuh");
          convPiece = static_cast<int>(piece - pieces.begin());
          convStore = "      nf::causal_conv_decode<" + *wt + ", " + *bt +
                      ", " + num(CD) + ", " + num(KW) + ", " +
                      (bias ? "true" : "false") + ">(a, r, COL, v, " +
                      weightPtr(cin[2]) + ", " +
                      (bias ? weightPtr(cin[3])
                            : "static_cast<const " + *bt + " *>(nullptr)") +
                      ", nf::storage(a, " + num(2 * cv.storage) + "), " +
                      arenaPtr(cout[0]) + ");\n";
          consumed = 3;
          label += "_split_conv";
          comment += " + nf.split + nf_kv.causal_conv (decode, per channel "
                     "in the epilogue)";
        }
      }
      if (consumed != 3 || phase != "decode" ||
          stringAttr(cv, attr::Mode).value_or("") != "decode")
        return notInEpilogue(i + 2);
    }
    if (epilogue.size() != 1 + (consumed == 3 ? 1 : 0))
      return fail(i, "nf.epilogue: unknown ops after nf.split");
    if (consumed == 1) {
      consumed = 2;
      label += "_split";
      comment += " + nf.split";
    }
    fused = {i + 1};
    if (consumed == 3)
      fused.push_back(i + 2);
    int64_t c0 = 0;
    // Column pairs never straddle pieces of even widths: then store2 too.
    bool pairs = cacheOf.empty();
    for (size_t r = 0; r < pieces.size(); ++r) {
      const int64_t w = (*sizes)[r];
      pairs = pairs && w % 2 == 0;
      const std::string col = c0 ? "(n - " + num(c0) + ")" : std::string("n");
      std::string piece = "      " + arenaPtr(pieces[r]) + "[" + rn + num(w) +
                          " + " + col + "] = v;\n";
      const std::string rawPiece = piece;
      if (static_cast<int>(r) == convPiece) {
        std::string conv = convStore;
        conv.replace(conv.find("COL"), 3, col);
        piece = (needed(pieces[r], {i + 2}) ? piece : std::string()) + conv;
        pairs = false; // per element: the conv's store has no pair form
      }
      std::string piece2 = "      nf::store_act2(" + arenaPtr(pieces[r]) +
                           " + " + rn + num(w) + " + " + col + ", v0, v1);\n";
      if (auto it = cacheOf.find(static_cast<int>(r)); it != cacheOf.end())
        piece += cacheF32 ? "      " + it->second + "[ctx + " + col + "] = v;\n"
                          : "      nf::kv_put(&" + it->second + "[ctx + " +
                                col + "], v);\n";
      const bool last = r + 1 == pieces.size();
      const std::string open =
          r == 0 ? (last ? "    {" : "    if (n < " + num(c0 + w) + ") {")
                 : (last ? " else {" : " else if (n < " + num(c0 + w) + ") {");
      store += open + "\n" + piece + "    }";
      store2 += open + "\n" + piece2 + "    }";
      rawStore += open + "\n" + rawPiece + "    }";
      c0 += w;
    }
    store += "\n";
    rawStore += "\n";
    store2 = pairs ? store2 + "\n" : std::string();
  } else if (epilogue.size() == 1 && epilogue[0] == "nf.activation") {
    // linear + activation: in the epilogue.
    const PlanOp &act = *ops[i + 1];
    if (operands(act) != std::vector<int>{out[0]})
      return notInEpilogue(i + 1);
    auto aout = results(act);
    auto kind = activationKind(i + 1, attr::Kind, true);
    if (!kind)
      return kind.status();
    if (aout.size() != 1 || !isAct(aout[0]) || V(aout[0]).cols != s.N)
      return fail(i + 1, "result does not match the linear layer");
    store = storeAct(aout[0], rn + num(s.N) + " + n",
                     "nf::activate<" + *kind + ">(v)");
    store2 = storeAct2(aout[0], rn + num(s.N) + " + n",
                       "nf::activate<" + *kind + ">(v0)",
                       "nf::activate<" + *kind + ">(v1)");
    fused = {i + 1};
    consumed = 2;
    label += std::string("_") + stringAttr(act, attr::Kind).value_or("act");
    comment += " + nf.activation";
  } else if (!epilogue.empty()) {
    return fail(i, "nf.epilogue: no CUDA epilogue computes " + epilogue[0]);
  }
  bool raw = consumed == 1;
  if (!raw) {
    raw = isOutput(out[0]);
    for (size_t u : usersOf(out[0]))
      raw |= std::find(fused.begin(), fused.end(), u) == fused.end();
  }
  if (raw) {
    store = storeAct(out[0], rn + num(s.N) + " + n", "v") + store;
    // Pairs for the result alone (fused stores besides it keep per element).
    store2 = consumed == 1
                 ? storeAct2(out[0], rn + num(s.N) + " + n", "v0", "v1")
                 : std::string();
  }
  s.store = store;
  s.store2 = store2;
  // The conv in the epilogue pays its window's dependent loads once per
  // element, one element after another (the stores may alias the next
  // loads): cheap for the few rows of narrow steps (Nano at batch 1: 3.19
  // -> 3.16 ms), but 44 us against 22 + 3.3 for in_proj and the conv at
  // batch 32 on the H200. The wide variants store xBC, and a conv launch
  // follows for their steps.
  const bool wideConv = convPiece >= 0 && s.path == kBf16Skinny && wideSteps();
  if (wideConv)
    s.wideStore = rawStore;
  emitLinear(fnName(i, label), s, comment);
  if (wideConv)
    if (auto conv = causalConv(i + 2, narrowTokens + 1); !conv)
      return conv;
  return consumed;
}

} // namespace nf::codegen::detail
