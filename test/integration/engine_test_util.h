// Helpers shared by the nf::Engine integration tests (plan_engine_test.cpp
// on the CPU backend, the cuda_*_test.cpp files on the CUDA backend,
// exactness_suite.cpp on both): test engine options and loading,
// one-sequence steps, logits comparisons, each reference prompt run alone,
// and test names from string parameters. The reference data itself
// (RefFile, Prompt, relError, argmax) is ReferenceUtil.h's.
#pragma once

#include "engine/engine.h"

#include "ReferenceUtil.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace nf::test::integration {

/// Tests run on one thread (results do not depend on the thread count) with
/// a small KV cache; `backend` and `weightsDir` as EngineOptions takes them
/// (the defaults are EngineOptions').
EngineOptions testOptions(const std::string &backend = "auto",
                          const std::string &weightsDir = "");

/// The engine of `plan`, or nullptr after a test failure saying why.
std::unique_ptr<Engine> loadEngine(const std::string &plan,
                                   const EngineOptions &o = testOptions());

/// One step of one sequence.
Status stepOne(Engine &e, int32_t seq, std::span<const int32_t> tokens,
               LogitsFor which, std::vector<float> &logits,
               StepStats *stats = nullptr, int32_t expertsPerToken = 0);

/// max |a - b| over n elements.
double maxAbsDiff(const float *a, const float *b, size_t n);

/// Per prompt: prefill logits [T, V] then one row per greedy step.
struct SingleRun {
  std::vector<float> prefill;
  std::vector<std::vector<float>> decode;
};

/// The tokens runOneAtATime feeds its decode steps.
enum class Feed {
  Argmax,    // each step's own greedy token (the argmax of its last logits)
  Reference, // the reference's greedy tokens
};

/// Each prompt alone: prefill, then as many decode steps as the prompt has
/// greedy tokens, one at a time.
std::vector<SingleRun> runOneAtATime(Engine &e,
                                     const std::vector<ref::Prompt> &prompts,
                                     Feed feed = Feed::Argmax);

/// A string test parameter as a test name suffix: "tiny-hybrid" ->
/// "tiny_hybrid" (INSTANTIATE_TEST_SUITE_P's name generator).
struct ParamName {
  template <class T>
  std::string operator()(const ::testing::TestParamInfo<T> &info) const {
    std::string n = info.param;
    std::replace(n.begin(), n.end(), '-', '_');
    return n;
  }
};

} // namespace nf::test::integration
