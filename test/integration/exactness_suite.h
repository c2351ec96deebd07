// The exactness suite: one parameterised suite (Exactness) over backends x
// fixtures. Every fixture's plan, loaded by nf::Engine on a backend, gives
// prefill and greedy-decode logits within the backend's tolerance of the
// Hugging Face float64 references and the same greedy tokens; and all
// prompts batched in one prefill step, then decoded in lockstep, give what
// each prompt gives alone (within the backend's batch tolerance).
//
// The test bodies are written once (exactness_suite.cpp, linked into both
// binaries); each backend's binary instantiates the suite with its
// ExactnessBackend: the CPU backend in nf-plan-tests (plan_engine_test.cpp,
// "Cpu/Exactness.*": every machine, under ctest), the CUDA backend in
// nf-cuda-tests (cuda_fixture_test.cpp, "Cuda/Exactness.*": skipped without
// a GPU, failing with NF_CUDA_REQUIRE=1, run by scripts/gpu_check.sh).
#pragma once

#include "engine/engine.h"

#include "ReferenceUtil.h"
#include "engine_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace nf::test::integration {

/// What one backend brings to the exactness suite.
struct ExactnessBackend {
  /// EngineInfo::backend of the engines it loads ("cpu", "cuda").
  std::string name;
  /// Prefix of the summary lines the tests print ("[ plan ]", "[ cuda ]").
  std::string tag;
  /// A fixture's plan, the options to load it with, and the directory of
  /// its reference.safetensors.
  std::function<std::string(const std::string &fixture)> plan;
  std::function<EngineOptions(const std::string &fixture)> options;
  std::function<std::string(const std::string &fixture)> modelDir;
  /// Called first in SetUp with the plan (may be empty): skips (GTEST_SKIP)
  /// or fails (FAIL) a case this machine cannot run; SetUp then stops.
  std::function<void(const std::string &plan)> require;
  /// Logits against the reference: relError <= refTol.
  double refTol = 0;
  /// How batched logits are compared with one sequence at a time.
  enum class BatchMetric {
    MaxAbs,   // max |batched - single| (maxAbsDiff)
    Relative, // relError(batched, single)
  };
  BatchMetric batchMetric = BatchMetric::MaxAbs;
  /// The largest batched-vs-single difference allowed (0: bit-identical).
  double batchTol = 0;
  /// The tokens fed to the decode steps of the batched test (and of its
  /// one-at-a-time runs): Argmax, each step's own greedy token, which must
  /// be the reference's; Reference, the reference's greedy tokens.
  Feed feed = Feed::Argmax;
};

/// One case of the suite: a backend and a fixture.
struct ExactnessCase {
  const ExactnessBackend *backend = nullptr;
  std::string fixture;
  /// The reference may lack greedy logits (pydoc-moe's has greedy tokens
  /// only): decode logits are then not compared. Otherwise their absence is
  /// a failure.
  bool greedyLogitsOptional = false;
};

void PrintTo(const ExactnessCase &c, std::ostream *os);

/// The test/data/fixtures every backend runs.
const std::vector<std::string> &exactnessFixtures();

/// The cases of `backend` over `fixtures` ("pydoc-moe": greedy logits
/// optional).
std::vector<ExactnessCase>
exactnessCases(const ExactnessBackend &backend,
               const std::vector<std::string> &fixtures);

/// The fixture as a test name suffix: "tiny-hybrid" -> "tiny_hybrid".
struct ExactnessName {
  std::string
  operator()(const ::testing::TestParamInfo<ExactnessCase> &info) const {
    std::string n = info.param.fixture;
    std::replace(n.begin(), n.end(), '-', '_');
    return n;
  }
};

/// The fixture's engine on the backend, its reference prompts and its
/// vocabulary size.
class Exactness : public ::testing::TestWithParam<ExactnessCase> {
protected:
  void SetUp() override;

  const ExactnessBackend &backend() const { return *GetParam().backend; }
  const std::string &fixture() const { return GetParam().fixture; }
  /// max difference of n logits, batched vs one at a time, by the backend's
  /// metric.
  double batchDiff(const float *batched, const float *single, size_t n) const;

  std::string plan_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ref::RefFile> ref_;
  std::vector<ref::Prompt> prompts_;
  int64_t V_ = 0;
};

} // namespace nf::test::integration
