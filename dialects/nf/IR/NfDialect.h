//===- NfDialect.h - the nf model dialect -----------------------*- C++ -*-===//
#pragma once

#include "mlir/IR/Dialect.h"

#include "nf/IR/NfDialect.h.inc"
