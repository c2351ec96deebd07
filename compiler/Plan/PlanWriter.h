//===- PlanWriter.h - compiled module -> plan.nfb ---------------*- C++ -*-===//
#pragma once

#include "nf/status.h"

#include "mlir/IR/BuiltinOps.h"

#include <cstdint>
#include <string>
#include <vector>

namespace nf::compiler {

/// Serialises a module that went through every compile phase (steps made of
/// nf.kernel regions with planned arena offsets) into the flatbuffer plan of
/// runtime/schema/plan.fbs.
StatusOr<std::vector<uint8_t>> writePlan(mlir::ModuleOp module,
                                         const std::string &generator,
                                         float defaultExpertBudget = 1.0f);

} // namespace nf::compiler
