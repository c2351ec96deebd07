//===- PlanWriter.cpp - compiled module -> plan.nfb -----------------------===//
//
// Serialises a PlanModel (Plan/PlanModel.h: every value a step touches,
// numbered), once, with the CUDA binaries generated from the same model when
// the target is CUDA. Ops keep their names and attributes, so the runtime
// interprets exactly the IR, and carry their code from nf/plan_ops.def.
//
//===----------------------------------------------------------------------===//

#include "Plan/PlanWriter.h"

#include "Plan/PlanModel.h"
#include "Target/Cuda/CudaBackend.h"
#include "Transforms/StepUtils.h"
#include "nf/IR/NfOps.h"
#include "nf/plan_generated.h"
#include "nf/plan_version.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

using namespace mlir;
namespace fb = flatbuffers;
namespace pl = ::nf::plan;
namespace nfir = ::mlir::nf;

namespace nf::compiler {
namespace {

class Writer {
public:
  Writer(const PlanModel &model, const codegen::CudaPlanBinaries *cuda)
      : model(model), cuda(cuda) {}

  StatusOr<std::vector<uint8_t>> run(const std::string &generator,
                                     float defaultExpertBudget);

private:
  fb::Offset<pl::Weight> weight(const PlanWeight &w);
  fb::Offset<pl::Value> value(const PlanValue &v);
  fb::Offset<pl::Op> op(const PlanOp &p);
  fb::Offset<pl::Step> step(const PlanStep &s);
  fb::Offset<pl::Launch> launch(const codegen::CudaLaunchInfo &l) {
    return pl::CreateLaunch(b, b.CreateString(l.function), l.grid, l.block,
                            l.sharedBytes, l.cooperative, l.minTokens,
                            l.maxTokens, l.programmatic);
  }

  const PlanModel &model;
  const codegen::CudaPlanBinaries *cuda;
  fb::FlatBufferBuilder b{1 << 16};
  std::vector<fb::Offset<pl::Weight>> weights;
};

// The plan's quantisation enums mirror the IR's (NfAttrs.td) value for value.
static_assert(static_cast<int>(nfir::QuantGranularity::PerGroup) ==
              static_cast<int>(pl::QuantGranularity::PerGroup));
static_assert(static_cast<int>(nfir::ActivationQuant::DynamicPerToken) ==
              static_cast<int>(pl::ActivationQuant::DynamicPerToken));

fb::Offset<pl::Weight> Writer::weight(const PlanWeight &w) {
  auto op = cast<nfir::WeightOp>(w.op);
  std::vector<fb::Offset<fb::String>> names;
  for (Attribute a : op.getTensors())
    names.push_back(b.CreateString(cast<StringAttr>(a).getValue().str()));
  std::vector<int64_t> rows;
  if (auto r = op.getConcatRows())
    rows.assign(r->begin(), r->end());
  fb::Offset<pl::WeightQuant> quantTable;
  if (auto quant = op.getQuant()) {
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
  return pl::CreateWeight(b, b.CreateVector(names), op.getStacked(),
                          rows.empty() ? 0 : b.CreateVector(rows), w.dtype,
                          b.CreateVector(w.shape), quantTable);
}

fb::Offset<pl::Value> Writer::value(const PlanValue &v) {
  switch (v.kind) {
  case pl::ValueKind::Weight:
    // Weights are written where a step first refers to them.
    if (v.weight == static_cast<int>(weights.size()))
      weights.push_back(weight(model.weights[static_cast<size_t>(v.weight)]));
    return pl::CreateValue(b, v.kind, v.dtype, pl::Rows::None, 0, -1, 0,
                           v.weight);
  case pl::ValueKind::Dispatch:
    return pl::CreateValue(b, v.kind, v.dtype, v.rows, 0, v.offset, v.bytes, -1,
                           v.numExperts, v.maxPerToken);
  case pl::ValueKind::Tensor:
    return pl::CreateValue(b, v.kind, v.dtype, v.rows, b.CreateVector(v.shape),
                           v.offset, v.bytes);
  default: // step inputs
    return pl::CreateValue(b, v.kind, v.dtype);
  }
}

fb::Offset<pl::Op> Writer::op(const PlanOp &p) {
  // Attributes, generically: the runtime reads them by name.
  std::vector<fb::Offset<pl::IntAttr>> ints;
  std::vector<fb::Offset<pl::FloatAttr>> floats;
  std::vector<fb::Offset<pl::StringAttr>> strings;
  std::vector<fb::Offset<pl::IntListAttr>> lists;
  for (NamedAttribute a : planAttrs(*p.op)) {
    Attribute v = a.getValue();
    // Other kinds (a symbol: p.storage; unit marks the compiler alone
    // reads) are not stored, so neither is their name.
    if (!isa<BoolAttr, IntegerAttr, FloatAttr, StringAttr, DenseI64ArrayAttr>(
            v))
      continue;
    auto name = b.CreateString(a.getName().str());
    if (auto flag = dyn_cast<BoolAttr>(v)) {
      ints.push_back(pl::CreateIntAttr(b, name, flag.getValue()));
    } else if (auto i = dyn_cast<IntegerAttr>(v)) {
      ints.push_back(pl::CreateIntAttr(b, name, i.getInt()));
    } else if (auto f = dyn_cast<FloatAttr>(v)) {
      floats.push_back(pl::CreateFloatAttr(b, name, f.getValueAsDouble()));
    } else if (auto s = dyn_cast<StringAttr>(v)) {
      strings.push_back(pl::CreateStringAttr(b, name, b.CreateString(s.str())));
    } else if (auto l = dyn_cast<DenseI64ArrayAttr>(v)) {
      lists.push_back(pl::CreateIntListAttr(
          b, name, b.CreateVector(l.asArrayRef().data(), l.size())));
    }
  }
  return pl::CreateOp(
      b, b.CreateString(opName(p)), b.CreateVector(p.operands),
      b.CreateVector(p.results), p.storage, b.CreateVectorOfSortedTables(&ints),
      b.CreateVectorOfSortedTables(&floats),
      b.CreateVectorOfSortedTables(&strings),
      b.CreateVectorOfSortedTables(&lists), static_cast<uint16_t>(p.code));
}

fb::Offset<pl::Step> Writer::step(const PlanStep &s) {
  // Values are written in the order the module defines them: step inputs
  // and weights, then per kernel its outputs and, op by op, its internal
  // values.
  std::vector<fb::Offset<pl::Value>> values;
  auto valuesUpTo = [&](int end) {
    while (static_cast<int>(values.size()) < end)
      values.push_back(value(s.values[values.size()]));
  };
  const bool isPrefill = s.phase == "prefill";
  const auto *bins = !cuda       ? nullptr
                     : isPrefill ? &cuda->prefill
                                 : &cuda->decode;
  std::vector<fb::Offset<pl::Kernel>> kernels;
  for (const PlanKernel &k : s.kernels) {
    for (int o : k.outputs)
      valuesUpTo(o + 1);
    std::vector<fb::Offset<pl::Op>> ops;
    for (const PlanOp &p : k.ops) {
      for (int r : p.results)
        valuesUpTo(r + 1);
      ops.push_back(op(p));
    }
    valuesUpTo(static_cast<int>(values.size())); // (none left unwritten)
    if (!bins) {
      kernels.push_back(
          pl::CreateKernel(b, b.CreateString(k.name), b.CreateVector(k.inputs),
                           b.CreateVector(k.outputs), b.CreateVector(ops)));
      continue;
    }
    const codegen::CudaKernelBinary &bin = (*bins)[kernels.size()];
    std::vector<fb::Offset<fb::String>> archs;
    std::vector<fb::Offset<pl::CubinBlob>> cubins;
    for (size_t a = 0; a < bin.archs.size(); ++a) {
      archs.push_back(b.CreateString(bin.archs[a]));
      cubins.push_back(pl::CreateCubinBlob(b, b.CreateVector(bin.cubins[a])));
    }
    std::vector<fb::Offset<pl::Launch>> launches;
    for (const codegen::CudaLaunchInfo &l : bin.launches)
      launches.push_back(launch(l));
    kernels.push_back(pl::CreateKernel(
        b, b.CreateString(k.name), b.CreateVector(k.inputs),
        b.CreateVector(k.outputs), b.CreateVector(ops), b.CreateVector(archs),
        b.CreateVector(cubins), b.CreateString(bin.ptx),
        b.CreateVector(launches), b.CreateString(bin.sourceHash)));
  }
  valuesUpTo(static_cast<int>(s.values.size()));
  // The generated kernels' own scratch (e.g. the shared expert's hidden
  // rows) follows the plan's kernel-internal values.
  int64_t scratchBytes = s.scratchBytes;
  if (cuda)
    scratchBytes = std::max(scratchBytes, isPrefill ? cuda->prefillScratchBytes
                                                    : cuda->decodeScratchBytes);
  fb::Offset<pl::TopLogits> topLogits;
  if (cuda && !isPrefill && cuda->decodeTopLogits.kernel >= 0) {
    const codegen::CudaTopLogits &t = cuda->decodeTopLogits;
    std::vector<fb::Offset<pl::Launch>> launches;
    for (const codegen::CudaLaunchInfo &l : t.launches)
      launches.push_back(launch(l));
    topLogits = pl::CreateTopLogits(b, t.kernel, t.k, t.idsOffset,
                                    t.valuesOffset, b.CreateVector(launches),
                                    t.noiseOffset, t.totalsOffset);
  }
  return pl::CreateStep(b, b.CreateString(s.phase), b.CreateVector(values),
                        b.CreateVector(kernels), s.tokens, s.batch, s.budget,
                        s.logits, s.maxTokens, s.arenaBytes, s.noReuseBytes,
                        scratchBytes, topLogits,
                        !cuda       ? int64_t(-1)
                        : isPrefill ? cuda->prefillExpertStatsOffset
                                    : cuda->decodeExpertStatsOffset);
}

StatusOr<std::vector<uint8_t>> Writer::run(const std::string &generator,
                                           float defaultExpertBudget) {
  ModuleOp module = model.module;
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
  for (const PlanStorage &s : model.storage)
    storage.push_back(pl::CreateStorage(
        b, b.CreateString(s.name), s.kind, s.layer, s.pageSize, s.numPages,
        s.kvHeads, s.headDim, s.dtype, s.slots, s.convDim, s.convWindow,
        s.numHeads, s.stateSize, s.hotWindow));
  // Steps in the module's order.
  fb::Offset<pl::Step> prefill, decode;
  for (auto func : module.getOps<func::FuncOp>()) {
    StringRef phase = stepPhase(func);
    if (phase == "prefill")
      prefill = step(model.prefill);
    else if (phase == "decode")
      decode = step(model.decode);
  }

  std::vector<int64_t> eos;
  if (auto e = info.getAs<DenseI64ArrayAttr>("eos_token_ids"))
    eos.assign(e.asArrayRef().begin(), e.asArrayRef().end());
  std::vector<fb::Offset<fb::String>> files;
  if (auto f = info.getAs<ArrayAttr>("weight_files"))
    for (Attribute a : f)
      files.push_back(b.CreateString(cast<StringAttr>(a).str()));
  std::vector<fb::Offset<fb::String>> planFiles;
  if (auto f = info.getAs<ArrayAttr>("plan_weight_files"))
    for (Attribute a : f)
      planFiles.push_back(b.CreateString(cast<StringAttr>(a).str()));
  auto config = pl::CreateModelConfig(
      b, b.CreateString(getStr("sym_name")), getInt("vocab_size", 0),
      getInt("hidden_size", 0), getInt("bos_token_id", -1), b.CreateVector(eos),
      getInt("pad_token_id", -1), b.CreateString(getStr("layer_kinds")),
      b.CreateString(getStr("checkpoint")), b.CreateVector(files),
      planFiles.empty() ? 0 : b.CreateVector(planFiles));
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
      target, b.CreateString(model.policy), defaultExpertBudget);
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
  auto model = buildPlanModel(module);
  if (!model)
    return model.status();
  if (!cuda)
    return Writer(*model, nullptr).run(generator, defaultExpertBudget);
  // The CUDA kernels read FP8 codes with a scale per output row (and
  // quantise the activations where the weight says so), and int4 codes of
  // weight-only schemes, eight a word, in groups of whole words.
  for (const PlanWeight &w : model->weights) {
    auto op = cast<nfir::WeightOp>(w.op);
    auto quant = op.getQuant();
    if (!quant)
      continue;
    std::string missing;
    const int64_t cols = w.shape.empty() ? 0 : w.shape.back();
    if (quant->getScheme() == nfir::QuantScheme::Int4) {
      if (quant->getActivations() != nfir::ActivationQuant::None)
        missing = "int4 weights with quantised activations";
      else if (quant->getPack() != 8 ||
               quant->getGranularity() != nfir::QuantGranularity::PerGroup ||
               quant->getGroupSize() % 8 != 0 || cols % 8 != 0)
        missing = "int4 weights in groups of " +
                  std::to_string(quant->getGroupSize()) + " of " +
                  std::to_string(cols) +
                  " columns (a word of eight codes must lie in one group)";
    } else if (quant->getGranularity() == nfir::QuantGranularity::PerGroup) {
      missing = "FP8 weights with group scales";
    }
    if (!missing.empty())
      return Status::error(
          "plan: " + missing +
          " have no CUDA kernels yet; compile for the CPU target: '" +
          cast<StringAttr>(op.getTensors()[0]).getValue().str() + "'");
  }
  auto compiled = codegen::compileCudaPlan(*model, *cuda);
  if (!compiled)
    return compiled.status();
  auto plan = Writer(*model, &*compiled).run(generator, defaultExpertBudget);
  if (plan && binaries)
    *binaries = std::move(*compiled);
  return plan;
}

} // namespace nf::compiler
