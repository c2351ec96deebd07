//===- OutlineSteps.cpp - nf.model -> prefill/decode step functions -------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace nf::compiler {
#define GEN_PASS_DEF_OUTLINESTEPS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

struct OutlineStepsPass : impl::OutlineStepsBase<OutlineStepsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<mlir::nf::ModelOp> models(module.getOps<mlir::nf::ModelOp>());
    if (models.size() > 1) {
      models[1].emitOpError()
          << "a module holds one model; found " << models.size();
      return signalPassFailure();
    }
    for (mlir::nf::ModelOp model : models)
      outline(module, model);
  }

  void outline(ModuleOp module, mlir::nf::ModelOp model) {
    MLIRContext *ctx = &getContext();
    OpBuilder b(model);
    Block &body = model.getBody().front();
    auto logits = cast<mlir::nf::OutputOp>(body.getTerminator()).getLogits();

    // Model-level facts the runtime needs move to the module.
    NamedAttrList info(model->getAttrDictionary());
    // One letter per layer, in order: what the plan reports and checks.
    std::string kinds;
    for (Operation &op : body)
      if (isa<mlir::nf::Mamba2Op>(op))
        kinds += 'M';
      else if (isa<mlir::nf::AttentionOp>(op))
        kinds += '*';
      else if (isa<mlir::nf::MLPOp>(op))
        kinds += '-';
      else if (isa<mlir::nf::MoEOp>(op))
        kinds += 'E';
    info.set("layer_kinds", b.getStringAttr(kinds));
    module->setAttr("nf.model", info.getDictionary(ctx));

    auto tokens = body.getArgument(0).getType();
    auto batch = mlir::nf_kv::BatchType::get(ctx);
    auto budget = RankedTensorType::get({ShapedType::kDynamic}, b.getF32Type());
    auto type = b.getFunctionType({tokens, batch, budget}, {logits.getType()});
    for (StringRef phase : {"prefill", "decode"}) {
      auto func = func::FuncOp::create(b, model.getLoc(), phase, type);
      func->setAttr(kPhaseAttr, b.getStringAttr(phase));
      const char *roles[] = {"tokens", "batch", "expert_budget"};
      for (auto [i, role] : llvm::enumerate(roles))
        func.setArgAttr(i, kArgRoleAttr, b.getStringAttr(role));
      Block *entry = func.addEntryBlock();
      IRMapping map;
      map.map(body.getArgument(0), entry->getArgument(0));
      OpBuilder fb = OpBuilder::atBlockEnd(entry);
      for (Operation &op : body.without_terminator())
        fb.clone(op, map);
      func::ReturnOp::create(fb, model.getLoc(), map.lookup(logits));
    }
    model.erase();
  }
};

} // namespace
} // namespace nf::compiler
