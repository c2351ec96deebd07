//===- CudaScanForms.cpp - the CUDA kernel form of each Mamba2 scan -------===//
//
// Marks each prefill nf_kv.ssm_scan of a CUDA plan with `nf.scan_form`
// (Passes.td): SSD's matrix form on tensor cores, the sequential walk over
// chunks in parallel, or the walk over each sequence. The CUDA code
// generator (compiler/Target/Cuda/EmitMamba.cpp) emits that form; both size
// the kernels by compiler/Target/Cuda/KernelShapes.h.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "Target/Cuda/KernelShapes.h"
#include "nf_kv/IR/NfKvOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

namespace nf::compiler {
#define GEN_PASS_DEF_CUDASCANFORMS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;
namespace shapes = ::nf::codegen::shapes;

namespace nf::compiler {
namespace {

struct CudaScanForms : impl::CudaScanFormsBase<CudaScanForms> {
  using CudaScanFormsBase::CudaScanFormsBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    clearDecision(module, kScanFormAttr);
    clearDecision(module, kScanSubChunkAttr);
    Builder b(&getContext());
    module.walk([&](kv::SSMScanOp op) {
      auto decl = dyn_cast_or_null<kv::MambaStateOp>(
          SymbolTable::lookupSymbolIn(module, op.getStateAttr()));
      if (!decl)
        return;
      kv::MambaStateType state = decl.getType();
      const int64_t P = state.getHeadDim(), N = state.getStateSize();
      if (P <= 0 || N <= 0 || state.getSlots() <= 0) {
        op->setAttr(kScanFormAttr, b.getStringAttr("sequential"));
        return;
      }
      // Sub-chunks of 64 tokens, 32 where 64 needs more shared memory than
      // the targets have.
      const int64_t sub =
          shapes::ssdFits(P, N, 64, matmulTerms, maxSharedBytes) ? 64 : 32;
      if (ampereOrLater &&
          shapes::ssdFits(P, N, sub, matmulTerms, maxSharedBytes)) {
        op->setAttr(kScanFormAttr, b.getStringAttr("ssd"));
        op->setAttr(kScanSubChunkAttr, b.getI64IntegerAttr(sub));
        return;
      }
      const bool chunked =
          maxTokens > shapes::kSsmChunk && shapes::ssmChunkedWalkFits(P, N);
      op->setAttr(kScanFormAttr,
                  b.getStringAttr(chunked ? "chunked" : "sequential"));
    });
  }
};

} // namespace
} // namespace nf::compiler
