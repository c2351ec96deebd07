//===- Passes.h - nf compiler passes ----------------------------*- C++ -*-===//
#pragma once

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include <memory>

namespace nf::compiler {

/// On an nf.weight that nf-quantize-weights chose: the checkpoint tensors
/// its codes are computed from, one per part (a stacked weight's one tensor:
/// its experts). Packing concatenates the parts' lists; the plan writer's
/// caller computes the codes and drops the attribute.
inline constexpr llvm::StringLiteral kQuantizeFromAttr = "nf.quantize_from";

#define GEN_PASS_DECL
#include "Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Transforms/Passes.h.inc"

} // namespace nf::compiler
