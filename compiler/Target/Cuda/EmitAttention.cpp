//===- EmitAttention.cpp - attention -> CUDA ------------------------------===//
//
// KernelEmitter's KV-cache ops: the cache append (kernels/nf_kv_cache.cuh)
// and attention (nf_attention.cuh; decode: split-context flash decoding, per
// head, grouped or on tensor cores; prefill: tensor-core or shared-memory
// tiles).
//
//===----------------------------------------------------------------------===//

#include "Target/Cuda/KernelEmitter.h"
#include "Target/Cuda/KernelShapes.h"

namespace nf::codegen::detail {

StatusOr<size_t> KernelEmitter::kvAppend(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op);
  const PlanStorage *st = storageOf(op, pl::StorageKind::KVCache);
  if (!st)
    return fail(i, "needs a KVCache storage");
  const int64_t row = st->kvHeads * st->headDim;
  if (in.size() != 3 || V(in[0]).kind != pl::ValueKind::Batch ||
      !isAct(in[1]) || !isAct(in[2]) || V(in[1]).cols != row ||
      V(in[2]).cols != row)
    return fail(i, "expects (batch, key, value) rows of the cache's width");
  const std::string kc = kvCachePtr(op, *st, 0), vc = kvCachePtr(op, *st, 1);
  if (kc.empty())
    return fail(i, "f32, bf16 and fp8 KV caches have CUDA kernels, not " +
                       std::string(pl::EnumNameDType(st->dtype)));
  includes.insert("nf_kv_cache.cuh");
  // Tiered: the step's page moves (a block each, the page staged in shared
  // memory; at least a block an SM, as a step after a long prefill moves
  // hundreds), then bf16 rows into hot pages.
  if (st->dtype == pl::DType::F8E4M3 && st->hotWindow > 0) {
    addLaunch(
        fnName(i, "kv_append"),
        gridOf(std::max<int64_t>(ceilDiv(maxTokens * row, 256), opts.smCount),
               int64_t(opts.smCount) * 8),
        256,
        "  nf::kv_append_tiered<" + num(row) + ", " + num(st->pageSize) + ", " +
            num(st->headDim) + ">(a, " + arenaPtr(in[1]) + ", " +
            arenaPtr(in[2]) + ", " + kc + ", " + vc + ");\n",
        "nf_kv.append (tiered): the pages leaving the hot window to "
        "fp8, then bf16 rows");
    return size_t(1);
  }
  // fp8: a warp per K or V row of a kv head (its scale is the row's max).
  if (st->dtype == pl::DType::F8E4M3) {
    constexpr int64_t kWarps = 8;
    addLaunch(fnName(i, "kv_append"),
              gridOf(ceilDiv(maxTokens * st->kvHeads * 2, kWarps),
                     int64_t(opts.smCount) * 8),
              32 * kWarps,
              "  nf::kv_append_e4m3<" + num(row) + ", " + num(st->pageSize) +
                  ", " + num(st->headDim) + ">(a, " + arenaPtr(in[1]) + ", " +
                  arenaPtr(in[2]) + ", " + kc + ", " + vc + ");\n",
              "nf_kv.append: E4M3 codes and a scale per (token, kv head) "
              "row, a warp per row");
    return size_t(1);
  }
  addLaunch(fnName(i, "kv_append"), elementGrid(maxTokens * row), 256,
            "  nf::kv_append<" + num(row) + ", " + num(st->pageSize) + ">(a, " +
                arenaPtr(in[1]) + ", " + arenaPtr(in[2]) + ", " + kc + ", " +
                vc + ");\n",
            "nf_kv.append");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::kvAttend(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  const PlanStorage *st = storageOf(op, pl::StorageKind::KVCache);
  if (!st)
    return fail(i, "needs a KVCache storage");
  auto heads = intAttr(op, attr::NumHeads);
  auto scale = floatAttr(op, attr::Scale);
  const int64_t HD = st->headDim, NKV = st->kvHeads;
  if (in.size() != 2 || out.size() != 1 ||
      V(in[0]).kind != pl::ValueKind::Batch || !isAct(in[1]) ||
      !isAct(out[0]) || !heads || !scale || *heads <= 0 || *heads % NKV ||
      V(in[1]).cols != *heads * HD || V(out[0]).cols != *heads * HD)
    return fail(i, "expects (batch, query) -> result with num_heads x "
                   "head_dim features");
  const std::string kc = kvCachePtr(op, *st, 0), vc = kvCachePtr(op, *st, 1);
  if (kc.empty())
    return fail(i, "f32, bf16 and fp8 KV caches have CUDA kernels, not " +
                       std::string(pl::EnumNameDType(st->dtype)));
  // Bytes a value of the decode tiles in shared memory (fp8 widens to f32).
  const int64_t kvBytes = st->dtype == pl::DType::BF16 ? 2 : 4;
  // nf-cuda-attention-forms' choice; the emitter checks that the target
  // and shapes allow it.
  const std::string form =
      stringAttr(op, "nf.attention_form").value_or(std::string());
  auto unsupported = [&](const char *what) {
    return fail(i, "nf.attention_form \"" + form + "\" needs " + what);
  };
  namespace sh = shapes;
  includes.insert("nf_attention.cuh");
  const std::string args = "(a, " + arenaPtr(in[1]) + ", " + kc + ", " + vc +
                           ", " + floatLit(*scale) + ", " + arenaPtr(out[0]) +
                           ");\n";
  // Decode: split over the context, then combine (flash decoding). Up to
  // 64 splits of at least 32 positions, as many as give about 64 warps per
  // SM for a warp per head, 16 for a warp per kv head (nf_attention.cuh
  // decode_splits): at batch 1 that is 64 splits for 32 heads, and a 1K
  // context is one 32-position tile per warp; at batch 32 (Nano: 2 kv
  // heads) 33 splits of 32 positions.
  if (phase == "decode") {
    constexpr int64_t kSplits = sh::kDecodeSplits, perBlock = 8;
    const std::string warpsTarget = num(int64_t(opts.smCount) * 64);
    const int64_t part =
        scratchOf(op, maxTokens * *heads * kSplits * (HD + 2) * 4);
    const std::string partPtr = "nf::arena<float>(a, " + num(part) + "ll)";
    // Every split launch: (q, K cache, V cache, scale, partials).
    const std::string splitArgs = ">(a, " + arenaPtr(in[1]) + ", " + kc + ", " +
                                  vc + ", " + floatLit(*scale) + ", " +
                                  partPtr + ");\n";
    // The combine: a block of 8 warps per (token, head), with the split
    // count's parameters of the split launches.
    auto addCombine = [&](const std::string &target,
                          const std::string &gqaFrom) {
      addLaunch(fnName(i, "attend_combine"),
                gridOf(maxTokens * *heads, int64_t(opts.smCount) * 8), 256,
                "  nf::kv_attend_combine<" + num(*heads) + ", " + num(NKV) +
                    ", " + num(HD) + ", " + num(kSplits) + ", " + target +
                    ", " + gqaFrom + ">(a, " + partPtr + ", " + outPtr(out[0]) +
                    ");\n",
                "nf_kv.attend (decode): the splits' softmaxes merged, a block "
                "per (token, head)");
    };
    const int64_t rep = *heads / NKV;
    if (form != "split_mma" && form != "split_gqa" && form != "split")
      return fail(i, "a decode attention without a decode nf.attention_form "
                     "(nf-cuda-attention-forms)");
    // On tensor cores for every step size where every target has them
    // (kv_attend_split_mma: a warp per (token, kv head, split) whose query
    // heads are mma's 16 rows, K/V tiles through its shared memory, in the
    // plan's bf16 terms), 4 warps a block and one block an SM (the tiles),
    // so its splits aim at 4 warps an SM. (Before sm_80 the kernel has no
    // body.)
    constexpr int64_t kMmaWarps = sh::kSplitMmaWarps;
    const int64_t mmaSmem = sh::splitMmaSmem(HD, kvBytes);
    if (form == "split_mma") {
      if (!(opts.ampereOrLater &&
            sh::splitMmaFits(rep, HD, opts.maxSharedBytes)))
        return unsupported("sm_80, at most 16 query heads a kv head and "
                           "its tiles in shared memory");
      const std::string mmaTarget = num(int64_t(opts.smCount) * kMmaWarps * 4);
      addLaunch(
          fnName(i, "attend_split_mma"),
          gridOf(ceilDiv(maxTokens * NKV * kSplits, kMmaWarps),
                 int64_t(opts.smCount)),
          32 * kMmaWarps,
          "  static_assert(nf::kv_attend_split_mma_smem<" + num(HD) + ", " +
              num(kMmaWarps) + (kvBytes == 4 ? "" : ", " + num(kvBytes)) +
              ">() == " + num(mmaSmem) +
              ", \"shared memory size\");\n"
              "  nf::kv_attend_split_mma<" +
              num(*heads) + ", " + num(NKV) + ", " + num(HD) + ", " +
              num(st->pageSize) + ", " + num(kMmaWarps) + ", " + num(kSplits) +
              ", " + mmaTarget + ", " + num(opts.matmulTerms) + splitArgs,
          "nf_kv.attend (decode): a warp per (token, kv head, context "
          "split), its " +
              num(rep) + " query heads one mma tile, online softmax per split");
      launches.back().sharedBytes = static_cast<uint32_t>(mmaSmem);
      addCombine(mmaTarget, "0"); // grouped from the first token
      return size_t(1);
    }
    // Grouped queries (2 to 16 query heads per kv head), from kGqaTokens
    // tokens: a warp per (token, kv head, split) takes all of the kv head's
    // query heads, reading each K/V row once for them (its queries and
    // exponentials in static shared memory, 4 warps a block). Measured on
    // the H200 (Nano shape): batch 32 128 us per layer against 269 for a
    // warp per head, but batch 1 39 against 23 (its 64 warps each walk 16
    // heads where the per-head form has 2048 warps), so up to 3 tokens keep
    // a warp per head (about even at 4, where the fixtures' batched decode
    // steps then check the grouped form). The grouped form takes its own
    // split count (decode_splits: 16 warps an SM, not 64 / 16 heads): batch
    // 32 70 us against 132 with the per-head form's 8 splits (the combine
    // 19 against 11 us).
    constexpr int64_t kGqaWarps = sh::kGqaWarps, kGqaTokens = sh::kGqaTokens;
    const bool gqa = form == "split_gqa";
    if (gqa && !(sh::gqaFits(rep, HD) && maxTokens >= kGqaTokens))
      return unsupported("2 to 16 query heads a kv head whose queries fit "
                         "48 KB, and steps of 4 tokens");
    // Where the grouped form takes over (INT32_MAX: never); the split
    // count depends on it (decode_splits), so every launch gets it.
    const std::string gqaFrom = gqa ? num(kGqaTokens) : "0x7fffffff";
    addLaunch(
        fnName(i, "attend_split"),
        gridOf(ceilDiv((gqa ? kGqaTokens - 1 : maxTokens) * *heads * kSplits,
                       perBlock),
               int64_t(opts.smCount) * 8),
        32 * perBlock,
        "  nf::kv_attend_split<" + num(*heads) + ", " + num(NKV) + ", " +
            num(HD) + ", " + num(st->pageSize) + ", " + num(perBlock) + ", " +
            num(kSplits) + ", " + warpsTarget + ", " + gqaFrom + splitArgs,
        "nf_kv.attend (decode): a warp per (token, head, context "
        "split), online softmax per split",
        0, gqa ? uint32_t(kGqaTokens - 1) : 0);
    if (gqa)
      addLaunch(fnName(i, "attend_split_gqa"),
                gridOf(ceilDiv(maxTokens * NKV * kSplits, kGqaWarps),
                       int64_t(opts.smCount) * 8),
                32 * kGqaWarps,
                "  nf::kv_attend_split_gqa<" + num(*heads) + ", " + num(NKV) +
                    ", " + num(HD) + ", " + num(st->pageSize) + ", " +
                    num(kGqaWarps) + ", " + num(kSplits) + ", " + warpsTarget +
                    ", " + gqaFrom + splitArgs,
                "nf_kv.attend (decode): a warp per (token, kv head, context "
                "split) for its " +
                    num(rep) + " query heads, online softmax per split",
                uint32_t(kGqaTokens), 0);
    addCombine(warpsTarget, gqaFrom);
    return size_t(1);
  }
  // Prefill on tensor cores (FlashAttention-2 loop, nf_attention.cuh) when
  // the head dimension fits mma's K steps and the O tile the registers;
  // activations split into the plan's bf16 terms as the GEMMs do.
  // K/V tiles of 64 positions with one bf16 term (3.19 ms against 3.53
  // for 32 per 8192-token Nano layer on the H200,
  // bench/kernels/attention_check.cu); exact products keep 32 (their three
  // terms' tiles would not fit beside the registers), and so does a target
  // whose shared memory 64 would pass. Only when every target is sm_80 or
  // later (before, the kernel falls back to the warp form, which needs none
  // of the tiles) and the tiles fit every target.
  // With one term, the step's K/V rows are first rounded to bf16 once
  // (kv_rows_to_bf16, codegen scratch), and the blocks stream them with
  // cp.async into double-buffered tiles instead of each converting the f32
  // cache rows through registers.
  constexpr int64_t kWarps = sh::kMmaWarps, kRows = sh::kMmaRows;
  const int64_t terms = opts.matmulTerms;
  const bool kv16 = terms == 1;
  auto mmaSmem = [&](int64_t positions) {
    return sh::mmaSmem(HD, terms, kv16, positions);
  };
  if (form == "mma") {
    const int64_t positions = intAttr(op, "nf.attention_positions").value_or(0);
    if (!((positions == 32 || positions == 64) && opts.ampereOrLater &&
          sh::mmaFits(HD, terms, positions, opts.maxSharedBytes)))
      return unsupported("sm_80, head_dim a multiple of 16 up to 128, and "
                         "tiles of nf.attention_positions (32 or 64) in "
                         "shared memory");
    const int64_t tiles = ceilDiv(maxTokens * (*heads / NKV), kRows) * NKV;
    const int64_t smem = mmaSmem(positions);
    const std::string tmpl = num(HD) + ", " + num(kWarps) + ", " + num(terms) +
                             ", " + num(positions) +
                             (kv16 ? ", true" : std::string());
    std::string callArgs = args;
    if (kv16) {
      const int64_t row = NKV * HD;
      const int64_t k16 = scratchOf(op, 2 * maxTokens * row * 2);
      const std::string k16Ptr =
          "nf::arena<unsigned short>(a, " + num(k16) + "ll)";
      const std::string v16Ptr = "nf::arena<unsigned short>(a, " +
                                 num(k16 + maxTokens * row * 2) + "ll)";
      addLaunch(fnName(i, "attend_kv16"), elementGrid(maxTokens * row / 4), 256,
                "  nf::kv_rows_to_bf16<" + num(row) + ", " + num(st->pageSize) +
                    ">(a, " + kc + ", " + vc + ", " + k16Ptr + ", " + v16Ptr +
                    ");\n",
                "nf_kv.attend: the step's K/V rows in bf16 (codegen scratch "
                "at " +
                    num(k16) + ")");
      callArgs = args.substr(0, args.rfind(");")) + ", " + k16Ptr + ", " +
                 v16Ptr + ");\n";
    }
    addLaunch(fnName(i, "attend_mma"), gridOf(tiles, int64_t(opts.smCount) * 4),
              static_cast<uint32_t>(32 * kWarps),
              "  static_assert(nf::kv_attend_mma_smem<" + tmpl +
                  ">() == " + num(smem) + ", \"shared memory size\");\n" +
                  "  nf::kv_attend_mma<" + num(*heads) + ", " + num(NKV) +
                  ", " + num(HD) + ", " + num(st->pageSize) + ", " +
                  num(kWarps) + ", " + num(terms) + ", " + num(positions) +
                  (kv16 ? ", true" : "") + ">" + callArgs,
              "nf_kv.attend: tensor cores, a block per 128 (token, head) rows "
              "of a kv head, " +
                  num(positions) + " positions per step, online softmax" +
                  (kv16 ? ", bf16 K/V tiles by cp.async" : ""));
    launches.back().sharedBytes = static_cast<uint32_t>(smem);
    return size_t(1);
  }
  // Block per (token, kv head), K/V tiles in shared memory, when they fit.
  const int64_t rep = *heads / NKV;
  const int64_t warps = sh::attendWarps(rep);
  // Prefill: a block per (query tile of consecutive tokens, kv head) when a
  // one-token block's tiles fit in 48 KiB; four tokens share each K/V tile
  // (queries in dynamic shared memory; bit-identical to one per block) when
  // their queries fit too.
  if (form == "tiles") {
    if (sh::attendBlockSmem(rep, HD) > 48 * 1024)
      return unsupported("a one-token block within 48 KB");
    auto tileSmem = [&](int64_t qt) { return sh::attendTileSmem(rep, HD, qt); };
    const int64_t qt = tileSmem(4) <= 96 * 1024 ? 4 : 1;
    addLaunch(fnName(i, "attend"),
              gridOf(ceilDiv(maxTokens, qt) * NKV, int64_t(opts.smCount) * 8),
              static_cast<uint32_t>(32 * warps),
              "  nf::kv_attend<" + num(*heads) + ", " + num(NKV) + ", " +
                  num(HD) + ", " + num(st->pageSize) + ", " + num(warps) +
                  ", " + num(qt) + ">" + args,
              "nf_kv.attend: one block per (" + num(qt) +
                  " tokens, kv head), K/V tiles in shared memory, online "
                  "softmax");
    launches.back().sharedBytes = static_cast<uint32_t>(tileSmem(qt));
    return size_t(1);
  }
  if (form != "warp")
    return fail(i, "a prefill attention without a prefill nf.attention_form "
                   "(nf-cuda-attention-forms)");
  constexpr int perBlock = 4;
  addLaunch(
      fnName(i, "attend"),
      gridOf(ceilDiv(maxTokens * *heads, perBlock), int64_t(opts.smCount) * 8),
      32 * perBlock,
      "  nf::kv_attend_warp<" + num(*heads) + ", " + num(NKV) + ", " + num(HD) +
          ", " + num(st->pageSize) + ", " + num(perBlock) + ">" + args,
      "nf_kv.attend: one warp per (token, head), online softmax");
  return size_t(1);
}

} // namespace nf::codegen::detail
