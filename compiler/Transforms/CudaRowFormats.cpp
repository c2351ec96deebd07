//===- CudaRowFormats.cpp - how GEMM inputs are stored on CUDA -----------===//
//
// Marks the producers of activations that tensor-core GEMMs read with
// `nf.row_format` (Passes.td): "bf16" rows in prefill, "f32+bf16" (f32 rows
// and a bf16 copy) in decode steps wide enough for the wide skinny GEMMs.
// Which GEMMs those are is nf-cuda-gemm-paths' decision (`nf.gemm_paths`).
// A value is followed across kernels: a kernel's block argument is its
// input operand, a kernel's result the value its region yields.
//
// Measured on the H200 (bench/results/2026-11-30f): decode keeps f32 rows
// because the narrow skinny variants reading bf16 rows gave identical logits
// but slowed batch 1-8 by 2-3%.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace nf::compiler {
#define GEN_PASS_DEF_CUDAROWFORMATS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

/// An f32 tensor of token (or expert assignment) rows.
bool isF32Rows(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getElementType().isF32() && t.getRank() > 0 &&
         t.isDynamicDim(0);
}

/// Elements per row of a row tensor (all elements of another tensor).
int64_t rowElements(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  if (!t)
    return 1;
  int64_t n = 1;
  for (int64_t d = t.getRank() > 0 && t.isDynamicDim(0) ? 1 : 0;
       d < t.getRank(); ++d)
    n *= t.getDimSize(d);
  return n;
}

struct CudaRowFormats : impl::CudaRowFormatsBase<CudaRowFormats> {
  using CudaRowFormatsBase::CudaRowFormatsBase;

  void runOnOperation() override {
    clearDecision(getOperation(), kRowFormatAttr);
    if (!bf16Inputs)
      return;
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      StringRef phase = stepPhase(func);
      if (phase == "prefill")
        markStep(func, /*decode=*/false);
      else if (phase == "decode" && hasWideSteps(func))
        markStep(func, /*decode=*/true);
    }
  }

  /// Decode steps can be longer than those that run the narrow skinny
  /// variants, which read f32 rows (nf-cuda-gemm-paths).
  bool hasWideSteps(func::FuncOp func) const {
    auto narrow = func->getAttrOfType<IntegerAttr>(kSkinnyNarrowTokensAttr);
    return narrow && maxSequences > narrow.getInt();
  }

  /// Prefill: every reader takes the value as a GEMM input on the bf16
  /// planes (K a multiple of 8). Decode: some reader takes it as a skinny
  /// GEMM's input (K a multiple of 32).
  void markStep(func::FuncOp func, bool decode) {
    Block &entry = func.getBody().front();
    Value logits;
    if (auto ret = dyn_cast<func::ReturnOp>(entry.getTerminator());
        ret && ret.getNumOperands() == 1)
      logits = canonicalValue(ret.getOperand(0));
    llvm::DenseSet<Value> read, notGemmOnly, gemmRead;
    llvm::DenseMap<Value, Operation *> producer;
    for (auto kernel : entry.getOps<nfir::KernelOp>()) {
      Block &body = kernel.getBody().front();
      for (Operation &op : body.without_terminator()) {
        Value gemmInput; // operand 0, read as a bf16 GEMM input
        SmallVector<StringRef, 2> paths = gemmPaths(op);
        if (isa<moe::RouterOp>(op)) {
          // Only when the selection follows in the kernel: the router's
          // logits GEMM then reads bf16 rows (a lone router reads f32).
          auto select = dyn_cast_or_null<moe::SelectOp>(op.getNextNode());
          if (!paths.empty() && paths[0] == "bf16_planes" && select &&
              op.getNumResults() == 2 && select->getNumOperands() == 3 &&
              select->getOperand(0) == op.getResult(0) &&
              select->getOperand(1) == op.getResult(1))
            gemmInput = canonicalValue(op.getOperand(0));
        } else if (!paths.empty() &&
                   paths[0] == (decode ? "bf16_skinny" : "bf16_planes")) {
          // A GEMM that quantises its input to FP8 reads the f32 rows: a
          // bf16 rounding first would change its codes.
          SmallVector<Value, 2> weights = gemmWeights(op);
          if (weights.empty() || !quantisesInput(weights[0]))
            gemmInput = canonicalValue(op.getOperand(0));
        }
        if (gemmInput)
          gemmRead.insert(gemmInput);
        for (auto [i, operand] : llvm::enumerate(op.getOperands())) {
          Value v = canonicalValue(operand);
          read.insert(v);
          if (!(i == 0 && v == gemmInput))
            notGemmOnly.insert(v);
        }
        // Producers whose emitters write bf16 rows or copies.
        const bool writes =
            decode
                ? isa<nfir::RMSNormOp, nfir::GatedRMSNormOp, nfir::ActivationOp,
                      moe::ExpertUpOp, kv::AttendOp>(op)
                : isa<nfir::RMSNormOp, nfir::GatedRMSNormOp, nfir::ActivationOp,
                      moe::ExpertUpOp, nfir::LinearOp>(op);
        if (writes && op.getNumResults() == 1)
          producer[op.getResult(0)] = &op;
      }
    }
    OpBuilder b(func.getContext());
    for (auto [v, op] : producer) {
      if (v == logits || !isF32Rows(v))
        continue;
      const bool qualifies = decode
                                 ? gemmRead.contains(v)
                                 : read.contains(v) && !notGemmOnly.contains(v);
      if (qualifies)
        op->setAttr(kRowFormatAttr,
                    b.getStringAttr(decode ? "f32+bf16" : "bf16"));
    }
  }
};

} // namespace
} // namespace nf::compiler
