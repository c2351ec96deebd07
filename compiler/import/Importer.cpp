//===- Importer.cpp - Hugging Face checkpoint -> nf dialect ---------------===//
//
// The checkpoint layer (compiler/hf) has already checked names, shapes,
// dtypes and quantisation scales against the config; this file only turns the
// bound model into IR and runs the verifier as a second, independent check.
//
//===----------------------------------------------------------------------===//

#include "import/Importer.h"

#include "hf/HFConfig.h"
#include "nf/IR/NfDialect.h"
#include "nf/IR/NfOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"

#include <cctype>
#include <filesystem>
#include <limits>
#include <map>

using namespace mlir;
namespace hf = ::nf::hf;
namespace nfir = ::mlir::nf;

namespace nf::import {
namespace {

Type elementType(MLIRContext *ctx, DType dtype) {
  switch (dtype) {
  case DType::F32:
    return Float32Type::get(ctx);
  case DType::BF16:
    return BFloat16Type::get(ctx);
  case DType::F16:
    return Float16Type::get(ctx);
  default:
    return {}; // bindCheckpoint rejects every other dtype
  }
}

/// `#nf.quant` of a quantised binding: the same facts in the IR's terms. Null
/// (after a diagnostic at `loc`) when they break the attribute's invariants.
nfir::QuantAttr quantAttr(MLIRContext *ctx, Location loc,
                          const hf::WeightQuant &q) {
  Builder b(ctx);
  auto tensors = [&](const std::vector<hf::TensorRef> &refs, ArrayAttr &names,
                     ArrayAttr &types) {
    if (refs.empty())
      return;
    SmallVector<Attribute> n, t;
    for (const hf::TensorRef &r : refs) {
      n.push_back(b.getStringAttr(r.name));
      t.push_back(TypeAttr::get(
          RankedTensorType::get(r.shape, elementType(ctx, r.dtype))));
    }
    names = b.getArrayAttr(n);
    types = b.getArrayAttr(t);
  };
  ArrayAttr scales, scaleTypes, inputScales, inputTypes;
  tensors(q.scales, scales, scaleTypes);
  tensors(q.inputScales, inputScales, inputTypes);
  auto scheme = q.scheme == hf::QuantScheme::Int4 ? nfir::QuantScheme::Int4
                                                  : nfir::QuantScheme::Fp8E4M3;
  Type storage = q.storage == DType::I32 ? Type(b.getI32Type())
                                         : Type(b.getType<Float8E4M3FNType>());
  nfir::QuantGranularity granularity = nfir::QuantGranularity::PerTensor;
  switch (q.granularity) {
  case hf::QuantGranularity::PerTensor:
    granularity = nfir::QuantGranularity::PerTensor;
    break;
  case hf::QuantGranularity::PerChannel:
    granularity = nfir::QuantGranularity::PerChannel;
    break;
  case hf::QuantGranularity::PerGroup:
    granularity = nfir::QuantGranularity::PerGroup;
    break;
  }
  nfir::ActivationQuant activations = nfir::ActivationQuant::None;
  switch (q.activations) {
  case hf::ActivationQuant::None:
    activations = nfir::ActivationQuant::None;
    break;
  case hf::ActivationQuant::StaticPerTensor:
    activations = nfir::ActivationQuant::StaticPerTensor;
    break;
  case hf::ActivationQuant::DynamicPerToken:
    activations = nfir::ActivationQuant::DynamicPerToken;
    break;
  }
  return nfir::QuantAttr::getChecked(
      [&] { return emitError(loc); }, ctx, scheme, storage, q.pack, granularity,
      q.groupSize, q.symmetric, scales, scaleTypes, activations, inputScales,
      inputTypes);
}

/// A valid bare symbol name from a directory name ("pydoc-moe" -> pydoc_moe).
std::string symbolName(const std::string &dir) {
  std::string base = std::filesystem::path(dir).lexically_normal().filename();
  if (base.empty() || base == "." || base == "..")
    base = std::filesystem::absolute(dir).lexically_normal().filename();
  std::string out;
  for (char c : base)
    out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0])))
    out = "m_" + out;
  return out;
}

class ModelBuilder {
public:
  ModelBuilder(MLIRContext &ctx, const hf::ModelConfig &config,
               const hf::ModelBinding &binding)
      : ctx(ctx), b(&ctx), config(config), binding(binding) {}

  void build(ModuleOp module, const std::string &dir);

private:
  /// One nf.weight per distinct tensor list, so a tied embedding and LM head
  /// share a value.
  Value weight(const hf::WeightBinding &w) {
    std::string key;
    for (const auto &t : w.tensors)
      key += t + '\n';
    if (auto it = weights.find(key); it != weights.end())
      return it->second;
    // A quantised weight keeps its logical shape; its element type is the
    // codes' (f8E4M3FN, i4), and #nf.quant says how they are stored.
    Location loc = NameLoc::get(b.getStringAttr(w.tensors[0]));
    nfir::QuantAttr quant =
        w.quant ? quantAttr(&ctx, loc, *w.quant) : nfir::QuantAttr();
    Type element = quant ? quant.getCodeType() : elementType(&ctx, w.dtype);
    if (!element) // a quant that failed: the diagnostic is out already
      element = b.getF32Type();
    auto type = RankedTensorType::get(w.shape, element);
    SmallVector<StringRef> names(w.tensors.begin(), w.tensors.end());
    auto op = nfir::WeightOp::create(b, loc, type, b.getStrArrayAttr(names),
                                     w.stacked ? b.getUnitAttr() : UnitAttr(),
                                     DenseI64ArrayAttr(), quant);
    return weights[key] = op.getResult();
  }

  Value mixer(const hf::LayerBinding &layer, Value x, Location loc);

  MLIRContext &ctx;
  OpBuilder b;
  const hf::ModelConfig &config;
  const hf::ModelBinding &binding;
  std::map<std::string, Value> weights;
};

void ModelBuilder::build(ModuleOp module, const std::string &dir) {
  b.setInsertionPointToEnd(module.getBody());
  auto fileLoc = FileLineColLoc::get(&ctx, config.sourcePath, 1, 1);
  std::vector<int64_t> eos = config.eosTokenIds;
  std::vector<std::string> files;
  for (const auto &f : binding.files)
    files.push_back(std::filesystem::path(f).lexically_relative(dir).string());
  SmallVector<StringRef> fileRefs(files.begin(), files.end());

  auto model = nfir::ModelOp::create(
      b, fileLoc, b.getStringAttr(symbolName(dir)),
      b.getI64IntegerAttr(config.vocabSize),
      b.getI64IntegerAttr(config.hiddenSize),
      b.getI64IntegerAttr(config.bosTokenId), b.getDenseI64ArrayAttr(eos),
      b.getI64IntegerAttr(config.padTokenId),
      b.getStringAttr(
          std::filesystem::absolute(dir).lexically_normal().string()),
      b.getStrArrayAttr(fileRefs));
  Block *body = b.createBlock(&model.getBody());
  Value tokens = body->addArgument(
      RankedTensorType::get({ShapedType::kDynamic}, b.getI32Type()), fileLoc);

  auto act = RankedTensorType::get({ShapedType::kDynamic, config.hiddenSize},
                                   b.getF32Type());
  auto eps = b.getF64FloatAttr(config.layerNormEpsilon);
  Value h =
      nfir::EmbedOp::create(b, NameLoc::get(b.getStringAttr("embeddings")), act,
                            tokens, weight(binding.embedding));
  for (const auto &layer : binding.layers) {
    auto loc =
        NameLoc::get(b.getStringAttr("layers." + std::to_string(layer.index) +
                                     "." + hf::blockKindName(layer.kind)));
    Value x = nfir::RMSNormOp::create(b, loc, act, h, weight(layer.norm), eps);
    h = nfir::AddOp::create(b, loc, h, mixer(layer, x, loc));
  }
  auto finalLoc = NameLoc::get(b.getStringAttr("norm_f"));
  h = nfir::RMSNormOp::create(b, finalLoc, act, h, weight(binding.finalNorm),
                              eps);
  auto logitsType = RankedTensorType::get(
      {ShapedType::kDynamic, config.vocabSize}, b.getF32Type());
  auto headLoc = NameLoc::get(b.getStringAttr("lm_head"));
  Value logits =
      nfir::LMHeadOp::create(b, headLoc, logitsType, h, weight(binding.lmHead));
  nfir::OutputOp::create(b, headLoc, logits);
}

Value ModelBuilder::mixer(const hf::LayerBinding &layer, Value x,
                          Location loc) {
  // Materialise the weights in binding order first: argument evaluation order
  // is unspecified, and the printed IR should be stable and readable.
  std::map<std::string, Value> weightsByRole;
  for (const hf::WeightBinding &wb : layer.mixer)
    weightsByRole[wb.role] = weight(wb);
  auto w = [&](const char *role) -> Value {
    auto it = weightsByRole.find(role);
    return it == weightsByRole.end() ? Value() : it->second;
  };
  Type type = x.getType();
  auto i64 = [&](int64_t v) { return b.getI64IntegerAttr(v); };
  auto f64 = [&](double v) { return b.getF64FloatAttr(v); };
  switch (layer.kind) {
  case hf::BlockKind::Mamba:
    return nfir::Mamba2Op::create(
        b, loc, type, x, w("in_proj"), w("conv_weight"), w("dt_bias"),
        w("A_log"), w("D"), w("norm"), w("out_proj"), w("conv_bias"),
        i64(config.mambaNumHeads), i64(config.mambaHeadDim),
        i64(config.ssmStateSize), i64(config.nGroups), i64(config.convKernel),
        i64(config.chunkSize), f64(config.layerNormEpsilon),
        f64(config.timeStepLimitMin), f64(config.timeStepLimitMax));
  case hf::BlockKind::Attention: {
    auto op = nfir::AttentionOp::create(
        b, loc, type, x, w("q_proj"), w("k_proj"), w("v_proj"), w("o_proj"),
        i64(config.numAttentionHeads), i64(config.numKeyValueHeads),
        i64(config.headDim),
        /*rope_theta=*/FloatAttr(), /*scale=*/FloatAttr());
    return op;
  }
  case hf::BlockKind::Mlp:
    return nfir::MLPOp::create(b, loc, type, x, w("up_proj"), w("down_proj"),
                               b.getStringAttr(config.activation));
  case hf::BlockKind::Moe: {
    SmallVector<Value> latent;
    if (Value down = w("latent_down"))
      latent = {down, w("latent_up")};
    return nfir::MoEOp::create(
        b, loc, type, x, w("gate"), w("correction_bias"), w("experts_up"),
        w("experts_down"), w("shared_up"), w("shared_down"), latent,
        i64(config.nRoutedExperts), i64(config.numExpertsPerTok),
        i64(config.nGroup), i64(config.topkGroup),
        b.getBoolAttr(config.normTopkProb), f64(config.routedScalingFactor),
        b.getStringAttr(config.activation));
  }
  }
  llvm_unreachable("unknown block kind");
}

} // namespace

StatusOr<OwningOpRef<ModuleOp>> importCheckpoint(MLIRContext &context,
                                                 const std::string &dir) {
  context.getOrLoadDialect<nfir::NfDialect>();
  if (!std::filesystem::is_directory(dir))
    return Status::error(dir + ": not a checkpoint directory");
  auto config = hf::parseCheckpointConfig(dir);
  if (!config)
    return config.status();
  auto checkpoint = openCheckpoint(dir);
  if (!checkpoint)
    return checkpoint.status();
  auto binding = hf::bindCheckpoint(*config, *checkpoint);
  if (!binding)
    return binding.status();

  // The checkpoint layer validated shapes already; a verifier failure here is
  // an inconsistency the config checks missed, reported with its op (a
  // #nf.quant the binding got wrong is reported while building).
  std::string diag;
  {
    ScopedDiagnosticHandler handler(&context, [&](Diagnostic &d) {
      if (diag.empty())
        diag = d.str();
      return success();
    });
    OwningOpRef<ModuleOp> module = ModuleOp::create(
        FileLineColLoc::get(&context, config->sourcePath, 1, 1));
    ModelBuilder(context, *config, *binding).build(*module, dir);
    if (!diag.empty() || failed(verify(*module)))
      return Status::error(
          config->sourcePath + ": imported model does not verify: " +
          (diag.empty() ? std::string("unknown error") : diag));
    return std::move(module);
  }
}

} // namespace nf::import
