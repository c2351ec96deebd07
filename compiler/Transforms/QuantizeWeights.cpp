//===- QuantizeWeights.cpp - choose the weights stored quantised ----------===//
//
// Compile-time quantisation (nfc compile --weights): decides which weights
// a plan stores as fp8 or int4 codes and says so in the IR (#nf.quant, the
// code element type, new tensor names, nf.quantize_from). The codes are
// computed when the plan is written (compiler/Plan/QuantizedWeights.cpp).
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"

#include "nf/IR/NfOps.h"
#include "nf/IR/ShapeChecks.h"

#include "mlir/IR/Builders.h"

namespace nf::compiler {
#define GEN_PASS_DEF_QUANTIZEWEIGHTS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;
namespace nfir = ::mlir::nf;
namespace moe = ::mlir::nf_moe;

namespace nf::compiler {
namespace {

/// What a weight is to one of its users.
enum class Role { Other, Projection, RoutedExperts };

Role roleOf(OpOperand &use) {
  Operation *op = use.getOwner();
  Value v = use.get();
  auto any = [&](std::initializer_list<Value> values) {
    return llvm::is_contained(values, v) ? Role::Projection : Role::Other;
  };
  if (auto m = dyn_cast<nfir::Mamba2Op>(op))
    return any({m.getInProj(), m.getOutProj()});
  if (auto a = dyn_cast<nfir::AttentionOp>(op))
    return any({a.getQProj(), a.getKProj(), a.getVProj(), a.getOProj()});
  if (auto m = dyn_cast<nfir::MLPOp>(op))
    return any({m.getUpProj(), m.getDownProj()});
  if (auto m = dyn_cast<nfir::MoEOp>(op)) {
    if (v == m.getExpertsUp() || v == m.getExpertsDown())
      return Role::RoutedExperts;
    if (v == m.getSharedUp() || v == m.getSharedDown() ||
        llvm::is_contained(m.getLatent(), v))
      return Role::Projection;
    return Role::Other;
  }
  // The same weights after lowering (the pass may run on lowered IR).
  if (isa<moe::ExpertUpOp, moe::ExpertDownOp>(op))
    return Role::RoutedExperts;
  if (isa<nfir::LinearOp, moe::SharedExpertOp, moe::LatentProjOp>(op))
    return Role::Projection;
  return Role::Other; // embeddings, LM head, routers, norms, convolutions
}

struct QuantizeWeightsPass : impl::QuantizeWeightsBase<QuantizeWeightsPass> {
  using Base::Base;

  void runOnOperation() override {
    if (scheme != "fp8" && scheme != "int4") {
      getOperation().emitError() << "nf-quantize-weights: unknown scheme '"
                                 << scheme << "' (expected fp8 or int4)";
      return signalPassFailure();
    }
    if (scope != "experts" && scope != "all") {
      getOperation().emitError() << "nf-quantize-weights: unknown scope '"
                                 << scope << "' (expected experts or all)";
      return signalPassFailure();
    }
    if (groupSize < 8 || (groupSize & (groupSize - 1))) {
      getOperation().emitError()
          << "nf-quantize-weights: group size " << int64_t(groupSize)
          << " is not a power of two of at least 8";
      return signalPassFailure();
    }
    getOperation().walk([&](nfir::WeightOp w) {
      if (chosen(w))
        quantize(w);
    });
  }

  bool chosen(nfir::WeightOp w) {
    auto type = w.getResult().getType();
    if (w.getQuant() || !nfir::isWeightElementType(type.getElementType()) ||
        w.getConcatRows() || w->hasAttr(kQuantizeFromAttr) ||
        w.getResult().use_empty())
      return false;
    bool experts = false;
    for (OpOperand &use : w.getResult().getUses()) {
      Role role = roleOf(use);
      if (role == Role::Other)
        return false;
      experts = experts || role == Role::RoutedExperts;
    }
    if (scope == "experts" && !experts)
      return false;
    const int64_t rank = w.getStacked() ? 3 : 2;
    return type.getRank() == rank && groupOf(type.getShape().back()) > 0;
  }

  /// int4: columns per scale for `cols` input columns (0: none fits).
  int64_t groupOf(int64_t cols) const {
    if (scheme != "int4")
      return cols;
    for (int64_t g = groupSize; g >= 8; g /= 2)
      if (cols % g == 0)
        return g;
    return 0;
  }

  void quantize(nfir::WeightOp w) {
    MLIRContext *ctx = w.getContext();
    Builder b(ctx);
    auto type = w.getResult().getType();
    const bool int4 = scheme == "int4";
    const int64_t rows = type.getDimSize(type.getRank() - 2);
    const int64_t cols = type.getShape().back();
    const int64_t group = groupOf(cols);
    ArrayAttr sources = w.getTensors();
    // One part per expert of a stacked weight, one tensor per part.
    const int64_t parts = w.getStacked() ? type.getDimSize(0) : 1;
    SmallVector<Attribute> names, scales, scaleTypes;
    auto scaleType =
        RankedTensorType::get({rows, int4 ? cols / group : 1}, b.getF32Type());
    for (int64_t p = 0; p < parts; ++p) {
      std::string base =
          cast<StringAttr>(sources[sources.size() == 1 ? 0 : p]).str();
      if (sources.size() == 1 && w.getStacked())
        base += "." + std::to_string(p);
      base += int4 ? ".nfc_int4" : ".nfc_fp8";
      names.push_back(b.getStringAttr(base));
      scales.push_back(b.getStringAttr(base + "_scale"));
      scaleTypes.push_back(TypeAttr::get(scaleType));
    }
    auto quant = nfir::QuantAttr::get(
        ctx, int4 ? nfir::QuantScheme::Int4 : nfir::QuantScheme::Fp8E4M3,
        int4 ? Type(b.getI32Type()) : Type(b.getType<Float8E4M3FNType>()),
        int4 ? 8 : 1,
        int4 ? nfir::QuantGranularity::PerGroup
             : nfir::QuantGranularity::PerChannel,
        int4 ? group : 0, /*symmetric=*/true, b.getArrayAttr(scales),
        b.getArrayAttr(scaleTypes), nfir::ActivationQuant::None, ArrayAttr(),
        ArrayAttr());
    w->setAttr(kQuantizeFromAttr, sources);
    w.setTensorsAttr(b.getArrayAttr(names));
    w.setQuantAttr(quant);
    w.getResult().setType(
        RankedTensorType::get(type.getShape(), quant.getCodeType()));
  }
};

} // namespace
} // namespace nf::compiler
