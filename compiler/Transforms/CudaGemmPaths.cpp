//===- CudaGemmPaths.cpp - the CUDA GEMM path of each weight GEMM ---------===//
//
// Marks the ops that run GEMMs over weights with `nf.gemm_paths`
// (Passes.td): bf16-plane tensor-core tiles outside decode, the skinny
// tensor-core GEMVs in decode, int4 codes on CUDA cores, or another path, and
// each decode step with the token count up to which its skinny GEMVs run their
// narrow variants
// (`nf.skinny_narrow_tokens`). nf-cuda-row-formats and the CUDA code
// generator (compiler/Target/Cuda) read these decisions.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/IR/Builders.h"

namespace nf::compiler {
#define GEN_PASS_DEF_CUDAGEMMPATHS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

/// Decode steps of up to this many tokens run the narrow skinny variants
/// (items of 16 rows, mma's N, reading f32 rows); longer steps the wide
/// variants, which stream the rows' bf16 copies (nf-cuda-row-formats).
constexpr int64_t kSkinnyNarrowTokens = 16;

struct CudaGemmPaths : impl::CudaGemmPathsBase<CudaGemmPaths> {
  using CudaGemmPathsBase::CudaGemmPathsBase;

  void runOnOperation() override {
    clearDecision(getOperation(), kGemmPathsAttr);
    clearDecision(getOperation(), kSkinnyNarrowTokensAttr);
    Builder b(&getContext());
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      StringRef phase = stepPhase(func);
      if (phase.empty())
        continue;
      const bool decode = phase == "decode";
      if (decode)
        func->setAttr(kSkinnyNarrowTokensAttr,
                      b.getI64IntegerAttr(kSkinnyNarrowTokens));
      func.walk([&](Operation *op) {
        if (!op->getParentOfType<nfir::KernelOp>())
          return;
        SmallVector<Value, 2> weights = gemmWeights(*op);
        if (weights.empty())
          return;
        SmallVector<Attribute, 2> paths;
        for (Value w : weights) {
          auto t = dyn_cast<RankedTensorType>(w.getType());
          const int64_t k = t && t.hasStaticShape() && t.getRank() >= 2
                                ? t.getShape().back()
                                : 0;
          StringRef path = "other";
          // A router's logits GEMM has no skinny path (its decode kernels
          // compute the logits with their selection).
          if (ampereOrLater && k > 0 && isBf16Weight(w)) {
            if (!decode && k % 8 == 0)
              path = "bf16_planes";
            else if (decode && k % 32 == 0 && !isa<moe::RouterOp>(op))
              path = "bf16_skinny";
          }
          // FP8 codes widen to bf16 exactly, as the skinny GEMVs load them
          // or by a launch before a plane GEMM; their row scales are applied
          // to the sums.
          if (ampereOrLater && k > 0 && isFp8CodesWeight(w) &&
              !isa<moe::RouterOp>(op)) {
            if (!decode && k % 8 == 0)
              path = "bf16_planes";
            else if (decode && k % 32 == 0)
              path = "bf16_skinny";
          }
          // int4 codes: every step dequantises them in registers, on CUDA
          // cores (the code generator's int4_linear), the router's aside
          // (which the code generator refuses).
          if (isInt4CodesWeight(w) && !isa<moe::RouterOp>(op))
            path = "int4_rows";
          paths.push_back(b.getStringAttr(path));
        }
        op->setAttr(kGemmPathsAttr, b.getArrayAttr(paths));
      });
    }
  }
};

} // namespace
} // namespace nf::compiler
