// nf::Engine's CUDA backend without a GPU (CI): the driver loader against
// a missing library, a library that is not a driver and the toolkit's stub
// driver (CudaDriver); backend selection (EngineOptions::backend,
// nf_model_params.backend; CudaBackend): CPU plans run on the CPU silently,
// CUDA plans fall back to the CPU with one line on stderr under "auto" and
// fail under "cuda", and run on the fake driver (fake_cuda_driver.cpp)
// through the C API. See cuda_test_util.h for the environment.
#include "backends/cuda/driver.h"
#include "engine/engine.h"
#include "nf/nf.h"

#include "TestUtil.h"
#include "cuda_smoke_plan.h"
#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace nf;
using namespace nf::test::integration;
using namespace nf::test::gpu;
namespace fs = std::filesystem;

TEST(CudaDriver, MissingLibraryIsAnError) {
  StatusOr<const cuda::Driver *> d =
      cuda::loadDriver("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.message().find("cannot load /nonexistent/libcuda.so.1"),
            std::string::npos)
      << d.message();
  // The failure is remembered, message and all.
  StatusOr<const cuda::Driver *> again =
      cuda::loadDriver("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.message(), d.message());
}

TEST(CudaDriver, LibraryWithoutTheEntryPoints) {
  StatusOr<const cuda::Driver *> d = cuda::loadDriver("libm.so.6");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.message().find("libm.so.6: no entry point cuGetErrorName"),
            std::string::npos)
      << d.message();
}

TEST(CudaDriver, StubDriverFailsToInitialise) {
  // The toolkit's link stub exports every entry point and fails them all.
  // Its soname is libcuda.so.1: once loaded, it would answer every later
  // dlopen("libcuda.so.1") of this process, so only where there is no
  // driver to find (the real one is loaded first where there is).
  if (StatusOr<const cuda::Driver *> real = cuda::loadDriver();
      real.ok() || real.message().rfind("cannot load", 0) != 0)
    GTEST_SKIP() << "a CUDA driver is installed here";
  std::string stub;
  for (const char *p : {"/usr/local/cuda/lib64/stubs/libcuda.so",
                        "/usr/local/cuda/targets/x86_64-linux/lib/stubs/"
                        "libcuda.so"})
    if (fs::exists(p))
      stub = p;
  if (stub.empty())
    GTEST_SKIP() << "no CUDA stub driver here";
  StatusOr<const cuda::Driver *> d = cuda::loadDriver(stub);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.message().rfind("cuInit: ", 0), 0u) << d.message();
  std::cout << "[ cuda ] stub driver: " << d.message() << "\n";
}

TEST(CudaDriver, DefaultLibraryName) {
  EXPECT_EQ(cuda::driverLibrary("/x/libcuda.so"), "/x/libcuda.so");
  if (!std::getenv("NF_LIBCUDA")) {
    EXPECT_EQ(cuda::driverLibrary(), "libcuda.so.1");
  }
}

SmokeSpec cpuTarget() {
  SmokeSpec s;
  s.target = "cpu";
  s.ptx = false;
  return s;
}

TEST(CudaBackend, UnknownBackendIsAnError) {
  test::TempDir dir;
  StatusOr<std::unique_ptr<Engine>> e = Engine::load(
      writeSmokePlan(dir.path(), "cpu", cpuTarget()), testOptions("gpu"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("unknown backend 'gpu'"), std::string::npos)
      << e.message();
}

TEST(CudaBackend, CpuPlanRunsOnTheCpuSilently) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "cpu", cpuTarget());
  testing::internal::CaptureStderr();
  std::unique_ptr<Engine> e = loadEngine(plan, testOptions("auto"));
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info().backend, "cpu");
  EXPECT_EQ(err, "");
}

TEST(CudaBackend, CpuPlanCannotBeForcedOntoCuda) {
  test::TempDir dir;
  StatusOr<std::unique_ptr<Engine>> e = Engine::load(
      writeSmokePlan(dir.path(), "cpu", cpuTarget()), testOptions("cuda"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("has no CUDA binaries (target 'cpu'"),
            std::string::npos)
      << e.message();
}

TEST(CudaBackend, CudaPlanFallsBackToTheCpuWithOneLine) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "dense", {});
  EngineOptions o = testOptions("auto");
  o.cudaDriver = "/nonexistent/libcuda.so.1";
  testing::internal::CaptureStderr();
  std::unique_ptr<Engine> e = loadEngine(plan, o);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info().backend, "cpu");
  EXPECT_EQ(err.rfind("nf: CUDA unavailable (cannot load "
                      "/nonexistent/libcuda.so.1: ",
                      0),
            0u)
      << err;
  EXPECT_NE(err.find("): using the CPU backend\n"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;

  // The CPU runs the plan's ops (the binaries are ignored).
  StatusOr<int32_t> seq = e->addSequence();
  ASSERT_TRUE(seq.ok());
  const std::vector<int32_t> toks = {3, 17, 31};
  std::vector<float> logits;
  ASSERT_TRUE(stepOne(*e, *seq, toks, LogitsFor::AllTokens, logits).ok());
  for (size_t t = 0; t < toks.size(); ++t)
    EXPECT_EQ(maxAbsDiff(logits.data() + t * kV, denseRow(toks[t]).data(), kV),
              0.0);

  // Forced: an error naming the reason.
  o.backend = "cuda";
  StatusOr<std::unique_ptr<Engine>> forced = Engine::load(plan, o);
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(forced.message().rfind(
                "CUDA backend: cannot load /nonexistent/libcuda.so.1", 0),
            0u)
      << forced.message();
}

TEST(CudaBackend, CApiBackendParameter) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "dense", {});
  nf_model_params p = nf_model_default_params();
  EXPECT_EQ(p.backend, nullptr);
  p.backend = "tpu";
  nf_model *m = nullptr;
  EXPECT_EQ(nf_model_load(plan.c_str(), &p, &m), NF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(nf_last_error()).find("unknown backend 'tpu'"),
            std::string::npos)
      << nf_last_error();
  p.backend = "cpu";
  // The memory share: in (0, 1], and not beside a page count.
  EXPECT_EQ(p.gpu_memory_utilization, 0.0);
  for (double bad : {-0.1, 1.5}) {
    p.gpu_memory_utilization = bad;
    EXPECT_EQ(nf_model_load(plan.c_str(), &p, &m), NF_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(nf_last_error())
                  .find("gpu_memory_utilization must be in (0, 1]"),
              std::string::npos)
        << nf_last_error();
  }
  p.gpu_memory_utilization = 0.5;
  p.kv_pages = 8;
  EXPECT_EQ(nf_model_load(plan.c_str(), &p, &m), NF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(nf_last_error())
                .find("kv_pages and gpu_memory_utilization both set"),
            std::string::npos)
      << nf_last_error();
  p.kv_pages = 0;
  // The CPU backend has no device memory to share: the plan's pages.
  ASSERT_EQ(nf_model_load(plan.c_str(), &p, &m), NF_OK) << nf_last_error();
  nf_model_free(m);
  p.gpu_memory_utilization = 0.0;
  ASSERT_EQ(nf_model_load(plan.c_str(), &p, &m), NF_OK) << nf_last_error();
  EXPECT_STREQ(nf_model_backend(m), "cpu");
  EXPECT_NE(std::string(nf_model_info(m)).find("backend: cpu\n"),
            std::string::npos);
  nf_model_free(m);
  EXPECT_STREQ(nf_model_backend(nullptr), "");
  // "cuda" through the C API, on the fake driver ($NF_LIBCUDA).
  {
    const char *saved = std::getenv("NF_LIBCUDA");
    const std::string keep = saved ? saved : "";
    setenv("NF_LIBCUDA", fakeDriver().c_str(), 1);
    p.backend = "cuda";
    const nf_status st = nf_model_load(plan.c_str(), &p, &m);
    if (saved)
      setenv("NF_LIBCUDA", keep.c_str(), 1);
    else
      unsetenv("NF_LIBCUDA");
    ASSERT_EQ(st, NF_OK) << nf_last_error();
    EXPECT_STREQ(nf_model_backend(m), "cuda");
    EXPECT_NE(std::string(nf_model_info(m)).find("backend: cuda (nf fake GPU"),
              std::string::npos)
        << nf_model_info(m);
    nf_seq_input in = {};
    const int32_t toks[] = {3, 4};
    ASSERT_EQ(nf_seq_add(m, &in.seq_id), NF_OK);
    in.tokens = toks;
    in.n_tokens = 2;
    nf_batch batch = {&in, 1, nullptr};
    std::vector<float> logits(2 * kV);
    ASSERT_EQ(nf_decode(m, &batch, logits.data(), logits.size(), 1), NF_OK)
        << nf_last_error();
    EXPECT_EQ(maxAbsDiff(logits.data() + kV, denseRow(4).data(), kV), 0.0);
    nf_model_free(m);
  }
  if (cudaUnavailable().empty()) {
    p.backend = "cuda";
    ASSERT_EQ(nf_model_load(plan.c_str(), &p, &m), NF_OK) << nf_last_error();
    EXPECT_STREQ(nf_model_backend(m), "cuda");
    std::cout << "[ cuda ] " << nf_model_info(m);
    nf_model_free(m);
  }
}

// nf_decode_sample against nf_decode then nf_sample: the same tokens, step
// after step, for a batch of samplers of different kinds (CPU backend: the
// rows path; the device's top lists are checked by CudaFixture).
TEST(CudaBackend, CApiDecodeSampleDrawsWhatDecodeThenSampleDraws) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "dense", {});
  nf_model_params p = nf_model_default_params();
  p.backend = "cpu";
  nf_model *a = nullptr, *b = nullptr;
  ASSERT_EQ(nf_model_load(plan.c_str(), &p, &a), NF_OK) << nf_last_error();
  ASSERT_EQ(nf_model_load(plan.c_str(), &p, &b), NF_OK) << nf_last_error();
  nf_sampler_params sp[3] = {nf_sampler_default_params(),
                             nf_sampler_default_params(),
                             nf_sampler_default_params()};
  sp[1].temperature = 0.9f;
  sp[1].top_k = 3;
  sp[1].seed = 5;
  sp[2].temperature = 1.2f;
  sp[2].top_p = 0.8f;
  sp[2].seed = 6;
  nf_sampler *sa[3], *sb[3];
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(nf_sampler_create(&sp[i], &sa[i]), NF_OK);
    ASSERT_EQ(nf_sampler_create(&sp[i], &sb[i]), NF_OK);
  }
  nf_seq_input ia[3] = {}, ib[3] = {};
  int32_t ta[3] = {3, 5, 7}, tb[3] = {3, 5, 7};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(nf_seq_add(a, &ia[i].seq_id), NF_OK);
    ASSERT_EQ(nf_seq_add(b, &ib[i].seq_id), NF_OK);
    ia[i].tokens = &ta[i];
    ib[i].tokens = &tb[i];
    ia[i].n_tokens = ib[i].n_tokens = 1;
  }
  nf_batch ba = {ia, 3, nullptr}, bb = {ib, 3, nullptr};
  std::vector<float> logits(3 * kV);
  for (int step = 0; step < 6; ++step) {
    int32_t got[3];
    ASSERT_EQ(nf_decode_sample(a, &ba, sa, got), NF_OK) << nf_last_error();
    ASSERT_EQ(nf_decode(b, &bb, logits.data(), logits.size(), 0), NF_OK);
    for (int i = 0; i < 3; ++i) {
      const int32_t want = nf_sample(sb[i], logits.data() + i * kV, kV);
      ASSERT_GE(want, 0) << nf_last_error();
      EXPECT_EQ(got[i], want) << "step " << step << " sampler " << i;
      ta[i] = got[i];
      tb[i] = want;
    }
  }
  EXPECT_EQ(nf_decode_sample(a, &ba, nullptr, ta), NF_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < 3; ++i) {
    nf_sampler_free(sa[i]);
    nf_sampler_free(sb[i]);
  }
  nf_model_free(a);
  nf_model_free(b);
}

} // namespace
