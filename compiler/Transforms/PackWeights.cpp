//===- PackWeights.cpp - fuse linears over concatenated weights -----------===//

#include "Transforms/Passes.h"

#include "nf/IR/NfOps.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

namespace nf::compiler {
#define GEN_PASS_DEF_PACKWEIGHTS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;
namespace nfir = ::mlir::nf;

namespace nf::compiler {
namespace {

/// Scale element type of a quant's first part (every part of a weight that
/// packing produces must agree).
Type scaleElementType(ArrayAttr types) {
  return cast<RankedTensorType>(cast<TypeAttr>(types[0]).getValue())
      .getElementType();
}

/// Quantised weights concatenate when they are quantised the same way (one
/// GEMM, one kernel variant); each part keeps its own scales. Unquantised
/// weights concatenate only with unquantised ones.
bool sameQuantFormat(nfir::WeightOp wa, nfir::WeightOp wb) {
  nfir::QuantAttr a = wa.getQuantAttr(), b = wb.getQuantAttr();
  if (!a || !b)
    return !a && !b;
  // Codes a checkpoint holds and codes compile-time quantisation computes
  // are bound differently: never in one weight.
  if (wa->hasAttr(kQuantizeFromAttr) != wb->hasAttr(kQuantizeFromAttr))
    return false;
  auto inputType = [](nfir::QuantAttr q) {
    return q.getInputScaleTypes() ? scaleElementType(q.getInputScaleTypes())
                                  : Type();
  };
  return a.getScheme() == b.getScheme() && a.getStorage() == b.getStorage() &&
         a.getPack() == b.getPack() &&
         a.getGranularity() == b.getGranularity() &&
         a.getGroupSize() == b.getGroupSize() &&
         a.getSymmetric() == b.getSymmetric() &&
         a.getActivations() == b.getActivations() &&
         scaleElementType(a.getScaleTypes()) ==
             scaleElementType(b.getScaleTypes()) &&
         inputType(a) == inputType(b);
}

/// The quant of the concatenation of `parts`: the first part's format with
/// every part's scales, in order. Null when the parts are unquantised.
nfir::QuantAttr concatQuant(MutableArrayRef<nfir::WeightOp> parts) {
  nfir::QuantAttr first = parts.front().getQuantAttr();
  if (!first)
    return {};
  SmallVector<Attribute> scales, scaleTypes, inputScales, inputTypes;
  for (nfir::WeightOp w : parts) {
    nfir::QuantAttr q = w.getQuantAttr();
    llvm::append_range(scales, q.getScales());
    llvm::append_range(scaleTypes, q.getScaleTypes());
    if (q.getInputScales()) {
      llvm::append_range(inputScales, q.getInputScales());
      llvm::append_range(inputTypes, q.getInputScaleTypes());
    }
  }
  MLIRContext *ctx = first.getContext();
  auto array = [&](ArrayRef<Attribute> a) {
    return a.empty() ? ArrayAttr() : ArrayAttr::get(ctx, a);
  };
  return nfir::QuantAttr::get(
      ctx, first.getScheme(), first.getStorage(), first.getPack(),
      first.getGranularity(), first.getGroupSize(), first.getSymmetric(),
      array(scales), array(scaleTypes), first.getActivations(),
      array(inputScales), array(inputTypes));
}

/// A plain (unstacked, unpacked) weight that can be concatenated.
nfir::WeightOp plainWeight(Value v) {
  auto w = v.getDefiningOp<nfir::WeightOp>();
  if (!w || w.getStacked() || w.getConcatRows() ||
      w.getResult().getType().getRank() != 2)
    return {};
  return w;
}

struct PackWeightsPass : impl::PackWeightsBase<PackWeightsPass> {
  void runOnOperation() override {
    SmallVector<Block *> blocks;
    getOperation().walk([&](Block *block) { blocks.push_back(block); });
    for (Block *block : blocks) {
      // Linears grouped by input, in program order.
      llvm::MapVector<Value, SmallVector<nfir::LinearOp>> byInput;
      for (auto linear : block->getOps<nfir::LinearOp>())
        if (plainWeight(linear.getWeight()))
          byInput[linear.getInput()].push_back(linear);
      for (auto &[input, group] : byInput)
        if (group.size() > 1 && compatible(group))
          fuse(group);
    }
  }

  static bool compatible(MutableArrayRef<nfir::LinearOp> group) {
    auto first = plainWeight(group[0].getWeight()).getResult().getType();
    return llvm::all_of(group, [&](nfir::LinearOp op) {
      auto t = plainWeight(op.getWeight()).getResult().getType();
      return t.getElementType() == first.getElementType() &&
             t.getDimSize(1) == first.getDimSize(1) &&
             sameQuantFormat(plainWeight(op.getWeight()),
                             plainWeight(group[0].getWeight()));
    });
  }

  void fuse(MutableArrayRef<nfir::LinearOp> group) {
    OpBuilder b(group.front());
    SmallVector<Attribute> names;
    SmallVector<int64_t> weightRows;
    SmallVector<nfir::WeightOp> parts;
    for (nfir::LinearOp op : group) {
      auto w = plainWeight(op.getWeight());
      parts.push_back(w);
      names.push_back(w.getTensors()[0]);
      weightRows.push_back(w.getResult().getType().getDimSize(0));
    }
    int64_t total = 0;
    for (int64_t r : weightRows)
      total += r;
    auto first = plainWeight(group[0].getWeight()).getResult().getType();
    auto packedType = RankedTensorType::get({total, first.getDimSize(1)},
                                            first.getElementType());
    Location loc = b.getFusedLoc(llvm::to_vector(
        llvm::map_range(group, [](nfir::LinearOp op) { return op.getLoc(); })));
    auto packed = nfir::WeightOp::create(
        b, loc, packedType, b.getArrayAttr(names), UnitAttr(),
        b.getDenseI64ArrayAttr(weightRows), concatQuant(parts));
    // Compile-time quantisation: the parts' sources, in order.
    if (parts.front()->hasAttr(kQuantizeFromAttr)) {
      SmallVector<Attribute> sources;
      for (nfir::WeightOp w : parts)
        llvm::append_range(sources,
                           w->getAttrOfType<ArrayAttr>(kQuantizeFromAttr));
      packed->setAttr(kQuantizeFromAttr, b.getArrayAttr(sources));
    }
    auto resultType =
        RankedTensorType::get({ShapedType::kDynamic, total}, b.getF32Type());
    Value fused =
        nfir::LinearOp::create(b, loc, resultType, group[0].getInput(), packed);
    SmallVector<Type> types;
    for (nfir::LinearOp op : group)
      types.push_back(op.getType());
    auto split = nfir::SplitOp::create(b, loc, types, fused,
                                       b.getDenseI64ArrayAttr(weightRows));
    for (auto [op, result] : llvm::zip(group, split.getResults())) {
      Operation *weight = op.getWeight().getDefiningOp();
      op.getResult().replaceAllUsesWith(result);
      op.erase();
      if (weight->use_empty())
        weight->erase();
    }
  }
};

} // namespace
} // namespace nf::compiler
