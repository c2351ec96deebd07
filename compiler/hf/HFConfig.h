// Hugging Face Nemotron-H / Nemotron 3 checkpoints: config.json parsing and
// binding of the tensors a model needs to the tensors a checkpoint holds.
//
// No MLIR here: the importer builds IR from these plain structs, and the unit
// tests exercise them without an MLIR build.
#pragma once

#include "hf/HFQuant.h"
#include "nf/safetensors.h"
#include "nf/status.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nf::hf {

/// One mixer per layer: M (Mamba2), * (attention), - (dense MLP), E (MoE).
enum class BlockKind { Mamba, Attention, Mlp, Moe };
char blockKindLetter(BlockKind k);
const char *blockKindName(BlockKind k); // "mamba", "attention", "mlp", "moe"

/// The model hyperparameters, with Nemotron-H semantics (see
/// docs/nemotron-h-reference.md §1). Field names follow the HF config.
struct ModelConfig {
  std::string sourcePath; // config.json it came from, for messages
  std::vector<BlockKind> layers;
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  double layerNormEpsilon = 1e-5;
  bool tieWordEmbeddings = false;
  int64_t bosTokenId = -1, eosTokenId = -1, padTokenId = -1;
  std::vector<int64_t> eosTokenIds; // all eos ids when config lists several

  // Attention
  int64_t numAttentionHeads = 0;
  int64_t numKeyValueHeads = 0;
  int64_t headDim = 0;
  std::optional<double> ropeTheta; // unused by Nemotron-H (NoPE); kept for room

  // Mamba2
  int64_t mambaNumHeads = 0;
  int64_t mambaHeadDim = 0;
  int64_t ssmStateSize = 0;
  int64_t nGroups = 0;
  int64_t convKernel = 0;
  int64_t chunkSize = 0;
  bool useConvBias = true;
  bool useBias = false;
  double timeStepLimitMin = 0.0;
  double timeStepLimitMax = 0.0; // +inf when unlimited

  // Dense MLP
  int64_t intermediateSize = 0;

  // MoE
  int64_t nRoutedExperts = 0;
  int64_t numExpertsPerTok = 0;
  int64_t moeIntermediateSize = 0;
  int64_t moeSharedExpertIntermediateSize = 0;
  int64_t nGroup = 1;
  int64_t topkGroup = 1;
  bool normTopkProb = true;
  double routedScalingFactor = 1.0;
  std::optional<int64_t> moeLatentSize;

  std::string activation = "relu2"; // mlp_hidden_act
  std::string weightDtype;          // config "dtype"/"torch_dtype", informative

  /// The declared quantisation: config.json's `quantization_config`, or
  /// hf_quant_config.json when parseCheckpointConfig found one.
  std::optional<QuantConfig> quantization;

  // Derived sizes.
  int64_t mambaInner() const { return mambaNumHeads * mambaHeadDim; }
  int64_t convDim() const { return mambaInner() + 2 * nGroups * ssmStateSize; }
  int64_t inProjDim() const { return mambaInner() + convDim() + mambaNumHeads; }
  int64_t expertInputDim() const {
    return moeLatentSize ? *moeLatentSize : hiddenSize;
  }
  bool hasKind(BlockKind k) const;
};

/// Parse config.json at `path`: Hub spelling (hybrid_override_pattern,
/// mamba_n_groups, mamba_d_conv, ...) and transformers-5 spelling
/// (layers_block_type with linear_attention|full_attention|moe|mlp). Checks
/// required fields and internal consistency (heads divide, top-k <= experts).
StatusOr<ModelConfig> parseConfigFile(const std::string &path);
/// Same, from JSON text; `source` names the file in messages.
StatusOr<ModelConfig> parseConfigText(const std::string &text,
                                      const std::string &source);
/// `dir`/config.json, and `dir`/hf_quant_config.json (ModelOpt) when it
/// exists, which then describes the quantisation (see mergeQuantConfigs).
StatusOr<ModelConfig> parseCheckpointConfig(const std::string &dir);

/// A weight as the model sees it, bound to checkpoint tensors. A stacked
/// weight (routed experts) lists one tensor per expert in expert order, or a
/// single tensor that already holds all experts.
struct WeightBinding {
  std::string role;                 // "in_proj", "experts_up", "embedding", ...
  std::vector<std::string> tensors; // checkpoint tensor names
  /// True: shape[0] indexes `tensors` (or the one stacked tensor).
  bool stacked = false;
  DType dtype = DType::F32;   // quantised: the codes' storage (F8_E4M3, I32)
  std::vector<int64_t> shape; // logical shape (stacked shape for experts)
  std::string file;           // file holding tensors[0] (messages, plans)
  /// Set for a quantised linear: its scales, one per tensor.
  std::optional<WeightQuant> quant;
};

struct LayerBinding {
  int64_t index = 0;
  BlockKind kind = BlockKind::Mamba;
  WeightBinding norm;
  std::vector<WeightBinding> mixer; // in a fixed order per kind (see .cpp)
  const WeightBinding *find(const std::string &role) const;
};

struct ModelBinding {
  WeightBinding embedding;
  std::vector<LayerBinding> layers;
  WeightBinding finalNorm;
  WeightBinding lmHead; // the embedding when tied and no lm_head.weight exists
  std::vector<std::string> files;
};

/// Look up every tensor the model needs: `backbone.` (Hub) or `model.` (HF
/// memory) prefixes, per-expert or stacked experts. Fails on a missing tensor,
/// a wrong shape, a dtype other than f32/bf16/f16, or mixed dtypes inside a
/// stacked weight, with a message naming the file and tensor. Linear
/// projections may be quantised as `config.quantization` declares (see
/// findLinear); routed experts then come one tensor per expert.
StatusOr<ModelBinding> bindCheckpoint(const ModelConfig &config,
                                      const Checkpoint &ckpt);

} // namespace nf::hf
