// The CUDA backend's engine class (CudaEngine) and what the files that define
// its methods share: plan helpers, a step program as loaded (LaunchInfo,
// StatCopy, TopLaunches, Program), the layout of the step arguments
// (ArgsLayout) and the device objects (Gpu). The methods are defined in
// cuda_engine.cpp (probe, init, sequences), cuda_load.cpp (programs,
// modules, launches, device buffers, weights upload, tensor maps) and
// cuda_step.cpp (enqueue, decode graphs, steps and runs: arguments, logits,
// top logits, expert statistics). What it shares with the CPU engine
// (sequences, statistics) is in engine/backend_engine.h. Internal to the CUDA
// backend.
#pragma once

#include "backends/cuda/cuda_engine.h"
#include "engine/backend_engine.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace nf::engine::cuda_detail {

namespace fb = flatbuffers;
namespace pl = nf::plan;
using namespace nf::cuda;

// ---------------------------------------------------------------------------
// Plan helpers

constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

inline const pl::Step *stepOf(const pl::Plan &plan, int i) {
  return i == 0 ? plan.prefill() : plan.decode();
}
inline const char *phaseOf(int i) { return i == 0 ? "prefill" : "decode"; }

inline std::string kernelWhere(const PlanFile &pf, int phase, fb::uoffset_t k,
                               const pl::Kernel &kernel) {
  return pf.path + ": " + phaseOf(phase) + " kernel " + std::to_string(k) +
         " '" + (kernel.name() ? kernel.name()->str() : "") + "'";
}

// ---------------------------------------------------------------------------
// The engine

struct LaunchInfo {
  CUfunction fn = nullptr;
  unsigned grid = 0, block = 0, shared = 0;
  bool cooperative = false;
  bool programmatic = false; // may start while its predecessor runs (PDL)
  int64_t minTokens = 0, maxTokens = 0; // runs for steps in range (0: open)
  bool runsFor(int64_t rows) const {
    return rows >= minTokens && (maxTokens == 0 || rows <= maxTokens);
  }
  std::string where;
  std::string profileKey; // "<phase> <kernel name>: <function sans k#_op#_>"
};

/// The select results of one MoE layer, copied aside after the kernel that
/// computes them.
struct StatCopy {
  size_t afterLaunch = 0; // launches that run before the copy
  int32_t layer = 0;      // MoE layer (select ordinal)
  int32_t k = 0;          // experts per token (columns of `experts`)
  int64_t countsOffset = 0, expertsOffset = 0; // arena byte offsets
};

/// A decode step's top-logits launches (Plan Step.top_logits), run after
/// the step when the caller asks for each row's largest logits.
/// sizeof(nf::top_logit_noise): {u64 seed, u64 draw, f32 temperature, u32}.
inline constexpr int64_t kTopNoiseBytes = 24;

struct TopLaunches {
  int32_t k = 0; // 0: none
  int64_t idsOffset = 0, valuesOffset = 0;
  /// [rows] of nf::top_logit_noise (kernels/nf_sample.cuh); -1: plans
  /// before 1.6, whose lists rank by the logits only.
  int64_t noiseOffset = -1;
  int64_t totalsOffset = -1; // [rows] f64; -1: no totals
  std::vector<LaunchInfo> launches;
};

struct Program : StepValues {
  std::vector<LaunchInfo> launches;
  std::vector<StatCopy> copies; // by afterLaunch
  bool statsAvailable = true;
  /// Plans 1.8: the arena region the kernels write the statistics to
  /// (Step.expert_stats_offset; -1: copies after each kernel), its layout:
  /// counts [layers][rows], then experts [layers][rows * maxK].
  int64_t statsOffset = -1, statsRows = 0, statsMaxK = 0, statsLayers = 0;
  TopLaunches top;
};

/// Byte offsets of the per-run arrays in the step-argument buffers (the
/// same in pinned host staging and in device memory).
struct ArgsLayout {
  size_t tokens = 0, budget = 0, seqs = 0, tokenSeq = 0, logitRows = 0,
         moves = 0,       // a tiered KV cache's page moves (Caches::compress)
      pages = 0, end = 0; // pages last: a run uploads [0, pages + used)
  int64_t maxRows = 0, maxSeqs = 0, maxPages = 0;
};

struct Gpu {
  Stream stream;
  std::vector<Module> modules;
  std::vector<std::string> moduleWhere; // the first kernel of each module
  DeviceBuffer arena;
  DeviceBuffer weights;                // every weight, 256-byte aligned
  std::vector<CUdeviceptr> weightAddr; // per weight: its address and bytes
  std::vector<size_t> weightBytes;
  size_t arenaBytes = 0;
  DeviceBuffer weightPtrs;           // const void *[num weights]
  std::vector<DeviceBuffer> storage; // per Plan.storage entry: two buffers
  DeviceBuffer storagePtrs;          // void *[2 * num storage]
  DeviceBuffer args;                 // nf_step_args + per-run arrays
  PinnedBuffer staging;              // its host image
  DeviceBuffer stats;                // select results, [layer] counts, experts
  PinnedBuffer statsHost;
  PinnedBuffer topHost; // a decode step's top-logits lists
  /// Decode graphs, one per bucket of token counts (launches with token
  /// ranges differ between buckets): graph i serves steps of up to
  /// decodeBuckets[i] tokens.
  std::vector<int64_t> decodeBuckets;
  std::vector<Graph> decodeGraphs;
  std::vector<GraphExec> decodeExecs;
  Event profileStart, profileEnd; // NF_CUDA_PROFILE with CUDA events
};

class CudaEngine final : public BackendEngine {
public:
  CudaEngine(std::unique_ptr<PlanFile> plan,
             std::unique_ptr<BoundWeights> weights,
             std::unique_ptr<CudaProbe> probe)
      : plan_(std::move(plan)), weights_(std::move(weights)),
        probe_(std::move(probe)), d_(probe_->driver) {}
  ~CudaEngine() override {
    printProfile();
    if (gpu_ && ctx_.get()) {
      ContextScope scope(*d_, ctx_.get());
      if (gpu_->stream)
        (void)d_->cuStreamSynchronize(gpu_->stream.get());
      gpu_.reset();
    }
  }

  Status init(const EngineOptions &options);

  /// NF_CUDA_PROFILE=1: graphs are not used, every launch is timed on its
  /// own (GPU time between two CUDA events; host time around a synchronize
  /// where the driver has no events) and the time per kernel is printed to
  /// stderr when the engine goes away. Launches run one at a time, so the
  /// sum is more than a step takes; for finding hot kernels, not a
  /// measurement.
  void printProfile() const {
    if (profile_.empty())
      return;
    std::vector<std::pair<double, std::string>> rows;
    double total = 0.0;
    for (const auto &[name, t] : profile_) {
      rows.push_back({t.first, name});
      total += t.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "nf: CUDA profile (%s, %.1f ms):\n",
                 profileEvents_ ? "GPU time of each launch, CUDA events"
                                : "host-timed launches",
                 total * 1e3);
    for (size_t i = 0; i < rows.size() && i < 80; ++i)
      std::fprintf(stderr, "  %8.2f ms %5.1f%%  %6lld x  %s\n",
                   rows[i].first * 1e3, 100.0 * rows[i].first / total,
                   static_cast<long long>(profile_.at(rows[i].second).second),
                   rows[i].second.c_str());
  }

  StatusOr<int32_t> addSequence() override;
  StatusOr<int32_t> forkSequence(int32_t sequence) override;
  Status clearState(int32_t slot);
  /// A fork's device side: slot `from`'s state into the fork's slot, and
  /// the partly filled KV page it copies.
  Status copyForFork(const cpu::Caches::Fork &fork, int32_t from);
  CacheUsage cacheUsage() const override {
    return sequences_.usage(storage_.hasAttention);
  }
  Status lastTokenRow(size_t input, std::span<float> row) override;

private:
  Status readPrograms();
  Status loadKernels();
  StatusOr<LaunchInfo> loadLaunch(const pl::Launch &l, CUmodule module,
                                  std::string where,
                                  const std::string &profileKind);
  Status allocate();
  Status sizeKvCache();
  Status createBookkeeping();
  Status uploadWeights();
  Status bindTensorMaps();
  /// A device array of `ptrs` (room for one at least), copied on the stream:
  /// the weight and state tables; the caller syncs before `ptrs` goes.
  Status uploadTable(const std::vector<CUdeviceptr> &ptrs, DeviceBuffer &out,
                     const char *what);
  /// Waits for the engine's stream (host sources of copies must outlive
  /// them); a failure reads "<context>: <driver message>".
  Status syncStream(const std::string &context) const {
    Status s = d_->check(d_->cuStreamSynchronize(gpu_->stream.get()),
                         "cuStreamSynchronize");
    return s ? s : Status::error(context + ": " + s.message());
  }
  Status captureDecode();
  Status runStep(std::span<const SequenceInput> inputs, LogitsFor which,
                 std::vector<float> &logits, StepStats *stats,
                 TopLogits *top) override;
  /// "graph", or "graphs for <= 16 | <= 64 tokens".
  std::string decodeGraphs() const {
    const std::vector<int64_t> &b = gpu_->decodeBuckets;
    if (b.size() <= 1)
      return "graph";
    std::string s = "graphs for";
    for (size_t i = 0; i < b.size(); ++i)
      s += (i ? " | <= " : " <= ") + std::to_string(b[i]);
    return s + " tokens";
  }
  Status enqueue(const Program &p, int64_t rows);
  Status runProgram(const Program &p, std::span<const SequenceInput> inputs,
                    std::span<const Chunk> chunks, LogitsFor which,
                    std::span<const int64_t> tokenBase, float *logitsOut,
                    StepStats *stats, int32_t expertsPerToken, TopLogits *top);
  std::string where() const { return plan_->path + ": CUDA"; }

  std::unique_ptr<PlanFile> plan_;
  std::unique_ptr<BoundWeights> weights_; // released after the upload
  const bool profiling_ = [] {
    const char *e = std::getenv("NF_CUDA_PROFILE");
    return e && *e && *e != '0';
  }();
  /// NF_CUDA_TRACE: each launch of an uncaptured program is written to
  /// stderr before it starts and waited for, so a kernel that never
  /// finishes is the last line (diagnostics of hangs).
  const bool tracing_ = [] {
    const char *e = std::getenv("NF_CUDA_TRACE");
    return e && *e && *e != '0';
  }();
  bool capturing_ = false;
  std::map<std::string, std::pair<double, int64_t>> profile_; // where -> (s, n)
  bool profileEvents_ = false;
  bool usePdl_ = false;
  std::unique_ptr<CudaProbe> probe_;
  const Driver *d_;
  StorageLayout storage_;
  /// The arena row of each input's last token in the last step, when that
  /// step returned top lists (lastTokenRow); empty otherwise.
  std::vector<int64_t> lastTopRows_;
  Program programs_[2]; // prefill, decode
  Program &prefill_ = programs_[0];
  Program &decode_ = programs_[1];
  ArgsLayout layout_;
  int32_t maxExpertsOverride_ = 0;
  // nf_step_args' expert selection (EngineOptions: budget scope "step",
  // distinct-expert cap); checked against the plan by stepWideSelection.
  int32_t budgetPooled_ = 0;
  double distinctExpertCap_ = 0.0;
  double gpuMemoryUtilization_ = 0.0; // EngineOptions'
  /// The most KV pages one sequence holds (1M tokens of 16-token pages):
  /// the step arguments' page-table rows (device and pinned host memory,
  /// a row per sequence of a step) are this long at most, whatever the
  /// page count.
  static constexpr int64_t kMaxSequencePages = 65536;
  int32_t maxK_ = 0; // largest k of any select (stats buffer columns)
  // Device objects: the context first, so that it is released last.
  Context ctx_;
  std::unique_ptr<Gpu> gpu_;
  std::vector<int32_t> tokenInput_; // per row of the run in progress
  std::vector<int32_t> kvMoves_;    // the run's tiered-cache page moves
};

} // namespace nf::engine::cuda_detail
