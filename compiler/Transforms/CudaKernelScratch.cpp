//===- CudaKernelScratch.cpp - the CUDA kernels' own scratch --------------===//
//
// Marks each op whose CUDA kernels need memory beyond the plan's values with
// `nf.kernel_scratch` (Passes.td): the bytes of each region, in the order
// the code generator uses them, sized for the step's most tokens from the
// forms the earlier CUDA passes chose. nf-plan-memory places them; the code
// generator (compiler/Target/Cuda/Emit*.cpp) takes the regions it is given
// and fails where they do not match what it emits.
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

namespace nf::compiler {
#define GEN_PASS_DEF_CUDAKERNELSCRATCH
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;
namespace shapes = ::nf::codegen::shapes;

namespace nf::compiler {
namespace {

int64_t lastDim(Value v) {
  auto t = dyn_cast<ShapedType>(v.getType());
  return t && t.hasRank() && t.getRank() > 0 ? t.getShape().back() : 0;
}
int64_t numElements(Value v) {
  auto t = dyn_cast<ShapedType>(v.getType());
  return t && t.hasStaticShape() ? t.getNumElements() : 0;
}
/// Whether `v`'s producer stores it as bf16 rows (nf-cuda-row-formats).
bool storedAsBf16(Value v) { return rowFormatOf(v) == "bf16"; }

struct CudaKernelScratch : impl::CudaKernelScratchBase<CudaKernelScratch> {
  using CudaKernelScratchBase::CudaKernelScratchBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    clearDecision(module, kKernelScratchAttr);
    clearDecision(module, kAfterStepScratchAttr);
    clearDecision(module, kTopLogitsChunkAttr);
    Builder b(&getContext());
    for (auto func : module.getOps<func::FuncOp>()) {
      StringRef phase = stepPhase(func);
      if (phase.empty())
        continue;
      const bool decode = phase == "decode";
      const int64_t rows = decode ? maxSequences : maxTokens;
      auto narrow = func->getAttrOfType<IntegerAttr>(kSkinnyNarrowTokensAttr);
      // Decode steps that run the wide skinny variants (nf-cuda-gemm-paths).
      const bool wideSteps =
          decode && narrow && narrow.getInt() > 0 && rows > narrow.getInt();
      func.walk([&](Operation *op) {
        if (!op->getParentOfType<nfir::KernelOp>())
          return;
        SmallVector<int64_t, 2> bytes =
            regions(module, *op, rows, decode, wideSteps);
        if (!bytes.empty())
          op->setAttr(kKernelScratchAttr, b.getDenseI64ArrayAttr(bytes));
      });
      if (decode)
        topLogits(func, rows);
    }
  }

  /// The decode step's top-logits launches (kernels/nf_sample.cuh), which
  /// the runtime runs after the step on request: on the op that computes
  /// the logits, the logits each block ranks and the buffers they use after
  /// the step (each chunk's best, the rows' ids and values, the noise, the
  /// totals, the chunks' parts of the totals).
  void topLogits(func::FuncOp func, int64_t rows) const {
    auto ret = dyn_cast<func::ReturnOp>(func.getBody().front().getTerminator());
    if (!ret || ret.getNumOperands() != 1)
      return;
    Value logits = canonicalValue(ret.getOperand(0));
    Operation *def = logits.getDefiningOp();
    auto type = dyn_cast<RankedTensorType>(logits.getType());
    if (!def || !def->getParentOfType<nfir::KernelOp>() || !type ||
        type.getRank() != 2 || !type.getElementType().isF32() ||
        ShapedType::isDynamic(type.getShape()[1]))
      return;
    const int64_t chunk = shapes::topLogitsChunk(type.getShape()[1]);
    if (chunk == 0)
      return;
    const int64_t chunks = (type.getShape()[1] + chunk - 1) / chunk,
                  k = shapes::kTopLogits;
    Builder b(func.getContext());
    def->setAttr(kTopLogitsChunkAttr, b.getI64IntegerAttr(chunk));
    def->setAttr(kAfterStepScratchAttr,
                 b.getDenseI64ArrayAttr({rows * chunks * k * 8, rows * k * 4,
                                         rows * k * 4,
                                         rows * shapes::kTopLogitNoiseBytes,
                                         rows * 8, rows * chunks * 16}));
  }

  /// Plane GEMM inputs may be stored as bf16 rows by their producers: one
  /// bf16 term, targets with mma.sync's bf16 shapes.
  bool bf16RowsAllowed() const { return matmulTerms == 1 && ampereOrLater; }

  /// A GEMM's own regions, on every path: its input rows quantised to FP8
  /// and back to f32 by a first launch where its weight says so (the rows
  /// the GEMM then reads). On the bf16-plane path: the input rows split into
  /// the plan's bf16 terms by a launch, unless their producer stores them as
  /// bf16 (which the GEMM streams as they are); then, for a weight of FP8
  /// codes, the codes widened to bf16 by another launch (every element of
  /// the weight, all experts of a stacked one).
  void gemmRegions(SmallVectorImpl<int64_t> &out, StringRef path, int64_t rows,
                   Value weight, bool inputBf16) const {
    if (quantisesInput(weight))
      out.push_back(rows * lastDim(weight) * 4);
    if (path != "bf16_planes")
      return;
    if (!inputBf16)
      out.push_back(matmulTerms * rows * lastDim(weight) * 2);
    if (isFp8CodesWeight(weight))
      out.push_back(numElements(weight) * 2);
  }

  SmallVector<int64_t, 2> regions(ModuleOp module, Operation &op, int64_t rows,
                                  bool decode, bool wideSteps) const {
    SmallVector<int64_t, 2> out;
    SmallVector<StringRef, 2> paths = gemmPaths(op);
    SmallVector<Value, 2> weights = gemmWeights(op);
    auto path = [&](size_t i) {
      return i < paths.size() ? paths[i] : StringRef();
    };
    if (isa<nfir::LinearOp, nfir::LMHeadOp, moe::LatentProjOp>(op) &&
        weights.size() == 1) {
      Value x = op.getOperand(0);
      gemmRegions(out, path(0), rows, weights[0], storedAsBf16(x));
    } else if (isa<moe::ExpertUpOp, moe::ExpertDownOp>(op) &&
               weights.size() == 1) {
      // Down projections read a row per (token, expert) assignment.
      auto dispatch = dyn_cast<moe::DispatchType>(op.getOperand(1).getType());
      const int64_t perToken = isa<moe::ExpertDownOp>(op) && dispatch
                                   ? dispatch.getMaxPerToken()
                                   : 1;
      Value x = op.getOperand(0);
      gemmRegions(out, path(0), rows * perToken, weights[0], storedAsBf16(x));
    } else if (isa<moe::SharedExpertOp>(op) && weights.size() == 2) {
      // The hidden rows (bf16 where the down GEMM would round them anyway),
      // their bf16 copy for the wide down projection of decode steps (not
      // where it quantises its input: it reads f32 rows), then the GEMMs'
      // planes.
      const int64_t hidden = dimOf(weights[0], 0);
      const bool quantises = quantisesInput(weights[1]);
      const bool hidden16 =
          bf16RowsAllowed() && path(1) == "bf16_planes" && !quantises;
      out.push_back(rows * hidden * (hidden16 ? 2 : 4));
      if (bf16RowsAllowed() && wideSteps && path(1) == "bf16_skinny" &&
          !quantises)
        out.push_back(rows * hidden * 2);
      Value x = op.getOperand(0);
      gemmRegions(out, path(0), rows, weights[0], storedAsBf16(x));
      gemmRegions(out, path(1), rows, weights[1], hidden16);
    } else if (auto router = dyn_cast<moe::RouterOp>(op);
               router && weights.size() == 1) {
      // Routed with the select after it: each token's f64 logit sums (s,
      // sb), then on the bf16-plane path the logits GEMM's planes.
      if (!routesWithSelect(op))
        return out;
      const int64_t experts = dimOf(weights[0], 0);
      out.push_back(rows * experts * 2 * 8);
      if (bf16RowsAllowed()) {
        Value x = op.getOperand(0);
        gemmRegions(out, path(0), rows, weights[0], storedAsBf16(x));
      }
    } else if (auto attend = dyn_cast<kv::AttendOp>(op)) {
      auto decl = dyn_cast_or_null<kv::KVCacheOp>(
          SymbolTable::lookupSymbolIn(module, attend.getCacheAttr()));
      if (!decl)
        return out;
      kv::KVCacheType cache = decl.getType();
      const int64_t headDim = cache.getHeadDim();
      auto form = op.getAttrOfType<StringAttr>(kAttentionFormAttr);
      if (decode) // each split's partial output, max and sum
        out.push_back(rows * attend.getNumHeads() * shapes::kDecodeSplits *
                      (headDim + 2) * 4);
      else if (form && form.getValue() == "mma" && matmulTerms == 1)
        // The step's K and V rows rounded to bf16 once.
        out.push_back(2 * rows * cache.getKvHeads() * headDim * 2);
    } else if (auto scan = dyn_cast<kv::SSMScanOp>(op)) {
      auto decl = dyn_cast_or_null<kv::MambaStateOp>(
          SymbolTable::lookupSymbolIn(module, scan.getStateAttr()));
      auto form = op.getAttrOfType<StringAttr>(kScanFormAttr);
      if (!decl || !form)
        return out;
      // Each chunk's state from zero, and its decay.
      if ((form.getValue() == "ssd" && rows > shapes::kSsmChunk) ||
          form.getValue() == "chunked") {
        kv::MambaStateType state = decl.getType();
        const int64_t chunks = shapes::ssmChunkStates(rows, state.getSlots());
        out.push_back(chunks * state.getNumHeads() * state.getHeadDim() *
                      state.getStateSize() * 4);
        out.push_back(chunks * state.getNumHeads() * 4);
      }
    }
    return out;
  }
};

} // namespace
} // namespace nf::compiler
