//===- NfDialect.cpp - the nf model dialect -------------------------------===//

#include "nf/IR/NfDialect.h"
#include "nf/IR/NfOps.h"

using namespace mlir;
using namespace mlir::nf;

#include "nf/IR/NfDialect.cpp.inc"

void NfDialect::initialize() {
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "nf/IR/NfOps.cpp.inc"
      >();
}
