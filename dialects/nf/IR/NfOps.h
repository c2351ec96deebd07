//===- NfOps.h - nf dialect operations --------------------------*- C++ -*-===//
#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "nf/IR/NfAttrs.h"
#include "nf/IR/NfDialect.h"

#define GET_OP_CLASSES
#include "nf/IR/NfOps.h.inc"
