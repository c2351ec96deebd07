//===- StepUtils.cpp - step functions made by nf-outline-steps ------------===//

#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"
#include "nf_moe/IR/NfMoeOps.h"

using namespace mlir;

namespace nf::compiler {

StringRef stepPhase(func::FuncOp func) {
  if (auto phase = func->getAttrOfType<StringAttr>(kPhaseAttr))
    return phase.getValue();
  return {};
}

Value stepArgument(func::FuncOp func, StringRef role) {
  for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
    if (auto r = func.getArgAttrOfType<StringAttr>(i, kArgRoleAttr);
        r && r.getValue() == role)
      return func.getArgument(i);
  return {};
}

func::FuncOp enclosingStep(Operation *op) {
  auto func = op->getParentOfType<func::FuncOp>();
  return func && !stepPhase(func).empty() ? func : func::FuncOp();
}

Value canonicalValue(Value v) {
  while (true) {
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      auto kernel = dyn_cast<nfir::KernelOp>(arg.getOwner()->getParentOp());
      if (!kernel)
        return v;
      v = kernel.getInputs()[arg.getArgNumber()];
    } else if (auto kernel = v.getDefiningOp<nfir::KernelOp>()) {
      auto yield =
          cast<nfir::YieldOp>(kernel.getBody().front().getTerminator());
      v = yield.getValues()[cast<OpResult>(v).getResultNumber()];
    } else {
      return v;
    }
  }
}

void clearDecision(ModuleOp module, StringRef name) {
  module.walk([&](Operation *op) { op->removeAttr(name); });
}

StringRef rowFormatOf(Value v) {
  Operation *def = canonicalValue(v).getDefiningOp();
  auto format =
      def ? def->getAttrOfType<StringAttr>(kRowFormatAttr) : StringAttr();
  return format ? format.getValue() : StringRef();
}

int64_t dimOf(Value v, unsigned i) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getRank() > i ? t.getDimSize(i) : ShapedType::kDynamic;
}

bool isBf16Weight(Value v) {
  auto w = canonicalValue(v).getDefiningOp<nfir::WeightOp>();
  return w && !w.getQuant() &&
         w.getResult().getType().getElementType().isBF16();
}

bool isFp8CodesWeight(Value v) {
  auto w = canonicalValue(v).getDefiningOp<nfir::WeightOp>();
  return w && w.getQuant() &&
         isa<Float8E4M3FNType>(w.getResult().getType().getElementType());
}

bool isInt4CodesWeight(Value v) {
  auto w = canonicalValue(v).getDefiningOp<nfir::WeightOp>();
  return w && w.getQuant() &&
         w.getQuant()->getScheme() == nfir::QuantScheme::Int4;
}

bool quantisesInput(Value v) {
  auto w = canonicalValue(v).getDefiningOp<nfir::WeightOp>();
  return w && w.getQuant() &&
         w.getQuant()->getActivations() != nfir::ActivationQuant::None;
}

SmallVector<Value, 2> gemmWeights(Operation &op) {
  if (isa<nfir::LinearOp, nfir::LMHeadOp, moe::LatentProjOp>(op) &&
      op.getNumOperands() == 2)
    return {op.getOperand(1)};
  if (isa<moe::ExpertUpOp, moe::ExpertDownOp>(op) && op.getNumOperands() == 3)
    return {op.getOperand(2)};
  if (isa<moe::SharedExpertOp>(op) && op.getNumOperands() == 3)
    return {op.getOperand(1), op.getOperand(2)};
  if (isa<moe::RouterOp>(op) && op.getNumOperands() == 3)
    return {op.getOperand(1)};
  return {};
}

SmallVector<StringRef, 2> gemmPaths(Operation &op) {
  SmallVector<StringRef, 2> out;
  if (auto paths = op.getAttrOfType<ArrayAttr>(kGemmPathsAttr))
    for (Attribute a : paths)
      if (auto s = dyn_cast<StringAttr>(a))
        out.push_back(s.getValue());
  return out;
}

bool routesWithSelect(Operation &router) {
  auto select = dyn_cast_or_null<moe::SelectOp>(router.getNextNode());
  return isa<moe::RouterOp>(router) && select &&
         select->getNumOperands() == 3 &&
         select->getOperand(0) == router.getResult(0) &&
         select->getOperand(1) == router.getResult(1);
}

} // namespace nf::compiler
