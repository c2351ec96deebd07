//===- CudaCoLaunches.cpp - launches a decode MoE layer merges ------------===//
//
// Marks the decode MoE layers whose CUDA launches run side by side or
// replace others (Passes.td): `nf.co_launch` on the shared expert (its
// GEMVs beside the routing chain, and in wide steps beside the routed
// experts) and `nf.one_token_experts` on the dispatch (steps of one token
// run the routed experts on the ranking's slots, the down projection
// ending the layer). The CUDA code generator
// (compiler/Target/Cuda/EmitSharedExpert.cpp) arranges the launches so,
// with the measurements behind each form, and fails where it cannot.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/IR/Builders.h"

namespace nf::compiler {
#define GEN_PASS_DEF_CUDACOLAUNCHES
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

/// A co-launch's static shared memory is both parts' (the ranking's 16
/// bytes an expert) and must stay within 48 KB: routers of more experts
/// run alone.
constexpr int64_t kMaxCoLaunchExperts = 256;
/// Slots of a token that the one-token experts take (a register per slot
/// and lane).
constexpr int64_t kMaxOneTokenSlots = 8;

bool allSkinny(Operation *op) {
  SmallVector<StringRef, 2> paths = gemmPaths(*op);
  return !paths.empty() &&
         llvm::all_of(paths, [](StringRef p) { return p == "bf16_skinny"; });
}

/// Whether a GEMM of `op` quantises its input rows to FP8: a launch of its
/// own before the GEMM, which the merged forms have no place for.
bool quantisesAnInput(Operation *op) {
  return llvm::any_of(gemmWeights(*op), quantisesInput);
}

/// The ops of a decode MoE layer in one kernel, from its shared expert:
/// router, select, and (where the kernel has them) the routed experts and
/// the combine.
struct MoeLayer {
  moe::SharedExpertOp shared;
  moe::RouterOp router;
  moe::SelectOp select;
  moe::DispatchOp dispatch;
  moe::ExpertUpOp up;
  moe::ExpertDownOp down;
  moe::CombineOp combine;

  static std::optional<MoeLayer> from(moe::SharedExpertOp shared) {
    MoeLayer l;
    l.shared = shared;
    l.router = dyn_cast_or_null<moe::RouterOp>(shared->getNextNode());
    if (!l.router)
      return std::nullopt;
    l.select = dyn_cast_or_null<moe::SelectOp>(l.router->getNextNode());
    // The ranking fuses with the router where it reads both scores.
    if (l.select &&
        (l.select.getScores() != l.router.getScores() ||
         l.select.getSelectionScores() != l.router.getSelectionScores()))
      l.select = {};
    if (!l.select)
      return l;
    l.dispatch = dyn_cast_or_null<moe::DispatchOp>(l.select->getNextNode());
    l.up = l.dispatch
               ? dyn_cast_or_null<moe::ExpertUpOp>(l.dispatch->getNextNode())
               : moe::ExpertUpOp();
    l.down = l.up ? dyn_cast_or_null<moe::ExpertDownOp>(l.up->getNextNode())
                  : moe::ExpertDownOp();
    l.combine = l.down ? dyn_cast_or_null<moe::CombineOp>(l.down->getNextNode())
                       : moe::CombineOp();
    if (!l.down) { // not the routed experts
      l.dispatch = {};
      l.up = {};
    }
    return l;
  }
  bool withExperts() const { return bool(down); }
};

struct CudaCoLaunches : impl::CudaCoLaunchesBase<CudaCoLaunches> {
  using CudaCoLaunchesBase::CudaCoLaunchesBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    clearDecision(module, kCoLaunchAttr);
    clearDecision(module, kOneTokenExpertsAttr);
    Builder b(&getContext());
    for (auto func : module.getOps<func::FuncOp>()) {
      if (stepPhase(func) != "decode")
        continue;
      auto narrowAttr =
          func->getAttrOfType<IntegerAttr>(kSkinnyNarrowTokensAttr);
      const int64_t narrow = narrowAttr ? narrowAttr.getInt() : 0;
      // Steps longer than the narrow tokens run the wide GEMV variants.
      const bool wide = narrow > 0 && maxSequences > narrow;
      func.walk([&](moe::SharedExpertOp shared) {
        if (!shared->getParentOfType<nfir::KernelOp>())
          return;
        std::optional<MoeLayer> layer = MoeLayer::from(shared);
        if (!layer)
          return;
        if (oneTokenExperts(*layer))
          layer->dispatch->setAttr(kOneTokenExpertsAttr, b.getUnitAttr());
        StringRef form = coLaunch(*layer, wide);
        if (!form.empty())
          shared->setAttr(kCoLaunchAttr, b.getStringAttr(form));
      });
    }
  }

  /// "routing": every GEMV variant of the shared expert beside the routing
  /// chain (up with the logits, down with the ranking). "routing_and_experts"
  /// (steps with wide variants, whose block size differs from the routing
  /// chain's): the narrow variants so, the wide ones beside the routed
  /// experts' wide variants. "" where the launches run one after the other.
  StringRef coLaunch(MoeLayer l, bool wide) const {
    // Both GEMVs on the skinny path (templates that run on a slice of a
    // grid), a router fused with its ranking, of few enough experts.
    if (!allSkinny(l.shared) || quantisesAnInput(l.shared) || !l.select ||
        dimOf(l.router.getWeight(), 0) > kMaxCoLaunchExperts)
      return "";
    if (!wide)
      return "routing";
    // The routed experts' variants pair with the shared expert's.
    if (l.withExperts() && allSkinny(l.up) && allSkinny(l.down) &&
        !quantisesAnInput(l.up) && !quantisesAnInput(l.down))
      return "routing_and_experts";
    return "";
  }

  /// Steps of one token run the routed experts on the ranking's slots and
  /// end the layer in the down projection: the experts' one-token variants
  /// exist (row-linear), the layer ends in the combine's epilogue
  /// (nf-cuda-epilogues), and a token has few slots.
  bool oneTokenExperts(MoeLayer l) const {
    if (!rowLinear || !l.withExperts() || !l.combine || !allSkinny(l.up) ||
        !allSkinny(l.down) || quantisesAnInput(l.up) ||
        quantisesAnInput(l.down))
      return false;
    auto epilogue = l.combine->getAttrOfType<ArrayAttr>(kEpilogueAttr);
    if (!epilogue || epilogue.size() != 3)
      return false;
    const int64_t slots = dimOf(l.dispatch.getExperts(), 1);
    auto dispatch = cast<moe::DispatchType>(l.dispatch.getType());
    return slots >= 1 && slots <= kMaxOneTokenSlots &&
           slots <= dispatch.getMaxPerToken() &&
           dimOf(l.combine.getWeights(), 1) == slots &&
           l.up.getDispatch() == l.dispatch.getResult() &&
           l.down.getDispatch() == l.dispatch.getResult() &&
           l.down.getInput() == l.up.getResult() &&
           l.combine.getInput() == l.down.getResult() &&
           l.combine.getDispatch() == l.dispatch.getResult();
  }
};

} // namespace
} // namespace nf::compiler
