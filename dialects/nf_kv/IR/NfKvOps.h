//===- NfKvOps.h - the nf_kv dialect ----------------------------*- C++ -*-===//
#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "nf_kv/IR/NfKvDialect.h.inc"

#define GET_TYPEDEF_CLASSES
#include "nf_kv/IR/NfKvTypes.h.inc"

#define GET_OP_CLASSES
#include "nf_kv/IR/NfKvOps.h.inc"
