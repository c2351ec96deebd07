//===- NfMoeOps.cpp - mixture-of-experts execution ------------------------===//

#include "nf_moe/IR/NfMoeOps.h"

#include "nf/IR/ShapeChecks.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::nf_moe;
using mlir::nf::checkActivation;
using mlir::nf::checkLinearWeight;
using mlir::nf::checkPositive;
using mlir::nf::checkSameTokens;
using mlir::nf::checkWeight;

#include "nf_moe/IR/NfMoeDialect.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "nf_moe/IR/NfMoeTypes.cpp.inc"

void NfMoeDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "nf_moe/IR/NfMoeTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "nf_moe/IR/NfMoeOps.cpp.inc"
      >();
}

static LogicalResult checkActivationKind(Operation *op, StringRef act) {
  if (act != "relu2")
    return op->emitOpError()
           << "unsupported activation '" << act << "' (supported: relu2)";
  return success();
}

LogicalResult RouterOp::verify() {
  int64_t hidden, experts, selection;
  if (failed(checkActivation(*this, "input", getInput().getType(), hidden)) ||
      failed(
          checkActivation(*this, "scores", getScores().getType(), experts)) ||
      failed(checkActivation(*this, "selection scores",
                             getSelectionScores().getType(), selection)) ||
      failed(checkWeight(*this, "router", getWeight(), {experts, hidden})) ||
      failed(checkWeight(*this, "correction_bias", getCorrectionBias(),
                         {experts})) ||
      failed(
          checkSameTokens(*this, getInput().getType(), getScores().getType())))
    return failure();
  if (getScores().getType() != getSelectionScores().getType())
    return emitOpError() << "scores and selection scores differ in type";
  return success();
}

LogicalResult SelectOp::verify() {
  int64_t experts;
  if (failed(checkActivation(*this, "scores", getScores().getType(), experts)))
    return failure();
  const int64_t k = getTopK(), minK = getMinK(), ng = getNGroup(),
                tg = getTopkGroup();
  if (failed(checkPositive(*this, "top_k", k)) ||
      failed(checkPositive(*this, "min_k", minK)) ||
      failed(checkPositive(*this, "n_group", ng)) ||
      failed(checkPositive(*this, "topk_group", tg)))
    return failure();
  if (k > experts)
    return emitOpError() << "top_k (" << k
                         << ") exceeds the number of experts (" << experts
                         << ")";
  if (minK > k)
    return emitOpError() << "min_k (" << minK << ") exceeds top_k (" << k
                         << ")";
  if (experts % ng != 0 || tg > ng)
    return emitOpError() << "expert groups must satisfy n_group | experts and "
                         << "topk_group <= n_group";
  if (getPolicy() != "topk" && getPolicy() != "budget")
    return emitOpError() << "unknown selection policy '" << getPolicy()
                         << "' (expected topk or budget)";
  auto ids = cast<RankedTensorType>(getExperts().getType());
  auto weights = cast<RankedTensorType>(getWeights().getType());
  if (ids.getRank() != 2 || ids.getDimSize(1) != k ||
      !ids.getElementType().isSignlessInteger(32))
    return emitOpError() << "experts must be [tokens, " << k << "] i32, got "
                         << ids;
  if (weights.getRank() != 2 || weights.getDimSize(1) != k ||
      !weights.getElementType().isF32())
    return emitOpError() << "weights must be [tokens, " << k << "] f32, got "
                         << weights;
  auto budget = cast<RankedTensorType>(getBudget().getType());
  if (budget.getRank() != 1 || !budget.getElementType().isF32())
    return emitOpError() << "budget must be a per-token f32 vector, got "
                         << budget;
  return success();
}

static LogicalResult checkExpertGemm(Operation *op, Value input,
                                     DispatchType dispatch, Value weight,
                                     Type result) {
  int64_t in, out;
  if (failed(checkActivation(op, "input", input.getType(), in)) ||
      failed(checkActivation(op, "result", result, out)))
    return failure();
  return checkLinearWeight(op, "expert", weight,
                           {dispatch.getNumExperts(), out, in});
}

LogicalResult ExpertUpOp::verify() {
  if (failed(checkActivationKind(*this, getActivation())))
    return failure();
  return checkExpertGemm(*this, getInput(), getDispatch().getType(),
                         getWeight(), getType());
}

LogicalResult ExpertDownOp::verify() {
  return checkExpertGemm(*this, getInput(), getDispatch().getType(),
                         getWeight(), getType());
}

LogicalResult SharedExpertOp::verify() {
  int64_t hidden;
  if (failed(checkActivationKind(*this, getActivation())) ||
      failed(checkActivation(*this, "input", getInput().getType(), hidden)))
    return failure();
  auto up = cast<RankedTensorType>(getUp().getType());
  int64_t inter = up.getRank() == 2 ? up.getDimSize(0) : -1;
  if (failed(checkLinearWeight(*this, "shared_up", getUp(), {inter, hidden})) ||
      failed(
          checkLinearWeight(*this, "shared_down", getDown(), {hidden, inter})))
    return failure();
  if (getType() != getInput().getType())
    return emitOpError() << "result type differs from the input type";
  return success();
}

LogicalResult LatentProjOp::verify() {
  if (getDirection() != "down" && getDirection() != "up")
    return emitOpError() << "direction must be 'down' or 'up'";
  int64_t in, out;
  if (failed(checkActivation(*this, "input", getInput().getType(), in)) ||
      failed(checkActivation(*this, "result", getType(), out)) ||
      failed(checkSameTokens(*this, getInput().getType(), getType())))
    return failure();
  return checkLinearWeight(*this, "latent", getWeight(), {out, in});
}

#define GET_OP_CLASSES
#include "nf_moe/IR/NfMoeOps.cpp.inc"
