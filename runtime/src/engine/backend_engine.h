// What the CPU and CUDA engines keep alike of nf::Engine, so that it is
// written once: the model facts, the sequence table over a cpu::Caches, the
// expert utilization, the Engine methods that only read them, step()'s error
// handling and statistics, and the factory that builds and initialises an
// engine. Internal.
#pragma once

#include "engine/plan_common.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <new>
#include <utility>

namespace nf::engine {

class BackendEngine : public Engine {
public:
  const ModelInfo &info() const override { return info_; }
  Status removeSequence(int32_t sequence) override {
    return sequences_.remove(sequence);
  }
  int64_t sequenceLength(int32_t sequence) const override {
    return sequences_.length(sequence);
  }
  int64_t exclusivePages(std::span<const int32_t> sequences) const override {
    return sequences_.exclusivePages(sequences);
  }
  const std::vector<std::vector<int64_t>> &expertUtilization() const override {
    return utilization_;
  }
  void resetExpertUtilization() override {
    for (auto &layer : utilization_)
      std::fill(layer.begin(), layer.end(), 0);
  }
  /// runStep, with exceptions (both backends allocate per step) turned into
  /// errors, and each input's budgetSpent once its expert calls are counted.
  Status step(std::span<const SequenceInput> inputs, LogitsFor which,
              std::vector<float> &logits, StepStats *stats,
              TopLogits *top) final {
    try {
      Status s = runStep(inputs, which, logits, stats, top);
      if (s && stats)
        setBudgetSpent(*stats, inputs);
      return s;
    } catch (const std::bad_alloc &) {
      return Status::error("step: out of memory");
    } catch (const std::exception &e) {
      return Status::error(std::string("step: ") + e.what());
    }
  }

protected:
  /// The backend's Engine::step; resetStats sizes `stats` when given.
  virtual Status runStep(std::span<const SequenceInput> inputs, LogitsFor which,
                         std::vector<float> &logits, StepStats *stats,
                         TopLogits *top) = 0;
  /// Zeroed statistics for a step of `n` inputs.
  void resetStats(StepStats &stats, size_t n) const {
    stats.expertCalls.assign(n, 0);
    stats.expertCallsPerLayer.assign(
        n, std::vector<int64_t>(static_cast<size_t>(info_.numMoeLayers), 0));
    stats.budgetSpent.assign(n, 0.0);
  }

  ModelInfo info_;
  /// Slots, lengths and KV page tables (the CPU engine's state too; the CUDA
  /// engine's state lives on the device).
  cpu::Caches caches_;
  SequenceTable sequences_{caches_}; // sequence id -> slot of caches_
  std::vector<std::vector<int64_t>> utilization_; // [moe layer][expert]

private:
  /// StepStats::budgetSpent: expert calls over what static top-k would run.
  void setBudgetSpent(StepStats &stats,
                      std::span<const SequenceInput> inputs) const {
    if (info_.numMoeLayers <= 0 || info_.topK <= 0)
      return;
    for (size_t i = 0; i < inputs.size(); ++i)
      stats.budgetSpent[i] =
          static_cast<double>(stats.expertCalls[i]) /
          (static_cast<double>(info_.topK) * info_.numMoeLayers *
           static_cast<double>(inputs[i].tokens.size()));
  }
};

/// A new engine E(args...) after E::init(options) (createCpuEngine,
/// createCudaEngine).
template <class E, class... Args>
StatusOr<std::unique_ptr<Engine>> createEngine(const EngineOptions &options,
                                               Args &&...args) {
  try {
    auto engine = std::make_unique<E>(std::forward<Args>(args)...);
    if (Status s = engine->init(options); !s)
      return s;
    return std::unique_ptr<Engine>(std::move(engine));
  } catch (const std::bad_alloc &) {
    return Status::error("engine: out of memory loading the plan");
  }
}

} // namespace nf::engine
