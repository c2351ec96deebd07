// The CPU reference executor: a Nemotron-H model described by plain structs
// (ModelDesc, views of mapped weights) run one continuous-batching step at a
// time over per-slot recurrent state and a paged KV cache.
//
// Usage:
//   Executor ex = *Executor::create(desc);
//   Caches caches = *Caches::create(desc, {.numSlots = 8, .numPages = 256,
//                                          .pageSize = 16});
//   int32_t a = *caches.addSequence();
//   SeqSpan span{.begin = 0, .count = n, .startPos = 0, .slot = a};
//   ex.step(caches, {&span, 1}, tokens, logits);    // prefill
//   ... then one token per step at startPos = caches.length(a) ...
//   caches.removeSequence(a);
#pragma once

#include "cpu/kernels.h"
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

/// Splits a stacked [E, ...] expert tensor into E per-expert views.
std::vector<WeightView> splitExperts(const WeightView &stacked);

// ---------------------------------------------------------------------------
// Caches

/// Recurrent state of every Mamba layer, per slot: conv [CD, K-1] and ssm
/// [nh, P, N], f32.
class StateCache {
public:
  static StatusOr<StateCache> create(const ModelDesc &m, int32_t numSlots);
  /// One state per entry of `mambaLayers` (e.g. from a plan's Storage table).
  static StatusOr<StateCache> create(std::span<const MambaShape> mambaLayers,
                                     int32_t numSlots);
  StateCache() = default;

  /// The lowest free slot, its state zeroed.
  StatusOr<int32_t> allocateSlot();
  Status freeSlot(int32_t slot);
  bool isLive(int32_t slot) const;
  int32_t numSlots() const { return static_cast<int32_t>(live_.size()); }
  int32_t numFree() const;

  int32_t numMambaLayers() const {
    return static_cast<int32_t>(shapes_.size());
  }
  float *conv(int32_t mambaLayer, int32_t slot);
  float *ssm(int32_t mambaLayer, int32_t slot);

private:
  std::vector<MambaShape> shapes_;
  std::vector<std::vector<float>> conv_, ssm_; // per Mamba layer
  std::vector<bool> live_;
};

/// K/V row layout of one attention layer's cache.
struct KvLayerShape {
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
};

/// Paged K/V storage of every attention layer and its page allocator.
class KvCache {
public:
  static StatusOr<KvCache> create(const ModelDesc &m, int32_t numPages,
                                  int32_t pageSize);
  /// One layer per entry of `attentionLayers`, all sharing the page ids.
  static StatusOr<KvCache> create(std::span<const KvLayerShape> attentionLayers,
                                  int32_t numPages, int32_t pageSize);
  KvCache() = default;

  /// The lowest free page.
  StatusOr<int32_t> allocatePage();
  Status freePage(int32_t page);
  int32_t numPages() const { return static_cast<int32_t>(used_.size()); }
  int32_t numFreePages() const;
  int32_t pageSize() const { return pageSize_; }

  /// Grows `pageTable` with fresh pages until positions [0, numTokens) are
  /// covered; on failure the table keeps the pages it got.
  Status reserve(std::vector<int32_t> &pageTable, int64_t numTokens);
  /// Frees every page of `pageTable` and clears it.
  void release(std::vector<int32_t> &pageTable);

  int32_t numAttentionLayers() const {
    return static_cast<int32_t>(layers_.size());
  }
  PagedKvLayer layer(int32_t attentionLayer);

private:
  struct Storage {
    int64_t numKvHeads = 0, headDim = 0;
    std::vector<float> k, v;
  };
  std::vector<Storage> layers_;
  std::vector<bool> used_;
  int32_t numUsed_ = 0; // pages in use (a server reads the count per step)
  int32_t pageSize_ = 0;
};

struct CacheConfig {
  int32_t numSlots = 8;  // concurrent sequences
  int32_t numPages = 64; // KV pages shared by all sequences
  int32_t pageSize = 16; // positions per page
};

/// Both caches plus per-sequence bookkeeping (page table, length), keyed by
/// slot. Sequences join and leave between steps.
class Caches {
public:
  static StatusOr<Caches> create(const ModelDesc &m, const CacheConfig &c);
  /// Caches for explicit layer shapes (a plan's Storage table) rather than a
  /// ModelDesc.
  static StatusOr<Caches> create(std::span<const MambaShape> mambaLayers,
                                 std::span<const KvLayerShape> attentionLayers,
                                 const CacheConfig &c);
  Caches() = default;

  /// A new, empty sequence: a slot with zeroed state and no pages.
  StatusOr<int32_t> addSequence();
  /// Frees the sequence's slot and pages.
  Status removeSequence(int32_t slot);
  bool isLive(int32_t slot) const { return state_.isLive(slot); }
  /// Tokens of the sequence processed so far (the next step's startPos).
  int64_t length(int32_t slot) const;
  const std::vector<int32_t> &pageTable(int32_t slot) const;
  /// Pages for positions [0, numTokens) of the sequence.
  Status reserve(int32_t slot, int64_t numTokens);
  /// Pages that reserve(slot, numTokens) would still have to allocate.
  int64_t pagesNeeded(int32_t slot, int64_t numTokens) const;
  /// Records that `count` more tokens of the sequence were processed (for
  /// executors other than Executor, which advances lengths itself).
  Status advance(int32_t slot, int64_t count);

  StateCache &state() { return state_; }
  KvCache &kv() { return kv_; }
  const StateCache &state() const { return state_; }
  const KvCache &kv() const { return kv_; }

private:
  friend class Executor;
  StateCache state_;
  KvCache kv_;
  std::vector<std::vector<int32_t>> pageTables_; // per slot
  std::vector<int64_t> lengths_;                 // per slot
};

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
