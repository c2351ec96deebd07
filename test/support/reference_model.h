// The CPU reference executor: a Nemotron-H model described by plain structs
// (ModelDesc, views of mapped weights) run one continuous-batching step at a
// time over per-slot recurrent state and a paged KV cache. Test-only
// (test/support, target nf_reference_model): the unit tests' oracle, not
// part of libnf; it runs the CPU backend's kernels over the engine's caches.
//
// Usage:
//   Executor ex = *Executor::create(desc);
//   Caches caches = *createCaches(desc, {.numSlots = 8, .numPages = 256,
//                                        .pageSize = 16});
//   int32_t a = *caches.addSequence();
//   SeqSpan span{.begin = 0, .count = n, .startPos = 0, .slot = a};
//   ex.step(caches, {&span, 1}, tokens, logits);    // prefill
//   ... then one token per step at startPos = caches.length(a) ...
//   caches.removeSequence(a);
#pragma once

#include "backends/cpu/kernels.h"
#include "engine/caches.h"
#include "nf/status.h"

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace nf::cpu {

enum class LayerKind { Mamba, Attention, Mlp, Moe };
const char *layerKindName(LayerKind k);

struct MambaLayer {
  MambaShape shape;
  /// dt clamp; (0, inf) = none (NVIDIA / vLLM / mamba_ssm semantics).
  float dtMin = 0.0f;
  float dtMax = std::numeric_limits<float>::infinity();
  WeightView inProj;     // [DIN, H]: rows z | x | B | C | dt
  WeightView convWeight; // [CD, 1, K]
  WeightView convBias;   // [CD], or invalid
  WeightView dtBias;     // [nh]
  WeightView aLog;       // [nh]
  WeightView d;          // [nh]
  WeightView norm;       // [I] gated-norm weight
  WeightView outProj;    // [H, I]
};

struct AttentionLayer {
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  WeightView q, k, v; // [nq·hd, H], [nkv·hd, H], [nkv·hd, H]
  WeightView o;       // [H, nq·hd]
};

struct MlpLayer {
  WeightView up;   // [Id, H]
  WeightView down; // [H, Id]
};

struct MoeLayer {
  RouterConfig router;
  int32_t topK = 0;                    // default experts per token
  WeightView gate;                     // [E, H]
  WeightView correctionBias;           // [E], or invalid
  std::vector<WeightView> expertsUp;   // E views [Ie, He]
  std::vector<WeightView> expertsDown; // E views [He, Ie]
  WeightView sharedUp;                 // [Is, H], or invalid: no shared expert
  WeightView sharedDown;               // [H, Is]
  WeightView latentDown;               // fc1 [He, H], or invalid: He = H
  WeightView latentUp;                 // fc2 [H, He]
};

struct LayerDesc {
  LayerKind kind = LayerKind::Mamba;
  WeightView norm; // pre-mixer RMSNorm [H]
  MambaLayer mamba;
  AttentionLayer attention;
  MlpLayer mlp;
  MoeLayer moe;
};

struct ModelDesc {
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  double eps = 1e-5;
  std::vector<LayerDesc> layers;
  WeightView embedding; // [V, H]
  WeightView finalNorm; // [H]
  WeightView lmHead;    // [V, H]

  /// Every view present, of a supported dtype and of the shape the
  /// hyperparameters imply; errors name the layer and role.
  Status validate() const;
};

/// Caches for `m`'s Mamba and attention layers.
StatusOr<Caches> createCaches(const ModelDesc &m, const CacheConfig &c);

// ---------------------------------------------------------------------------
// Executor

enum class LogitsMode {
  AllTokens,            // [T, V], row t = token t of the step
  LastTokenPerSequence, // [spans, V], row i = last token of spans[i]
};

/// Router decisions of one MoE layer in one step.
struct LayerRoutes {
  int32_t layer = 0;
  RouterOutput routes;
};

struct StepOptions {
  LogitsMode logits = LogitsMode::AllTokens;
  /// Experts per token in MoE layers: empty = each layer's topK; one value =
  /// every token; T values = per token (1 <= ... <= layer's maximum).
  std::span<const int32_t> expertsPerToken;
  /// When set, receives every MoE layer's routing, in layer order.
  std::vector<LayerRoutes> *routes = nullptr;
  /// When set, receives the HF `output_hidden_states`: entry l < L is the
  /// input of layer l, entry L the final-normed output; each [T, H].
  std::vector<std::vector<float>> *hiddenStates = nullptr;
};

struct ExecutorOptions {
  Accum accum = Accum::F32; // dot products of linear layers
  /// OpenMP threads for a step; 0 = the OpenMP default (OMP_NUM_THREADS).
  /// Results do not depend on it.
  int numThreads = 0;
};

class Executor {
public:
  /// Validates the description; views must outlive the executor.
  static StatusOr<Executor> create(ModelDesc desc, ExecutorOptions opts = {});

  /// One step over the flattened tokens of several sequences. `spans` must
  /// cover [0, tokens.size()) exactly, with distinct live slots, count >= 1
  /// and startPos == caches.length(slot). Appends K/V (reserving pages),
  /// advances the recurrent state and lengths, and writes logits per
  /// opts.logits. On error nothing has been computed (pages reserved for
  /// the step may remain with their sequences).
  Status step(Caches &caches, std::span<const SeqSpan> spans,
              std::span<const int32_t> tokens, std::vector<float> &logits,
              const StepOptions &opts = {});

  const ModelDesc &desc() const { return desc_; }

private:
  Executor() = default;
  Status checkStep(Caches &caches, std::span<const SeqSpan> spans,
                   std::span<const int32_t> tokens,
                   const StepOptions &opts) const;
  void runStep(Caches &caches, std::span<const SeqSpan> spans,
               std::span<const int32_t> tokens, std::vector<float> &logits,
               const StepOptions &opts);
  void mamba(const MambaLayer &l, int32_t ordinal, Caches &caches,
             std::span<const SeqSpan> spans, const float *x, float *out);
  void attention(const AttentionLayer &l, int32_t ordinal, Caches &caches,
                 std::span<const SeqSpan> spans, const float *x, float *out);
  void moe(const MoeLayer &l, int32_t layerIndex,
           std::span<const int32_t> kPerToken, const float *x, int64_t T,
           float *out, const StepOptions &opts);

  ModelDesc desc_;
  ExecutorOptions opts_;
  std::vector<int32_t> ordinal_; // per layer: index among its kind's layers
  // Step scratch, reused across steps (an Executor runs one step at a time).
  std::vector<float> h_, x_, mix_, a_, b_, c_;
};

} // namespace nf::cpu
