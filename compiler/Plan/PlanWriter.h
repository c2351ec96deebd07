//===- PlanWriter.h - compiled module -> plan.nfb ---------------*- C++ -*-===//
#pragma once

#include "nf/status.h"

#include "mlir/IR/BuiltinOps.h"

#include <cstdint>
#include <string>
#include <vector>

namespace nf::codegen {
struct CudaOptions;
struct CudaPlanBinaries;
} // namespace nf::codegen

namespace nf::compiler {

/// Serialises a module that went through every compile phase (steps made of
/// nf.kernel regions with planned arena offsets) into the flatbuffer plan of
/// runtime/schema/plan.fbs.
///
/// With `cuda` (target "cuda"), every kernel also gets its CUDA module
/// (compiler/Target/Cuda), generated from the module's PlanModel
/// (Plan/PlanModel.h), the same tables the plan is written from: the plan
/// is written once, with the cubins, PTX, launches and source hashes, the
/// scratch the generated kernels add, and Target{"cuda", archs}. `binaries`,
/// if given, receives the compile statistics. Without `cuda` the plan is
/// exactly the CPU plan.
StatusOr<std::vector<uint8_t>>
writePlan(mlir::ModuleOp module, const std::string &generator,
          float defaultExpertBudget = 1.0f,
          const codegen::CudaOptions *cuda = nullptr,
          codegen::CudaPlanBinaries *binaries = nullptr);

} // namespace nf::compiler
