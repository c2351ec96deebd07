//===- NfOps.cpp - nf dialect operations ----------------------------------===//
//
// Verifiers check each op's weights against its hyperparameters. Messages name
// the operand role and show the shape found next to the shape expected, so an
// inconsistent model is reported at the offending layer.
//
//===----------------------------------------------------------------------===//

#include "nf/IR/NfOps.h"
#include "nf/IR/ShapeChecks.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <cmath>
#include <string>

using namespace mlir;
using namespace mlir::nf;

namespace {

/// The result of a mixer: same type as its input.
LogicalResult checkMixerResult(Operation *op) {
  if (op->getResult(0).getType() != op->getOperand(0).getType())
    return op->emitOpError()
           << "result type " << op->getResult(0).getType()
           << " differs from the input type " << op->getOperand(0).getType();
  return success();
}

} // namespace

//===----------------------------------------------------------------------===//
// ModelOp
//===----------------------------------------------------------------------===//

LogicalResult ModelOp::verify() {
  Block &body = getBody().front();
  if (body.getNumArguments() != 1)
    return emitOpError() << "body must take exactly one argument (the token "
                         << "ids), got " << body.getNumArguments();
  auto tokens = dyn_cast<RankedTensorType>(body.getArgument(0).getType());
  if (!tokens || tokens.getRank() != 1 ||
      !tokens.getElementType().isSignlessInteger())
    return emitOpError() << "token ids must be a 1-D integer tensor, got "
                         << body.getArgument(0).getType();
  if (failed(checkPositive(*this, "vocab_size", getVocabSize())) ||
      failed(checkPositive(*this, "hidden_size", getHiddenSize())))
    return failure();
  auto output = dyn_cast<OutputOp>(body.getTerminator());
  if (!output)
    return emitOpError() << "body must end in nf.output";
  auto logits = dyn_cast<RankedTensorType>(output.getLogits().getType());
  if (!logits || logits.getRank() != 2 ||
      logits.getDimSize(1) != getVocabSize())
    return output.emitOpError() << "logits must be [tokens, " << getVocabSize()
                                << "], got " << output.getLogits().getType();
  for (int64_t id : getEosTokenIds())
    if (id < 0 || id >= getVocabSize())
      return emitOpError() << "eos token id " << id
                           << " is outside the vocabulary of "
                           << getVocabSize();
  return success();
}

//===----------------------------------------------------------------------===//
// WeightOp
//===----------------------------------------------------------------------===//

/// Scale shapes per part against the weight: see `#nf.quant`.
static LogicalResult verifyQuant(WeightOp op, QuantAttr quant) {
  auto type = op.getResult().getType();
  auto names = op.getTensors();
  StringRef first = cast<StringAttr>(names[0]).getValue();
  StringRef scheme = stringifyQuantScheme(quant.getScheme());
  if (type.getElementType() != quant.getCodeType())
    return op.emitOpError()
           << "quantised weight '" << first << "' (" << scheme
           << ") must have element type " << quant.getCodeType() << ", got "
           << type.getElementType();
  const int64_t rank = op.getStacked() ? 3 : 2;
  if (type.getRank() != rank)
    return op.emitOpError() << "quantised weight '" << first << "' must be "
                            << (op.getStacked() ? "a stack of matrices "
                                                  "[experts, rows, cols]"
                                                : "a matrix [rows, cols]")
                            << ", got " << type;
  if (op.getStacked() && type.getDimSize(0) != (int64_t)names.size())
    return op.emitOpError() << "quantised stacked weight '" << first
                            << "' must list one tensor per expert ("
                            << type.getDimSize(0) << "), got " << names.size();
  if (quant.getNumParts() != names.size())
    return op.emitOpError() << "quant of '" << first << "' lists "
                            << quant.getNumParts() << " scales for "
                            << names.size() << " weight tensors (one per part)";
  const int64_t cols = type.getDimSize(rank - 1);
  const int64_t group = quant.getGroupSize();
  if (quant.getGranularity() == QuantGranularity::PerGroup && cols % group != 0)
    return op.emitOpError()
           << "quant group_size " << group << " does not divide the " << cols
           << " input columns of '" << first << "'";
  auto concat = op.getConcatRows();
  for (auto [i, scale, scaleType] :
       llvm::enumerate(quant.getScales(), quant.getScaleTypes())) {
    const int64_t rows = concat ? (*concat)[i] : type.getDimSize(rank - 2);
    auto shape =
        cast<RankedTensorType>(cast<TypeAttr>(scaleType).getValue()).getShape();
    bool ok = false;
    std::string expected;
    switch (quant.getGranularity()) {
    case QuantGranularity::PerTensor:
      ok = shape.empty() || shape == ArrayRef<int64_t>{1};
      expected = "[] or [1] (per_tensor)";
      break;
    case QuantGranularity::PerChannel:
      ok = shape == ArrayRef<int64_t>{rows} ||
           shape == ArrayRef<int64_t>{rows, 1};
      expected = shapeString({rows}) + " or " + shapeString({rows, 1}) +
                 " (per_channel)";
      break;
    case QuantGranularity::PerGroup:
      ok = shape == ArrayRef<int64_t>{rows, cols / group};
      expected = shapeString({rows, cols / group}) + " (per_group, " +
                 std::to_string(group) + " columns per scale)";
      break;
    }
    if (!ok)
      return op.emitOpError()
             << "scale '" << cast<StringAttr>(scale).getValue() << "' of '"
             << cast<StringAttr>(names[i]).getValue() << "' has shape "
             << shapeString(shape) << ", expected " << expected;
  }
  return success();
}

LogicalResult WeightOp::verify() {
  auto type = getResult().getType();
  auto names = getTensors();
  if (names.empty())
    return emitOpError() << "must name at least one checkpoint tensor";
  StringRef first = cast<StringAttr>(names[0]).getValue();
  if (!getQuant() && isQuantCodeType(type.getElementType()))
    return emitOpError() << "weight '" << first << "' has element type "
                         << type.getElementType()
                         << " (quantised codes) but no quant attribute";
  if (!getQuant() && !isWeightElementType(type.getElementType()))
    return emitOpError() << "weight '" << first
                         << "' has unsupported element type "
                         << type.getElementType()
                         << " (expected f32, bf16 or f16)";
  if (!type.hasStaticShape())
    return emitOpError() << "weight '" << first
                         << "' must have a static shape, got " << type;
  if (!getStacked() && !getConcatRows() && names.size() != 1)
    return emitOpError() << "an unstacked weight names exactly one tensor, got "
                         << names.size();
  if (getStacked() && names.size() > 1 &&
      (type.getRank() < 1 || type.getDimSize(0) != (int64_t)names.size()))
    return emitOpError() << "stacked weight '" << first << "' lists "
                         << names.size() << " tensors but its type " << type
                         << " stacks "
                         << (type.getRank() ? type.getDimSize(0) : 0);
  if (auto rows = getConcatRows()) {
    if (getStacked())
      return emitOpError()
             << "a weight is either stacked or concatenated, not both";
    if (rows->size() != names.size())
      return emitOpError() << "concat_rows has " << rows->size()
                           << " entries for " << names.size() << " tensors";
    int64_t total = 0;
    for (int64_t r : *rows)
      total += r;
    if (type.getRank() < 1 || total != type.getDimSize(0))
      return emitOpError() << "concatenated rows sum to " << total
                           << " but the weight has " << type.getDimSize(0);
  }
  if (auto quant = getQuant())
    return verifyQuant(*this, *quant);
  return success();
}

//===----------------------------------------------------------------------===//
// Blocks
//===----------------------------------------------------------------------===//

LogicalResult EmbedOp::verify() {
  auto tokens = cast<RankedTensorType>(getTokens().getType());
  if (tokens.getRank() != 1 || !tokens.getElementType().isSignlessInteger())
    return emitOpError() << "token ids must be a 1-D integer tensor, got "
                         << tokens;
  auto table = cast<RankedTensorType>(getTable().getType());
  if (table.getRank() != 2 || !table.hasStaticShape())
    return emitOpError() << "embedding table must be a static [vocab, hidden] "
                         << "tensor, got " << table;
  int64_t hidden;
  if (failed(checkWeight(*this, "embedding", getTable(), table.getShape())) ||
      failed(checkActivation(*this, "result", getType(), hidden)))
    return failure();
  if (hidden != table.getDimSize(1))
    return emitOpError() << "result has " << hidden
                         << " features but the embedding table has "
                         << table.getDimSize(1);
  if (getType().getDimSize(0) != tokens.getDimSize(0))
    return emitOpError() << "result has " << getType().getDimSize(0)
                         << " rows for " << tokens.getDimSize(0) << " tokens";
  return success();
}

LogicalResult RMSNormOp::verify() {
  int64_t hidden;
  if (failed(checkActivation(*this, "input", getInput().getType(), hidden)) ||
      failed(checkWeight(*this, "norm", getWeight(), {hidden})) ||
      failed(checkMixerResult(*this)))
    return failure();
  if (!(getEpsilon().convertToDouble() > 0.0))
    return emitOpError() << "epsilon must be positive, got "
                         << getEpsilon().convertToDouble();
  return success();
}

LogicalResult Mamba2Op::verify() {
  int64_t hidden;
  if (failed(checkActivation(*this, "input", getInput().getType(), hidden)) ||
      failed(checkMixerResult(*this)))
    return failure();
  const int64_t nh = getNumHeads(), p = getHeadDim(), n = getStateSize(),
                g = getNGroups(), k = getConvKernel();
  for (auto [name, v] : {std::pair<StringRef, int64_t>{"num_heads", nh},
                         {"head_dim", p},
                         {"state_size", n},
                         {"n_groups", g},
                         {"conv_kernel", k},
                         {"chunk_size", getChunkSize()}})
    if (failed(checkPositive(*this, name, v)))
      return failure();
  if (nh % g != 0)
    return emitOpError() << "n_groups (" << g << ") must divide num_heads ("
                         << nh << ")";
  const int64_t inner = nh * p, convDim = inner + 2 * g * n;
  const int64_t inProj = inner + convDim + nh;
  if (failed(
          checkLinearWeight(*this, "in_proj", getInProj(), {inProj, hidden})) ||
      failed(checkWeight(*this, "conv", getConvWeight(), {convDim, 1, k})) ||
      failed(checkWeight(*this, "dt_bias", getDtBias(), {nh})) ||
      failed(checkWeight(*this, "A_log", getALog(), {nh})) ||
      failed(checkWeight(*this, "D", getD(), {nh})) ||
      failed(checkWeight(*this, "gated norm", getNormWeight(), {inner})) ||
      failed(
          checkLinearWeight(*this, "out_proj", getOutProj(), {hidden, inner})))
    return failure();
  if (getConvBias() &&
      failed(checkWeight(*this, "conv bias", getConvBias(), {convDim})))
    return failure();
  double lo = getTimeStepMin().convertToDouble(),
         hi = getTimeStepMax().convertToDouble();
  if (!(lo >= 0.0) || !(hi >= lo))
    return emitOpError()
           << "time step limits must satisfy 0 <= min <= max, got [" << lo
           << ", " << hi << "]";
  return success();
}

LogicalResult AttentionOp::verify() {
  int64_t hidden;
  if (failed(checkActivation(*this, "input", getInput().getType(), hidden)) ||
      failed(checkMixerResult(*this)))
    return failure();
  const int64_t nq = getNumHeads(), nkv = getNumKvHeads(), hd = getHeadDim();
  if (failed(checkPositive(*this, "num_heads", nq)) ||
      failed(checkPositive(*this, "num_kv_heads", nkv)) ||
      failed(checkPositive(*this, "head_dim", hd)))
    return failure();
  if (nq % nkv != 0)
    return emitOpError() << "num_kv_heads (" << nkv
                         << ") must divide num_heads (" << nq << ")";
  if (failed(
          checkLinearWeight(*this, "q_proj", getQProj(), {nq * hd, hidden})) ||
      failed(
          checkLinearWeight(*this, "k_proj", getKProj(), {nkv * hd, hidden})) ||
      failed(
          checkLinearWeight(*this, "v_proj", getVProj(), {nkv * hd, hidden})) ||
      failed(checkLinearWeight(*this, "o_proj", getOProj(), {hidden, nq * hd})))
    return failure();
  if (auto theta = getRopeTheta(); theta && !(theta->convertToDouble() > 0))
    return emitOpError() << "rope_theta must be positive";
  return success();
}

static LogicalResult checkActivationName(Operation *op, StringRef act) {
  if (act != "relu2")
    return op->emitOpError()
           << "unsupported activation '" << act << "' (supported: relu2)";
  return success();
}

LogicalResult MLPOp::verify() {
  int64_t hidden;
  if (failed(checkActivation(*this, "input", getInput().getType(), hidden)) ||
      failed(checkMixerResult(*this)) ||
      failed(checkActivationName(*this, getActivation())))
    return failure();
  auto up = cast<RankedTensorType>(getUpProj().getType());
  int64_t inter = up.getRank() == 2 ? up.getDimSize(0) : -1;
  if (failed(
          checkLinearWeight(*this, "up_proj", getUpProj(), {inter, hidden})) ||
      failed(checkLinearWeight(*this, "down_proj", getDownProj(),
                               {hidden, inter})))
    return failure();
  return success();
}

LogicalResult MoEOp::verify() {
  int64_t hidden;
  if (failed(checkActivation(*this, "input", getInput().getType(), hidden)) ||
      failed(checkMixerResult(*this)) ||
      failed(checkActivationName(*this, getActivation())))
    return failure();
  const int64_t e = getNumExperts(), k = getTopK(), ng = getNGroup(),
                tg = getTopkGroup();
  if (failed(checkPositive(*this, "num_experts", e)) ||
      failed(checkPositive(*this, "top_k", k)) ||
      failed(checkPositive(*this, "n_group", ng)) ||
      failed(checkPositive(*this, "topk_group", tg)))
    return failure();
  if (k > e)
    return emitOpError() << "top_k (" << k
                         << ") exceeds the number of experts (" << e << ")";
  if (e % ng != 0)
    return emitOpError() << "n_group (" << ng << ") must divide num_experts ("
                         << e << ")";
  if (tg > ng)
    return emitOpError() << "topk_group (" << tg << ") exceeds n_group (" << ng
                         << ")";
  if (k > tg * (e / ng))
    return emitOpError() << "top_k (" << k << ") exceeds the " << tg * (e / ng)
                         << " experts in the " << tg << " selected groups";
  if (!getLatent().empty() && getLatent().size() != 2)
    return emitOpError() << "latent projections come as a pair "
                         << "(latent_down, latent_up), got "
                         << getLatent().size();

  int64_t expertIn = hidden;
  if (hasLatent()) {
    auto down = cast<RankedTensorType>(getLatent()[0].getType());
    expertIn = down.getRank() == 2 ? down.getDimSize(0) : -1;
    if (failed(checkLinearWeight(*this, "latent_down", getLatent()[0],
                                 {expertIn, hidden})) ||
        failed(checkLinearWeight(*this, "latent_up", getLatent()[1],
                                 {hidden, expertIn})))
      return failure();
  }
  auto up = cast<RankedTensorType>(getExpertsUp().getType());
  int64_t inter = up.getRank() == 3 ? up.getDimSize(1) : -1;
  auto shared = cast<RankedTensorType>(getSharedUp().getType());
  int64_t sharedInter = shared.getRank() == 2 ? shared.getDimSize(0) : -1;
  if (failed(checkWeight(*this, "router", getRouter(), {e, hidden})) ||
      failed(checkWeight(*this, "correction_bias", getCorrectionBias(), {e})) ||
      failed(checkLinearWeight(*this, "experts_up", getExpertsUp(),
                               {e, inter, expertIn})) ||
      failed(checkLinearWeight(*this, "experts_down", getExpertsDown(),
                               {e, expertIn, inter})) ||
      failed(checkLinearWeight(*this, "shared_up", getSharedUp(),
                               {sharedInter, hidden})) ||
      failed(checkLinearWeight(*this, "shared_down", getSharedDown(),
                               {hidden, sharedInter})))
    return failure();
  if (!(getRoutedScalingFactor().convertToDouble() > 0))
    return emitOpError() << "routed_scaling_factor must be positive";
  return success();
}

LogicalResult LMHeadOp::verify() {
  int64_t hidden, vocab;
  if (failed(checkActivation(*this, "input", getInput().getType(), hidden)) ||
      failed(checkActivation(*this, "result", getType(), vocab)) ||
      failed(checkSameTokens(*this, getInput().getType(), getType())))
    return failure();
  if (failed(checkLinearWeight(*this, "lm_head", getWeight(), {vocab, hidden})))
    return failure();
  if (!getType().getElementType().isF32())
    return emitOpError() << "logits must be f32, got " << getType();
  return success();
}

//===----------------------------------------------------------------------===//
// Compute ops
//===----------------------------------------------------------------------===//

LogicalResult LinearOp::verify() {
  int64_t in, out;
  if (failed(checkActivation(*this, "input", getInput().getType(), in)) ||
      failed(checkActivation(*this, "result", getType(), out)) ||
      failed(checkSameTokens(*this, getInput().getType(), getType())))
    return failure();
  return checkLinearWeight(*this, "linear", getWeight(), {out, in});
}

LogicalResult SplitOp::verify() {
  int64_t features;
  if (failed(checkActivation(*this, "input", getInput().getType(), features)))
    return failure();
  if (getSizes().size() != getNumResults())
    return emitOpError() << "has " << getSizes().size() << " sizes for "
                         << getNumResults() << " results";
  int64_t total = 0;
  for (auto [size, result] : llvm::zip(getSizes(), getResults())) {
    int64_t f;
    if (failed(checkActivation(*this, "result", result.getType(), f)) ||
        failed(checkSameTokens(*this, getInput().getType(), result.getType())))
      return failure();
    if (f != size)
      return emitOpError() << "result of size " << size << " has type "
                           << result.getType();
    total += size;
  }
  if (total != features)
    return emitOpError() << "sizes sum to " << total << " but the input has "
                         << features << " features";
  return success();
}

LogicalResult ActivationOp::verify() {
  if (getKind() != "relu2" && getKind() != "silu")
    return emitOpError() << "unknown activation '" << getKind()
                         << "' (expected relu2 or silu)";
  return success();
}

LogicalResult GatedRMSNormOp::verify() {
  int64_t features, gate;
  if (failed(checkActivation(*this, "input", getInput().getType(), features)) ||
      failed(checkActivation(*this, "gate", getGate().getType(), gate)) ||
      failed(checkMixerResult(*this)) ||
      failed(checkWeight(*this, "norm", getWeight(), {features})) ||
      failed(checkPositive(*this, "groups", getGroups())))
    return failure();
  if (gate != features)
    return emitOpError() << "gate has " << gate << " features, input has "
                         << features;
  if (features % getGroups() != 0)
    return emitOpError() << "groups (" << getGroups()
                         << ") must divide the features (" << features << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// KernelOp
//===----------------------------------------------------------------------===//

SmallVector<Value> KernelOp::internalValues() {
  Block &body = getBody().front();
  llvm::SmallPtrSet<Value, 8> yielded;
  for (Value v : cast<YieldOp>(body.getTerminator()).getValues())
    yielded.insert(v);
  SmallVector<Value> out;
  for (Operation &op : body.without_terminator())
    for (Value r : op.getResults())
      if (!yielded.contains(r))
        out.push_back(r);
  return out;
}

LogicalResult KernelOp::verify() {
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size())
    return emitOpError() << "region takes " << body.getNumArguments()
                         << " arguments for " << getInputs().size()
                         << " inputs";
  for (auto [arg, in] : llvm::zip(body.getArguments(), getInputs()))
    if (arg.getType() != in.getType())
      return emitOpError() << "region argument type " << arg.getType()
                           << " differs from input type " << in.getType();
  auto yield = cast<YieldOp>(body.getTerminator());
  if (yield.getValues().getTypes() != getResultTypes())
    return emitOpError()
           << "yields " << yield.getValues().size()
           << " values whose types differ from the kernel results";
  if (auto offsets = getArenaOffsets();
      offsets && offsets->size() != getNumResults())
    return emitOpError() << "has " << offsets->size() << " arena offsets for "
                         << getNumResults() << " results";
  if (auto offsets = getScratchOffsets()) {
    const size_t internal = internalValues().size();
    if (offsets->size() != internal)
      return emitOpError() << "has " << offsets->size()
                           << " scratch offsets for " << internal
                           << " internal values";
  }
  return success();
}

#define GET_OP_CLASSES
#include "nf/IR/NfOps.cpp.inc"
