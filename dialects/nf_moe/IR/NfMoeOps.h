//===- NfMoeOps.h - the nf_moe dialect ----------------------------*- C++
//-*-===//
#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "nf_moe/IR/NfMoeDialect.h.inc"

#define GET_TYPEDEF_CLASSES
#include "nf_moe/IR/NfMoeTypes.h.inc"

#define GET_OP_CLASSES
#include "nf_moe/IR/NfMoeOps.h.inc"
