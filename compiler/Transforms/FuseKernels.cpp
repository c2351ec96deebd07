//===- FuseKernels.cpp - group compute ops into nf.kernel regions ---------===//
//
// Fusion is pattern-driven: each pattern starts at an op and follows its
// users to the ops that one GPU kernel should compute together. Ops that no
// pattern claims become single-op kernels, so after this pass every compute op
// of a step lives in exactly one kernel and the step is a list of launches.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"
#include "Transforms/StepUtils.h"

#include "nf/IR/NfOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace nf::compiler {
#define GEN_PASS_DEF_FUSEKERNELS
#include "Transforms/Passes.h.inc"
} // namespace nf::compiler

using namespace mlir;

namespace nf::compiler {
namespace {

/// The single user of `v`'s results, if it is an `OpTy`.
template <typename OpTy> OpTy soleUser(Operation *op) {
  Operation *user = nullptr;
  for (Value result : op->getResults())
    for (Operation *u : result.getUsers()) {
      if (user && user != u)
        return {};
      user = u;
    }
  return user ? dyn_cast<OpTy>(user) : OpTy();
}

/// A user of `op`'s results of type `OpTy`, if there is exactly one such.
template <typename OpTy> OpTy userOfType(Operation *op) {
  OpTy found;
  for (Value result : op->getResults())
    for (Operation *u : result.getUsers())
      if (auto t = dyn_cast<OpTy>(u)) {
        if (found && found != t)
          return {};
        found = t;
      }
  return found;
}

bool isComputeOp(Operation *op) {
  if (isa<nfir::WeightOp, nfir::KernelOp, func::ReturnOp>(op))
    return false;
  return isa<nfir::NfDialect, kv::NfKvDialect, moe::NfMoeDialect>(
      op->getDialect());
}

std::string kernelName(Operation *op) {
  std::string name = op->getName().getStringRef().str();
  for (char &c : name)
    if (c == '.')
      c = '_';
  return name;
}

struct FuseKernelsPass : impl::FuseKernelsBase<FuseKernelsPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!stepPhase(func).empty())
        fuseStep(func);
  }

  void fuseStep(func::FuncOp func) {
    Block &entry = func.getBody().front();
    // Weights first: they are kernel operands, never kernel contents.
    SmallVector<nfir::WeightOp> weights(entry.getOps<nfir::WeightOp>());
    for (nfir::WeightOp w : llvm::reverse(weights))
      w->moveBefore(&entry, entry.begin());

    const bool decode = stepPhase(func) == "decode";
    if (decode)
      hoistSharedExperts(entry);
    SmallVector<Operation *> ops;
    for (Operation &op : entry)
      if (isComputeOp(&op))
        ops.push_back(&op);
    llvm::DenseSet<Operation *> claimed;
    SmallVector<std::pair<SmallVector<Operation *>, std::string>> groups;
    for (Operation *op : ops) {
      // A hoisted shared expert is claimed with its layer's router below.
      if (claimed.contains(op) || hoistedShared.contains(op))
        continue;
      auto [group, name] = match(op, decode);
      if (group.empty() || llvm::any_of(group, [&](Operation *o) {
            return claimed.contains(o);
          }))
        group = {op}, name = kernelName(op);
      claimed.insert(group.begin(), group.end());
      groups.push_back({group, name});
    }
    for (auto &[group, name] : groups)
      if (!outline(group, name))
        for (Operation *op : group) // could not fuse: one kernel per op
          outline({op}, kernelName(op));
  }

  /// Decode: the MoE layers whose shared expert can run next to the routing
  /// chain (router -> select -> dispatch -> experts) and whose end (the
  /// combine, the add of the shared expert's rows, the residual add) feeds
  /// an RMSNorm. Each such shared expert moves to just before its router,
  /// to be fused with it (match: "moe_route_shared_expert"; the code
  /// generator runs its two GEMVs in the routing chain's launches), and the
  /// layer's end becomes one kernel with the next norm
  /// ("moe_combine_add_rms_norm"). The shared expert reads only the router's
  /// input and weights, so the move keeps every use after its definition.
  void hoistSharedExperts(Block &entry) {
    sharedOfRouter.clear();
    hoistedShared.clear();
    for (auto combine :
         llvm::make_early_inc_range(entry.getOps<moe::CombineOp>())) {
      auto [shared, add] = sharedExpertAdd(combine);
      if (!shared || combineAddNorm(combine).empty())
        continue;
      auto dispatch = combine.getDispatch().getDefiningOp<moe::DispatchOp>();
      auto select = dispatch
                        ? dispatch.getExperts().getDefiningOp<moe::SelectOp>()
                        : moe::SelectOp();
      auto router = select ? select.getScores().getDefiningOp<moe::RouterOp>()
                           : moe::RouterOp();
      if (!router || soleUser<moe::SelectOp>(router) != select ||
          userOfType<moe::DispatchOp>(select) != dispatch ||
          shared.getInput() != router.getInput() ||
          llvm::any_of(shared->getOperands(), [&](Value v) {
            Operation *def = v.getDefiningOp();
            return def && def->getBlock() == &entry &&
                   !def->isBeforeInBlock(router);
          }))
        continue;
      shared->moveBefore(router);
      sharedOfRouter[router] = shared;
      hoistedShared.insert(shared);
    }
  }

  /// The ops of a decode MoE layer's end when it feeds an RMSNorm: the
  /// combine, the add of the shared expert's rows, the residual add and the
  /// norm; else {}.
  static SmallVector<Operation *> combineAddNorm(moe::CombineOp combine) {
    auto [shared, add] = sharedExpertAdd(combine);
    if (!shared)
      return {};
    auto residual = soleUser<nfir::AddOp>(add);
    auto norm =
        residual ? userOfType<nfir::RMSNormOp>(residual) : nfir::RMSNormOp();
    if (!norm || norm.getInput() != residual.getResult())
      return {};
    return {combine, add, residual, norm};
  }

  /// Decode shared experts moved before their layer's router, by router.
  llvm::DenseMap<Operation *, Operation *> sharedOfRouter;
  llvm::DenseSet<Operation *> hoistedShared;

  /// The shared expert and the add of a MoE layer's result when `combine`'s
  /// rows are the add's other operand (each the add's only input from it).
  static std::pair<moe::SharedExpertOp, nfir::AddOp>
  sharedExpertAdd(moe::CombineOp combine) {
    auto add = soleUser<nfir::AddOp>(combine);
    if (!add)
      return {};
    Value other =
        add.getLhs() == combine.getResult() ? add.getRhs() : add.getLhs();
    auto shared = other.getDefiningOp<moe::SharedExpertOp>();
    if (!shared || soleUser<nfir::AddOp>(shared) != add)
      return {};
    return {shared, add};
  }

  /// The fused group starting at `op`, with its kernel name, or {}.
  std::pair<SmallVector<Operation *>, std::string> match(Operation *op,
                                                         bool decode) {
    if (auto add = dyn_cast<nfir::AddOp>(op))
      if (auto norm = userOfType<nfir::RMSNormOp>(add))
        return {{add, norm}, "add_rms_norm"};
    if (auto router = dyn_cast<moe::RouterOp>(op))
      if (auto select = soleUser<moe::SelectOp>(router))
        if (auto dispatch = userOfType<moe::DispatchOp>(select)) {
          if (auto it = sharedOfRouter.find(op); it != sharedOfRouter.end()) {
            // With the routed experts when their projections follow the
            // dispatch: the code generator runs each of the shared expert's
            // GEMVs beside the routed one of the same side (up, down), not
            // in the routing chain, whose launches then wait for nothing
            // but the logits.
            auto up = userOfType<moe::ExpertUpOp>(dispatch);
            auto down =
                up ? soleUser<moe::ExpertDownOp>(up) : moe::ExpertDownOp();
            if (up && down && up.getDispatch() == dispatch.getResult() &&
                down.getDispatch() == dispatch.getResult()) {
              // With the layer's end and the next norm
              // (combineAddNorm) when it follows: steps of one token end
              // the layer in the down projection's launch.
              SmallVector<Operation *> group = {it->second, router, select,
                                                dispatch,   up,     down};
              if (auto combine = soleUser<moe::CombineOp>(down);
                  combine && sharedExpertAdd(combine).first == it->second) {
                SmallVector<Operation *> end = combineAddNorm(combine);
                if (!end.empty()) {
                  group.append(end.begin(), end.end());
                  return {group, "moe_layer_rms_norm"};
                }
              }
              return {group, "moe_shared_and_routed_experts"};
            }
            return {{it->second, router, select, dispatch},
                    "moe_route_shared_expert"};
          }
          return {{router, select, dispatch}, "moe_route"};
        }
    if (isa<moe::ExpertUpOp>(op))
      return {{op}, "moe_expert_up_relu2"};
    // Decode MoE layers whose shared expert runs next to the routing chain
    // end in one kernel with the next norm (hoistSharedExperts); the others
    // keep the combine with the routed down projection, as prefill does.
    if (auto down = dyn_cast<moe::ExpertDownOp>(op))
      if (auto combine = soleUser<moe::CombineOp>(down)) {
        auto shared = sharedExpertAdd(combine).first;
        if (!decode || !shared || !hoistedShared.contains(shared))
          return {{down, combine}, "moe_expert_down_combine"};
      }
    if (auto combine = dyn_cast<moe::CombineOp>(op); combine && decode)
      if (auto shared = sharedExpertAdd(combine).first;
          shared && hoistedShared.contains(shared))
        return {combineAddNorm(combine), "moe_combine_add_rms_norm"};
    if (auto conv = dyn_cast<kv::CausalConvOp>(op);
        conv && conv.getMode() == "decode")
      if (auto ssm = soleUser<kv::SSMUpdateOp>(conv))
        if (auto norm = soleUser<nfir::GatedRMSNormOp>(ssm))
          return {{conv, ssm, norm}, "mamba_decode"};
    // (Decode layers whose conv joined their in_proj, below: the state
    // update and the gated norm.)
    if (auto ssm = dyn_cast<kv::SSMUpdateOp>(op))
      if (auto norm = soleUser<nfir::GatedRMSNormOp>(ssm))
        return {{ssm, norm}, "mamba_ssm_decode"};
    if (isa<kv::SSMScanOp>(op))
      return {{op}, "mamba_ssd_scan"};
    // The shared expert's down projection adds the routed output in its
    // epilogue (the MoE layer's result).
    if (auto shared = dyn_cast<moe::SharedExpertOp>(op))
      if (auto add = soleUser<nfir::AddOp>(shared))
        return {{shared, add}, "moe_shared_expert_add"};
    if (auto linear = dyn_cast<nfir::LinearOp>(op)) {
      if (auto split = soleUser<nfir::SplitOp>(linear)) {
        if (auto append = userOfType<kv::AppendOp>(split))
          return {{linear, split, append}, "qkv_proj_append"};
        // Decode Mamba2 in_proj: with one token per sequence the conv is
        // per channel, so the GEMM's epilogue computes it (the conv window
        // read and advanced there) and xBC is never stored unconvolved.
        if (auto conv = userOfType<kv::CausalConvOp>(split);
            decode && conv && conv.getMode() == "decode" &&
            conv.getInput().getDefiningOp() == split.getOperation())
          return {{linear, split, conv}, "linear_split_conv"};
        return {{linear, split}, "linear_split"};
      }
      if (auto act = soleUser<nfir::ActivationOp>(linear))
        return {{linear, act}, "linear_" + act.getKind().str()};
    }
    return {};
  }

  /// Moves `group` into one nf.kernel; false (IR untouched) when a value the
  /// group produces is used before the group's last op.
  bool outline(ArrayRef<Operation *> group, StringRef name) {
    SmallVector<Operation *> ops(group.begin(), group.end());
    llvm::sort(
        ops, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    llvm::SmallPtrSet<Operation *, 4> inGroup(ops.begin(), ops.end());
    Operation *last = ops.back();

    llvm::SetVector<Value> inputs;
    SmallVector<Value> outputs;
    for (Operation *op : ops) {
      for (Value operand : op->getOperands())
        if (!inGroup.contains(operand.getDefiningOp()))
          inputs.insert(operand);
      for (Value result : op->getResults()) {
        bool usedOutside = false;
        for (Operation *user : result.getUsers()) {
          if (inGroup.contains(user))
            continue;
          if (user->getBlock() == last->getBlock() &&
              user->isBeforeInBlock(last))
            return false;
          usedOutside = true;
        }
        if (usedOutside)
          outputs.push_back(result);
      }
    }

    OpBuilder b(last);
    SmallVector<Location> locs;
    for (Operation *op : ops)
      locs.push_back(op->getLoc());
    Location loc = b.getFusedLoc(locs);
    SmallVector<Type> resultTypes;
    for (Value v : outputs)
      resultTypes.push_back(v.getType());
    auto kernel =
        nfir::KernelOp::create(b, loc, resultTypes, inputs.getArrayRef(),
                               b.getStringAttr(name), DenseI64ArrayAttr(),
                               DenseI64ArrayAttr());
    Block *body = new Block();
    kernel.getBody().push_back(body);
    IRMapping map;
    for (Value in : inputs)
      map.map(in, body->addArgument(in.getType(), in.getLoc()));
    OpBuilder kb = OpBuilder::atBlockEnd(body);
    for (Operation *op : ops)
      kb.clone(*op, map);
    SmallVector<Value> yielded;
    for (Value v : outputs)
      yielded.push_back(map.lookup(v));
    nfir::YieldOp::create(kb, loc, yielded);
    for (auto [v, r] : llvm::zip(outputs, kernel.getResults()))
      v.replaceAllUsesWith(r);
    for (Operation *op : llvm::reverse(ops))
      op->erase();
    return true;
  }
};

} // namespace
} // namespace nf::compiler
