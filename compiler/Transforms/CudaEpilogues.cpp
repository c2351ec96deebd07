//===- CudaEpilogues.cpp - ops a CUDA launch computes in its epilogue ----===//
//
// Marks the ops of CUDA plans whose following ops in the same kernel their
// launch computes as it stores its result with `nf.epilogue` (Passes.td):
// the ops' names, in order. The CUDA code generator (compiler/Target/Cuda)
// emits those ops in the producer's store instead of launching them, and
// fails where the mark and the ops differ.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "Target/Cuda/KernelShapes.h"

#include "nf/IR/NfOps.h"
#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseSet.h"

namespace nf::compiler {
#define GEN_PASS_DEF_CUDAEPILOGUES
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;
namespace shapes = ::nf::codegen::shapes;

namespace nf::compiler {
namespace {

bool isResultOf(Value v, Operation *op) { return v.getDefiningOp() == op; }

struct CudaEpilogues : impl::CudaEpiloguesBase<CudaEpilogues> {
  using CudaEpiloguesBase::CudaEpiloguesBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    clearDecision(module, kEpilogueAttr);
    clearDecision(module, kEpilogueMaxTokensAttr);
    Builder b(&getContext());
    for (auto func : module.getOps<func::FuncOp>()) {
      StringRef phase = stepPhase(func);
      if (phase.empty())
        continue;
      // Ops already in an epilogue get none of their own.
      llvm::DenseSet<Operation *> absorbed;
      func.walk([&](Operation *op) {
        if (!op->getParentOfType<nfir::KernelOp>() || absorbed.contains(op))
          return;
        SmallVector<Operation *, 3> ops;
        if (isa<nfir::LinearOp, nfir::LMHeadOp, moe::LatentProjOp>(op))
          ops = linearEpilogue(module, op, phase);
        else if (isa<nfir::AddOp>(op))
          ops = addEpilogue(op);
        else if (isa<moe::SharedExpertOp>(op))
          ops = sharedExpertEpilogue(op);
        else if (isa<moe::CombineOp>(op))
          ops = combineEpilogue(op);
        else if (auto ssm = dyn_cast<kv::SSMUpdateOp>(op))
          ops = ssmEpilogue(module, ssm, phase);
        if (ops.empty())
          return;
        SmallVector<Attribute, 3> names;
        for (Operation *e : ops) {
          names.push_back(b.getStringAttr(e->getName().getStringRef()));
          absorbed.insert(e);
        }
        op->setAttr(kEpilogueAttr, b.getArrayAttr(names));
      });
    }
  }

  /// The ops after a linear layer that its epilogue computes:
  /// - nf.split of its result: the epilogue stores the split pieces;
  ///   then either nf_kv.append of two pieces into an f32 KV cache (the
  ///   K/V rows written into their pages as they are computed), or, in
  ///   decode steps, an nf_kv.causal_conv (mode "decode") of a piece (the
  ///   conv of each channel computed as its column is stored);
  /// - nf.activation of its result.
  SmallVector<Operation *, 3> linearEpilogue(ModuleOp module, Operation *op,
                                             StringRef phase) const {
    Operation *next = op->getNextNode();
    if (auto act = dyn_cast_or_null<nfir::ActivationOp>(next))
      return act->getOperand(0) == op->getResult(0)
                 ? SmallVector<Operation *, 3>{next}
                 : SmallVector<Operation *, 3>{};
    auto split = dyn_cast_or_null<nfir::SplitOp>(next);
    if (!split || split->getNumOperands() != 1 ||
        split->getOperand(0) != op->getResult(0))
      return {};
    Operation *after = split->getNextNode();
    if (auto append = dyn_cast_or_null<kv::AppendOp>(after)) {
      auto cache = SymbolTable::lookupSymbolIn(module, append.getCacheAttr());
      auto decl = dyn_cast_or_null<kv::KVCacheOp>(cache);
      // f32 and bf16 caches (nf::kv_put); fp8 rows need their amax first.
      Type element = decl ? decl.getType().getElementType() : Type();
      if (decl && (element.isF32() || element.isBF16()) &&
          isResultOf(append.getKey(), split) &&
          isResultOf(append.getValue(), split))
        return {split, append};
    } else if (auto conv = dyn_cast_or_null<kv::CausalConvOp>(after);
               conv && phase == "decode" && conv.getMode() == "decode" &&
               isResultOf(conv.getInput(), split)) {
      return {split, conv};
    }
    return {split};
  }

  /// nf.add, then nf.rms_norm of the sum: one row kernel writes both.
  SmallVector<Operation *, 3> addEpilogue(Operation *op) const {
    auto norm = dyn_cast_or_null<nfir::RMSNormOp>(op->getNextNode());
    if (norm && norm->getOperand(0) == op->getResult(0))
      return {norm};
    return {};
  }

  /// The routed experts' combine, then the add of the shared expert's
  /// rows, the residual add and the RMSNorm of the sum, where nothing else
  /// reads the combined rows or the first sum: one row kernel a token.
  SmallVector<Operation *, 3> combineEpilogue(Operation *op) const {
    auto add1 = dyn_cast_or_null<nfir::AddOp>(op->getNextNode());
    auto add2 = add1 ? dyn_cast_or_null<nfir::AddOp>(add1->getNextNode())
                     : nfir::AddOp();
    auto norm = add2 ? dyn_cast_or_null<nfir::RMSNormOp>(add2->getNextNode())
                     : nfir::RMSNormOp();
    if (!norm || op->getNumResults() != 1 ||
        !addsOnce(op->getResult(0), add1) ||
        !addsOnce(add1->getResult(0), add2) ||
        norm->getOperand(0) != add2->getResult(0))
      return {};
    return {add1, add2, norm};
  }

  /// A decode SSM update, then the gated RMSNorm of its result over the
  /// state's groups: one launch of clusters, a block per head
  /// (ssm_gated_decode, nf_mamba.cuh), for steps whose clusters fit the GPU
  /// at a block an SM (marked with kEpilogueMaxTokensAttr), where the
  /// state's shapes fit the kernel (KernelShapes.h).
  SmallVector<Operation *, 3> ssmEpilogue(ModuleOp module, kv::SSMUpdateOp op,
                                          StringRef phase) const {
    auto norm = dyn_cast_or_null<nfir::GatedRMSNormOp>(op->getNextNode());
    if (!hopperOrLater || phase != "decode" || !norm ||
        norm.getInput() != op.getResult() || !op.getResult().hasOneUse())
      return {};
    auto decl = dyn_cast_or_null<kv::MambaStateOp>(
        SymbolTable::lookupSymbolIn(module, op.getStateAttr()));
    if (!decl)
      return {};
    kv::MambaStateType state = decl.getType();
    const int64_t NH = state.getNumHeads(), P = state.getHeadDim(),
                  N = state.getStateSize(), CD = state.getConvDim();
    if (NH <= 0 || P <= 0 || N <= 0 || CD <= NH * P ||
        (CD - NH * P) % (2 * N) != 0)
      return {};
    const int64_t G = (CD - NH * P) / (2 * N);
    if (NH % G != 0 || norm.getGroups() != G ||
        !shapes::ssmDecodeFits(NH, P, N, CD) ||
        !shapes::ssmGatedDecodeFits(P, N, NH / G))
      return {};
    op->setAttr(
        kEpilogueMaxTokensAttr,
        Builder(op).getI64IntegerAttr(std::max<int64_t>(smCount / NH, 1)));
    return {norm};
  }

  /// `add` adds v to another value, and nothing else reads v.
  static bool addsOnce(Value v, Operation *add) {
    const bool lhs = add->getOperand(0) == v, rhs = add->getOperand(1) == v;
    return lhs != rhs &&
           llvm::all_of(v.getUsers(), [&](Operation *u) { return u == add; });
  }

  /// The shared expert, then the nf.add of its result and another row (the
  /// routed experts' combined rows) where nothing else reads its result:
  /// the down projection's epilogue adds the row and stores the sum.
  SmallVector<Operation *, 3> sharedExpertEpilogue(Operation *op) const {
    Operation *add = dyn_cast_or_null<nfir::AddOp>(op->getNextNode());
    if (!add || op->getNumResults() != 1)
      return {};
    if (!addsOnce(op->getResult(0), add))
      return {};
    return {add};
  }
};

} // namespace
} // namespace nf::compiler
