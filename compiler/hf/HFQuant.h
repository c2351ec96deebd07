// Quantised Hugging Face checkpoints: the quantisation a checkpoint declares
// (NVIDIA ModelOpt's hf_quant_config.json, or config.json's
// `quantization_config` from ModelOpt or compressed-tensors / llm-compressor)
// and how one linear weight is stored (codes, scales, activation scales).
//
// Which formats nf reads (see docs/pipeline.md, "Quantised checkpoints"):
//  - ModelOpt `quant_algo: FP8`: float8_e4m3fn weights with a per-tensor
//    `weight_scale` and a static per-tensor `input_scale`;
//  - compressed-tensors `float-quantized`: FP8 weights with per-tensor or
//    per-channel `weight_scale`; activations none, static per-tensor
//    (`input_scale`) or dynamic per-token;
//  - compressed-tensors `pack-quantized`: symmetric int4 weights, 8 per
//    int32 (`weight_packed`), per-group or per-channel `weight_scale`,
//    weight-only.
// Anything else is refused with a one-line error naming the file and scheme.
#pragma once

#include "nf/safetensors.h"
#include "nf/status.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace nf::hf {

/// Number format of the codes (IR spelling: fp8_e4m3, int4).
enum class QuantScheme { Fp8E4M3, Int4 };
/// What one weight scale covers.
enum class QuantGranularity { PerTensor, PerChannel, PerGroup };
/// How a quantised linear's input is quantised (always to fp8 e4m3).
enum class ActivationQuant { None, StaticPerTensor, DynamicPerToken };

const char *quantSchemeName(QuantScheme s);         // "fp8_e4m3", "int4"
const char *granularityName(QuantGranularity g);    // "per_tensor", ...
const char *activationQuantName(ActivationQuant a); // "none", ...

/// One quantisation recipe of a checkpoint and the modules it covers.
struct QuantGroup {
  std::string name; // compressed-tensors config group ("group_0"); ModelOpt:
                    // "quant_algo FP8"
  /// compressed-tensors targets: "Linear" (every linear projection), exact
  /// module names, or "re:<regex>" (matched from the start of the name).
  /// Empty for ModelOpt, whose one recipe covers every linear.
  std::vector<std::string> targets;
  std::string format; // "float-quantized", "pack-quantized", "modelopt"
  QuantScheme scheme = QuantScheme::Fp8E4M3;
  QuantGranularity granularity = QuantGranularity::PerTensor;
  int64_t groupSize = 0; // per-group only
  ActivationQuant activations = ActivationQuant::None;
};

/// The quantisation a checkpoint declares.
struct QuantConfig {
  enum class Producer { ModelOpt, CompressedTensors };
  Producer producer = Producer::ModelOpt;
  std::string source; // the file that declares it, for messages
  std::vector<QuantGroup> groups;
  /// Modules left unquantised: compressed-tensors `ignore` (names, "re:"
  /// patterns or "Linear"), ModelOpt `exclude_modules` (fnmatch patterns,
  /// with the exporter's stray ".\0..." sentinel suffix removed).
  std::vector<std::string> ignore;
  std::string algo; // ModelOpt quant_algo
};

/// Parses `hf_quant_config.json` (ModelOpt's descriptor). `source` names the
/// file in messages.
StatusOr<QuantConfig> parseHfQuantConfigText(const std::string &text,
                                             const std::string &source);
StatusOr<QuantConfig> parseHfQuantConfigFile(const std::string &path);

/// Reconciles the two descriptions of one checkpoint: hf_quant_config.json
/// (`descriptor`) wins over config.json's `quantization_config`
/// (`fromConfig`, may be empty), which must then be ModelOpt's with the same
/// quant_algo.
StatusOr<QuantConfig>
mergeQuantConfigs(QuantConfig descriptor,
                  const std::optional<QuantConfig> &fromConfig);

/// A checkpoint tensor a quantised weight refers to.
struct TensorRef {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

/// How a quantised linear weight is stored; scales are listed per part (one
/// per expert of a stacked weight, else one).
struct WeightQuant {
  QuantScheme scheme = QuantScheme::Fp8E4M3;
  DType storage = DType::F8E4M3; // I32 for packed int4
  int64_t pack = 1;              // codes per storage element (int4: 8)
  QuantGranularity granularity = QuantGranularity::PerTensor;
  int64_t groupSize = 0;
  bool symmetric = true;
  ActivationQuant activations = ActivationQuant::None;
  std::vector<TensorRef> scales;
  std::vector<TensorRef> inputScales; // StaticPerTensor only
};

/// Finds the quant group of a module from the config's targets and ignore
/// list, with compressed-tensors' precedence (exact name, then regex, then
/// class). Compiles the patterns once.
class QuantMatcher {
public:
  explicit QuantMatcher(const QuantConfig &config);
  ~QuantMatcher();
  QuantMatcher(const QuantMatcher &) = delete;
  QuantMatcher &operator=(const QuantMatcher &) = delete;

  /// The group that quantises linear `module`, or null when the module is
  /// ignored / excluded or no group targets it.
  const QuantGroup *groupFor(const std::string &module) const;
  /// Whether `module` is on the ignore / exclude list.
  bool ignored(const std::string &module) const;

private:
  struct Patterns;
  const QuantConfig &config_;
  std::unique_ptr<Patterns> patterns_;
};

/// A linear projection's weight as the checkpoint stores it.
struct LinearTensor {
  const TensorInfo *weight = nullptr; // `.weight` or `.weight_packed`
  std::string module;                 // name without the ".weight" suffix
  std::optional<WeightQuant> quant;   // one part's scales
};

/// Looks up linear `modules` (candidate spellings, preferred first; the
/// tensor is `<module>.weight`, or `<module>.weight_packed` for packed int4)
/// and decides from the tensors themselves whether it is quantised: an
/// F8_E4M3 weight with a sibling weight_scale, or an I32 weight_packed with
/// weight_scale and weight_shape. The result is checked against the declared
/// quantisation (`quant`, may be null): scheme, scale shapes for `shape`
/// ([out, in]), activation scales. `weight` is null when no spelling exists.
StatusOr<LinearTensor> findLinear(const Checkpoint &ckpt,
                                  const QuantConfig *quant,
                                  const QuantMatcher *matcher,
                                  const std::vector<std::string> &modules,
                                  const std::vector<int64_t> &shape);

/// True when two parts are quantised the same way (scheme, granularity,
/// activations), so that one weight may hold both.
bool sameQuantFormat(const WeightQuant &a, const WeightQuant &b);

} // namespace nf::hf
