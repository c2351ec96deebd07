//===- nf-opt.cpp - run nf passes on MLIR files ---------------------------===//
//
// The mlir-opt of this project: parses, verifies and transforms IR with every
// nf dialect and pass registered. Drives the lit tests.
//
//===----------------------------------------------------------------------===//

#include "nf/IR/NfDialect.h"
#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerTransformsPasses();
  mlir::DialectRegistry registry;
  registry.insert<mlir::nf::NfDialect, mlir::nf_kv::NfKvDialect,
                  mlir::nf_moe::NfMoeDialect, mlir::func::FuncDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "nf optimizer driver\n", registry));
}
