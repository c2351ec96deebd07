//===- EmitMamba.cpp - Mamba ops -> CUDA ----------------------------------===//
//
// KernelEmitter's Mamba-2 ops: the gated RMSNorm, the causal conv
// (prefill and decode) and the selective scan (decode update with or
// without the fused gated norm, walked and chunked prefill scans, and the
// SSD form on tensor cores), kernels/nf_mamba.cuh.
//
//===----------------------------------------------------------------------===//

#include "Target/Cuda/KernelEmitter.h"
#include "Target/Cuda/KernelShapes.h"

namespace nf::codegen::detail {

StatusOr<size_t> KernelEmitter::gatedRmsNorm(size_t i, uint32_t minTokens) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 1 || !isAct(in[0]) || !isAct(in[1]) ||
      !isAct(out[0]))
    return fail(i, "expects (y, z, weight) -> result, f32 rows");
  const int64_t I = V(in[0]).cols;
  auto groups = intAttr(op, attr::Groups);
  auto eps = floatAttr(op, attr::Epsilon);
  auto wt = weightType(in[2]);
  if (V(in[1]).cols != I || V(out[0]).cols != I || !wt ||
      weightNumel(in[2]) != I || !groups || *groups <= 0 || I % *groups || !eps)
    return fail(i, "shapes, groups or epsilon do not match");
  includes.insert("nf_rows.cuh");
  // A warp per (token, group) where groups are whole float4s per lane (the
  // template's choice), else a block.
  const int64_t gs = I / *groups;
  const int64_t items = maxTokens * *groups;
  addLaunch(
      fnName(i, "gated_rms_norm"),
      gs % 128 == 0 && gs <= 1024
          ? gridOf(ceilDiv(items, kRowThreads / 32), int64_t(opts.smCount) * 8)
          : blockGrid(items),
      kRowThreads,
      "  nf::gated_rms_norm<" + *wt + ", " + num(I) + ", " + num(*groups) +
          ">(a, " + arenaPtr(in[0]) + ", " + arenaPtr(in[1]) + ", " +
          weightPtr(in[2]) + ", " + doubleLit(*eps) + ", " + outPtr(out[0]) +
          ");\n",
      "nf.gated_rms_norm", minTokens);
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::causalConv(size_t i, uint32_t minTokens) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  const PlanStorage *st = storageOf(op, pl::StorageKind::MambaState);
  if (!st)
    return fail(i, "needs a MambaState storage");
  if (in.size() < 3 || in.size() > 4 || out.size() != 1 ||
      V(in[0]).kind != pl::ValueKind::Batch || !isAct(in[1]) || !isAct(out[0]))
    return fail(i, "expects (batch, input, weight[, bias]) -> result");
  const int64_t CD = st->convDim, KW = st->convWindow + 1;
  auto wt = weightType(in[2]);
  if (!wt || V(in[1]).cols != CD || V(out[0]).cols != CD ||
      weightNumel(in[2]) != CD * KW)
    return fail(i, "input / weight do not match the conv state (" +
                       std::to_string(CD) + " channels, kernel " +
                       std::to_string(KW) + ")");
  const bool bias = in.size() == 4;
  std::optional<std::string> bt = bias ? weightType(in[3]) : wt;
  if (!bt || (bias && weightNumel(in[3]) != CD))
    return fail(i, "bias must have " + std::to_string(CD) + " elements");
  includes.insert("nf_mamba.cuh");
  const std::string targs = "<" + *wt + ", " + *bt + ", " + num(CD) + ", " +
                            num(KW) + ", " + (bias ? "true" : "false") + ">";
  const std::string biasPtr =
      bias ? weightPtr(in[3]) : "static_cast<const " + *bt + " *>(nullptr)";
  const std::string window = "nf::storage(a, " + num(2 * op.storage) + ")";
  const std::string mode = stringAttr(op, attr::Mode).value_or("prefill");
  if (mode == "decode") {
    addLaunch(fnName(i, "causal_conv"), elementGrid(maxTokens * CD), 256,
              "  nf::causal_conv_seq" + targs + "(a, " + arenaPtr(in[1]) +
                  ", " + weightPtr(in[2]) + ", " + biasPtr + ", " + window +
                  ", " + arenaPtr(out[0]) + ");\n",
              "nf_kv.causal_conv (decode: one thread per sequence and "
              "channel)",
              minTokens);
    return size_t(1);
  }
  addLaunch(fnName(i, "causal_conv"), elementGrid(ceilDiv(maxTokens, 8) * CD),
            256,
            "  nf::causal_conv_out" + targs + "(a, " + arenaPtr(in[1]) + ", " +
                weightPtr(in[2]) + ", " + biasPtr + ", " + window + ", " +
                arenaPtr(out[0]) + ");\n",
            "nf_kv.causal_conv: outputs (reads the old conv window)");
  addLaunch(fnName(i, "conv_window"), elementGrid(maxTokens * CD), 256,
            "  nf::causal_conv_window<" + num(CD) + ", " + num(KW) + ">(a, " +
                arenaPtr(in[1]) + ", " + window + ");\n",
            "nf_kv.causal_conv: advance the conv window");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::ssm(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  const PlanStorage *st = storageOf(op, pl::StorageKind::MambaState);
  if (!st)
    return fail(i, "needs a MambaState storage");
  if (in.size() != 6 || out.size() != 1 ||
      V(in[0]).kind != pl::ValueKind::Batch || !isAct(in[1]) || !isAct(in[2]) ||
      !isAct(out[0]))
    return fail(i, "expects (batch, xbc, dt, dt_bias, A_log, D) -> y");
  const int64_t NH = st->numHeads, P = st->headDim, N = st->stateSize,
                CD = st->convDim;
  if (NH <= 0 || P <= 0 || N <= 0 || CD <= NH * P ||
      (CD - NH * P) % (2 * N) != 0)
    return fail(i, "bad mamba state sizes");
  const int64_t G = (CD - NH * P) / (2 * N);
  auto t3 = weightType(in[3]), t4 = weightType(in[4]), t5 = weightType(in[5]);
  if (NH % G || V(in[1]).cols != CD || V(in[2]).cols != NH ||
      V(out[0]).cols != NH * P || !t3 || !t4 || !t5 ||
      weightNumel(in[3]) != NH || weightNumel(in[4]) != NH ||
      weightNumel(in[5]) != NH)
    return fail(i, "operands do not match the state");
  auto lo = floatAttr(op, attr::TimeStepMin),
       hi = floatAttr(op, attr::TimeStepMax);
  if (!lo || !hi)
    return fail(i, "missing time_step_min / time_step_max");
  // NS threads per head channel, each holding N / NS (<= 16 where
  // possible) state values (nf_mamba.cuh).
  const int64_t NS = shapes::ssmThreadsPerChannel(N);
  // nf-cuda-epilogues' choice: the gated norm after a decode update, in its
  // launch for steps of up to nf.epilogue_max_tokens tokens.
  auto epilogue = epilogueOf(i);
  if (!epilogue)
    return epilogue.status();
  const bool fuseNorm =
      *epilogue == std::vector<std::string>{"nf.gated_rms_norm"};
  if (!epilogue->empty() && !fuseNorm)
    return fail(i, "nf.epilogue: no CUDA epilogue of the SSM computes " +
                       epilogue->front());
  includes.insert("nf_mamba.cuh");
  const std::string state = "nf::storage(a, " + num(2 * op.storage + 1) + ")";
  // Decode: a warp per (sequence, head, 32 / NS channels), no shared
  // memory or barriers (ssm_decode); the H200, Nano at batch 32: see
  // docs/performance.md.
  if (opCode(op) == OpCode::SsmUpdate && shapes::ssmDecodeFits(NH, P, N, CD)) {
    // With the gated norm of its result (nf-cuda-epilogues; groups = the
    // state's groups):
    // steps whose clusters fit the GPU at a block an SM (a block per head:
    // up to SMs / NH tokens, Nano 2) run both in one launch of clusters
    // (ssm_gated_decode; the norm's launch was 3.9 us a layer on the
    // step's critical path at batch 1, the step 3.16 -> 3.11 ms on the
    // H200), larger ones as two launches: a cluster walks its items one
    // after another, barriers in each, where ssm_update streams the state
    // at its bytes (batch 8 with clusters up to 16 tokens: 5.07 -> 5.41
    // ms).
    const int64_t HPG = NH / G, warpsPerHead = P / (32 / NS);
    const int64_t fusedTokens =
        intAttr(op, "nf.epilogue_max_tokens").value_or(0);
    if (fuseNorm) {
      const PlanOp &nop = *ops[i + 1];
      auto nin = operands(nop), nout = results(nop);
      auto groups = intAttr(nop, attr::Groups);
      auto eps = floatAttr(nop, attr::Epsilon);
      auto wt = nin.size() == 3 ? weightType(nin[2]) : std::nullopt;
      if (!(opts.hopperOrLater && fusedTokens > 0 && !needed(out[0], {i + 1}) &&
            shapes::ssmGatedDecodeFits(P, N, HPG) && nin.size() == 3 &&
            nout.size() == 1 && nin[0] == out[0] && isAct(nin[1]) &&
            isAct(nout[0]) && V(nin[1]).cols == NH * P &&
            V(nout[0]).cols == NH * P && wt && weightNumel(nin[2]) == NH * P &&
            groups && *groups == G && eps))
        return notInEpilogue(i + 1);
      includes.insert("nf_rows.cuh");
      const int64_t clusters = std::min(maxTokens, fusedTokens) * G;
      addLaunch(fnName(i, "ssm_gated_decode"),
                static_cast<uint32_t>(clusters * HPG), 32 * warpsPerHead,
                "  nf::ssm_gated_decode<" + *t3 + ", " + *t4 + ", " + *t5 +
                    ", " + *wt + ", " + num(NH) + ", " + num(P) + ", " +
                    num(N) + ", " + num(G) + ", " + num(NS) + ">(a, " +
                    arenaPtr(in[1]) + ", " + arenaPtr(in[2]) + ", " +
                    weightPtr(in[3]) + ", " + weightPtr(in[4]) + ", " +
                    weightPtr(in[5]) + ", " + floatLit(*lo) + ", " +
                    floatLit(*hi) + ", " + state + ", " + arenaPtr(nin[1]) +
                    ", " + weightPtr(nin[2]) + ", " + doubleLit(*eps) + ", " +
                    outPtr(nout[0]) + ");\n",
                opName(op) + " + nf.gated_rms_norm: a cluster of a group's " +
                    num(HPG) +
                    " heads per (sequence, group), a block per "
                    "head, the norm over distributed shared memory",
                0, maxTokens > fusedTokens ? fusedTokens : 0,
                /*bodyWaits=*/true);
      functions.back().clusterBlocks = static_cast<int>(HPG);
      if (maxTokens <= fusedTokens)
        return size_t(2);
    }
    const int64_t warps = maxTokens * NH * (P / (32 / NS));
    addLaunch(fnName(i, "ssm_update"),
              gridOf(ceilDiv(warps, 8), int64_t(opts.smCount) * 4), 256,
              "  nf::ssm_decode<" + *t3 + ", " + *t4 + ", " + *t5 + ", " +
                  num(NH) + ", " + num(P) + ", " + num(N) + ", " + num(G) +
                  ", " + num(NS) + ">(a, " + arenaPtr(in[1]) + ", " +
                  arenaPtr(in[2]) + ", " + weightPtr(in[3]) + ", " +
                  weightPtr(in[4]) + ", " + weightPtr(in[5]) + ", " +
                  floatLit(*lo) + ", " + floatLit(*hi) + ", " + state + ", " +
                  arenaPtr(out[0]) + ");\n",
              opName(op) + ": a warp per (sequence, head, " + num(32 / NS) +
                  " channels), tokens in order",
              fuseNorm ? fusedTokens + 1 : 0, 0, /*bodyWaits=*/true);
    if (!fuseNorm)
      return size_t(1);
    auto norm = gatedRmsNorm(i + 1, fusedTokens + 1);
    if (!norm)
      return norm;
    return size_t(2);
  }
  if (fuseNorm) // only the decode update's warp layout has the fused form
    return notInEpilogue(i + 1);
  // The form nf-cuda-scan-forms chose (prefill scans; updates walk).
  const std::string form = opCode(op) == OpCode::SsmScan
                               ? stringAttr(op, "nf.scan_form").value_or("")
                               : std::string("sequential");
  if (form.empty())
    return fail(i, "has no nf.scan_form (nf-cuda-scan-forms)");
  constexpr int64_t kChunk = shapes::kSsmChunk;
  const int64_t terms = opts.matmulTerms;
  // Prefill on tensor cores (SSD's matrix form, nf_mamba.cuh ssd_chunk):
  // chunks of kChunk tokens, sub-chunks of nf.scan_sub_chunk tokens.
  // Measured on the H200 at the Nano shape, 8192 tokens
  // (bench/kernels/ssd_check.cu): 0.80 ms per layer with bf16 inputs, 1.96
  // with exact products, against 2.20 for the walk.
  if (form == "ssd") {
    const int64_t kSub = intAttr(op, "nf.scan_sub_chunk").value_or(0);
    if (!(opts.ampereOrLater && (kSub == 64 || kSub == 32) && st->slots > 0 &&
          shapes::ssdFits(P, N, kSub, terms, opts.maxSharedBytes)))
      return fail(i, "nf.scan_form \"ssd\" needs sm_80, head channels and "
                     "state in mma's tiles and nf.scan_sub_chunk (32 or 64) "
                     "tiles in shared memory");
    const int64_t cmax = ceilDiv(maxTokens, kChunk);
    auto smemOfSub = [&](bool states) {
      return shapes::ssdChunkSmem(P, N, kSub, terms, states);
    };
    std::string local = "static_cast<float *>(nullptr)", decay = local;
    const std::string common = ", " + num(NH) + ", " + num(P) + ", " + num(N) +
                               ", " + num(G) + ", " + num(kChunk) + ", " +
                               num(cmax) + ", " + num(kSub) + ", " + num(terms);
    auto body = [&](bool states) {
      const std::string tmpl = "<" + *t3 + ", " + *t4 + ", " + *t5 + common +
                               (states ? ", true>" : ", false>");
      return "  static_assert(nf::ssd_chunk_smem<" + num(P) + ", " + num(N) +
             ", " + num(kSub) + ", " + num(terms) +
             (states ? ", true>" : ", false>") +
             "() == " + num(smemOfSub(states)) +
             ", \"shared memory size\");\n  nf::ssd_chunk" + tmpl + "(a, " +
             arenaPtr(in[1]) + ", " + arenaPtr(in[2]) + ", " +
             weightPtr(in[3]) + ", " + weightPtr(in[4]) + ", " +
             weightPtr(in[5]) + ", " + floatLit(*lo) + ", " + floatLit(*hi) +
             ", " + state + ", " + arenaPtr(out[0]) + ", " + local + ", " +
             decay + ");\n";
    };
    const uint32_t block = static_cast<uint32_t>(32 * (P / 16));
    if (maxTokens > kChunk) {
      const int64_t slots = shapes::ssmChunkStates(maxTokens, st->slots);
      local = "nf::arena<float>(a, " +
              num(scratchOf(op, slots * NH * P * N * 4)) + "ll)";
      decay =
          "nf::arena<float>(a, " + num(scratchOf(op, slots * NH * 4)) + "ll)";
      addLaunch(fnName(i, "ssd_states"),
                gridOf(cmax * NH, int64_t(opts.smCount) * 8), block, body(true),
                "nf_kv.ssm_scan, chunked on tensor cores: each chunk's state "
                "from zero and its decay (generated scratch)");
      launches.back().sharedBytes = static_cast<uint32_t>(smemOfSub(true));
      addLaunch(fnName(i, "ssm_chunk_carry"), elementGrid(NH * P * N), 256,
                "  nf::ssm_chunk_carry<" + num(NH) + ", " + num(P) + ", " +
                    num(N) + ", " + num(kChunk) + ">(a, " + state + ", " +
                    local + ", " + decay + ");\n",
                "nf_kv.ssm_scan, chunked: chunk inits in order");
    }
    addLaunch(fnName(i, "ssd_scan"),
              gridOf(cmax * NH, int64_t(opts.smCount) * 8), block, body(false),
              "nf_kv.ssm_scan on tensor cores: a block per (sequence, chunk, "
              "head), sub-chunks of " +
                  num(kSub) + " tokens in order");
    launches.back().sharedBytes = static_cast<uint32_t>(smemOfSub(false));
    return size_t(1);
  }
  // The walk: nf-cuda-launch-tiles' PT head channels a block and TC tokens
  // a staged chunk.
  const std::optional<std::vector<int64_t>> tile = listAttr(op, "nf.walk_tile");
  if (!tile || tile->size() != 2)
    return fail(i, "has no nf.walk_tile (nf-cuda-launch-tiles)");
  const int64_t PT = (*tile)[0], TC = (*tile)[1];
  if (PT <= 0 || P % PT != 0 || PT * NS > 128 || TC <= 0 || TC > 32 ||
      TC * shapes::ssmWalkBytesPerToken(PT, N) > shapes::kSsmWalkSharedBytes)
    return fail(i, "nf.walk_tile [" + num(PT) + ", " + num(TC) +
                       "] does not fit the walk's block or shared memory");
  const int64_t block = PT * NS;
  const int64_t items = maxTokens * NH * (P / PT);
  // Prefill steps longer than a chunk: the chunked scan (nf_mamba.cuh), so
  // a long sequence's chunks walk in parallel.
  const bool chunked = form == "chunked";
  if (chunked && !(maxTokens > kChunk && st->slots > 0 &&
                   shapes::ssmChunkedWalkFits(P, N)))
    return fail(i, "nf.scan_form \"chunked\" needs steps longer than a "
                   "chunk, head channels a multiple of 4 and state of 8");
  if (!chunked && form != "sequential")
    return fail(i, "unknown nf.scan_form \"" + form + "\"");
  std::string chunkArgs, chunkInit;
  if (chunked) {
    const int64_t cmax = ceilDiv(maxTokens, kChunk);
    const int64_t slots = shapes::ssmChunkStates(maxTokens, st->slots);
    const int64_t localOff = scratchOf(op, slots * NH * P * N * 4);
    const int64_t decayOff = scratchOf(op, slots * NH * 4);
    const std::string local = "nf::arena<float>(a, " + num(localOff) + "ll)";
    const std::string decay = "nf::arena<float>(a, " + num(decayOff) + "ll)";
    addLaunch(fnName(i, "ssm_chunk_states"),
              gridOf(cmax * NH, int64_t(opts.smCount) * 8), 256,
              "  nf::ssm_chunk_states<" + *t3 + ", " + *t4 + ", " + num(NH) +
                  ", " + num(P) + ", " + num(N) + ", " + num(G) + ", " +
                  num(kChunk) + ", " + num(cmax) + ">(a, " + arenaPtr(in[1]) +
                  ", " + arenaPtr(in[2]) + ", " + weightPtr(in[3]) + ", " +
                  weightPtr(in[4]) + ", " + floatLit(*lo) + ", " +
                  floatLit(*hi) + ", " + local + ", " + decay + ");\n",
              "nf_kv.ssm_scan, chunked: each chunk's state from zero and its "
              "decay (generated scratch)");
    addLaunch(fnName(i, "ssm_chunk_carry"), elementGrid(NH * P * N), 256,
              "  nf::ssm_chunk_carry<" + num(NH) + ", " + num(P) + ", " +
                  num(N) + ", " + num(kChunk) + ">(a, " + state + ", " + local +
                  ", " + decay + ");\n",
              "nf_kv.ssm_scan, chunked: chunk inits in order");
    chunkArgs = ", " + num(kChunk) + ", " + num(cmax);
    chunkInit = ", " + local;
  }
  addLaunch(
      fnName(i, opCode(op) == OpCode::SsmUpdate ? "ssm_update" : "ssm_scan"),
      gridOf(items, int64_t(opts.smCount) * 8), static_cast<uint32_t>(block),
      "  nf::ssm_scan<" + *t3 + ", " + *t4 + ", " + *t5 + ", " + num(NH) +
          ", " + num(P) + ", " + num(N) + ", " + num(G) + ", " + num(PT) +
          ", " + num(NS) + ", " + num(TC) + chunkArgs + ">(a, " +
          arenaPtr(in[1]) + ", " + arenaPtr(in[2]) + ", " + weightPtr(in[3]) +
          ", " + weightPtr(in[4]) + ", " + weightPtr(in[5]) + ", " +
          floatLit(*lo) + ", " + floatLit(*hi) + ", " + state + ", " +
          arenaPtr(out[0]) + chunkInit + ");\n",
      opName(op) + (chunked ? ": sequential over each chunk's tokens"
                            : ": sequential over each sequence's tokens"));
  return size_t(1);
}

} // namespace nf::codegen::detail
