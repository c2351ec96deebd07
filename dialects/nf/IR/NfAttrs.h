//===- NfAttrs.h - nf dialect attributes ------------------------*- C++ -*-===//
#pragma once

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/DialectImplementation.h"

#include "nf/IR/NfEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "nf/IR/NfAttrs.h.inc"
