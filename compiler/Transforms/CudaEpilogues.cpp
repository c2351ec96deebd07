//===- CudaEpilogues.cpp - ops a CUDA GEMM computes in its epilogue ------===//
//
// Marks the weight GEMMs of CUDA plans whose following ops in the same
// kernel are computed by the GEMM's epilogue with `nf.epilogue` (Passes.td):
// the ops' names, in order. The CUDA code generator
// (compiler/Target/Cuda/EmitLinear.cpp) emits those ops in the GEMM's store
// instead of launching them, and fails where the mark and the ops differ.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"
#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

namespace nf::compiler {
#define GEN_PASS_DEF_CUDAEPILOGUES
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

bool isResultOf(Value v, Operation *op) { return v.getDefiningOp() == op; }

struct CudaEpilogues : impl::CudaEpiloguesBase<CudaEpilogues> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    Builder b(&getContext());
    for (auto func : module.getOps<func::FuncOp>()) {
      StringRef phase = stepPhase(func);
      if (phase.empty())
        continue;
      func.walk([&](Operation *op) {
        if (!isa<nfir::LinearOp, nfir::LMHeadOp, moe::LatentProjOp>(op) ||
            !op->getParentOfType<nfir::KernelOp>())
          return;
        SmallVector<Operation *, 2> ops = epilogue(module, op, phase);
        if (ops.empty())
          return;
        SmallVector<Attribute, 2> names;
        for (Operation *e : ops)
          names.push_back(b.getStringAttr(e->getName().getStringRef()));
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
  SmallVector<Operation *, 2> epilogue(ModuleOp module, Operation *op,
                                       StringRef phase) const {
    Operation *next = op->getNextNode();
    if (auto act = dyn_cast_or_null<nfir::ActivationOp>(next))
      return act->getOperand(0) == op->getResult(0)
                 ? SmallVector<Operation *, 2>{next}
                 : SmallVector<Operation *, 2>{};
    auto split = dyn_cast_or_null<nfir::SplitOp>(next);
    if (!split || split->getNumOperands() != 1 ||
        split->getOperand(0) != op->getResult(0))
      return {};
    Operation *after = split->getNextNode();
    if (auto append = dyn_cast_or_null<kv::AppendOp>(after)) {
      auto cache = SymbolTable::lookupSymbolIn(module, append.getCacheAttr());
      auto decl = dyn_cast_or_null<kv::KVCacheOp>(cache);
      if (decl && decl.getType().getElementType().isF32() &&
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
};

} // namespace
} // namespace nf::compiler
