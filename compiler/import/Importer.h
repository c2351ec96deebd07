//===- Importer.h - Hugging Face checkpoint -> nf dialect --------*- C++
//-*-===//
#pragma once

#include "nf/status.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <string>

namespace mlir {
class MLIRContext;
}

namespace nf::import {

/// Reads `dir`/config.json and the safetensors header(s), checks every tensor
/// the model needs, and builds a verified module holding one `nf.model`.
/// Errors are one line naming the file and the problem.
StatusOr<mlir::OwningOpRef<mlir::ModuleOp>>
importCheckpoint(mlir::MLIRContext &context, const std::string &dir);

} // namespace nf::import
