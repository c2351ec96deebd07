// nf::Engine: a loaded plan with its weights and state, executing steps.
//
// This is the internal C++ interface between the plan interpreter (backends)
// and the public APIs (include/nf/nf.h, nfrun). One Engine owns the mapped
// weights, the arena, the KV cache and the recurrent-state slots of one
// model; sequences are added and removed between steps (continuous batching).
// Not thread-safe: one step at a time.
#pragma once

#include "nf/status.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace nf {

/// The most CPU threads Engine::load accepts (EngineOptions::numThreads).
inline constexpr int kMaxThreads = 1024;

struct EngineOptions {
  /// Directory holding the safetensors files; empty: the plan's checkpoint.
  std::string weightsDir;
  /// CPU threads for one step; 0: OpenMP default. At most kMaxThreads.
  int numThreads = 0;
  /// Sequences that may be alive at once; 0: the plan's state slots. May
  /// exceed the plan's decode batch: larger decode steps run in several
  /// passes of the decode program.
  int32_t maxSequences = 0;
  /// KV pages per attention layer (page ids are shared by all layers; a
  /// sequence holds ceil(length / page size) of them); 0: the plan's
  /// default.
  int32_t kvPages = 0;
  /// CUDA: the fraction of device memory the engine may take; the KV pages
  /// fill what the weights, arena and recurrent state leave of it (kvPages
  /// must be 0). 0: kvPages or the plan's count.
  double gpuMemoryUtilization = 0.0;
  /// "auto": the CUDA backend when the plan carries binaries for this
  /// machine's GPU (a cubin for its sm_XX, else PTX to JIT), the CUDA driver
  /// (libcuda.so.1, loaded at run time) loads and a device exists; otherwise
  /// (or when the device then fails to take the plan: a module it cannot
  /// load, too little memory) the CPU backend, with one line on stderr
  /// saying why, "nf: CUDA unavailable (<reason>): using the CPU backend",
  /// when the plan was compiled for CUDA. "cpu": the CPU backend (it runs
  /// every plan: CUDA binaries are ignored). "cuda": the CUDA backend or an
  /// error.
  std::string backend = "auto";
  /// Seeded random weights of the plan's shapes instead of the checkpoint
  /// (benchmarks: bench/, nfrun bench --random-weights).
  bool syntheticWeights = false;
  uint64_t syntheticSeed = 0;
  /// CUDA: the driver library to load; empty: $NF_LIBCUDA, else
  /// "libcuda.so.1" (tests point it elsewhere).
  std::string cudaDriver;
  /// CUDA: the device ordinal; -1: $NF_CUDA_DEVICE, else 0.
  int cudaDevice = -1;
  /// CUDA: replay the decode program as a captured CUDA graph (false: launch
  /// its kernels one by one every step, e.g. to compare).
  bool cudaGraphs = true;
  /// Budget plans: pool the budget of every sequence of a step (step scope)
  /// instead of spending each sequence's on its own tokens (request scope,
  /// false: a sequence's results do not depend on its batch-mates).
  bool budgetStepScope = false;
  /// A cap on the distinct routed experts a MoE layer runs in one step: >= 1
  /// a number, in (0, 1) a fraction of those the step's candidates name; 0:
  /// none.
  double distinctExpertCap = 0.0;
};

/// Facts about the loaded model, from the plan.
struct ModelInfo {
  std::string name;
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  int64_t bosTokenId = -1;
  std::vector<int64_t> eosTokenIds;
  std::string layerKinds;       // "MEMEM*EM-EM*E"
  int64_t maxPrefillTokens = 0; // tokens per prefill step (arena size)
  int64_t maxDecodeTokens = 0;  // sequences per decode step
  int32_t maxSequences = 0;
  // Tokens a sequence may hold: KV pages * page size, or -1 (unlimited) for
  // attention-free models.
  int64_t maxContext = 0;
  // Memory a sequence holds as the backend stores it: its recurrent state
  // (every Mamba layer's), and one KV page of every attention layer (K and
  // V; 0 without attention).
  int64_t stateBytesPerSequence = 0;
  int64_t kvBytesPerPage = 0;
  int32_t topK = 0;         // the model's experts per token (0: no MoE)
  int32_t numMoeLayers = 0; // MoE layers, in layer order
  int32_t numExperts = 0;   // routed experts per MoE layer
  std::string expertPolicy; // "topk" or "budget"
  float defaultExpertBudget = 1.0f;
  std::string weightsDir;
  /// The backend running the plan: "cpu" or "cuda".
  std::string backend;
  /// What it runs on, e.g. "NVIDIA H200 (sm_90, 132 SMs, 140 GiB; driver
  /// 13.0); kernels: 94 cubin, 0 PTX JIT; decode graph"; "cpu" on the CPU.
  std::string device;
  /// Whether StepStats and expertUtilization() are reported (always on the
  /// CPU; on CUDA when the plan leaves the select results of every MoE layer
  /// in the arena, see backends/cuda/cuda_engine.h).
  bool expertStats = true;
  /// Length of the top-logits lists decode steps can return
  /// (LogitsFor::LastTokenTop); 0: none.
  int32_t topLogits = 0;
  /// Whether those lists can be ranked by a temperature sampler's noisy
  /// keys, and come with the rows' totals (TopLogits::noise; plans from
  /// format 1.7).
  bool topLogitsNoise = false;
  bool topLogitsTotals = false;
};

/// The tokens one sequence contributes to a step.
struct SequenceInput {
  int32_t sequence = 0;            // id returned by addSequence
  std::span<const int32_t> tokens; // appended at the sequence's current length
  /// Fraction of static top-k (1.0 = the model's k); finite, >= 0. Read by
  /// the "budget" policy (plans compiled with --expert-policy=budget; see
  /// docs/expert-budget.md); "topk" plans ignore it.
  float expertBudget = 1.0f;
  /// > 0: run exactly this many of the best experts, renormalised over them
  /// (static top-k override, evaluation); at most ModelInfo::topK.
  int32_t expertsPerToken = 0;
};

/// Which logits a step returns. None: the caller reads none (nf_decode with
/// a NULL buffer): the step still computes each sequence's last-token row
/// (a captured decode graph runs its LM head), but nothing is copied back.
/// LastTokenTop: each sequence's last-token row's largest logits (TopLogits)
/// where the backend ranks them itself (CUDA decode steps of plans whose
/// decode step carries top-logits launches); otherwise the rows, as
/// LastTokenPerSequence.
enum class LogitsFor { AllTokens, LastTokenPerSequence, None, LastTokenTop };

/// How a top list ranks a row: by the logits, or (keys) by the Gumbel-max
/// keys of one sampler draw, float(logit / temperature + G(seed, draw,
/// token)) (sampling/sampler.h, sampling/philox.h); and whether the row's
/// total, the sum of exp((x - max) / temperature), comes with it (total).
struct TopNoise {
  float temperature = 0.0f;
  uint64_t seed = 0, draw = 0;
  bool keys = false, total = false;
};

/// The largest logits of each sequence's last token (LogitsFor::LastTokenTop).
struct TopLogits {
  /// In: per input, how its list is ranked (empty: every list by the
  /// logits); a step with noise where the backend cannot rank by it returns
  /// rows (k = 0).
  std::vector<TopNoise> noise;
  /// Per sequence; 0: this step returned full rows (`logits`) instead.
  int32_t k = 0;
  /// [sequences][k], value descending then id ascending (by the noisy key
  /// where noise asked for it; values are the logits); ids are -1 past the
  /// row's tokens (NaN is never listed).
  std::vector<int32_t> ids;
  std::vector<float> values;
  /// Per sequence: the row's total where noise asked for it, else NaN.
  std::vector<double> totals;
};

/// Per-step observability (MoE).
struct StepStats {
  /// Expert calls per sequence (index as in the step's inputs): routed
  /// experts run, summed over the sequence's tokens and the MoE layers.
  std::vector<int64_t> expertCalls;
  /// The same per MoE layer: expertCallsPerLayer[input][moe layer].
  std::vector<std::vector<int64_t>> expertCallsPerLayer;
  /// Budget actually spent per sequence: expert calls over what static top-k
  /// (the model's k) would have run on the same tokens.
  std::vector<double> budgetSpent;
};

/// What the sequences hold of the engine's storage now: state slots and KV
/// pages (page ids are shared by every attention layer). A sequence of
/// length n holds ceil(n / kvPageSize) pages.
struct CacheUsage {
  int32_t sequences = 0;    // sequences alive (state slots in use)
  int32_t maxSequences = 0; // state slots
  int64_t kvPages = 0;      // pages of each attention layer; 0: no attention
  int64_t kvFreePages = 0;
  int32_t kvPageSize = 0; // tokens per page; 0: no attention
};

class Engine {
public:
  virtual ~Engine() = default;

  /// Loads `planPath` (flatbuffers verifier, version check) and maps and
  /// checks every weight (name, dtype, shape), on the backend that
  /// options.backend selects (CUDA: the weights are uploaded to the device).
  /// Errors name the file.
  static StatusOr<std::unique_ptr<Engine>> load(const std::string &planPath,
                                                const EngineOptions &options);

  virtual const ModelInfo &info() const = 0;

  /// A new empty sequence (fresh recurrent state, no KV pages). Ids are
  /// never reused within an Engine. Fails when all maxSequences slots are
  /// in use.
  virtual StatusOr<int32_t> addSequence() = 0;
  /// A new sequence that continues from `sequence` as it is now (it is
  /// unchanged): the same length, a copy of its recurrent state, and its
  /// K/V: full pages shared (neither sequence writes them again), the last,
  /// partly filled page copied. Stepping either then gives what stepping
  /// the original would. Fails like addSequence when no slot is free, or
  /// when no KV page is free for the copy; an unknown id is an error.
  virtual StatusOr<int32_t> forkSequence(int32_t sequence) = 0;
  /// Frees the sequence's state slot and KV pages (a page shared with a
  /// fork stays with it); an unknown id is an error.
  virtual Status removeSequence(int32_t sequence) = 0;
  /// Tokens the sequence holds (processed so far); -1 for an unknown id.
  virtual int64_t sequenceLength(int32_t sequence) const = 0;
  /// Slots and KV pages in use (a server's admission and preemption read
  /// it between steps).
  virtual CacheUsage cacheUsage() const = 0;
  /// KV pages that only the given sequences hold (shared pages of other
  /// sequences not counted): what removing them all would free.
  virtual int64_t exclusivePages(std::span<const int32_t> sequences) const = 0;

  /// Runs one step over the given sequences (each appears at most once,
  /// with at least one token). Uses the decode program when every sequence
  /// contributes exactly one token, else the prefill program; steps with
  /// more rows than the program's max tokens run in several passes (a
  /// sequence split across passes continues from its state). `logits`
  /// receives [rows, vocab] f32, rows = all tokens of the step in input
  /// order, or the last token of each sequence in input order. `stats`, when
  /// given, is overwritten. Errors (unknown or repeated sequence, no tokens,
  /// token id outside the vocabulary, expertsPerToken > topK, bad budget,
  /// context or KV pages exhausted) are detected before anything runs: the
  /// sequences are left unchanged. An empty step succeeds with no logits.
  /// With LogitsFor::LastTokenTop, `top` (required) receives the lists, or
  /// k = 0 and `logits` the rows.
  virtual Status step(std::span<const SequenceInput> inputs, LogitsFor which,
                      std::vector<float> &logits, StepStats *stats = nullptr,
                      TopLogits *top = nullptr) = 0;

  /// The full last-token row of input `input` of the last step, when that
  /// step returned top lists (a sampler whose list could not decide); valid
  /// until the next step.
  virtual Status lastTokenRow(size_t input, std::span<float> row) {
    (void)input;
    (void)row;
    return Status::error("the last step returned no top logits");
  }

  /// Per-process expert utilisation since load (or the last reset): tokens
  /// routed to each expert, [moe layer][expert].
  virtual const std::vector<std::vector<int64_t>> &
  expertUtilization() const = 0;
  virtual void resetExpertUtilization() = 0;
};

} // namespace nf
