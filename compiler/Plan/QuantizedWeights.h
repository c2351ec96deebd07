//===- QuantizedWeights.h - codes of compile-time quantisation --*- C++ -*-===//
#pragma once

#include "nf/status.h"

#include "mlir/IR/BuiltinOps.h"

#include <string>

namespace nf::compiler {

/// Computes the codes and scales of every weight that nf-quantize-weights
/// marked (`nf.quantize_from`) from the checkpoint tensors they name, round
/// to nearest as #nf.quant defines, and writes them to `path` (one
/// safetensors file, written whole or not at all). Records the file's name
/// in the module's `nf.model` as `plan_weight_files` (the plan's directory
/// holds it) and drops the marks. No marks: writes nothing. Errors name the
/// tensor or file.
Status writeQuantizedWeights(mlir::ModuleOp module, const std::string &path);

} // namespace nf::compiler
