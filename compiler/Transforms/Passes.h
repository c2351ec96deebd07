//===- Passes.h - nf compiler passes ----------------------------*- C++ -*-===//
#pragma once

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include <memory>

namespace nf::compiler {

#define GEN_PASS_DECL
#include "Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Transforms/Passes.h.inc"

} // namespace nf::compiler
