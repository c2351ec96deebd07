//===- NfKvOps.cpp - KV cache and recurrent state -------------------------===//
//
// Ops refer to their storage by symbol; shapes are checked against the
// storage's type when symbol uses are verified.
//
//===----------------------------------------------------------------------===//

#include "nf_kv/IR/NfKvOps.h"

#include "nf/IR/ShapeChecks.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::nf_kv;
using mlir::nf::checkActivation;
using mlir::nf::checkMode;
using mlir::nf::checkSameTokens;
using mlir::nf::checkWeight;

#include "nf_kv/IR/NfKvDialect.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "nf_kv/IR/NfKvTypes.cpp.inc"

void NfKvDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "nf_kv/IR/NfKvTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "nf_kv/IR/NfKvOps.cpp.inc"
      >();
}

namespace {

template <typename StorageOp>
FailureOr<StorageOp> lookupStorage(Operation *op, SymbolTableCollection &tables,
                                   FlatSymbolRefAttr name, StringRef what) {
  auto storage = tables.lookupNearestSymbolFrom<StorageOp>(op, name);
  if (!storage)
    return op->emitOpError()
           << "'" << name.getValue() << "' does not name a " << what;
  return storage;
}

LogicalResult checkFeatures(Operation *op, StringRef role, Value v,
                            int64_t expected) {
  int64_t features;
  if (failed(checkActivation(op, role, v.getType(), features)))
    return failure();
  if (features != expected)
    return op->emitOpError()
           << role << " has " << features << " features, expected " << expected;
  return success();
}

} // namespace

LogicalResult AppendOp::verifySymbolUses(SymbolTableCollection &tables) {
  auto cache =
      lookupStorage<KVCacheOp>(*this, tables, getCacheAttr(), "KV cache");
  if (failed(cache))
    return failure();
  KVCacheType type = cache->getType();
  int64_t width = type.getKvHeads() * type.getHeadDim();
  if (failed(checkFeatures(*this, "key", getKey(), width)) ||
      failed(checkFeatures(*this, "value", getValue(), width)) ||
      failed(checkSameTokens(*this, getKey().getType(), getValue().getType())))
    return failure();
  return success();
}

LogicalResult AttendOp::verifySymbolUses(SymbolTableCollection &tables) {
  if (failed(checkMode(*this, getMode())))
    return failure();
  auto cache =
      lookupStorage<KVCacheOp>(*this, tables, getCacheAttr(), "KV cache");
  if (failed(cache))
    return failure();
  KVCacheType type = cache->getType();
  int64_t heads = getNumHeads();
  if (heads <= 0 || heads % type.getKvHeads() != 0)
    return emitOpError() << "the cache's " << type.getKvHeads()
                         << " KV heads must divide num_heads (" << heads << ")";
  int64_t width = heads * type.getHeadDim();
  if (failed(checkFeatures(*this, "query", getQuery(), width)) ||
      failed(checkFeatures(*this, "result", getResult(), width)) ||
      failed(checkSameTokens(*this, getQuery().getType(), getType())))
    return failure();
  return success();
}

LogicalResult CausalConvOp::verifySymbolUses(SymbolTableCollection &tables) {
  if (failed(checkMode(*this, getMode())))
    return failure();
  auto state =
      lookupStorage<MambaStateOp>(*this, tables, getStateAttr(), "Mamba state");
  if (failed(state))
    return failure();
  MambaStateType type = state->getType();
  int64_t channels = type.getConvDim();
  if (failed(checkFeatures(*this, "input", getInput(), channels)) ||
      failed(checkWeight(*this, "conv", getWeight(),
                         {channels, 1, type.getConvWindow() + 1})) ||
      (getBias() &&
       failed(checkWeight(*this, "conv bias", getBias(), {channels}))))
    return failure();
  if (getType() != getInput().getType())
    return emitOpError() << "result type " << getType()
                         << " differs from the input type "
                         << getInput().getType();
  return success();
}

template <typename SSMOp>
static LogicalResult verifySSM(SSMOp op, SymbolTableCollection &tables) {
  auto state =
      lookupStorage<MambaStateOp>(op, tables, op.getStateAttr(), "Mamba state");
  if (failed(state))
    return failure();
  MambaStateType type = state->getType();
  int64_t nh = type.getNumHeads(), g = op.getNGroups();
  if (g <= 0 || nh % g != 0)
    return op.emitOpError()
           << "n_groups (" << g << ") must divide num_heads (" << nh << ")";
  int64_t inner = nh * type.getHeadDim();
  int64_t convDim = inner + 2 * g * type.getStateSize();
  if (convDim != type.getConvDim())
    return op.emitOpError()
           << "state has " << type.getConvDim() << " conv channels, expected "
           << convDim << " (x, B and C)";
  if (failed(checkFeatures(op, "xbc", op.getXbc(), convDim)) ||
      failed(checkFeatures(op, "dt", op.getDt(), nh)) ||
      failed(checkWeight(op, "dt_bias", op.getDtBias(), {nh})) ||
      failed(checkWeight(op, "A_log", op.getALog(), {nh})) ||
      failed(checkWeight(op, "D", op.getD(), {nh})) ||
      failed(checkFeatures(op, "result", op.getResult(), inner)) ||
      failed(checkSameTokens(op, op.getXbc().getType(), op.getType())))
    return failure();
  return success();
}

template <typename SSMOp> static LogicalResult verifyLimits(SSMOp op) {
  double lo = op.getTimeStepMin().convertToDouble(),
         hi = op.getTimeStepMax().convertToDouble();
  if (!(lo >= 0.0) || !(hi >= lo))
    return op.emitOpError() << "time step limits must satisfy 0 <= min <= max";
  return success();
}

LogicalResult KVCacheOp::verify() {
  std::optional<int64_t> window = getHotWindow();
  if (!window)
    return success();
  if (*window <= 0)
    return emitOpError() << "hot_window must be positive, got " << *window;
  Type element = getType().getElementType();
  if (!isa<Float8E4M3FNType>(element))
    return emitOpError() << "hot_window needs an f8E4M3FN cache, got "
                         << element;
  return success();
}

LogicalResult SSMUpdateOp::verify() { return verifyLimits(*this); }
LogicalResult SSMUpdateOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifySSM(*this, tables);
}
LogicalResult SSMScanOp::verify() {
  if (getChunkSize() <= 0)
    return emitOpError() << "chunk_size must be positive";
  return verifyLimits(*this);
}
LogicalResult SSMScanOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifySSM(*this, tables);
}

#define GET_OP_CLASSES
#include "nf_kv/IR/NfKvOps.cpp.inc"
