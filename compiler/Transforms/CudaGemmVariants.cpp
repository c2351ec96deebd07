//===- CudaGemmVariants.cpp - the kernel of each wide decode GEMM --------===//
//
// Marks the ops that run GEMMs over weights in decode steps with wide steps
// (more tokens than their `nf.skinny_narrow_tokens`) with
// `nf.gemm_wide_variants` (Passes.td): the kernel the skinny GEMMs run in
// those steps, and `nf.gemm_wide_warps`: the warps a block of its skinny
// items. The CUDA code generator (compiler/Target/Cuda/EmitLinear.cpp)
// emits the variant it is given, with the measurements behind each choice.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"

namespace nf::compiler {
#define GEN_PASS_DEF_CUDAGEMMVARIANTS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

/// Features of a wide skinny item. A dense layer of more than two such
/// columns an SM takes items of 32 rows ("skinny_rows32"): at 32 rows its
/// 16-row items would not all fit on the GPU at once (EmitLinear.cpp's
/// four-warp wide blocks, four an SM).
constexpr int64_t kWideFeatures = 32;

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct CudaGemmVariants : impl::CudaGemmVariantsBase<CudaGemmVariants> {
  using CudaGemmVariantsBase::CudaGemmVariantsBase;

  void runOnOperation() override {
    clearDecision(getOperation(), kGemmWideVariantsAttr);
    clearDecision(getOperation(), kGemmWideWarpsAttr);
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      auto narrow = func->getAttrOfType<IntegerAttr>(kSkinnyNarrowTokensAttr);
      if (stepPhase(func) == "decode" && narrow &&
          maxSequences > narrow.getInt())
        markStep(func);
    }
  }

  void markStep(func::FuncOp func) {
    // Values some op reads (an LM head whose result nothing reads computes
    // only the rows whose logits the runtime takes).
    llvm::DenseSet<Value> read;
    func.walk([&](Operation *op) {
      if (op->getParentOfType<nfir::KernelOp>() && !isa<nfir::YieldOp>(op))
        for (Value v : op->getOperands())
          read.insert(canonicalValue(v));
    });
    Builder b(&getContext());
    func.walk([&](Operation *op) {
      SmallVector<StringRef, 2> paths = gemmPaths(*op);
      if (paths.empty())
        return;
      SmallVector<Attribute, 2> variants;
      SmallVector<int64_t, 2> warps;
      for (StringRef path : paths) {
        const bool skinny = path == "bf16_skinny";
        variants.push_back(
            b.getStringAttr(skinny ? variant(*op, read) : "none"));
        warps.push_back(skinny ? wideWarps(*op) : 0);
      }
      op->setAttr(kGemmWideVariantsAttr, b.getArrayAttr(variants));
      op->setAttr(kGemmWideWarpsAttr, b.getDenseI64ArrayAttr(warps));
    });
  }

  /// The wide kernel of a skinny GEMM. Routed experts and the shared expert
  /// (which runs beside them) keep skinny items; one dense weight can
  /// take feature tiles (an LM head whose rows are the logit rows), TMA or
  /// items of 32 rows.
  StringRef variant(Operation &op, const llvm::DenseSet<Value> &read) const {
    if (!isa<nfir::LinearOp, nfir::LMHeadOp, moe::LatentProjOp>(op))
      return "skinny";
    auto w = dyn_cast<RankedTensorType>(op.getOperand(1).getType());
    const int64_t n = w ? w.getShape().front() : 0;
    const bool logitRows =
        isa<nfir::LMHeadOp>(op) && !read.contains(op.getResult(0));
    // The input's bf16 copy (nf-cuda-row-formats), which feature tiles and
    // TMA stream.
    // FP8 codes: the skinny items only (the kernels that widen them).
    const bool copy = rowFormatOf(op.getOperand(0)) == "f32+bf16" &&
                      !isFp8CodesWeight(op.getOperand(1));
    if (copy && logitRows)
      return "feature_tiles";
    if (copy && !logitRows && hopperOrLater)
      return "tma";
    if (ceilDiv(n, kWideFeatures) > 2 * smCount)
      return "skinny_rows32";
    return "skinny";
  }

  /// The warps of a wide skinny block: 4 split an item's K, four blocks an
  /// SM (each warp's weight stream twice as long between folds), for the
  /// routed experts, the shared expert beside them and layers of at least a
  /// feature tile an SM; layers of fewer tiles keep 8 (more bytes in flight
  /// per item). On the H200, Nano at batch 32: routed experts 84 + 80 -> 81
  /// + 79 us a layer, in_proj 31.1 -> 28.6, qkv 23.8 -> 19.1, but out_proj
  /// (84 tiles) 14.4 -> 19.4.
  int64_t wideWarps(Operation &op) const {
    if (!isa<nfir::LinearOp, nfir::LMHeadOp, moe::LatentProjOp>(op))
      return 4;
    auto w = dyn_cast<RankedTensorType>(op.getOperand(1).getType());
    const int64_t n = w ? w.getShape().front() : 0;
    return ceilDiv(n, kWideFeatures) >= smCount ? 4 : 8;
  }
};

} // namespace
} // namespace nf::compiler
