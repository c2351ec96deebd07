// Reading an execution plan (.nfb) and binding its weights to checkpoint
// tensors. Internal to the runtime: backends build on a PlanFile and its
// BoundWeights.
#pragma once

#include "nf/plan_generated.h"
#include "nf/status.h"
#include "weights.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace nf::engine {

/// A mapped, verified plan of a supported version. `plan` points into the
/// mapping and stays valid while the PlanFile lives.
struct PlanFile {
  std::string path;
  MappedFile file;
  const nf::plan::Plan *plan = nullptr;
};

/// Maps `path` and checks, in order: size, file identifier ("NFPL"), format
/// version (major equal, minor not newer than this runtime's), the
/// flatbuffers verifier, and the presence of the tables every backend needs
/// (config, prefill and decode steps). Errors are one line naming the file.
StatusOr<std::unique_ptr<PlanFile>> openPlan(const std::string &path);

/// One plan Weight resolved to memory.
struct BoundWeight {
  /// The plan's logical shape.
  std::vector<int64_t> shape;
  /// The whole logical tensor (plan shape and dtype); invalid for experts
  /// stacked from one tensor per expert (see `experts`).
  WeightView view;
  /// stacked: one view per expert (shape = plan shape[1:]).
  std::vector<WeightView> experts;
  /// Quantised weights (Weight.quant): `view` and `experts` hold the
  /// dequantised f32 values, and this says how a linear's input is quantised
  /// before the matmul, per part of the weight.
  struct InputQuant {
    nf::plan::ActivationQuant kind = nf::plan::ActivationQuant::None;
    /// StaticPerTensor: the scale of each part (experts: one per expert).
    std::vector<float> scales;
    /// concat_rows parts' row counts (empty: one part, or experts).
    std::vector<int64_t> partRows;
  } input;
  bool quantised = false;
  /// Quantised weights bound as QuantForm::Codes (`view` and `experts` are
  /// then invalid): the codes of each part ([rows, C], int4: [rows, C / 8]
  /// words; stacked experts: one part per expert) in row order, and the f32
  /// scale of every row of the logical weight ([E * N] for stacked
  /// experts), int4: of every group of every row ([E * N, C / group]).
  std::vector<WeightView> codeParts;
  std::vector<float> rowScales;
};

/// How quantised weights are bound: dequantised to f32 values, which the
/// CPU backend's ops read as they read f32 weights, or as their codes with
/// a scale per output row or group, which the CUDA kernels read.
enum class QuantForm { Dequantised, Codes };

/// The checkpoint files of a plan, mapped, and every plan Weight bound.
struct BoundWeights {
  std::string dir;                  // the weights directory used
  std::vector<WeightStore> stores;  // one per config.weight_files entry
  std::vector<std::string> files;   // their paths
  std::vector<BoundWeight> weights; // per Plan.weights entry
  /// Row-concatenated weights (concat_rows), packed at load; synthetic
  /// weights' random blocks.
  std::vector<std::unique_ptr<uint8_t[]>> packed;
};

/// Opens config.weight_files under `weightsDir` (empty: the plan's
/// config.checkpoint) and checks that every tensor of every plan Weight
/// exists with the plan's dtype and shape. Errors name the weights file (or
/// directory) and the tensor.
StatusOr<std::unique_ptr<BoundWeights>>
bindWeights(const PlanFile &plan, const std::string &weightsDir,
            QuantForm form = QuantForm::Dequantised);

/// The random numbers of synthetic weights: xorshift64* (Vigna), seeded
/// per use so that each kind of weight has its own stream.
class WeightRandom {
public:
  WeightRandom(uint64_t seed, uint64_t stream) : state_(seed * stream + 1) {}
  uint64_t operator()() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  /// Uniform in [-0.5, 0.5).
  float centred() {
    return static_cast<float>((*this)() >> 40) / static_cast<float>(1 << 24) -
           0.5f;
  }

private:
  uint64_t state_;
};

/// The amplitude a of a synthetic weight's values, uniform in [-a, a]:
/// 1 / sqrt(K) for a matrix of K input columns (its outputs keep their
/// inputs' scale, as initialisers do), 1 for the token embeddings, and 0.05
/// for vectors (norms, biases, Mamba's A, D and dt bias). With 0.05 for
/// every weight, a Nano-wide stack of 52 layers over a 1,024-token random
/// context made the tokens of a decode step alike, and a batch of 32 loaded
/// 67 of 128 experts a layer where independent tokens load 100.5
/// (bench/results/2026-12-07e/routing-context.md); a trained model's router
/// picks by each token.
float syntheticAmplitude(const nf::plan::Weight &w);
/// That amplitude for a matrix of K input columns: 1 / sqrt(K).
float fanInAmplitude(int64_t K);

/// Seeded random weights of the plan's shapes and dtypes instead of a
/// checkpoint (benchmarks of model shapes whose checkpoint is not at hand):
/// values uniform in [-a, a], a = syntheticAmplitude. Every weight views a
/// window of one shared random block per dtype and amplitude (at a
/// per-weight offset), so memory is the largest weight of each, not the
/// model.
StatusOr<std::unique_ptr<BoundWeights>>
syntheticWeights(const PlanFile &plan, uint64_t seed,
                 QuantForm form = QuantForm::Dequantised);

/// "[63, 128]".
std::string shapeString(const std::vector<int64_t> &shape);

/// The safetensors dtype of a plan dtype.
nf::DType toDType(nf::plan::DType t);

/// Finds checkpoint tensors among a plan's bound weight files.
class WeightFinder {
public:
  explicit WeightFinder(const BoundWeights &bw) : bw_(bw) {}
  /// The tensor `name` and the file holding it; the error names the file.
  StatusOr<std::pair<WeightView, std::string>>
  find(const std::string &name) const;
  /// The tensor `name`, checked to have `dtype` and `shape`.
  StatusOr<WeightView> get(const std::string &name, nf::DType dtype,
                           const std::vector<int64_t> &shape) const;

private:
  const BoundWeights &bw_;
};

/// Binds quantised plan weight `w` (its `quant` table): reads each part's
/// codes and scales through `finder`, checks their dtypes and shapes, and
/// fills `out` with the dequantised f32 values (owned by `packed`) and the
/// input quantisation, or with QuantForm::Codes the codes and row scales.
/// `ctx` prefixes errors ("plan.nfb: weight 3").
Status bindQuantisedWeight(const WeightFinder &finder,
                           const nf::plan::Weight &w, const std::string &ctx,
                           BoundWeight &out,
                           std::vector<std::unique_ptr<uint8_t[]>> &packed,
                           QuantForm form = QuantForm::Dequantised);

/// Random codes, scales and input scales for every quantised weight of
/// plan `pf`, added to `store` under the plan's tensor names (the blocks
/// they view are owned by `packed`): bound like a checkpoint's, they
/// dequantise to values uniform in about [-0.05, 0.05]. Codes of all
/// weights view windows of one random block per code type.
Status addRandomQuantTensors(const PlanFile &pf, uint64_t seed,
                             WeightStore &store,
                             std::vector<std::unique_ptr<uint8_t[]>> &packed);

} // namespace nf::engine
