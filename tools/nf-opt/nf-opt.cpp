//===- nf-opt.cpp - run nf passes on MLIR files ---------------------------===//
//
// The mlir-opt of this project: parses, verifies and transforms IR with every
// nf dialect and pass registered. Drives the lit tests.
//
//===----------------------------------------------------------------------===//

#include "Pipeline/Pipeline.h"
#include "Transforms/Passes.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerTransformsPasses();
  nf::compiler::registerNFPasses();
  mlir::DialectRegistry registry;
  nf::compiler::registerDialects(registry);
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "nf optimizer driver\n", registry));
}
