//===- PlanWriter.cpp - compiled module -> plan.nfb -----------------------===//
//
// Every SSA value a step touches becomes a plan Value: step inputs, weights,
// kernel outputs (at their planned arena offsets) and kernel-internal values
// (in a scratch region after the arena, reused by every kernel). Ops keep
// their names and attributes, so the runtime interprets exactly the IR, and
// carry their code from nf/plan_ops.def: an op outside that list is an error.
//
//===----------------------------------------------------------------------===//

#include "Plan/PlanWriter.h"

#include "CodeGen/CudaBackend.h"
#include "Transforms/StepUtils.h"
#include "nf/IR/NfOps.h"
#include "nf/plan_generated.h"
#include "nf/plan_ops.h"
#include "nf/plan_version.h"
#include "nf_kv/IR/NfKvOps.h"
#include "nf_moe/IR/NfMoeOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"

#include <map>

using namespace mlir;
namespace fb = flatbuffers;
namespace pl = ::nf::plan;
namespace nfir = ::mlir::nf;
namespace kv = ::mlir::nf_kv;
namespace moe = ::mlir::nf_moe;

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
  return failure();
}

class Writer {
public:
  explicit Writer(ModuleOp module,
                  const codegen::CudaPlanBinaries *cuda = nullptr)
      : module(module), cuda(cuda) {}

  StatusOr<std::vector<uint8_t>> run(const std::string &generator,
                                     float defaultExpertBudget);

private:
  Status error(Operation *op, const std::string &message) {
    std::string loc;
    llvm::raw_string_ostream os(loc);
    os << op->getLoc();
    return Status::error("plan: " + message + " (at " + loc + ")");
  }

  StatusOr<int> weightIndex(nfir::WeightOp op);
  StatusOr<fb::Offset<pl::Step>> writeStep(func::FuncOp func);

  ModuleOp module;
  const codegen::CudaPlanBinaries *cuda;
  fb::FlatBufferBuilder b{1 << 16};
  std::vector<fb::Offset<pl::Weight>> weights;
  std::map<std::string, int> weightKeys;
  std::map<std::string, int> storageIndex;
  std::string policy = "topk";
};

// The plan's quantisation enums mirror the IR's (NfAttrs.td) value for value.
static_assert(static_cast<int>(nfir::QuantGranularity::PerGroup) ==
              static_cast<int>(pl::QuantGranularity::PerGroup));
static_assert(static_cast<int>(nfir::ActivationQuant::DynamicPerToken) ==
              static_cast<int>(pl::ActivationQuant::DynamicPerToken));

StatusOr<int> Writer::weightIndex(nfir::WeightOp op) {
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
  auto dtype =
      quant && isa<Float8E4M3FNType>(quant->getStorage())
          ? FailureOr<pl::DType>(pl::DType::F8E4M3)
          : dtypeOf(quant ? quant->getStorage() : type.getElementType());
  if (failed(dtype))
    return error(op, "unsupported weight dtype");
  std::vector<fb::Offset<fb::String>> names;
  for (Attribute a : op.getTensors())
    names.push_back(b.CreateString(cast<StringAttr>(a).getValue().str()));
  std::vector<int64_t> rows;
  if (auto r = op.getConcatRows())
    rows.assign(r->begin(), r->end());
  fb::Offset<pl::WeightQuant> quantTable;
  if (quant) {
    auto strings = [&](ArrayAttr list) {
      std::vector<fb::Offset<fb::String>> out;
      if (list)
        for (Attribute a : list)
          out.push_back(b.CreateString(cast<StringAttr>(a).getValue().str()));
      return b.CreateVector(out);
    };
    auto scales = strings(quant->getScales());
    auto inputScales = strings(quant->getInputScales());
    quantTable = pl::CreateWeightQuant(
        b,
        quant->getScheme() == nfir::QuantScheme::Int4
            ? pl::QuantScheme::Int4
            : pl::QuantScheme::Fp8E4M3,
        static_cast<int32_t>(quant->getPack()),
        static_cast<pl::QuantGranularity>(quant->getGranularity()),
        quant->getGroupSize(), scales,
        static_cast<pl::ActivationQuant>(quant->getActivations()), inputScales);
  }
  auto w =
      pl::CreateWeight(b, b.CreateVector(names), op.getStacked(),
                       rows.empty() ? 0 : b.CreateVector(rows), *dtype,
                       b.CreateVector(std::vector<int64_t>(
                           type.getShape().begin(), type.getShape().end())),
                       quantTable);
  weights.push_back(w);
  return weightKeys[key] = static_cast<int>(weights.size() - 1);
}

StatusOr<fb::Offset<pl::Step>> Writer::writeStep(func::FuncOp func) {
  auto maxTokens = func->getAttrOfType<IntegerAttr>("nf.max_tokens");
  auto arena = func->getAttrOfType<IntegerAttr>("nf.arena_bytes");
  auto noReuse = func->getAttrOfType<IntegerAttr>("nf.no_reuse_bytes");
  if (!maxTokens || !arena || !noReuse)
    return error(func, "step @" + func.getName().str() +
                           " has no memory plan (run every compile phase)");
  const int64_t rows = maxTokens.getInt();

  std::vector<fb::Offset<pl::Value>> values;
  llvm::DenseMap<Value, int> index;
  auto add = [&](Value v, fb::Offset<pl::Value> value) {
    values.push_back(value);
    return index[v] = static_cast<int>(values.size() - 1);
  };

  // A tensor or dispatch value at `offset`; `def` is the op that computes it.
  auto bufferValue = [&](Value v, Operation *def, int64_t offset,
                         int64_t &bytes) -> StatusOr<fb::Offset<pl::Value>> {
    if (auto d = dyn_cast<moe::DispatchType>(v.getType())) {
      bytes =
          alignTo(4 * (2 * rows * d.getMaxPerToken() + d.getNumExperts() + 1));
      return pl::CreateValue(b, pl::ValueKind::Dispatch, pl::DType::I32,
                             pl::Rows::Assignments, 0, offset, bytes, -1,
                             d.getNumExperts(), d.getMaxPerToken());
    }
    auto type = dyn_cast<RankedTensorType>(v.getType());
    if (!type)
      return error(def, "value of unsupported type");
    auto dtype = dtypeOf(type.getElementType());
    if (failed(dtype))
      return error(def, "value of unsupported element type");
    pl::Rows kind = pl::Rows::None;
    int64_t perRow = 1;
    if (type.getRank() > 0 && type.isDynamicDim(0)) {
      kind = pl::Rows::Tokens;
      if (isa_and_nonnull<moe::ExpertUpOp, moe::ExpertDownOp>(def)) {
        kind = pl::Rows::Assignments;
        perRow = cast<moe::DispatchType>(def->getOperand(1).getType())
                     .getMaxPerToken();
      }
    }
    int64_t elements = 1;
    std::vector<int64_t> shape;
    for (int64_t d : type.getShape()) {
      shape.push_back(ShapedType::isDynamic(d) ? -1 : d);
      elements *= ShapedType::isDynamic(d) ? rows * perRow : d;
    }
    bytes = alignTo(elements * ((type.getElementTypeBitWidth() + 7) / 8));
    return pl::CreateValue(b, pl::ValueKind::Tensor, *dtype, kind,
                           b.CreateVector(shape), offset, bytes);
  };

  // Step inputs.
  auto input = [&](StringRef role, pl::ValueKind kind) -> StatusOr<int> {
    Value arg = stepArgument(func, role);
    if (!arg)
      return error(func, "step has no '" + role.str() + "' argument");
    return add(arg,
               pl::CreateValue(b, kind,
                               kind == pl::ValueKind::Budget ? pl::DType::F32
                                                             : pl::DType::I32));
  };
  auto tokens = input("tokens", pl::ValueKind::Tokens);
  auto batch = input("batch", pl::ValueKind::Batch);
  auto budget = input("expert_budget", pl::ValueKind::Budget);
  if (!tokens || !batch || !budget)
    return !tokens  ? tokens.status()
           : !batch ? batch.status()
                    : budget.status();

  Block &entry = func.getBody().front();
  for (auto w : entry.getOps<nfir::WeightOp>()) {
    auto idx = weightIndex(w);
    if (!idx)
      return idx.status();
    auto dtype = dtypeOf(w.getResult().getType().getElementType());
    add(w.getResult(),
        pl::CreateValue(b, pl::ValueKind::Weight,
                        succeeded(dtype) ? *dtype : pl::DType::F32,
                        pl::Rows::None, 0, -1, 0, *idx));
  }

  std::vector<fb::Offset<pl::Kernel>> kernels;
  int64_t scratchBytes = 0;
  for (auto kernel : entry.getOps<nfir::KernelOp>()) {
    Block &body = kernel.getBody().front();
    auto yield = cast<nfir::YieldOp>(body.getTerminator());
    auto offsets = kernel.getArenaOffsets();
    if (!offsets || offsets->size() != kernel.getNumResults())
      return error(kernel, "kernel without arena offsets");
    // Outputs: the kernel's results, shared with the yielded inner values.
    std::vector<int> outputs;
    for (auto [i, result] : llvm::enumerate(kernel.getResults())) {
      Value inner = yield.getValues()[i];
      int64_t bytes = 0;
      auto v = bufferValue(result, inner.getDefiningOp(), (*offsets)[i], bytes);
      if (!v)
        return v.status();
      int id = add(result, *v);
      index[inner] = id;
      outputs.push_back(id);
    }
    std::vector<int> inputs;
    for (auto [arg, in] : llvm::zip(body.getArguments(), kernel.getInputs())) {
      auto it = index.find(in);
      if (it == index.end())
        return error(kernel, "kernel input defined outside the plan");
      // Copy before inserting: index[arg] may grow the map and invalidate it.
      const int id = it->second;
      index[arg] = id;
      inputs.push_back(id);
    }
    int64_t scratch = 0;
    std::vector<fb::Offset<pl::Op>> ops;
    for (Operation &op : body.without_terminator()) {
      const pl::OpCode code = pl::opCodeOf(op.getName().getStringRef());
      if (code == pl::OpCode::Unknown)
        return error(&op, "op has no plan op code (runtime/include/nf/"
                          "plan_ops.def)");
      std::vector<int> operands, results;
      for (Value operand : op.getOperands()) {
        auto it = index.find(operand);
        if (it == index.end())
          return error(&op, "operand defined outside the kernel");
        operands.push_back(it->second);
      }
      for (Value result : op.getResults()) {
        if (auto it = index.find(result); it != index.end()) {
          results.push_back(it->second); // a kernel output
          continue;
        }
        int64_t bytes = 0;
        auto v = bufferValue(result, &op, arena.getInt() + scratch, bytes);
        if (!v)
          return v.status();
        scratch += bytes;
        results.push_back(add(result, *v));
      }
      // Attributes, generically: the runtime reads them by name.
      std::vector<fb::Offset<pl::IntAttr>> ints;
      std::vector<fb::Offset<pl::FloatAttr>> floats;
      std::vector<fb::Offset<pl::StringAttr>> strings;
      std::vector<fb::Offset<pl::IntListAttr>> lists;
      int storage = -1;
      NamedAttrList attrs(op.getDiscardableAttrDictionary());
      if (auto props =
              dyn_cast_or_null<DictionaryAttr>(op.getPropertiesAsAttribute()))
        attrs.append(props.getValue());
      for (NamedAttribute a : attrs) {
        auto name = b.CreateString(a.getName().str());
        Attribute v = a.getValue();
        if (auto sym = dyn_cast<FlatSymbolRefAttr>(v)) {
          auto it = storageIndex.find(sym.getValue().str());
          if (it == storageIndex.end())
            return error(&op, "unknown storage @" + sym.getValue().str());
          storage = it->second;
        } else if (auto flag = dyn_cast<BoolAttr>(v)) {
          ints.push_back(pl::CreateIntAttr(b, name, flag.getValue()));
        } else if (auto i = dyn_cast<IntegerAttr>(v)) {
          ints.push_back(pl::CreateIntAttr(b, name, i.getInt()));
        } else if (auto f = dyn_cast<FloatAttr>(v)) {
          floats.push_back(pl::CreateFloatAttr(b, name, f.getValueAsDouble()));
        } else if (auto s = dyn_cast<StringAttr>(v)) {
          strings.push_back(
              pl::CreateStringAttr(b, name, b.CreateString(s.str())));
        } else if (auto l = dyn_cast<DenseI64ArrayAttr>(v)) {
          lists.push_back(pl::CreateIntListAttr(
              b, name, b.CreateVector(l.asArrayRef().data(), l.size())));
        }
      }
      if (auto select = dyn_cast<moe::SelectOp>(op))
        policy = select.getPolicy().str();
      ops.push_back(pl::CreateOp(
          b, b.CreateString(op.getName().getStringRef().str()),
          b.CreateVector(operands), b.CreateVector(results), storage,
          b.CreateVectorOfSortedTables(&ints),
          b.CreateVectorOfSortedTables(&floats),
          b.CreateVectorOfSortedTables(&strings),
          b.CreateVectorOfSortedTables(&lists), static_cast<uint16_t>(code)));
    }
    scratchBytes = std::max(scratchBytes, scratch);
    if (!cuda) {
      kernels.push_back(pl::CreateKernel(
          b, b.CreateString(kernel.getName().str()), b.CreateVector(inputs),
          b.CreateVector(outputs), b.CreateVector(ops)));
      continue;
    }
    // The CUDA module of this kernel (compiled from the first write).
    const auto &bins =
        stepPhase(func) == "prefill" ? cuda->prefill : cuda->decode;
    if (kernels.size() >= bins.size())
      return error(kernel, "kernel without a CUDA module");
    const codegen::CudaKernelBinary &bin = bins[kernels.size()];
    std::vector<fb::Offset<fb::String>> archs;
    std::vector<fb::Offset<pl::CubinBlob>> cubins;
    for (size_t a = 0; a < bin.archs.size(); ++a) {
      archs.push_back(b.CreateString(bin.archs[a]));
      cubins.push_back(pl::CreateCubinBlob(b, b.CreateVector(bin.cubins[a])));
    }
    std::vector<fb::Offset<pl::Launch>> launches;
    for (const codegen::CudaLaunchInfo &l : bin.launches)
      launches.push_back(pl::CreateLaunch(
          b, b.CreateString(l.function), l.grid, l.block, l.sharedBytes,
          l.cooperative, l.minTokens, l.maxTokens, l.programmatic));
    kernels.push_back(pl::CreateKernel(
        b, b.CreateString(kernel.getName().str()), b.CreateVector(inputs),
        b.CreateVector(outputs), b.CreateVector(ops), b.CreateVector(archs),
        b.CreateVector(cubins), b.CreateString(bin.ptx),
        b.CreateVector(launches), b.CreateString(bin.sourceHash)));
  }
  // The generated kernels' own scratch (e.g. the shared expert's hidden
  // rows) follows the plan's kernel-internal values.
  if (cuda)
    scratchBytes = std::max(scratchBytes, stepPhase(func) == "prefill"
                                              ? cuda->prefillScratchBytes
                                              : cuda->decodeScratchBytes);

  auto ret = cast<func::ReturnOp>(entry.getTerminator());
  auto logits = index.find(ret.getOperand(0));
  if (ret.getNumOperands() != 1 || logits == index.end())
    return error(ret, "step must return the logits of a kernel");
  fb::Offset<pl::TopLogits> topLogits;
  if (cuda && stepPhase(func) == "decode" &&
      cuda->decodeTopLogits.kernel >= 0) {
    const codegen::CudaTopLogits &t = cuda->decodeTopLogits;
    std::vector<fb::Offset<pl::Launch>> launches;
    for (const codegen::CudaLaunchInfo &l : t.launches)
      launches.push_back(pl::CreateLaunch(
          b, b.CreateString(l.function), l.grid, l.block, l.sharedBytes,
          l.cooperative, l.minTokens, l.maxTokens, l.programmatic));
    topLogits = pl::CreateTopLogits(b, t.kernel, t.k, t.idsOffset,
                                    t.valuesOffset, b.CreateVector(launches),
                                    t.noiseOffset, t.totalsOffset);
  }
  return pl::CreateStep(
      b, b.CreateString(stepPhase(func).str()), b.CreateVector(values),
      b.CreateVector(kernels), *tokens, *batch, *budget, logits->second, rows,
      arena.getInt(), noReuse.getInt(), scratchBytes, topLogits,
      !cuda                          ? int64_t(-1)
      : stepPhase(func) == "prefill" ? cuda->prefillExpertStatsOffset
                                     : cuda->decodeExpertStatsOffset);
}

StatusOr<std::vector<uint8_t>> Writer::run(const std::string &generator,
                                           float defaultExpertBudget) {
  auto info = module->getAttrOfType<DictionaryAttr>("nf.model");
  if (!info)
    return Status::error("plan: module has no nf.model attributes (run "
                         "nf-outline-steps)");
  auto getInt = [&](StringRef name, int64_t def) {
    auto a = info.getAs<IntegerAttr>(name);
    return a ? a.getInt() : def;
  };
  auto getStr = [&](StringRef name) {
    auto a = info.getAs<StringAttr>(name);
    return a ? a.str() : std::string();
  };

  // Storage first: ops refer to it by index.
  std::vector<fb::Offset<pl::Storage>> storage;
  for (Operation &op : module.getBody()->getOperations()) {
    if (auto c = dyn_cast<kv::KVCacheOp>(op)) {
      auto t = c.getType();
      auto dtype = dtypeOf(t.getElementType());
      if (failed(dtype))
        return error(c, "unsupported KV cache dtype");
      storageIndex[c.getSymName().str()] = storage.size();
      storage.push_back(pl::CreateStorage(
          b, b.CreateString(c.getSymName().str()), pl::StorageKind::KVCache,
          c.getLayer(), t.getPageSize(), t.getNumPages(), t.getKvHeads(),
          t.getHeadDim(), *dtype));
    } else if (auto s = dyn_cast<kv::MambaStateOp>(op)) {
      auto t = s.getType();
      storageIndex[s.getSymName().str()] = storage.size();
      storage.push_back(pl::CreateStorage(
          b, b.CreateString(s.getSymName().str()), pl::StorageKind::MambaState,
          s.getLayer(), 0, 0, 0, t.getHeadDim(), pl::DType::F32, t.getSlots(),
          t.getConvDim(), t.getConvWindow(), t.getNumHeads(),
          t.getStateSize()));
    }
  }

  fb::Offset<pl::Step> prefill, decode;
  for (auto func : module.getOps<func::FuncOp>()) {
    StringRef phase = stepPhase(func);
    if (phase.empty())
      continue;
    auto step = writeStep(func);
    if (!step)
      return step.status();
    (phase == "prefill" ? prefill : decode) = *step;
  }
  if (prefill.IsNull() || decode.IsNull())
    return Status::error("plan: module needs both a prefill and a decode step");

  std::vector<int64_t> eos;
  if (auto e = info.getAs<DenseI64ArrayAttr>("eos_token_ids"))
    eos.assign(e.asArrayRef().begin(), e.asArrayRef().end());
  std::vector<fb::Offset<fb::String>> files;
  if (auto f = info.getAs<ArrayAttr>("weight_files"))
    for (Attribute a : f)
      files.push_back(b.CreateString(cast<StringAttr>(a).str()));
  auto config = pl::CreateModelConfig(
      b, b.CreateString(getStr("sym_name")), getInt("vocab_size", 0),
      getInt("hidden_size", 0), getInt("bos_token_id", -1), b.CreateVector(eos),
      getInt("pad_token_id", -1), b.CreateString(getStr("layer_kinds")),
      b.CreateString(getStr("checkpoint")), b.CreateVector(files));
  fb::Offset<pl::Target> target;
  if (cuda) {
    std::vector<fb::Offset<fb::String>> archs;
    for (const std::string &a : cuda->archs)
      archs.push_back(b.CreateString(a));
    target = pl::CreateTarget(b, b.CreateString("cuda"), b.CreateVector(archs));
  } else {
    target = pl::CreateTarget(b, b.CreateString("cpu"));
  }
  // The version fields are always written, even at their default (0), so a
  // reader can check them before anything else.
  b.ForceDefaults(true);
  auto plan = pl::CreatePlan(
      b, kPlanVersionMajor, kPlanVersionMinor, b.CreateString(generator),
      config, b.CreateVector(weights), b.CreateVector(storage), prefill, decode,
      target, b.CreateString(policy), defaultExpertBudget);
  pl::FinishPlanBuffer(b, plan);
  return std::vector<uint8_t>(b.GetBufferPointer(),
                              b.GetBufferPointer() + b.GetSize());
}

} // namespace

StatusOr<std::vector<uint8_t>> writePlan(ModuleOp module,
                                         const std::string &generator,
                                         float defaultExpertBudget,
                                         const codegen::CudaOptions *cuda,
                                         codegen::CudaPlanBinaries *binaries) {
  auto plan = Writer(module).run(generator, defaultExpertBudget);
  if (!plan || !cuda)
    return plan;
  // The CUDA backend reads the plan it is given, exactly as the runtime will.
  fb::Verifier verifier(plan->data(), plan->size());
  if (!pl::VerifyPlanBuffer(verifier))
    return Status::error("plan: internal error: the CPU plan does not verify");
  for (const pl::Weight *w : *pl::GetPlan(plan->data())->weights())
    if (w->quant())
      return Status::error(
          std::string("plan: quantised weights (") +
          pl::EnumNameQuantScheme(w->quant()->scheme()) +
          ") have no CUDA kernels yet; compile for the CPU target: '" +
          w->tensors()->Get(0)->str() + "'");
  auto compiled = codegen::compileCudaPlan(*pl::GetPlan(plan->data()), *cuda);
  if (!compiled)
    return compiled.status();
  auto withCuda =
      Writer(module, &*compiled).run(generator, defaultExpertBudget);
  if (withCuda && binaries)
    *binaries = std::move(*compiled);
  return withCuda;
}

} // namespace nf::compiler
