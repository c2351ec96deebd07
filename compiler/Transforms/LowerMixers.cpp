//===- LowerMixers.cpp - Mamba2/attention/MLP -> nf_kv + compute ops ------===//
//
// The phase of the enclosing step decides the recurrent form: decode updates
// the Mamba state once per sequence, prefill runs the chunked SSD scan. The
// storage a mixer needs is declared once per layer at module level and named
// after the layer, so the prefill and decode steps share it.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

#include <cmath>
#include <string>

namespace nf::compiler {
#define GEN_PASS_DEF_LOWERMIXERS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

/// Activations [tokens, features] of f32.
RankedTensorType activation(MLIRContext *ctx, int64_t features) {
  return RankedTensorType::get({ShapedType::kDynamic, features},
                               Float32Type::get(ctx));
}

struct LowerMixersPass : impl::LowerMixersBase<LowerMixersPass> {
  using Base::Base;
  Type kvElement; // of every KV cache (kv-dtype)

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    if (kvDtype == "f32") {
      kvElement = Float32Type::get(ctx);
    } else if (kvDtype == "bf16") {
      kvElement = BFloat16Type::get(ctx);
    } else if (kvDtype == "fp8") {
      kvElement = Float8E4M3FNType::get(ctx);
    } else {
      module.emitError() << "nf-lower-mixers: kv-dtype must be f32, bf16 or "
                            "fp8, got '"
                         << kvDtype << "'";
      return signalPassFailure();
    }
    if (kvHotWindow < 0 || (kvHotWindow > 0 && kvDtype != "fp8")) {
      module.emitError() << "nf-lower-mixers: kv-hot-window needs kv-dtype "
                            "fp8 and a positive window";
      return signalPassFailure();
    }
    for (auto func : module.getOps<func::FuncOp>()) {
      if (stepPhase(func).empty())
        continue;
      Value batch = stepArgument(func, "batch");
      if (!batch) {
        func.emitOpError() << "step function has no 'batch' argument";
        return signalPassFailure();
      }
      // Layers are numbered by their mixers in program order.
      SmallVector<Operation *> mixers;
      func.walk([&](Operation *op) {
        if (isa<nfir::Mamba2Op, nfir::AttentionOp, nfir::MLPOp, nfir::MoEOp>(
                op))
          mixers.push_back(op);
      });
      for (auto [layer, op] : llvm::enumerate(mixers)) {
        OpBuilder b(op);
        Value result;
        if (auto m = dyn_cast<nfir::Mamba2Op>(op))
          result = lowerMamba(b, module, m, batch, layer, stepPhase(func));
        else if (auto a = dyn_cast<nfir::AttentionOp>(op))
          result = lowerAttention(b, module, a, batch, layer, stepPhase(func));
        else if (auto mlp = dyn_cast<nfir::MLPOp>(op))
          result = lowerMLP(b, mlp);
        if (!result)
          continue; // MoE: nf-lower-moe
        op->getResult(0).replaceAllUsesWith(result);
        op->erase();
      }
    }
  }

  /// The storage op named `name`, created at the module start if missing.
  template <typename StorageOp, typename StorageType>
  void declare(ModuleOp module, StringRef name, StorageType type,
               int64_t layer) {
    if (SymbolTable::lookupSymbolIn(module, name))
      return;
    // Declarations go before the step functions, in layer order.
    OpBuilder b = OpBuilder::atBlockBegin(module.getBody());
    if (auto funcs = module.getOps<func::FuncOp>(); !funcs.empty())
      b.setInsertionPoint(*funcs.begin());
    if constexpr (std::is_same_v<StorageOp, kv::KVCacheOp>)
      StorageOp::create(b, module.getLoc(), b.getStringAttr(name),
                        TypeAttr::get(type), b.getI64IntegerAttr(layer),
                        kvHotWindow > 0 ? b.getI64IntegerAttr(kvHotWindow)
                                        : IntegerAttr());
    else
      StorageOp::create(b, module.getLoc(), b.getStringAttr(name),
                        TypeAttr::get(type), b.getI64IntegerAttr(layer));
  }

  Value lowerMamba(OpBuilder &b, ModuleOp module, nfir::Mamba2Op op,
                   Value batch, int64_t layer, StringRef phase) {
    MLIRContext *ctx = b.getContext();
    Location loc = op.getLoc();
    const int64_t nh = op.getNumHeads(), p = op.getHeadDim(),
                  n = op.getStateSize(), g = op.getNGroups(),
                  k = op.getConvKernel();
    const int64_t inner = nh * p, convDim = inner + 2 * g * n;
    std::string name = "mamba_state_" + std::to_string(layer);
    declare<kv::MambaStateOp>(
        module, name,
        kv::MambaStateType::get(ctx, maxSequences, convDim, k - 1, nh, p, n),
        layer);
    auto sym = FlatSymbolRefAttr::get(ctx, name);

    Value zxbcdt =
        nfir::LinearOp::create(b, loc, activation(ctx, inner + convDim + nh),
                               op.getInput(), op.getInProj());
    auto split = nfir::SplitOp::create(
        b, loc,
        TypeRange{activation(ctx, inner), activation(ctx, convDim),
                  activation(ctx, nh)},
        zxbcdt, b.getDenseI64ArrayAttr({inner, convDim, nh}));
    Value z = split.getResult(0), xbc = split.getResult(1),
          dt = split.getResult(2);
    Value conv = kv::CausalConvOp::create(
        b, loc, xbc.getType(), sym, batch, xbc, op.getConvWeight(),
        op.getConvBias(), b.getStringAttr(phase));
    Value y;
    if (phase == "decode")
      y = kv::SSMUpdateOp::create(
          b, loc, activation(ctx, inner), sym, batch, conv, dt, op.getDtBias(),
          op.getALog(), op.getD(), op.getNGroupsAttr(), op.getTimeStepMinAttr(),
          op.getTimeStepMaxAttr());
    else
      y = kv::SSMScanOp::create(
          b, loc, activation(ctx, inner), sym, batch, conv, dt, op.getDtBias(),
          op.getALog(), op.getD(), op.getNGroupsAttr(), op.getTimeStepMinAttr(),
          op.getTimeStepMaxAttr(), op.getChunkSizeAttr());
    Value normed = nfir::GatedRMSNormOp::create(
        b, loc, y.getType(), y, z, op.getNormWeight(), op.getNGroupsAttr(),
        op.getEpsilonAttr());
    return nfir::LinearOp::create(b, loc, op.getType(), normed,
                                  op.getOutProj());
  }

  Value lowerAttention(OpBuilder &b, ModuleOp module, nfir::AttentionOp op,
                       Value batch, int64_t layer, StringRef phase) {
    MLIRContext *ctx = b.getContext();
    Location loc = op.getLoc();
    if (op.getRopeTheta()) {
      op.emitOpError() << "rotary position embeddings are not supported yet";
      signalPassFailure();
      return {};
    }
    const int64_t nq = op.getNumHeads(), nkv = op.getNumKvHeads(),
                  hd = op.getHeadDim();
    std::string name = "kv_cache_" + std::to_string(layer);
    // f32 by default, so decode is exact; bf16 and fp8 halve and quarter
    // the bytes (the backend rounds on write).
    declare<kv::KVCacheOp>(module, name,
                           kv::KVCacheType::get(ctx, pageSize, kvPages, nkv, hd,
                                                kvElement),
                           layer);
    auto sym = FlatSymbolRefAttr::get(ctx, name);
    Value q = nfir::LinearOp::create(b, loc, activation(ctx, nq * hd),
                                     op.getInput(), op.getQProj());
    Value k = nfir::LinearOp::create(b, loc, activation(ctx, nkv * hd),
                                     op.getInput(), op.getKProj());
    Value v = nfir::LinearOp::create(b, loc, activation(ctx, nkv * hd),
                                     op.getInput(), op.getVProj());
    kv::AppendOp::create(b, loc, sym, batch, k, v);
    double scale = op.getScale() ? op.getScale()->convertToDouble()
                                 : 1.0 / std::sqrt(static_cast<double>(hd));
    Value o = kv::AttendOp::create(
        b, loc, q.getType(), sym, batch, q, b.getI64IntegerAttr(nq),
        b.getF64FloatAttr(scale), b.getStringAttr(phase));
    return nfir::LinearOp::create(b, loc, op.getType(), o, op.getOProj());
  }

  Value lowerMLP(OpBuilder &b, nfir::MLPOp op) {
    Location loc = op.getLoc();
    auto up = cast<RankedTensorType>(op.getUpProj().getType());
    Value h = nfir::LinearOp::create(
        b, loc, activation(b.getContext(), up.getDimSize(0)), op.getInput(),
        op.getUpProj());
    h = nfir::ActivationOp::create(b, loc, h, op.getActivationAttr());
    return nfir::LinearOp::create(b, loc, op.getType(), h, op.getDownProj());
  }
};

} // namespace
} // namespace nf::compiler
