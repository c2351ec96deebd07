//===- EmitMoe.cpp - mixture of experts -> CUDA ---------------------------===//
//
// KernelEmitter's routed mixture-of-experts ops (kernels/nf_moe.cuh): the
// router and selection (logits, ranking, the budget policy), the dispatch,
// the stacked experts' projections, one-token experts on the ranking's
// slots, and the combine (with the layer's adds and next norm fused).
//
//===----------------------------------------------------------------------===//

#include "Target/Cuda/KernelEmitter.h"

namespace nf::codegen::detail {

StatusOr<size_t> KernelEmitter::route(size_t i) {
  const PlanOp &first = *ops[i];
  const bool isRouter = opCode(first) == OpCode::Router;
  std::string wg = "float", wb = "float", x = "nullptr", gate = "nullptr",
              bias = "nullptr";
  int64_t E = 0, H = 1;
  int xV = -1, scoresV = -1, selV = -1;
  size_t sel = i;
  if (isRouter) {
    auto in = operands(first), out = results(first);
    if (in.size() != 3 || out.size() != 2 || !isAct(in[0]) || !isAct(out[0]) ||
        !isAct(out[1]))
      return fail(i, "expects (input, weight, correction_bias) -> (scores, "
                     "selection_scores)");
    auto shape = weightShape(in[1]);
    auto gt = weightType(in[1]), bt = weightType(in[2]);
    if (!gt || !bt || shape.size() != 2 || shape[1] != V(in[0]).cols)
      return fail(i, "gate weight does not match the input");
    if (int4Weight(in[1]))
      return fail(i, "int4 router weights have no CUDA kernels");
    E = shape[0];
    H = shape[1];
    if (weightNumel(in[2]) != E || V(out[0]).cols != E || V(out[1]).cols != E)
      return fail(i, "bias and scores must have " + std::to_string(E) +
                         " experts");
    wg = *gt;
    wb = *bt;
    xV = in[0];
    x = arenaPtr(in[0]);
    gate = weightPtr(in[1]);
    bias = weightPtr(in[2]);
    scoresV = out[0];
    selV = out[1];
    sel = i + 1;
    // A select that reads both scores fuses with the router.
    if (!(sel < ops.size() && opCode(*ops[sel]) == OpCode::Select &&
          operands(*ops[sel]).size() == 3 &&
          operands(*ops[sel])[0] == scoresV && operands(*ops[sel])[1] == selV))
      sel = ops.size();
  }
  std::string body;
  includes.insert("nf_moe.cuh");
  // Every form but the logits GEMM reads the input as f32 rows.
  auto checkF32Input = [&] {
    if (xV >= 0 && rowsBf16(xV) && x != "nullptr")
      internalError =
          fnName(i, "router") + " reads bf16 rows but is not the logits GEMM";
  };
  if (sel >= ops.size()) { // the router alone
    checkF32Input();
    addLaunch(fnName(i, "router"), gridOf(maxTokens, int64_t(opts.smCount) * 4),
              256,
              "  nf::moe_route<" + wg + ", " + wb + ", " + num(E) + ", " +
                  num(H) + ", 1, 1, 1, true, false, false, false>(a, " + x +
                  ", " + gate + ", " + bias + ", " + arenaPtr(scoresV) + ", " +
                  arenaPtr(selV) + ", nullptr, nullptr, nullptr, 1.0f);\n",
              "nf_moe.router: one block per token, logits in f64");
    return size_t(1);
  }
  const PlanOp &op = *ops[sel];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 3 || !isAct(in[0]) || !isAct(in[1]))
    return fail(sel, "expects (scores, selection_scores, budget) -> "
                     "(experts, weights, counts)");
  if (!isRouter) {
    E = V(in[0]).cols;
    scoresV = in[0];
    selV = in[1];
  }
  if (V(in[0]).cols != E || V(in[1]).cols != E)
    return fail(sel, "scores and selection scores differ");
  std::string budget;
  if (V(in[2]).kind == pl::ValueKind::Budget)
    budget = "a->budget";
  else if (isAct(in[2]) && V(in[2]).cols == 1)
    budget = arenaPtr(in[2]);
  else
    return fail(sel, "budget must be the step's per-token budget");
  auto K = intAttr(op, attr::TopK), nGroup = intAttr(op, attr::NGroup),
       topkGroup = intAttr(op, attr::TopkGroup),
       norm = intAttr(op, attr::NormTopkProb);
  auto rsf = floatAttr(op, attr::RoutedScalingFactor);
  if (!K || !nGroup || !topkGroup || !norm || !rsf)
    return fail(sel, "missing top_k, n_group, topk_group, norm_topk_prob or "
                     "routed_scaling_factor");
  const int64_t minK = intAttr(op, attr::MinK).value_or(*K);
  const std::string policy = stringAttr(op, attr::Policy).value_or("topk");
  if (policy != "topk" && policy != "budget")
    return fail(sel, "unknown policy '" + policy + "'");
  if (*nGroup <= 0 || E % *nGroup || *topkGroup <= 0 || *topkGroup > *nGroup ||
      *K <= 0 || *K > 32 || E > 1024)
    return fail(sel, "unsupported routing (experts " + std::to_string(E) +
                         ", top_k " + std::to_string(*K) + ", groups " +
                         std::to_string(*nGroup) + ")");
  if (!isTensor(out[0], pl::DType::I32) || V(out[0]).cols != *K ||
      !isAct(out[1]) || V(out[1]).cols != *K ||
      !isTensor(out[2], pl::DType::I32) || V(out[2]).cols != 1)
    return fail(sel, "results must be i32 [T, top_k], f32 [T, top_k], i32 [T]");
  const bool defer = policy == "budget";
  const std::string experts = arenaPtr(out[0], "int32_t"),
                    weights = arenaPtr(out[1]),
                    counts = arenaPtr(out[2], "int32_t");
  // The logits over the whole grid first, in the form nf-cuda-launch-tiles
  // chose; the per-token blocks then only rank.
  std::string pre = "nullptr";
  if (isRouter) {
    const std::string form = stringAttr(first, "nf.router_logits").value_or("");
    if (form.empty())
      return fail(i, "has no nf.router_logits (nf-cuda-launch-tiles)");
    if (form != "warp" && phase == "decode")
      return fail(i, "nf.router_logits \"" + form + "\" in a decode step");
    const int64_t off = scratchOf(first, maxTokens * E * 2 * 8);
    pre = "nf::arena<double>(a, " + num(off) + "ll)";
    auto tiles = listsAttr(first, "nf.router_tiles");
    if ((form == "dmma" || form == "tiles") && tiles.empty())
      return fail(i, "has no nf.router_tiles (nf-cuda-launch-tiles)");
    for (const std::vector<int64_t> &t : tiles) {
      // [tokens, experts (0: all), first, last step size (0: unbounded)]
      if (t.size() != 4 || t[0] <= 0 || t[1] < 0 || t[2] < 0 || t[3] < 0 ||
          (form == "dmma") != (t[1] == 0))
        return fail(i, "bad nf.router_tiles entry");
      const std::string suffix = tiles.size() == 1 ? ""
                                 : t[3] > 0        ? "_small"
                                                   : "_large";
      const int64_t tokens = t[0];
      const int64_t rows = t[3] > 0 ? t[3] : maxTokens;
      const auto minT = static_cast<uint32_t>(t[2]),
                 maxT = static_cast<uint32_t>(t[3]);
      if (form == "dmma") {
        if (!(opts.ampereOrLater && shapes::routerDmmaFits(tokens, E)))
          return fail(i, "router logits on f64 tensor cores need sm_80 and "
                         "slices that fit static shared memory");
        addLaunch(fnName(i, "router_logits") + suffix,
                  gridOf(ceilDiv(rows, tokens), int64_t(opts.smCount) * 8), 256,
                  "  nf::moe_router_logits_dmma<" + wg + ", " + wb + ", " +
                      num(E) + ", " + num(H) + ", " + num(tokens) + ">(a, " +
                      x + ", " + gate + ", " + bias + ", " + arenaPtr(scoresV) +
                      ", " + arenaPtr(selV) + ", " + pre + ");\n",
                  "nf_moe.router: logits of " + num(tokens) +
                      " tokens a block, f64 tensor cores",
                  minT, maxT);
      } else {
        const int64_t experts = t[1];
        addLaunch(fnName(i, "router_logits") + suffix,
                  gridOf(ceilDiv(rows, tokens) * ceilDiv(E, experts),
                         int64_t(opts.smCount) * 8),
                  256,
                  "  nf::moe_router_logits_tiled<" + wg + ", " + wb + ", " +
                      num(E) + ", " + num(H) + ", " + num(tokens) + ", " +
                      num(experts) + ">(a, " + x + ", " + gate + ", " + bias +
                      ", " + arenaPtr(scoresV) + ", " + arenaPtr(selV) + ", " +
                      pre + ");\n",
                  "nf_moe.router: logits in tiles of " + num(tokens) + " x " +
                      num(experts) + " (tokens x experts), f64",
                  minT, maxT);
      }
    }
    // With bf16 matmul inputs the logits are a GEMM of the input rounded to
    // bf16 (as bf16 frameworks compute them: products exact, sums in f32)
    // whose epilogue computes s and sb (f64) from each f32 logit.
    if (form == "gemm") {
      if (!(bf16RowsAllowed(opts) && gemmPath(first, 0) == kBf16Planes))
        return fail(i, "router logits as a GEMM need bf16 inputs on the "
                       "bf16-plane path");
      LinearSpec s = LinearSpec::of(first, 0, wg, E, H);
      s.weight = gate;
      setInput(s, xV);
      s.rowIndex = "r";
      s.maxRows = maxTokens;
      s.store = "    {\n      double sc, sb;\n      nf::router_score("
                "static_cast<double>(v), " +
                bias + ", n, static_cast<long long>(r) * " + num(E) + " + n, " +
                arenaPtr(scoresV) + ", " + arenaPtr(selV) + ", " + pre +
                ", sc, sb);\n    }\n";
      emitLinear(fnName(i, "router_logits"), s,
                 "nf_moe.router: logits on the bf16 GEMM, s and sb in f64");
      x = "nullptr"; // moe_route reads s and sb from `pre`, not the rows
    } else if (form == "warp") {
      addLaunch(
          fnName(i, "router_logits"),
          gridOf(ceilDiv(maxTokens * E, 8), int64_t(opts.smCount) * 8), 256,
          "  nf::moe_router_logits<" + wg + ", " + wb + ", " + num(E) + ", " +
              num(H) + ">(a, " + x + ", " + gate + ", " + bias + ", " +
              arenaPtr(scoresV) + ", " + arenaPtr(selV) + ", " + pre + ");\n",
          "nf_moe.router: logits, a warp per (token, expert), f64");
      functions.back().sliceable = true;
    } else if (form != "dmma" && form != "tiles") {
      return fail(i, "unknown nf.router_logits \"" + form + "\"");
    }
  }
  checkF32Input();
  // The step's expert statistics, where the step has a region for them.
  std::string statArgs;
  if (expertStats && expertStats->offset >= 0 &&
      expertStats->layerOf.count(&op))
    statArgs =
        ", " + expertStats->counts(&op) + ", " + expertStats->experts(&op);
  // Decode steps have one token per sequence: the budget decision is then
  // per token and made by moe_route itself (no moe_budget launch).
  const bool oneTokenBudget = defer && phase == "decode";
  addLaunch(
      fnName(i, isRouter ? "moe_route" : "moe_select"),
      gridOf(maxTokens, int64_t(opts.smCount) * 4), 256,
      "  nf::moe_route<" + wg + ", " + wb + ", " + num(E) + ", " + num(H) +
          ", " + num(*K) + ", " + num(*nGroup) + ", " + num(*topkGroup) + ", " +
          (isRouter ? "true" : "false") + ", true, " +
          (defer ? "true" : "false") + ", " + (*norm ? "true" : "false") +
          ", " + (oneTokenBudget ? "true" : "false") + ">(a, " + x + ", " +
          gate + ", " + bias + ", " + arenaPtr(scoresV) + ", " +
          arenaPtr(selV) + ", " + experts + ", " + weights + ", " + counts +
          ", " + floatLit(*rsf) + ", " + pre + ", " +
          (oneTokenBudget ? budget + ", " + num(minK) : "nullptr, 0") +
          statArgs + ");\n",
      std::string(isRouter ? "nf_moe.router + " : "") + "nf_moe.select (" +
          policy + (oneTokenBudget ? ", one token per sequence" : "") +
          "): one block per token, ranking by warp argmax");
  functions.back().sliceable = true;
  if (defer && !oneTokenBudget)
    addLaunch(fnName(sel, "moe_budget"),
              gridOf(maxTokens, int64_t(opts.smCount)), 256,
              "  nf::moe_budget<" + num(*K) + ", " + num(E) + ">(a, " + budget +
                  ", " + experts + ", " + weights + ", " + counts + ", " +
                  num(minK) + ", " + (*norm ? "true" : "false") + ", " +
                  floatLit(*rsf) + statArgs + ");\n",
              "nf_moe.select (budget): one block per sequence decides each "
              "token's expert count");
  return sel + 1 - i;
}

StatusOr<size_t> KernelEmitter::dispatch(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isTensor(in[0], pl::DType::I32) ||
      !isTensor(in[1], pl::DType::I32) || V(in[1]).cols != 1 ||
      V(out[0]).kind != pl::ValueKind::Dispatch)
    return fail(i, "expects (experts i32 [T, k], counts i32 [T]) -> dispatch");
  const ValueInfo &d = V(out[0]);
  const int64_t K = V(in[0]).cols;
  if (K > d.maxPerToken || d.numExperts <= 0 || d.numExperts > 4096)
    return fail(i, "experts per token exceed the dispatch's");
  if (K > 32)
    return fail(i, "more than 32 experts per token");
  // Warps of the one block: about 128 assignments each at the step's most
  // tokens (fewer warps are quicker through the block's scans at decode
  // sizes), up to 32, and per-warp counters of every expert in 32 KiB.
  const int64_t warps =
      std::clamp<int64_t>(ceilDiv(maxTokens * K, 128), 1,
                          std::clamp<int64_t>(8192 / d.numExperts, 1, 32));
  includes.insert("nf_moe.cuh");
  addLaunch(fnName(i, "moe_dispatch"), 1, static_cast<uint32_t>(32 * warps),
            "  nf::moe_dispatch<" + num(d.numExperts) + ", " + num(K) + ", " +
                num(d.maxPerToken) + ", " + num(warps) + ">(a, " +
                arenaPtr(in[0], "int32_t") + ", " + arenaPtr(in[1], "int32_t") +
                ", " + arenaPtr(out[0], "int32_t") + ");\n",
            "nf_moe.dispatch: one block, counting sort by expert");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::expert(size_t i, bool up) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 1 ||
      V(in[1]).kind != pl::ValueKind::Dispatch ||
      !isTensor(out[0], pl::DType::F32) ||
      V(out[0]).rows != pl::Rows::Assignments ||
      !isTensor(in[0], pl::DType::F32) ||
      V(in[0]).rows != (up ? pl::Rows::Tokens : pl::Rows::Assignments))
    return fail(i, "expects (input, dispatch, weight) -> assignment rows");
  const ValueInfo &d = V(in[1]);
  auto shape = weightShape(in[2]);
  auto wt = weightType(in[2]);
  const PlanWeight *w = weightOf(in[2]);
  if (!wt || !w || shape.size() != 3 || shape[0] != d.numExperts ||
      shape[2] != V(in[0]).cols || shape[1] != V(out[0]).cols)
    return fail(i, "weight is not [experts, out, in] stacked experts");
  LinearSpec s = LinearSpec::of(op, 0, *wt, shape[1], shape[2]);
  s.G = d.numExperts;
  // The down projection follows the up projection of the same dispatch,
  // which lets the next launch start only after its own wait: the dispatch
  // is complete when the down projection starts, so it reads the groups and
  // fetches its first weights before waiting (H200, Nano: batch 1 3.12 ->
  // 3.09 ms, batch 32 7.19 -> 7.16 with the router's prefetch moved,
  // bench/results/2026-12-02).
  const bool groupsEarly =
      !up && i > 0 && opCode(*ops[i - 1]) == OpCode::ExpertUp &&
      operands(*ops[i - 1]).size() == 3 && operands(*ops[i - 1])[1] == in[1];
  s.groups = "nf::DispatchGroups<" + num(d.numExperts) + ", " + num(d.offset) +
             "ll" + (groupsEarly ? ", true>" : ">");
  s.groupsAfterWait = !groupsEarly;
  s.weight = weightPtr(in[2]) + " + static_cast<long long>(g) * " +
             num(s.N * s.K) + "ll";
  setQuantised(s, in[2], "static_cast<long long>(g) * " + num(s.N) + "ll");
  setInput(s, in[0]);
  s.rowIndex = up ? "row_token(a)[r]" : "r";
  s.rowsPerToken = up ? 1 : d.maxPerToken;
  std::string act;
  if (up) {
    auto kind = activationKind(i, attr::Activation, false);
    if (!kind)
      return kind.status();
    act = *kind;
  }
  auto valueOf = [&](const std::string &v) {
    return up ? "nf::activate<" + act + ">(" + v + ")" : v;
  };
  const std::string index = "static_cast<long long>(r) * " + num(s.N) + " + n";
  s.store = storeAct(out[0], index, valueOf("v"));
  s.store2 = storeAct2(out[0], index, valueOf("v0"), valueOf("v1"));
  s.maxRows = maxTokens * d.maxPerToken;
  emitLinear(fnName(i, up ? "expert_up" : "expert_down"), s, opName(op));
  return size_t(1);
}

/// Steps of one token in a decode MoE layer that ends in
/// moe_combine_add_rms_norm (combineTail at d + 3): the routed experts read
/// the ranking's slots directly (nf::SlotGroups), so the dispatch does not
/// run, and the down projection ends the layer itself
/// (nf::row_experts_combine: the combine, both adds and the next norm), so
/// moe_combine_add_rms_norm does not run. Appends the up and down
/// projections' "_row" launches (token range: as emitLinear's row variant);
/// false (nothing appended) where the layer does not fit this form.
bool KernelEmitter::oneTokenExperts(size_t d) {
  if (d + 3 >= ops.size() || opCode(*ops[d]) != OpCode::Dispatch ||
      opCode(*ops[d + 1]) != OpCode::ExpertUp ||
      opCode(*ops[d + 2]) != OpCode::ExpertDown)
    return false;
  std::optional<CombineTail> c = combineTail(d + 3);
  if (!c)
    return false;
  auto din = operands(*ops[d]), dout = results(*ops[d]);
  auto uin = operands(*ops[d + 1]), uout = results(*ops[d + 1]);
  auto win = operands(*ops[d + 2]), wout = results(*ops[d + 2]);
  auto cin = operands(*ops[d + 3]);
  if (din.size() != 2 || dout.size() != 1 || uin.size() != 3 ||
      uout.size() != 1 || win.size() != 3 || wout.size() != 1 ||
      cin.size() != 3 || uin[1] != dout[0] || win[1] != dout[0] ||
      win[0] != uout[0] || cin[0] != wout[0] || cin[1] != dout[0])
    return false;
  const ValueInfo &disp = V(dout[0]);
  const int64_t KW = V(din[0]).cols;
  auto upShape = weightShape(uin[2]), downShape = weightShape(win[2]);
  // The hidden rows read as f32 (SlotGroups rows are slot rows, row_linear
  // and row_experts_combine read S::row); at most 8 slots (a register
  // per slot and lane).
  if (KW < 1 || KW > 8 || V(cin[2]).cols != KW || KW > disp.maxPerToken ||
      gemmPath(*ops[d + 1], 0) != kBf16Skinny ||
      gemmPath(*ops[d + 2], 0) != kBf16Skinny || upShape.size() != 3 ||
      downShape.size() != 3 || rowsBf16(uin[0]) || rowsBf16(uout[0]) ||
      !isTensor(uin[0], pl::DType::F32) || V(uin[0]).cols != upShape[2] ||
      downShape[2] != upShape[1] || downShape[1] != V(c->sum).cols)
    return false;
  auto act = activationKind(d + 1, attr::Activation, false);
  if (!act)
    return false;
  const std::string groups =
      "nf::SlotGroups<" + num(KW) + ", " + num(disp.numExperts) + ", " +
      num(V(din[0]).offset) + "ll, " + num(V(din[1]).offset) + "ll";
  auto slotSpec = [&](int weight, const std::vector<int64_t> &shape,
                      bool early) {
    LinearSpec s;
    s.path = kBf16Skinny;
    s.wtype = weightType(weight).value_or("");
    s.N = shape[1];
    s.K = shape[2];
    s.G = KW;
    s.groups = groups + (early ? ", true>" : ">");
    s.groupsAfterWait = !early;
    s.weight = weightPtr(weight) +
               " + static_cast<long long>(expert(a, g)) * " + num(s.N * s.K) +
               "ll";
    setQuantised(s, weight,
                 "static_cast<long long>(expert(a, g)) * " + num(s.N) + "ll");
    s.maxRows = KW;
    s.rowOnly = true;
    return s;
  };
  LinearSpec up = slotSpec(uin[2], upShape, false);
  setInput(up, uin[0]);
  up.rowIndex = "token_of(a, r)";
  const std::string index = "static_cast<long long>(r) * " + num(up.N) + " + n";
  up.store = storeAct(uout[0], index, "nf::activate<" + *act + ">(v)");
  emitLinear(fnName(d + 1, "expert_up_one"), up,
             "nf_moe.expert_up of one token: the ranking's slots (no "
             "dispatch)");
  const std::string fn = fnName(d + 2, "expert_down_one");
  LinearSpec down = slotSpec(win[2], downShape, true);
  setInput(down, uout[0]);
  down.rowIndex = "r";
  down.store = "    (void)a; (void)r; (void)n; (void)v;\n"; // sums instead
  text << "// Blocks of " << fn << "_row done (row_experts_combine).\n"
       << "__device__ unsigned " << fn << "_done;\n";
  const RowItem item = rowItemOf(!down.rowScales.empty());
  const std::string features =
      item.features > 1 ? ", " + num(item.features) : "";
  down.rowBody = "  nf::row_experts_combine<" + fn + "_spec, " +
                 num(item.chunks) + features + ">(a, " + arenaPtr(cin[2]) +
                 ", " + arenaPtr(c->shared) + ", " + arenaPtr(c->residual) +
                 ", " + arenaPtr(c->sum) + ", " + weightPtr(c->normWeight) +
                 ", " + doubleLit(c->eps) + ", " + outPtr(c->out) + ", &" + fn +
                 "_done);\n";
  emitLinear(fn, down,
             "nf_moe.expert_down + nf_moe.combine + nf.add (shared expert) + "
             "nf.add + nf.rms_norm of one token: a warp per feature over the "
             "slots, the last block normalises");
  return true;
}

std::optional<KernelEmitter::CombineTail>
KernelEmitter::combineTail(size_t i) const {
  // nf-cuda-epilogues' choice (epilogueOf checks that the ops follow).
  if (i >= ops.size() || opCode(*ops[i]) != OpCode::Combine)
    return std::nullopt;
  auto epilogue = epilogueOf(i);
  if (!epilogue ||
      *epilogue != std::vector<std::string>{"nf.add", "nf.add", "nf.rms_norm"})
    return std::nullopt;
  auto out = results(*ops[i]);
  auto a1 = operands(*ops[i + 1]), r1 = results(*ops[i + 1]);
  auto a2 = operands(*ops[i + 2]), r2 = results(*ops[i + 2]);
  auto nin = operands(*ops[i + 3]), nout = results(*ops[i + 3]);
  if (out.size() != 1)
    return std::nullopt;
  auto wt = nin.size() == 2 ? weightType(nin[1]) : std::nullopt;
  auto eps = floatAttr(*ops[i + 3], attr::Epsilon);
  const int64_t HE = V(out[0]).cols;
  if (!(a1.size() == 2 && r1.size() == 1 &&
        (a1[0] == out[0]) != (a1[1] == out[0]) && !needed(out[0], {i + 1}) &&
        a2.size() == 2 && r2.size() == 1 &&
        (a2[0] == r1[0]) != (a2[1] == r1[0]) && !needed(r1[0], {i + 2}) &&
        nin.size() == 2 && nin[0] == r2[0] && nout.size() == 1 && wt && eps &&
        weightNumel(nin[1]) == HE))
    return std::nullopt;
  CombineTail c;
  c.shared = a1[0] == out[0] ? a1[1] : a1[0];
  c.residual = a2[0] == r1[0] ? a2[1] : a2[0];
  c.sum = r2[0];
  c.out = nout[0];
  c.normWeight = nin[1];
  c.normType = *wt;
  c.eps = *eps;
  if (!isAct(c.shared) || !isAct(c.residual) || !isAct(c.sum) ||
      !isAct(c.out) || V(c.shared).cols != HE || V(c.residual).cols != HE ||
      V(c.out).cols != HE)
    return std::nullopt;
  return c;
}

StatusOr<size_t> KernelEmitter::combine(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 1 ||
      V(in[1]).kind != pl::ValueKind::Dispatch ||
      !isTensor(in[0], pl::DType::F32) ||
      V(in[0]).rows != pl::Rows::Assignments || !isAct(in[2]) ||
      !isAct(out[0]) || V(in[0]).cols != V(out[0]).cols ||
      V(in[2]).cols > V(in[1]).maxPerToken)
    return fail(i, "expects (assignment rows, dispatch, weights) -> rows");
  const ValueInfo &d = V(in[1]);
  const int64_t HE = V(out[0]).cols;
  includes.insert("nf_rows.cuh");
  // Followed by the add of the shared expert's rows, the residual add and
  // an RMSNorm of the sum (decode's "moe_combine_add_rms_norm"): one row
  // kernel gathers each token's routed rows, adds the shared rows and the
  // residual and normalises, with the same f32 operations in the same order
  // as the combine, the shared expert's epilogue add and add_rms_norm.
  if (std::optional<CombineTail> c = combineTail(i)) {
    addLaunch(fnName(i, "moe_combine_add_rms_norm"), blockGrid(maxTokens),
              kRowThreads,
              "  nf::moe_combine_add_rms_norm<" + c->normType + ", " + num(HE) +
                  ", " + num(V(in[2]).cols) + ", " + num(d.numExperts) + ", " +
                  num(d.maxPerToken) + ">(a, " + arenaPtr(c->residual) + ", " +
                  arenaPtr(in[0]) + ", " + arenaPtr(in[1], "int32_t") + ", " +
                  arenaPtr(in[2]) + ", " + arenaPtr(c->shared) + ", " +
                  arenaPtr(c->sum) + ", " + weightPtr(c->normWeight) + ", " +
                  doubleLit(c->eps) + ", " + outPtr(c->out) + ");\n",
              "nf_moe.combine + nf.add (shared expert) + nf.add + "
              "nf.rms_norm: one block per token");
    return size_t(4);
  }
  auto epilogue = epilogueOf(i);
  if (!epilogue)
    return epilogue.status();
  if (!epilogue->empty())
    return notInEpilogue(i + 1);
  // Four columns a thread where rows are whole float4s (the template's
  // choice).
  addLaunch(fnName(i, "moe_combine"),
            elementGrid(maxTokens * (HE % 4 == 0 ? HE / 4 : HE)), 256,
            "  nf::moe_combine<" + num(HE) + ", " + num(V(in[2]).cols) + ", " +
                num(d.numExperts) + ", " + num(d.maxPerToken) + ">(a, " +
                arenaPtr(in[0]) + ", " + arenaPtr(in[1], "int32_t") + ", " +
                arenaPtr(in[2]) + ", " + arenaPtr(out[0]) + ");\n",
            "nf_moe.combine: weighted sum of each token's expert rows");
  return size_t(1);
}

} // namespace nf::codegen::detail
