//===- CudaAttentionForms.cpp - the CUDA kernel form of attention ---------===//
//
// Marks each nf_kv.attend of a CUDA plan with `nf.attention_form`
// (Passes.td): the kernel its launches run, chosen by what the target has
// (tensor cores, shared memory) and the shapes of the cache. The CUDA code
// generator (compiler/Target/Cuda/EmitAttention.cpp) emits that form, with
// the measurements behind each choice; both size the kernels by
// compiler/Target/Cuda/KernelShapes.h.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "Target/Cuda/KernelShapes.h"
#include "nf/IR/NfOps.h"
#include "nf_kv/IR/NfKvOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

namespace nf::compiler {
#define GEN_PASS_DEF_CUDAATTENTIONFORMS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;
namespace shapes = ::nf::codegen::shapes;

namespace nf::compiler {
namespace {

struct CudaAttentionForms : impl::CudaAttentionFormsBase<CudaAttentionForms> {
  using CudaAttentionFormsBase::CudaAttentionFormsBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    clearDecision(module, kAttentionFormAttr);
    clearDecision(module, kAttentionPositionsAttr);
    Builder b(&getContext());
    for (auto func : module.getOps<func::FuncOp>()) {
      StringRef phase = stepPhase(func);
      if (phase.empty())
        continue;
      func.walk([&](kv::AttendOp op) {
        auto decl = dyn_cast_or_null<kv::KVCacheOp>(
            SymbolTable::lookupSymbolIn(module, op.getCacheAttr()));
        if (!decl)
          return;
        kv::KVCacheType cache = decl.getType();
        const int64_t heads = op.getNumHeads(), kvHeads = cache.getKvHeads(),
                      headDim = cache.getHeadDim();
        if (heads <= 0 || kvHeads <= 0 || heads % kvHeads != 0)
          return;
        const int64_t rep = heads / kvHeads;
        if (phase == "decode") {
          op->setAttr(kAttentionFormAttr,
                      b.getStringAttr(decodeForm(rep, headDim)));
          return;
        }
        int64_t positions = 0;
        op->setAttr(kAttentionFormAttr,
                    b.getStringAttr(prefillForm(rep, headDim, positions)));
        if (positions > 0)
          op->setAttr(kAttentionPositionsAttr, b.getI64IntegerAttr(positions));
      });
    }
  }

  /// Decode (split-context flash decoding, then a combine): on tensor cores
  /// where every target has them and the query heads of a kv head fit
  /// mma's 16 rows; else a warp per (token, head, split), taken over by a
  /// warp per (token, kv head, split) for its grouped query heads from
  /// kGqaTokens tokens where they fit.
  StringRef decodeForm(int64_t rep, int64_t headDim) const {
    if (ampereOrLater && shapes::splitMmaFits(rep, headDim, maxSharedBytes))
      return "split_mma";
    if (shapes::gqaFits(rep, headDim) && maxSequences >= shapes::kGqaTokens)
      return "split_gqa";
    return "split";
  }

  /// Prefill: on tensor cores (K/V tiles of 64 positions with bf16 inputs
  /// where they fit, else 32; `positions`); else shared-memory tiles where a
  /// one-token block fits 48 KB; else a warp per (token, head).
  StringRef prefillForm(int64_t rep, int64_t headDim,
                        int64_t &positions) const {
    const int64_t terms = bf16Inputs ? 1 : 3;
    positions =
        bf16Inputs && shapes::mmaFits(headDim, terms, 64, maxSharedBytes) ? 64
                                                                          : 32;
    if (ampereOrLater &&
        shapes::mmaFits(headDim, terms, positions, maxSharedBytes))
      return "mma";
    positions = 0;
    if (shapes::attendBlockSmem(rep, headDim) <= 48 * 1024)
      return "tiles";
    return "warp";
  }
};

} // namespace
} // namespace nf::compiler
