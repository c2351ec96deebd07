//===- CudaGemmPaths.cpp - the CUDA GEMM path of each weight GEMM ---------===//
//
// Marks the ops that run GEMMs over weights with `nf.gemm_paths`
// (Passes.td): bf16-plane tensor-core tiles outside decode, the skinny
// tensor-core GEMVs in decode, or another path. nf-cuda-row-formats and the
// CUDA code generator (compiler/Target/Cuda) read the decision.
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

struct CudaGemmPaths : impl::CudaGemmPathsBase<CudaGemmPaths> {
  void runOnOperation() override {
    Builder b(&getContext());
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      StringRef phase = stepPhase(func);
      if (phase.empty())
        continue;
      const bool decode = phase == "decode";
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
          if (k > 0 && isBf16Weight(w)) {
            if (!decode && k % 8 == 0)
              path = "bf16_planes";
            else if (decode && k % 32 == 0 && !isa<moe::RouterOp>(op))
              path = "bf16_skinny";
          }
          paths.push_back(b.getStringAttr(path));
        }
        op->setAttr(kGemmPathsAttr, b.getArrayAttr(paths));
      });
    }
  }
};

} // namespace
} // namespace nf::compiler
