// What the tests of nf::Engine's CUDA backend (runtime/src/backends/cuda)
// share; the tests themselves, all in the nf-cuda-tests binary:
//  - cuda_driver_test.cpp (CudaDriver, CudaBackend): the driver loader and
//    backend selection, on every machine;
//  - cuda_smoke_test.cpp (CudaSmoke): synthetic plans (cuda_smoke_plan.h)
//    on the GPU and on every machine through the fake driver
//    (fake_cuda_driver.cpp);
//  - cuda_fixture_test.cpp (CudaFixture; and Exactness, the exactness suite
//    of exactness_suite.h, instantiated there as Cuda/Exactness.*) and
//    cuda_plans_test.cpp (CudaBf16Plans, CudaPlans, CudaQuantisedPlans) and
//    cuda_kv_storage_test.cpp (CudaKvStoragePlans): plans compiled with
//    `nfc compile --target=cuda`, on a GPU only.
// Tests that need a device skip (GTEST_SKIP) without one, or fail with
// NF_CUDA_REQUIRE=1 (scripts/gpu_check.sh sets it).
//
// The GPU machine runs binaries built elsewhere, so paths come from the
// environment when set:
//   NF_CUDA_PLAN_DIR  plans compiled for CUDA (default: <build>/test/
//                     integration/plans/cuda)
//   NF_TEST_DATA_DIR  the source tree's test/data (fixtures: weights and
//                     references)
//   NF_EXAMPLES_DIR   the source tree's examples (pydoc-moe)
//   NF_CUDA_REQUIRE   1: no device, or a missing CUDA plan, is a failure
//   NF_FAKE_CUDA      the fake driver library (libnf_fake_cuda.so)
//   PTXAS             ptxas for the cubin smoke test (default: PATH, then
//                     /usr/local/cuda/bin/ptxas)
#pragma once

#include "engine/engine.h"

#include "ReferenceUtil.h"
#include "engine_test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace nf::test::gpu {

// ---------------------------------------------------------------------------
// Environment

/// $name when set and not empty, else `fallback`.
std::string envOr(const char *name, const std::string &fallback);
/// NF_CUDA_REQUIRE=1: what would skip fails.
bool requireGpu();

std::string dataDir();
std::string examplesDir();
/// A fixture's directory (weights, reference), or examples/pydoc-moe.
std::string modelDir(const std::string &name);
/// The fake driver (fake_cuda_driver.cpp).
std::string fakeDriver();
/// <NF_CUDA_PLAN_DIR>/<name>.nfb.
std::string cudaPlan(const std::string &name);

/// Why the CUDA backend cannot run here; empty when a device is usable.
std::string cudaUnavailable();
/// Device 0's architecture ("sm_90"), or empty without one.
std::string deviceArch();

// ---------------------------------------------------------------------------
// Plans compiled for CUDA from the fixtures

constexpr double kCudaTol = 1e-3;  // * max(1, max |ref|)
constexpr double kBatchTol = 1e-5; // batched vs one at a time, relative

/// More than 16 sequences decode through the "wide" variants of the decode
/// linears (their own decode graph bucket); each sequence's logits must match
/// its one-at-a-time decode on `single`, which ran the "narrow" variants, to
/// rounding. Returns the largest relative difference (or -1: skipped).
double wideDecodeDifference(Engine &single, const std::string &plan,
                            const std::string &modelDir,
                            const std::vector<ref::Prompt> &prompts);

/// A CUDA engine and a CPU engine of one plan stepping the same sequences,
/// each sequence's next tokens the CPU's greedy choice, with every step's
/// last-token logits compared (the quantised and KV-storage plans' tests).
/// Failures are recorded (ADD_FAILURE) and make the calls return false.
class TwinSteps {
public:
  TwinSteps(Engine &gpu, Engine &cpu);
  /// Sequences on both engines, input i starting with prompts[i].
  bool add(const std::vector<std::vector<int32_t>> &prompts);
  /// One step of every sequence (input i: tokens()[i], or `inputs` when
  /// given); rows(i) is then sequence i's relative difference of the two
  /// engines' logits, and tokens()[i] the CPU's greedy choice.
  bool step(const std::vector<std::vector<int32_t>> *inputs = nullptr);
  const std::vector<double> &rows() const { return rows_; }
  /// Removes every sequence from both engines.
  bool clear();

private:
  Engine &gpu_, &cpu_;
  std::vector<int32_t> gs_, cs_;
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<double> rows_;
};

} // namespace nf::test::gpu

/// Skips (or fails, with NF_CUDA_REQUIRE=1) a test without a CUDA device.
#define NF_REQUIRE_GPU()                                                       \
  do {                                                                         \
    const std::string why_ = ::nf::test::gpu::cudaUnavailable();               \
    if (!why_.empty()) {                                                       \
      if (::nf::test::gpu::requireGpu())                                       \
        FAIL() << "NF_CUDA_REQUIRE=1 but CUDA is unavailable: " << why_;       \
      GTEST_SKIP() << "no CUDA device: " << why_;                              \
    }                                                                          \
  } while (0)

/// Skips (or fails, with NF_CUDA_REQUIRE=1) a test whose CUDA plan is
/// missing.
#define NF_REQUIRE_PLAN(path)                                                  \
  do {                                                                         \
    if (!std::filesystem::exists(path)) {                                      \
      if (::nf::test::gpu::requireGpu())                                       \
        FAIL() << "missing CUDA plan " << (path)                               \
               << " (see scripts/gpu_check.sh prepare)";                       \
      GTEST_SKIP() << "no CUDA plan " << (path)                                \
                   << " (compile with nfc compile --target=cuda)";             \
    }                                                                          \
  } while (0)
