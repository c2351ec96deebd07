//===- LowerMoE.cpp - nf.moe -> nf_moe ------------------------------------===//
//
// Selection is a run-time decision: `nf_moe.select` takes the step's
// per-token expert budget as an operand whatever the policy, so the budget
// scheduler changes an attribute, not the IR's shape.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"

#include "mlir/IR/Builders.h"

namespace nf::compiler {
#define GEN_PASS_DEF_LOWERMOE
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

RankedTensorType rows(Type element, int64_t features) {
  return RankedTensorType::get({ShapedType::kDynamic, features}, element);
}

struct LowerMoEPass : impl::LowerMoEBase<LowerMoEPass> {
  using Base::Base;

  void runOnOperation() override {
    if (policy != "topk" && policy != "budget") {
      getOperation().emitError()
          << "nf-lower-moe: unknown policy '"
          << static_cast<std::string>(policy) << "' (expected topk or budget)";
      return signalPassFailure();
    }
    SmallVector<nfir::MoEOp> ops;
    getOperation().walk([&](nfir::MoEOp op) { ops.push_back(op); });
    for (nfir::MoEOp op : ops) {
      func::FuncOp step = enclosingStep(op);
      Value budget = step ? stepArgument(step, "expert_budget") : Value();
      if (!budget) {
        op.emitOpError() << "must be inside a step function with an "
                         << "'expert_budget' argument (run nf-outline-steps)";
        return signalPassFailure();
      }
      if (minK > op.getTopK()) {
        op.emitOpError() << "min-k (" << static_cast<int64_t>(minK)
                         << ") exceeds top_k (" << op.getTopK() << ")";
        return signalPassFailure();
      }
      lower(op, budget);
    }
  }

  void lower(nfir::MoEOp op, Value budget) {
    OpBuilder b(op);
    Location loc = op.getLoc();
    Type f32 = b.getF32Type();
    const int64_t e = op.getNumExperts(), k = op.getTopK();
    auto hidden = cast<RankedTensorType>(op.getType());

    auto router =
        moe::RouterOp::create(b, loc, rows(f32, e), rows(f32, e), op.getInput(),
                              op.getRouter(), op.getCorrectionBias());
    auto select = moe::SelectOp::create(
        b, loc, rows(b.getI32Type(), k), rows(f32, k),
        RankedTensorType::get({ShapedType::kDynamic}, b.getI32Type()),
        router.getScores(), router.getSelectionScores(), budget,
        op.getTopKAttr(), b.getI64IntegerAttr(policy == "topk" ? k : minK),
        op.getNGroupAttr(), op.getTopkGroupAttr(), op.getNormTopkProbAttr(),
        op.getRoutedScalingFactorAttr(), b.getStringAttr(policy));
    Value dispatch = moe::DispatchOp::create(
        b, loc, moe::DispatchType::get(b.getContext(), e, k),
        select.getExperts(), select.getCounts());

    Value expertIn = op.getInput();
    if (op.hasLatent()) {
      auto down = cast<RankedTensorType>(op.getLatent()[0].getType());
      expertIn = moe::LatentProjOp::create(
          b, loc, rows(f32, down.getDimSize(0)), expertIn, op.getLatent()[0],
          b.getStringAttr("down"));
    }
    auto up = cast<RankedTensorType>(op.getExpertsUp().getType());
    auto expertInType = cast<RankedTensorType>(expertIn.getType());
    Value h = moe::ExpertUpOp::create(b, loc, rows(f32, up.getDimSize(1)),
                                      expertIn, dispatch, op.getExpertsUp(),
                                      op.getActivationAttr());
    Value y = moe::ExpertDownOp::create(b, loc, expertInType, h, dispatch,
                                        op.getExpertsDown());
    Value routed = moe::CombineOp::create(b, loc, expertInType, y, dispatch,
                                          select.getWeights());
    if (op.hasLatent())
      routed = moe::LatentProjOp::create(
          b, loc, hidden, routed, op.getLatent()[1], b.getStringAttr("up"));
    Value shared = moe::SharedExpertOp::create(
        b, loc, hidden, op.getInput(), op.getSharedUp(), op.getSharedDown(),
        op.getActivationAttr());
    Value out = nfir::AddOp::create(b, loc, routed, shared);
    op.getResult().replaceAllUsesWith(out);
    op.erase();
  }
};

} // namespace
} // namespace nf::compiler
