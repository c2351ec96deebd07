// The CPU backend's engine class (CpuEngine) and its decoded programs
// (OpInfo, Program), shared by the files that define its methods:
// cpu_engine.cpp (load, steps), cpu_engine_check.cpp (load-time op checks),
// cpu_ops.cpp (op execution, dense/row and mixer ops) and cpu_ops_moe.cpp
// (MoE ops). What it shares with the CUDA engine is in
// engine/backend_engine.h. Internal to the CPU backend.
#pragma once

#include "backends/cpu/cpu_engine.h"
#include "engine/backend_engine.h"
#include "nf/plan_ops.h"

#include "backends/cpu/kernels.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace nf::engine::cpu_detail {

namespace fb = flatbuffers;
namespace pl = nf::plan;
using cpu::KvLayerShape;
using cpu::MambaShape;
using cpu::PagedKvLayer;
using cpu::SeqSpan;

// ---------------------------------------------------------------------------
// Decoded programs

using pl::OpCode;

enum class Act { Relu2, Silu };

struct OpInfo {
  OpCode code = OpCode::Unknown;
  std::string where; // "<plan>: prefill kernel 3 'name' op nf.linear"
  std::vector<int32_t> in, out;
  int32_t storage = -1; // Plan.storage index
  int32_t ordinal = -1; // index among the storages of its kind
  // Attributes (those the op uses).
  double eps = 0.0;
  int64_t groups = 1;
  std::vector<int64_t> sizes;
  Act act = Act::Relu2;
  float dtMin = 0.0f, dtMax = std::numeric_limits<float>::infinity();
  int64_t numHeads = 0;
  float scale = 1.0f;
  int64_t topK = 0, minK = 0, nGroup = 1, topkGroup = 1;
  bool normTopkProb = true;
  float routedScalingFactor = 1.0f;
  bool budgetPolicy = false;
  bool hasBias = false;
};

/// A step program: its values (plan_common.h) and its decoded ops.
struct Program : StepValues {
  std::vector<OpInfo> ops;
};

// ---------------------------------------------------------------------------
// Helpers shared by the op files (the same arithmetic as
// backends/cpu/kernels.cpp)

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

inline void activate(Act act, float *x, int64_t n) {
  if (act == Act::Relu2) {
    cpu::relu2InPlace(x, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    x[i] = silu(x[i]);
}

struct FreeDeleter {
  void operator()(uint8_t *p) const { std::free(p); }
};

// ---------------------------------------------------------------------------
// The engine

class CpuEngine final : public BackendEngine {
public:
  CpuEngine(std::unique_ptr<PlanFile> plan,
            std::unique_ptr<BoundWeights> weights)
      : plan_(std::move(plan)), weights_(std::move(weights)) {}

  Status init(const EngineOptions &options);

  StatusOr<int32_t> addSequence() override {
    return sequences_.add(info_.maxSequences);
  }
  // The state and pages live in caches_, which copies them.
  StatusOr<int32_t> forkSequence(int32_t sequence) override {
    return sequences_.fork(sequence);
  }
  CacheUsage cacheUsage() const override {
    return sequences_.usage(hasAttention_);
  }

private:
  // Load
  Status initStorage(const EngineOptions &options);
  Status compileProgram(const pl::Step *step, const char *phase, Program &prog);
  Status compileOp(Program &prog, const pl::Op &op, const std::string &where,
                   OpInfo &o);
  Status checkOp(const Program &prog, OpInfo &o, const pl::Op &op);

  // Step
  Status runStep(std::span<const SequenceInput> inputs, LogitsFor which,
                 std::vector<float> &logits, StepStats *stats,
                 TopLogits *top) override;
  void runProgram(Program &prog, std::span<const SequenceInput> inputs,
                  std::span<const Chunk> chunks, LogitsFor which,
                  std::span<const int64_t> tokenBase, float *logitsOut,
                  std::vector<int64_t> *expertCalls);
  void execOp(Program &prog, const OpInfo &o);

  // Value access during a run.
  float *f32(const Program &p, int32_t v) {
    return reinterpret_cast<float *>(arena_.get() + p.values[v].offset);
  }
  int32_t *i32(const Program &p, int32_t v) {
    return reinterpret_cast<int32_t *>(arena_.get() + p.values[v].offset);
  }
  const BoundWeight &weight(const Program &p, int32_t v) const {
    return weights_->weights[p.values[v].weight];
  }
  float *scratchF(size_t i, size_t n) {
    if (scratch_[i].size() < n)
      scratch_[i].resize(n);
    return scratch_[i].data();
  }

  // Ops with more than a kernel call.
  void opRouter(const Program &p, const OpInfo &o);
  void opSelect(const Program &p, const OpInfo &o);
  void opDispatch(const Program &p, const OpInfo &o);
  void opExperts(const Program &p, const OpInfo &o, bool up);
  void opCombine(const Program &p, const OpInfo &o);
  void opLmHead(const Program &p, const OpInfo &o);
  /// y = x · Wᵀ over a bound weight; a quantised one's input is quantised
  /// first, part by part (BoundWeight::input).
  void linearOf(const float *x, int64_t T, int64_t ldx, const BoundWeight &w,
                float *y, int64_t ldy);

  std::unique_ptr<PlanFile> plan_;
  std::unique_ptr<BoundWeights> weights_;
  int numThreads_ = 0;
  Program prefill_, decode_;
  std::vector<StorageInfo> storage_;
  bool hasAttention_ = false;
  int32_t maxExpertsOverride_ = 0; // largest expertsPerToken accepted
  bool budgetStepScope_ = false;   // EngineOptions::budgetStepScope
  double distinctExpertCap_ = 0.0; // EngineOptions::distinctExpertCap
  std::unique_ptr<uint8_t, FreeDeleter> arena_;
  int64_t arenaSize_ = 0;

  // State of the run in progress.
  struct Run {
    int64_t T = 0;
    std::vector<int32_t> tokens;
    std::vector<float> budget;
    std::vector<std::vector<int64_t>> *callsPerLayer = nullptr;
    std::vector<int32_t> rankedExperts; // select: [T, K] candidates by rank
    std::vector<double> rankedScores;
    std::vector<int32_t> kOverride; // per token, 0: the op's top_k
    std::vector<int32_t> tokenInput;
    std::vector<SeqSpan> spans;
    std::vector<std::span<const int32_t>> pageTables;
    std::vector<int64_t> needRows, outRows; // logits rows to produce
    float *logitsOut = nullptr;
    bool logitsDone = false;
    std::vector<int64_t> *expertCalls = nullptr;
  } run_;
  // f64 router scores of the run, by value index (generation-tagged).
  std::vector<std::vector<double>> f64Values_;
  std::vector<uint64_t> f64Gen_;
  uint64_t runGen_ = 0;
  std::vector<float> scratch_[4];
  std::vector<float> gateF32_;
};

} // namespace nf::engine::cpu_detail
