//===- PlanModel.cpp - a compiled module as the plan's tables -------------===//

#include "Plan/PlanModel.h"

#include "Transforms/StepUtils.h"
#include "nf/IR/NfOps.h"
#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"

#include <map>

using namespace mlir;

namespace nf::compiler {
namespace {

constexpr int64_t kAlignment = 256;

int64_t alignTo(int64_t v) {
  return (v + kAlignment - 1) / kAlignment * kAlignment;
}

FailureOr<pl::DType> dtypeOf(Type t) {
  if (t.isF32())
    return pl::DType::F32;
  if (t.isBF16())
    return pl::DType::BF16;
  if (t.isF16())
    return pl::DType::F16;
  if (t.isSignlessInteger(32))
    return pl::DType::I32;
  if (t.isSignlessInteger(64))
    return pl::DType::I64;
  if (isa<Float8E4M3FNType>(t))
    return pl::DType::F8E4M3;
  return failure();
}

Status error(Operation *op, const std::string &message) {
  std::string loc;
  llvm::raw_string_ostream os(loc);
  os << op->getLoc();
  return Status::error("plan: " + message + " (at " + loc + ")");
}

class Builder {
public:
  explicit Builder(PlanModel &model) : model(model) {}

  Status storage();
  Status step(func::FuncOp func, PlanStep &out);

private:
  StatusOr<int> weightIndex(nfir::WeightOp op);

  PlanModel &model;
  std::map<std::string, int> weightKeys;
  std::map<std::string, int> storageIndex;
};

StatusOr<int> Builder::weightIndex(nfir::WeightOp op) {
  std::string key;
  for (Attribute a : op.getTensors())
    key += cast<StringAttr>(a).getValue().str() + "\n";
  key += op.getStacked() ? "stacked" : "";
  if (auto rows = op.getConcatRows())
    for (int64_t r : *rows)
      key += "," + std::to_string(r);
  if (auto it = weightKeys.find(key); it != weightKeys.end())
    return it->second;
  auto type = op.getResult().getType();
  // A quantised weight's tensors hold codes of its storage type.
  auto quant = op.getQuant();
  auto dtype = dtypeOf(quant ? quant->getStorage() : type.getElementType());
  if (failed(dtype))
    return error(op, "unsupported weight dtype");
  PlanWeight w;
  w.op = op;
  w.dtype = *dtype;
  if (quant) {
    w.inputQuant = static_cast<pl::ActivationQuant>(quant->getActivations());
    if (quant->getScheme() == nfir::QuantScheme::Int4)
      w.int4GroupSize = quant->getGroupSize();
  }
  w.shape.assign(type.getShape().begin(), type.getShape().end());
  model.weights.push_back(std::move(w));
  return weightKeys[key] = static_cast<int>(model.weights.size() - 1);
}

/// The fields that KV caches and Mamba states share.
template <typename OpTy> PlanStorage storageOf(OpTy op, pl::StorageKind kind) {
  PlanStorage s;
  s.name = op.getSymName().str();
  s.kind = kind;
  s.layer = op.getLayer();
  s.headDim = op.getType().getHeadDim();
  return s;
}

Status Builder::storage() {
  for (Operation &op : model.module.getBody()->getOperations()) {
    PlanStorage s;
    if (auto c = dyn_cast<kv::KVCacheOp>(op)) {
      auto t = c.getType();
      auto dtype = dtypeOf(t.getElementType());
      if (failed(dtype))
        return error(c, "unsupported KV cache dtype");
      s = storageOf(c, pl::StorageKind::KVCache);
      s.pageSize = t.getPageSize();
      s.numPages = t.getNumPages();
      s.kvHeads = t.getKvHeads();
      s.dtype = *dtype;
      s.hotWindow = c.getHotWindow().value_or(0);
    } else if (auto m = dyn_cast<kv::MambaStateOp>(op)) {
      auto t = m.getType();
      s = storageOf(m, pl::StorageKind::MambaState);
      s.slots = t.getSlots();
      s.convDim = t.getConvDim();
      s.convWindow = t.getConvWindow();
      s.numHeads = t.getNumHeads();
      s.stateSize = t.getStateSize();
    } else {
      continue;
    }
    storageIndex[s.name] = static_cast<int>(model.storage.size());
    model.storage.push_back(std::move(s));
  }
  return Status::success();
}

Status Builder::step(func::FuncOp func, PlanStep &out) {
  auto maxTokens = func->getAttrOfType<IntegerAttr>("nf.max_tokens");
  auto arena = func->getAttrOfType<IntegerAttr>("nf.arena_bytes");
  auto noReuse = func->getAttrOfType<IntegerAttr>("nf.no_reuse_bytes");
  auto scratchBytes = func->getAttrOfType<IntegerAttr>("nf.scratch_bytes");
  auto reserved = func->getAttrOfType<IntegerAttr>("nf.reserved_bytes");
  if (!maxTokens || !arena || !noReuse || !scratchBytes || !reserved)
    return error(func, "step @" + func.getName().str() +
                           " has no memory plan (run every compile phase)");
  out.phase = stepPhase(func).str();
  out.maxTokens = maxTokens.getInt();
  out.arenaBytes = arena.getInt();
  out.noReuseBytes = noReuse.getInt();
  out.scratchBytes = scratchBytes.getInt();
  out.reservedBytes = reserved.getInt();
  if (auto end = func->getAttrOfType<IntegerAttr>("nf.kernel_scratch_end"))
    out.kernelScratchEnd = end.getInt();
  if (auto stats = func->getAttrOfType<IntegerAttr>("nf.expert_stats_offset"))
    out.expertStatsOffset = stats.getInt();
  if (auto narrow = func->getAttrOfType<IntegerAttr>(kSkinnyNarrowTokensAttr))
    out.skinnyNarrowTokens = narrow.getInt();
  const int64_t rows = out.maxTokens;

  llvm::DenseMap<Value, int> index;
  auto add = [&](Value v, PlanValue value) {
    out.values.push_back(std::move(value));
    return index[v] = static_cast<int>(out.values.size() - 1);
  };

  // A tensor or dispatch value at `offset`; `def` is the op that computes it.
  auto bufferValue = [&](Value v, Operation *def,
                         int64_t offset) -> StatusOr<PlanValue> {
    PlanValue pv;
    pv.offset = offset;
    if (auto d = dyn_cast<moe::DispatchType>(v.getType())) {
      pv.kind = pl::ValueKind::Dispatch;
      pv.dtype = pl::DType::I32;
      pv.rows = pl::Rows::Assignments;
      pv.bytes =
          alignTo(4 * (2 * rows * d.getMaxPerToken() + d.getNumExperts() + 1));
      pv.numExperts = d.getNumExperts();
      pv.maxPerToken = d.getMaxPerToken();
      return pv;
    }
    auto type = dyn_cast<RankedTensorType>(v.getType());
    if (!type)
      return error(def, "value of unsupported type");
    auto dtype = dtypeOf(type.getElementType());
    if (failed(dtype))
      return error(def, "value of unsupported element type");
    pv.dtype = *dtype;
    int64_t perRow = 1;
    if (type.getRank() > 0 && type.isDynamicDim(0)) {
      pv.rows = pl::Rows::Tokens;
      if (isa_and_nonnull<moe::ExpertUpOp, moe::ExpertDownOp>(def)) {
        pv.rows = pl::Rows::Assignments;
        perRow = cast<moe::DispatchType>(def->getOperand(1).getType())
                     .getMaxPerToken();
      }
    }
    int64_t elements = 1;
    for (int64_t d : type.getShape()) {
      pv.shape.push_back(ShapedType::isDynamic(d) ? -1 : d);
      elements *= ShapedType::isDynamic(d) ? rows * perRow : d;
    }
    pv.bytes = alignTo(elements * ((type.getElementTypeBitWidth() + 7) / 8));
    return pv;
  };

  // Step inputs.
  auto input = [&](StringRef role, pl::ValueKind kind) -> StatusOr<int> {
    Value arg = stepArgument(func, role);
    if (!arg)
      return error(func, "step has no '" + role.str() + "' argument");
    PlanValue pv;
    pv.kind = kind;
    pv.dtype = kind == pl::ValueKind::Budget ? pl::DType::F32 : pl::DType::I32;
    return add(arg, pv);
  };
  auto tokens = input("tokens", pl::ValueKind::Tokens);
  auto batch = input("batch", pl::ValueKind::Batch);
  auto budget = input("expert_budget", pl::ValueKind::Budget);
  if (!tokens || !batch || !budget)
    return !tokens  ? tokens.status()
           : !batch ? batch.status()
                    : budget.status();
  out.tokens = *tokens;
  out.batch = *batch;
  out.budget = *budget;

  Block &entry = func.getBody().front();
  for (auto w : entry.getOps<nfir::WeightOp>()) {
    auto idx = weightIndex(w);
    if (!idx)
      return idx.status();
    auto dtype = dtypeOf(w.getResult().getType().getElementType());
    PlanValue pv;
    pv.kind = pl::ValueKind::Weight;
    pv.dtype = succeeded(dtype) ? *dtype : pl::DType::F32;
    pv.weight = *idx;
    add(w.getResult(), pv);
  }

  for (auto kernel : entry.getOps<nfir::KernelOp>()) {
    Block &body = kernel.getBody().front();
    auto yield = cast<nfir::YieldOp>(body.getTerminator());
    auto offsets = kernel.getArenaOffsets();
    auto scratchOffsets = kernel.getScratchOffsets();
    if (!offsets || offsets->size() != kernel.getNumResults() ||
        !scratchOffsets)
      return error(kernel, "kernel without arena offsets");
    PlanKernel k;
    k.op = kernel;
    k.name = kernel.getName().str();
    // Outputs: the kernel's results, shared with the yielded inner values.
    for (auto [i, result] : llvm::enumerate(kernel.getResults())) {
      Value inner = yield.getValues()[i];
      auto v = bufferValue(result, inner.getDefiningOp(), (*offsets)[i]);
      if (!v)
        return v.status();
      int id = add(result, std::move(*v));
      index[inner] = id;
      k.outputs.push_back(id);
    }
    for (auto [arg, in] : llvm::zip(body.getArguments(), kernel.getInputs())) {
      auto it = index.find(in);
      if (it == index.end())
        return error(kernel, "kernel input defined outside the plan");
      // Copy before inserting: index[arg] may grow the map and invalidate it.
      const int id = it->second;
      index[arg] = id;
      k.inputs.push_back(id);
    }
    size_t internal = 0;
    for (Operation &op : body.without_terminator()) {
      PlanOp p;
      p.op = &op;
      p.code = pl::opCodeOf(op.getName().getStringRef());
      if (p.code == pl::OpCode::Unknown)
        return error(&op, "op has no plan op code (runtime/include/nf/"
                          "plan_ops.def)");
      for (Value operand : op.getOperands()) {
        auto it = index.find(operand);
        if (it == index.end())
          return error(&op, "operand defined outside the kernel");
        p.operands.push_back(it->second);
      }
      for (Value result : op.getResults()) {
        if (auto it = index.find(result); it != index.end()) {
          p.results.push_back(it->second); // a kernel output
          continue;
        }
        if (internal >= scratchOffsets->size())
          return error(&op, "value without a scratch offset");
        auto v = bufferValue(result, &op, (*scratchOffsets)[internal++]);
        if (!v)
          return v.status();
        p.results.push_back(add(result, std::move(*v)));
      }
      for (NamedAttribute a : planAttrs(op))
        if (auto sym = dyn_cast<FlatSymbolRefAttr>(a.getValue())) {
          auto it = storageIndex.find(sym.getValue().str());
          if (it == storageIndex.end())
            return error(&op, "unknown storage @" + sym.getValue().str());
          p.storage = it->second;
        }
      if (auto select = dyn_cast<moe::SelectOp>(op))
        model.policy = select.getPolicy().str();
      k.ops.push_back(std::move(p));
    }
    out.kernels.push_back(std::move(k));
  }

  auto ret = cast<func::ReturnOp>(entry.getTerminator());
  auto logits = index.find(ret.getOperand(0));
  if (ret.getNumOperands() != 1 || logits == index.end())
    return error(ret, "step must return the logits of a kernel");
  out.logits = logits->second;
  return Status::success();
}

} // namespace

NamedAttrList planAttrs(Operation &op) {
  NamedAttrList attrs(op.getDiscardableAttrDictionary());
  if (auto props =
          dyn_cast_or_null<DictionaryAttr>(op.getPropertiesAsAttribute()))
    attrs.append(props.getValue());
  return attrs;
}

StatusOr<PlanModel> buildPlanModel(ModuleOp module) {
  PlanModel model;
  model.module = module;
  Builder b(model);
  if (Status st = b.storage(); !st)
    return st;
  bool prefill = false, decode = false;
  for (auto func : module.getOps<func::FuncOp>()) {
    StringRef phase = stepPhase(func);
    if (phase.empty())
      continue;
    PlanStep &step = phase == "prefill" ? model.prefill : model.decode;
    (phase == "prefill" ? prefill : decode) = true;
    step = PlanStep();
    if (Status st = b.step(func, step); !st)
      return st;
  }
  if (!prefill || !decode)
    return Status::error("plan: module needs both a prefill and a decode step");
  return model;
}

std::optional<int64_t> intAttr(const PlanOp &op, std::string_view name) {
  Attribute a = op.op->getAttr(StringRef(name.data(), name.size()));
  if (auto flag = dyn_cast_or_null<BoolAttr>(a))
    return flag.getValue();
  if (auto i = dyn_cast_or_null<IntegerAttr>(a))
    return i.getInt();
  return std::nullopt;
}

std::optional<double> floatAttr(const PlanOp &op, std::string_view name) {
  Attribute a = op.op->getAttr(StringRef(name.data(), name.size()));
  if (auto f = dyn_cast_or_null<FloatAttr>(a))
    return f.getValueAsDouble();
  if (auto i = intAttr(op, name))
    return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<std::string> stringAttr(const PlanOp &op, std::string_view name) {
  Attribute a = op.op->getAttr(StringRef(name.data(), name.size()));
  if (auto s = dyn_cast_or_null<StringAttr>(a))
    return s.str();
  return std::nullopt;
}

std::vector<std::string> stringListAttr(const PlanOp &op,
                                        std::string_view name) {
  std::vector<std::string> out;
  if (auto l = dyn_cast_or_null<ArrayAttr>(
          op.op->getAttr(StringRef(name.data(), name.size()))))
    for (Attribute a : l)
      if (auto s = dyn_cast<StringAttr>(a))
        out.push_back(s.str());
  return out;
}

std::optional<std::vector<int64_t>> listAttr(const PlanOp &op,
                                             std::string_view name) {
  Attribute a = op.op->getAttr(StringRef(name.data(), name.size()));
  if (auto l = dyn_cast_or_null<DenseI64ArrayAttr>(a))
    return std::vector<int64_t>(l.asArrayRef().begin(), l.asArrayRef().end());
  return std::nullopt;
}

std::vector<std::vector<int64_t>> listsAttr(const PlanOp &op,
                                            std::string_view name) {
  std::vector<std::vector<int64_t>> out;
  if (auto l = dyn_cast_or_null<ArrayAttr>(
          op.op->getAttr(StringRef(name.data(), name.size()))))
    for (Attribute a : l)
      if (auto v = dyn_cast<DenseI64ArrayAttr>(a))
        out.emplace_back(v.asArrayRef().begin(), v.asArrayRef().end());
  return out;
}

std::string opName(const PlanOp &op) {
  return op.op->getName().getStringRef().str();
}

} // namespace nf::compiler
