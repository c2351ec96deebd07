// Checkpoint binding: the tensors a model needs, looked up in the tensors a
// checkpoint holds (see HFConfig.h, bindCheckpoint, and
// docs/nemotron-h-reference.md §6). Linear projections may be quantised
// (HFQuant.h); everything else is f32, bf16 or f16.
#include "hf/HFConfig.h"
#include "hf/HFInternal.h"

#include <memory>

namespace nf::hf {

namespace {

using ::nf::shapeString;

class Binder {
public:
  Binder(const ModelConfig &cfg, const Checkpoint &ckpt)
      : cfg_(cfg), ckpt_(ckpt),
        quant_(cfg.quantization ? &*cfg.quantization : nullptr) {
    if (quant_)
      matcher_ = std::make_unique<QuantMatcher>(*quant_);
    // Hub checkpoints use "backbone.", HF's in-memory names "model."; report
    // missing tensors in the spelling this checkpoint uses.
    bool anyBackbone = false, anyModel = false;
    for (const auto &[name, t] : ckpt.tensors) {
      anyBackbone |= name.rfind("backbone.", 0) == 0;
      anyModel |= name.rfind("model.", 0) == 0;
    }
    prefixes_ = (anyModel && !anyBackbone)
                    ? std::vector<std::string>{"model.", "backbone."}
                    : std::vector<std::string>{"backbone.", "model."};
  }

  /// Where a missing tensor is reported: the only file, or the directory.
  std::string where() const {
    return ckpt_.files.size() == 1 ? ckpt_.files.front() : ckpt_.dir;
  }

  /// Names of `suffix` under every accepted prefix, preferred one first.
  std::vector<std::string> withPrefixes(const std::string &suffix) const {
    std::vector<std::string> out;
    for (const std::string &p : prefixes_)
      out.push_back(p + suffix);
    return out;
  }

  const TensorInfo *findFirst(const std::vector<std::string> &names) const {
    for (const std::string &n : names)
      if (const TensorInfo *t = ckpt_.find(n))
        return t;
    return nullptr;
  }

  Status check(const TensorInfo &t, const std::vector<int64_t> &shape) const {
    if (t.shape != shape)
      return Status::error(t.file + ": tensor '" + t.name + "' has shape " +
                           shapeString(t.shape) + ", expected " +
                           shapeString(shape));
    if (t.dtype == DType::F8E4M3)
      return Status::error(t.file + ": tensor '" + t.name +
                           "' has dtype F8_E4M3 (quantised codes), which nf "
                           "reads only as the weight of a linear projection "
                           "(routed experts: one tensor per expert)");
    if (!isSupportedWeightDType(t.dtype))
      return Status::error(t.file + ": tensor '" + t.name +
                           "' has unsupported dtype " + dtypeName(t.dtype) +
                           " (supported: F32, BF16, F16)");
    return Status::success();
  }

  /// Binds the first existing name of `names`; a miss names names[0].
  Status bind(WeightBinding &w, const std::string &role,
              const std::vector<std::string> &names,
              const std::vector<int64_t> &shape, const std::string &context) {
    const TensorInfo *t = findFirst(names);
    if (!t)
      return Status::error(where() + ": missing tensor '" + names.front() +
                           "' (" + context + ")");
    if (Status s = check(*t, shape); !s)
      return s;
    w.role = role;
    w.tensors = {t->name};
    w.stacked = false;
    w.dtype = t->dtype;
    w.shape = shape;
    w.file = t->file;
    return Status::success();
  }

  /// Binds linear projection `modules` (candidate spellings of one module,
  /// without ".weight"), quantised or not; a miss names modules[0].
  Status bindLinear(WeightBinding &w, const std::string &role,
                    const std::vector<std::string> &modules,
                    const std::vector<int64_t> &shape,
                    const std::string &context) {
    StatusOr<LinearTensor> lt =
        findLinear(ckpt_, quant_, matcher_.get(), modules, shape);
    if (!lt)
      return lt.status();
    if (!lt->weight)
      return Status::error(where() + ": missing tensor '" + modules.front() +
                           ".weight' (" + context + ")");
    if (!lt->quant)
      if (Status s = check(*lt->weight, shape); !s)
        return s;
    w.role = role;
    w.tensors = {lt->weight->name};
    w.stacked = false;
    w.dtype = lt->weight->dtype;
    w.shape = shape;
    w.file = lt->weight->file;
    w.quant = std::move(lt->quant);
    return Status::success();
  }

  Status bindLayerLinear(LayerBinding &lb, const std::string &role,
                         const std::string &module,
                         const std::vector<int64_t> &shape) {
    WeightBinding w;
    if (Status s =
            bindLinear(w, role, withPrefixes(layerPath(lb.index) + module),
                       shape, context(lb));
        !s)
      return s;
    lb.mixer.push_back(std::move(w));
    return Status::success();
  }

  Status bindLayerWeight(LayerBinding &lb, const std::string &role,
                         const std::string &suffix,
                         const std::vector<int64_t> &shape) {
    WeightBinding w;
    if (Status s = bind(w, role, withPrefixes(layerPath(lb.index) + suffix),
                        shape, context(lb));
        !s)
      return s;
    lb.mixer.push_back(std::move(w));
    return Status::success();
  }

  /// Routed experts, per-expert (Hub: experts.{j}.up_proj.weight) or stacked
  /// (HF memory: experts.up_proj [E, ...]).
  Status bindExperts(LayerBinding &lb, const std::string &role,
                     const std::string &proj,
                     const std::vector<int64_t> &perExpert) {
    const int64_t numExperts = cfg_.nRoutedExperts;
    const std::string base = layerPath(lb.index) + "mixer.experts.";
    std::vector<int64_t> stackedShape = {numExperts};
    stackedShape.insert(stackedShape.end(), perExpert.begin(), perExpert.end());
    WeightBinding w;
    w.role = role;
    w.stacked = true;
    w.shape = stackedShape;

    auto expertModules = [&](int64_t j) {
      return withPrefixes(base + std::to_string(j) + "." + proj);
    };
    auto expertExists = [&](int64_t j) {
      for (const std::string &m : expertModules(j))
        if (ckpt_.find(m + ".weight") || ckpt_.find(m + ".weight_packed"))
          return true;
      return false;
    };
    if (expertExists(0)) {
      const TensorInfo *first = nullptr;
      for (int64_t j = 0; j < numExperts; ++j) {
        const std::string ctx = context(lb) + ", expert " + std::to_string(j);
        WeightBinding e;
        if (Status s = bindLinear(e, role, expertModules(j), perExpert, ctx);
            !s)
          return s;
        const TensorInfo *t = ckpt_.find(e.tensors.front());
        if (!first) {
          first = t;
          w.quant = e.quant;
        } else if (t->dtype != first->dtype) {
          return Status::error(
              t->file + ": tensor '" + t->name + "' has dtype " +
              dtypeName(t->dtype) + " but '" + first->name + "' has " +
              dtypeName(first->dtype) + " (the experts of layer " +
              std::to_string(lb.index) + " must share one dtype)");
        } else if (e.quant) {
          if (!sameQuantFormat(*e.quant, *w.quant))
            return Status::error(t->file + ": tensor '" + t->name +
                                 "' is quantised differently from '" +
                                 first->name + "' (the experts of layer " +
                                 std::to_string(lb.index) +
                                 " must share one quantisation)");
          w.quant->scales.push_back(e.quant->scales.front());
          if (!e.quant->inputScales.empty())
            w.quant->inputScales.push_back(e.quant->inputScales.front());
        }
        w.tensors.push_back(t->name);
      }
      // More experts than the config says means config and weights disagree.
      if (expertExists(numExperts)) {
        const TensorInfo *extra = nullptr;
        for (const std::string &m : expertModules(numExperts))
          if (!extra)
            extra = ckpt_.find(m + ".weight")
                        ? ckpt_.find(m + ".weight")
                        : ckpt_.find(m + ".weight_packed");
        return Status::error(extra->file + ": tensor '" + extra->name +
                             "' exists but n_routed_experts is " +
                             std::to_string(numExperts));
      }
      w.dtype = first->dtype;
      w.file = first->file;
      lb.mixer.push_back(std::move(w));
      return Status::success();
    }
    std::vector<std::string> stackedNames;
    for (const std::string &n : withPrefixes(base + proj)) {
      stackedNames.push_back(n);
      stackedNames.push_back(n + ".weight");
    }
    const TensorInfo *t = findFirst(stackedNames);
    if (!t)
      return Status::error(where() + ": missing tensor '" +
                           expertModules(0).front() + ".weight' (" +
                           context(lb) + "; no stacked '" +
                           stackedNames.front() + "' either)");
    if (Status s = check(*t, stackedShape); !s)
      return s;
    w.tensors = {t->name};
    w.dtype = t->dtype;
    w.file = t->file;
    lb.mixer.push_back(std::move(w));
    return Status::success();
  }

  Status bindLayer(LayerBinding &lb) {
    const ModelConfig &c = cfg_;
    const int64_t H = c.hiddenSize;
    if (Status s = bind(lb.norm, "norm",
                        withPrefixes(layerPath(lb.index) + "norm.weight"), {H},
                        context(lb));
        !s)
      return s;
    switch (lb.kind) {
    case BlockKind::Mamba: {
      const int64_t I = c.mambaInner(), CD = c.convDim(), nh = c.mambaNumHeads;
      if (Status s = bindLayerLinear(lb, "in_proj", "mixer.in_proj",
                                     {c.inProjDim(), H});
          !s)
        return s;
      if (Status s = bindLayerWeight(lb, "conv_weight", "mixer.conv1d.weight",
                                     {CD, 1, c.convKernel});
          !s)
        return s;
      if (c.useConvBias)
        if (Status s =
                bindLayerWeight(lb, "conv_bias", "mixer.conv1d.bias", {CD});
            !s)
          return s;
      if (Status s = bindLayerWeight(lb, "dt_bias", "mixer.dt_bias", {nh}); !s)
        return s;
      if (Status s = bindLayerWeight(lb, "A_log", "mixer.A_log", {nh}); !s)
        return s;
      if (Status s = bindLayerWeight(lb, "D", "mixer.D", {nh}); !s)
        return s;
      if (Status s = bindLayerWeight(lb, "norm", "mixer.norm.weight", {I}); !s)
        return s;
      return bindLayerLinear(lb, "out_proj", "mixer.out_proj", {H, I});
    }
    case BlockKind::Attention: {
      const int64_t q = c.numAttentionHeads * c.headDim;
      const int64_t kv = c.numKeyValueHeads * c.headDim;
      if (Status s = bindLayerLinear(lb, "q_proj", "mixer.q_proj", {q, H}); !s)
        return s;
      if (Status s = bindLayerLinear(lb, "k_proj", "mixer.k_proj", {kv, H}); !s)
        return s;
      if (Status s = bindLayerLinear(lb, "v_proj", "mixer.v_proj", {kv, H}); !s)
        return s;
      return bindLayerLinear(lb, "o_proj", "mixer.o_proj", {H, q});
    }
    case BlockKind::Mlp: {
      const int64_t I = c.intermediateSize;
      if (Status s = bindLayerLinear(lb, "up_proj", "mixer.up_proj", {I, H});
          !s)
        return s;
      return bindLayerLinear(lb, "down_proj", "mixer.down_proj", {H, I});
    }
    case BlockKind::Moe: {
      const int64_t E = c.nRoutedExperts, Ie = c.moeIntermediateSize,
                    He = c.expertInputDim(),
                    Is = c.moeSharedExpertIntermediateSize;
      if (Status s = bindLayerWeight(lb, "gate", "mixer.gate.weight", {E, H});
          !s)
        return s;
      if (Status s = bindLayerWeight(lb, "correction_bias",
                                     "mixer.gate.e_score_correction_bias", {E});
          !s)
        return s;
      if (Status s = bindExperts(lb, "experts_up", "up_proj", {Ie, He}); !s)
        return s;
      if (Status s = bindExperts(lb, "experts_down", "down_proj", {He, Ie}); !s)
        return s;
      if (Status s = bindLayerLinear(lb, "shared_up",
                                     "mixer.shared_experts.up_proj", {Is, H});
          !s)
        return s;
      if (Status s = bindLayerLinear(lb, "shared_down",
                                     "mixer.shared_experts.down_proj", {H, Is});
          !s)
        return s;
      if (c.moeLatentSize) {
        const int64_t L = *c.moeLatentSize;
        if (Status s = bindLayerLinear(lb, "latent_down",
                                       "mixer.fc1_latent_proj", {L, H});
            !s)
          return s;
        if (Status s = bindLayerLinear(lb, "latent_up", "mixer.fc2_latent_proj",
                                       {H, L});
            !s)
          return s;
      }
      return Status::success();
    }
    }
    return Status::success();
  }

  StatusOr<ModelBinding> run() {
    const ModelConfig &c = cfg_;
    const int64_t H = c.hiddenSize, V = c.vocabSize;
    ModelBinding mb;
    mb.files = ckpt_.files;

    std::vector<std::string> embNames;
    for (const std::string &p : prefixes_) {
      embNames.push_back(p + "embeddings.weight");
      embNames.push_back(p + "embedding.weight");
    }
    if (Status s =
            bind(mb.embedding, "embedding", embNames, {V, H}, "embedding");
        !s)
      return s;

    for (size_t i = 0; i < c.layers.size(); ++i) {
      LayerBinding lb;
      lb.index = static_cast<int64_t>(i);
      lb.kind = c.layers[i];
      if (Status s = bindLayer(lb); !s)
        return s;
      mb.layers.push_back(std::move(lb));
    }

    if (Status s = bind(mb.finalNorm, "final_norm",
                        withPrefixes("norm_f.weight"), {H}, "final norm");
        !s)
      return s;

    // A checkpoint that carries lm_head.weight is used as is, even when tied
    // (the HF reference outputs of tied fixtures were computed with it).
    if (ckpt_.find("lm_head.weight") || ckpt_.find("lm_head.weight_packed") ||
        !c.tieWordEmbeddings) {
      if (Status s = bindLinear(mb.lmHead, "lm_head", {"lm_head"}, {V, H},
                                "lm_head; tie_word_embeddings is false");
          !s)
        return s;
    } else {
      mb.lmHead = mb.embedding;
      mb.lmHead.role = "lm_head";
    }
    return mb;
  }

private:
  static std::string layerPath(int64_t i) {
    return "layers." + std::to_string(i) + ".";
  }
  static std::string context(const LayerBinding &lb) {
    return "layer " + std::to_string(lb.index) + ", " + blockKindName(lb.kind);
  }

  const ModelConfig &cfg_;
  const Checkpoint &ckpt_;
  const QuantConfig *quant_;
  std::unique_ptr<QuantMatcher> matcher_;
  std::vector<std::string> prefixes_;
};

} // namespace

const WeightBinding *LayerBinding::find(const std::string &role) const {
  for (const WeightBinding &w : mixer)
    if (w.role == role)
      return &w;
  return nullptr;
}

StatusOr<ModelBinding> bindCheckpoint(const ModelConfig &config,
                                      const Checkpoint &ckpt) {
  try {
    return Binder(config, ckpt).run();
  } catch (const std::exception &e) {
    return Status::error(config.sourcePath +
                         ": cannot bind checkpoint: " + e.what());
  }
}

} // namespace nf::hf
