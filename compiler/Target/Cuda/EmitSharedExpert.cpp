//===- EmitSharedExpert.cpp - shared expert -> CUDA -----------------------===//
//
// KernelEmitter's nf_moe.shared_expert: its up and down projections, and
// in decode its co-launches beside the routing chain and the routed
// experts (routeSharedExpert). Separate from EmitMoe.cpp because the
// co-launch scheduling rearranges the launches of the whole MoE layer.
//
//===----------------------------------------------------------------------===//

#include "Target/Cuda/KernelEmitter.h"

namespace nf::codegen::detail {

StatusOr<size_t> KernelEmitter::sharedExpert(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 1 || !isAct(in[0]) || !isAct(out[0]))
    return fail(i, "expects (input, up, down) -> result");
  auto up = weightShape(in[1]), down = weightShape(in[2]);
  auto ut = weightType(in[1]), dt = weightType(in[2]);
  const int64_t H = V(in[0]).cols;
  if (!ut || !dt || up.size() != 2 || down.size() != 2 || up[1] != H ||
      down[1] != up[0] || down[0] != V(out[0]).cols)
    return fail(i, "weights do not match the input");
  auto act = activationKind(i, attr::Activation, false);
  if (!act)
    return act.status();
  const int64_t I = up[0];
  // The hidden rows as bf16 where the down GEMM would round them anyway
  // (as nf-cuda-row-formats does for plan values), f32 where it quantises
  // them to FP8.
  const bool hidden16 = bf16RowsAllowed(opts) &&
                        gemmPath(op, 1) == kBf16Planes &&
                        !quantisesInput(in[2]);
  const int64_t hidden = scratchOf(op, maxTokens * I * (hidden16 ? 2 : 4));
  const std::string hid =
      std::string(hidden16 ? "nf::arena<unsigned short>" : "nf::arena<float>") +
      "(a, " + num(hidden) + "ll)";
  // Decode: a bf16 copy for the wide down projection (as nf-cuda-row-formats
  // gives values), unless it quantises its input (then it reads f32 rows).
  const bool hiddenCopy = decodeCopies() && gemmPath(op, 1) == kBf16Skinny &&
                          !quantisesInput(in[2]);
  const std::string hidCopy =
      hiddenCopy ? "nf::arena<unsigned short>(a, " +
                       num(scratchOf(op, maxTokens * I * 2)) + "ll)"
                 : std::string();
  const std::string hidOut = hiddenCopy ? shadowedRows(hid, hidCopy) : hid;
  LinearSpec s1 = LinearSpec::of(op, 0, *ut, I, H);
  s1.weight = weightPtr(in[1]);
  setQuantised(s1, in[1]);
  setInput(s1, in[0]);
  s1.rowIndex = "r";
  s1.store = "    nf::store_act(" + hidOut + " + static_cast<long long>(r) * " +
             num(I) + " + n, nf::activate<" + *act + ">(v));\n";
  s1.store2 = "    nf::store_act2(" + hidOut +
              " + static_cast<long long>(r) * " + num(I) +
              " + n, nf::activate<" + *act + ">(v0), nf::activate<" + *act +
              ">(v1));\n";
  s1.maxRows = maxTokens;
  s1.wideWithExperts = true;
  emitLinear(fnName(i, "shared_up"), s1,
             "nf_moe.shared_expert: hidden = act(x . up^T) (codegen scratch "
             "at " +
                 num(hidden) + (hidden16 ? ", bf16 rows)" : ")"));
  LinearSpec s2 = LinearSpec::of(op, 1, *dt, down[0], I);
  s2.weight = weightPtr(in[2]);
  setQuantised(s2, in[2]);
  (hidden16 ? s2.input16 : s2.input) = hid;
  s2.shadow16 = hidCopy;
  s2.rowIndex = "r";
  // Followed by nf.add of its result and another row of the same width
  // (the routed experts' combined rows): the epilogue adds that row and
  // writes the sum instead (same value as the add: one f32 addition).
  std::string dst = arenaPtr(out[0]), addend, addend2;
  size_t consumed = 1;
  auto epilogue = epilogueOf(i);
  if (!epilogue)
    return epilogue.status();
  if (*epilogue == std::vector<std::string>{"nf.add"}) {
    if (needed(out[0], {i + 1}))
      return notInEpilogue(i + 1);
    auto ain = operands(*ops[i + 1]), aout = results(*ops[i + 1]);
    if (ain.size() == 2 && aout.size() == 1 &&
        (ain[0] == out[0]) != (ain[1] == out[0])) {
      const int other = ain[0] == out[0] ? ain[1] : ain[0];
      if (isAct(other) && isAct(aout[0]) && V(other).cols == s2.N &&
          V(aout[0]).cols == s2.N) {
        dst = arenaPtr(aout[0]);
        addend = " + " + arenaPtr(other) + "[static_cast<long long>(r) * " +
                 num(s2.N) + " + n]";
        addend2 = "    const float2 o = *reinterpret_cast<const float2 *>(" +
                  arenaPtr(other) + " + static_cast<long long>(r) * " +
                  num(s2.N) + " + n);\n";
        consumed = 2;
      }
    }
    if (consumed != 2)
      return notInEpilogue(i + 1);
  } else if (!epilogue->empty()) {
    return fail(i, "nf.epilogue: no CUDA epilogue of the shared expert "
                   "computes " +
                       epilogue->front());
  }
  s2.store = "    " + dst + "[static_cast<long long>(r) * " + num(s2.N) +
             " + n] = v" + addend + ";\n";
  s2.store2 = addend2 + "    nf::store_act2(" + dst +
              " + static_cast<long long>(r) * " + num(s2.N) + " + n, v0" +
              (addend2.empty() ? ", v1" : " + o.x, v1 + o.y") + ");\n";
  s2.maxRows = maxTokens;
  s2.wideWithExperts = true;
  emitLinear(fnName(i, "shared_down"), s2,
             consumed == 2
                 ? "nf_moe.shared_expert + nf.add: out = hidden . down^T + "
                   "the routed rows"
                 : "nf_moe.shared_expert: out = hidden . down^T");
  return consumed;
}

/// Decode's "moe_route_shared_expert" and "moe_shared_and_routed_experts":
/// the shared expert's GEMVs run side by side with other launches of its
/// layer (sideBySide), which leave most of the GPU idle or read other
/// weights.
///  - Steps of few tokens (the narrow variants, or every step without the
///    routed experts in the kernel): beside the routing chain, its up
///    projection with the router's logits, its down projection with the
///    ranking (moe_route); the dispatch follows.
///  - Steps of more tokens (the wide variants, with the routed experts in
///    the kernel): beside the routed projections of the same side (the
///    launch of up projections, then of down projections), so the routing
///    chain (logits, ranking, dispatch) waits for nothing but itself; the
///    logits' blocks first ask L2 for the shared expert's weights, which the
///    chain would otherwise leave the memory idle for.
/// Measured on the H200 (Nano shape, bf16 inputs): batch 32 8.22 -> 7.95 ms,
/// batch 64 12.6 -> 12.3, batch 1 and 8 unchanged; all steps beside the
/// routed experts made batch 1 3.17 -> 3.37 ms (the shared expert then
/// streams in the experts' launches instead of during the chain)
/// (bench/results/2026-12-01b).
StatusOr<size_t> KernelEmitter::routeSharedExpert(size_t i) {
  const size_t l0 = launches.size();
  StatusOr<size_t> n = sharedExpert(i);
  if (!n)
    return n;
  if (*n != 1)
    return fail(i, "internal: the shared expert took the ops after it");
  const size_t l1 = launches.size();
  // Its up variants first, then the down ones (as many of each).
  const size_t variants = (l1 - l0) / 2;
  n = route(i + 1);
  if (!n)
    return n;
  const size_t l2 = launches.size();
  size_t consumed = 1 + *n;
  // The rest of "moe_shared_and_routed_experts": dispatch, up, down.
  const size_t d = i + consumed;
  const bool withExperts = d + 2 < ops.size() &&
                           opCode(*ops[d]) == OpCode::Dispatch &&
                           opCode(*ops[d + 1]) == OpCode::ExpertUp &&
                           opCode(*ops[d + 2]) == OpCode::ExpertDown;
  size_t l3 = l2, l4 = l2, l5 = l2; // ends of dispatch, ups, downs
  if (withExperts) {
    for (size_t k = 0; k < 3; ++k) {
      n = k == 0 ? dispatch(d) : expert(d + k, k == 1);
      if (!n)
        return n;
      (k == 0 ? l3 : k == 1 ? l4 : l5) = launches.size();
    }
    consumed += 3;
  }
  auto endsWith = [](const std::string &s, const std::string &tail) {
    return s.size() >= tail.size() &&
           s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  // The layer's end (FuseKernels' "moe_layer_rms_norm"): the combine, the
  // adds and the next norm, one launch after the down projections.
  size_t l6 = l5;
  if (withExperts && combineTail(d + 3)) {
    n = combine(d + 3);
    if (!n)
      return n;
    consumed += *n;
    l6 = launches.size();
  }
  // Steps of one token (the up and down projections' first variants,
  // row_linear's): the routed projections on the ranking's slots, the down
  // projection ending the layer (oneTokenExperts), in place of those
  // variants; the dispatch and the layer's end launch then run for more
  // tokens only (nf-cuda-co-launches' nf.one_token_experts). On the H200
  // (Nano, batch 1): see row_experts_combine.
  if (withExperts && ops[d]->op->hasAttr("nf.one_token_experts")) {
    if (!(l6 == l5 + 1 && l4 > l3 && l5 > l4 &&
          endsWith(launches[l3].function, "_row") &&
          endsWith(launches[l4].function, "_row") &&
          launches[l3].maxTokens == launches[l4].maxTokens &&
          launches[l3].maxTokens <= 1 && oneTokenExperts(d)))
      return fail(d, "nf.one_token_experts: the layer's experts have no "
                     "one-token form");
    for (size_t k = 0; k < 2; ++k) {
      const size_t to = k == 0 ? l3 : l4, from = l6 + k;
      launches[to] = launches[from];
      functions[to] = functions[from];
    }
    launches.resize(l6);
    functions.resize(l6);
    launches[l2].minTokens = 2; // the dispatch
    launches[l5].minTokens = 2; // moe_combine_add_rms_norm
  }
  // nf-cuda-co-launches' choice: "routing", "routing_and_experts" or none
  // (one launch after the other).
  const std::string form =
      stringAttr(*ops[i], "nf.co_launch").value_or(std::string());
  if (form.empty())
    return consumed;
  auto cannot = [&](const std::string &why) {
    return fail(i, "nf.co_launch \"" + form + "\": " + why);
  };
  const int E = static_cast<int>(V(results(*ops[i + 1])[0]).cols);
  bool sliceable = true;
  for (size_t l = l0; l < l2; ++l)
    sliceable = sliceable && functions[l].sliceable;
  // Co-launched templates index blocks through nf::Step (f32 weights' general
  // linear indexes the whole grid); a co-launch's static shared memory is
  // both parts' (the ranking's 16 bytes an expert) and must stay within
  // 48 KB.
  if (!sliceable || E > 256 || variants == 0 || l1 - l0 != 2 * variants ||
      l2 - l1 != 2 || !endsWith(launches[l1].function, "router_logits") ||
      !endsWith(launches[l1 + 1].function, "moe_route"))
    return cannot("the shared expert's and the routing chain's launches "
                  "cannot share a grid");
  if (form == "routing") {
    // Co-launches need one block size.
    for (size_t v = 0; v < variants; ++v)
      if (launches[l0 + v].block != launches[l1].block ||
          launches[l0 + variants + v].block != launches[l1 + 1].block)
        return cannot("a GEMV variant's block size differs from the routing "
                      "chain's");
    // Logits: a warp per (token, expert), 8 a block; ranking: a block per
    // token. Ranking with the down projection first (the later indices).
    coLaunch(l1 + 1, l0 + variants, variants,
             [](int64_t t) { return static_cast<uint32_t>(t); });
    coLaunch(l1 - variants, l0, variants, [E](int64_t t) {
      return static_cast<uint32_t>(ceilDiv(t * E, 8));
    });
    return consumed;
  }
  // The last variant of each GEMV is the wide one (steps of more than the
  // narrow tokens), beside the routed experts' wide variant; the others
  // (one token, few tokens) run beside the routing chain.
  if (form != "routing_and_experts")
    return cannot("unknown form");
  if (!(withExperts && variants >= 2 && l3 - l2 == 1 && l4 - l3 == variants &&
        l5 - l4 == variants && wideSteps() &&
        launches[l0 + variants - 1].minTokens > narrowTokens &&
        functions[l3 + variants - 1].sliceable &&
        functions[l4 + variants - 1].sliceable))
    return cannot("the routed experts' variants do not pair with the shared "
                  "expert's");
  // Variants [0, few) of each GEMV take few tokens, variant `few` is the
  // wide one; the routing launches run for every step size, so each takes a
  // copy per token range.
  const size_t few = variants - 1;
  const CudaLaunchInfo wide = launches[l0 + few];
  auto ranged = [&](size_t l, const CudaLaunchInfo &range, int64_t blocks,
                    const std::string &suffix) {
    CudaLaunchInfo r = launches[l];
    r.grid = std::min<uint32_t>(r.grid, static_cast<uint32_t>(blocks));
    r.minTokens = range.minTokens;
    r.maxTokens = range.maxTokens;
    r.function += suffix;
    return r;
  };
  auto named = [&](const CudaLaunchInfo &a, size_t b) {
    return a.function + "_and_" + unprefixed(launches[b].function);
  };
  std::string prefetch;
  for (int w : {operands(*ops[i])[1], operands(*ops[i])[2]}) {
    const std::optional<std::string> t = weightType(w);
    if (t == "nf::bf16" || t == "nf::fp8e4m3") // bytes: 2 or 1 an element
      prefetch += "  nf::prefetch_l2(a.block(), a.grid(), " + weightPtr(w) +
                  ", " + num(weightNumel(w) * (t == "nf::bf16" ? 2 : 1)) +
                  "ll);\n";
  }
  std::vector<Merged> seq;
  for (size_t v = 0; v < few; ++v) {
    const CudaLaunchInfo &up = launches[l0 + v];
    const CudaLaunchInfo logits =
        ranged(l1, up, ceilDiv(int64_t(up.maxTokens) * E, 8), "");
    seq.push_back(sideBySideOf(logits, functions[l1], up, functions[l0 + v],
                               logits.grid, named(logits, l0 + v)));
  }
  // (A warp per 4 tokens x 4 experts for the wide logits, each gate row
  // read once per 4 tokens, made batch 32 slower on the H200: 8.01 -> 8.23
  // ms, bench/results/2026-12-01b/ab-router-tiled.)
  FunctionText logitsWide = functions[l1];
  // The prefetches after the wait: asked for before it, they competed with
  // the launch before (an add + RMSNorm whose rows are on the step's
  // critical path; H200, Nano at batch 32: part of 7.19 -> 7.16 ms with the
  // down projection's early fetch, bench/results/2026-12-02).
  {
    const std::string trigger = "  nf::allow_next_grid();\n";
    const size_t at = logitsWide.body.find(trigger);
    if (at == std::string::npos)
      internalError = "router logits without a trigger line";
    else
      logitsWide.body.insert(at + trigger.size(), prefetch);
  }
  const CudaLaunchInfo logitsWideLaunch =
      ranged(l1, wide, launches[l1].grid, "_wide");
  seq.push_back({logitsWideLaunch, logitsWide});
  for (size_t v = 0; v < few; ++v) {
    const size_t down = l0 + variants + v;
    const CudaLaunchInfo route =
        ranged(l1 + 1, launches[down], launches[down].maxTokens, "");
    seq.push_back(sideBySideOf(route, functions[l1 + 1], launches[down],
                               functions[down], route.grid,
                               named(route, down)));
  }
  seq.push_back({ranged(l1 + 1, wide, launches[l1 + 1].grid, "_wide"),
                 functions[l1 + 1]});
  seq.push_back({launches[l2], functions[l2]}); // dispatch
  // The routed projections: up, then down, each its few-token variants
  // alone and its wide one beside the shared expert's.
  for (size_t v = 0; v < few; ++v)
    seq.push_back({launches[l3 + v], functions[l3 + v]});
  seq.push_back(pairVariants(l0 + few, l3 + few, 1)[0]);
  for (size_t v = 0; v < few; ++v)
    seq.push_back({launches[l4 + v], functions[l4 + v]});
  seq.push_back(pairVariants(l0 + variants + few, l4 + few, 1)[0]);
  for (size_t l = l5; l < l6; ++l) // the layer's end
    seq.push_back({launches[l], functions[l]});
  launches.resize(l0);
  functions.resize(l0);
  for (auto &[l, f] : seq) {
    launches.push_back(l);
    functions.push_back(f);
  }
  return consumed;
}

} // namespace nf::codegen::detail
