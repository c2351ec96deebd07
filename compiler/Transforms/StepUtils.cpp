//===- StepUtils.cpp - step functions made by nf-outline-steps ------------===//

#include "Transforms/StepUtils.h"

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

} // namespace nf::compiler
