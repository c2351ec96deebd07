// The CUDA kernels on KV caches that store bf16 or fp8 (`nfc compile
// --kv-cache-dtype=bf16|fp8`; GPU only): every step's logits against the CPU
// backend on the same plan, which rounds each K/V row as it writes it
// (engine/caches.h), so both hold the same cache. See cuda_test_util.h for
// the environment.
//
// Plans (scripts/gpu_check.sh): tiny-hybrid-kv<dtype> (exact products;
// sm_90: the tensor-core prefill and decode forms; bf16: the qkv GEMM's
// epilogue writes the cache, fp8: kv_append_e4m3 after it),
// tiny-hybrid-kv<dtype>-sm75 (the same for sm_75, run as PTX: the
// shared-memory tile prefill, the per-head and grouped-query decode forms),
// pydoc-moe-kv<dtype> (head_dim 32), and tiny-hybrid-bf16-kvbf16-bf16in
// (bf16 GEMM inputs: the step's K/V rows copied to bf16 scratch and
// streamed by cp.async, one-term decode), and tiny-hybrid-kvtiered[-sm75],
// pydoc-moe-kvtiered (fp8 with a bf16 hot window of 16 positions: the
// pages that leave it are moved to fp8 by the next step's appends, as the
// CPU rounds them before the step).
#include "engine/engine.h"

#include "ReferenceUtil.h"
#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace nf;
using namespace nf::test::ref;
using namespace nf::test::integration;
using namespace nf::test::gpu;

// bf16 GEMM inputs move the logits by about bf16 rounding against the CPU's
// exact products (and can turn that into another expert choice); a cache
// read in the wrong format gives differences of order 1.
constexpr double kBf16InputsTol = 0.2;
// fp8: a K/V value within f32 rounding of a tie between two E4M3 values (the
// backends sum the projections in different orders) can take the other
// code, 1/16 of its size; the rows are then not within kCudaTol, but the
// cache's values are still the same to that one code.
constexpr double kFp8RowsTol = 0.02;

struct KvCase {
  const char *plan;
  const char *model;
  bool bf16Inputs = false;
  bool fp8 = false;
};

class CudaKvStoragePlans : public ::testing::TestWithParam<KvCase> {};

// 20 sequences (the fixture's prompts in turn) prefilled in two chunks (the
// second attends to the first's cached rows), then four decode steps of all
// 20, four of the first 5 and four of one, each step's tokens the CPU's
// greedy choices.
TEST_P(CudaKvStoragePlans, MatchTheCpu) {
  NF_REQUIRE_GPU();
  const KvCase c = GetParam();
  const std::string plan = cudaPlan(c.plan);
  NF_REQUIRE_PLAN(plan);
  const std::string dir = modelDir(c.model);
  EngineOptions og = testOptions("cuda", dir), oc = testOptions("cpu", dir);
  og.maxSequences = oc.maxSequences = 20;
  std::unique_ptr<Engine> gpu = loadEngine(plan, og);
  std::unique_ptr<Engine> cpu = loadEngine(plan, oc);
  ASSERT_TRUE(gpu && cpu);
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  ASSERT_FALSE(prompts.empty());
  const double tol = c.bf16Inputs ? kBf16InputsTol
                     : c.fp8      ? kFp8RowsTol
                                  : kCudaTol;
  double worst = 0;
  size_t rows = 0, close = 0;
  TwinSteps twins(*gpu, *cpu);
  for (size_t batch : {size_t(20), size_t(5), size_t(1)}) {
    std::vector<std::vector<int32_t>> first, rest;
    for (size_t i = 0; i < batch; ++i) {
      const std::vector<int32_t> &p = prompts[i % prompts.size()].tokens;
      ASSERT_GE(p.size(), 2u);
      const size_t half = p.size() / 2;
      first.emplace_back(p.begin(), p.begin() + half);
      rest.emplace_back(p.begin() + half, p.end());
    }
    ASSERT_TRUE(twins.add(first));
    for (int st = 0; st < 6; ++st) {
      // The first halves, the second (the cached rows of the first read),
      // then a token at a time.
      ASSERT_TRUE(twins.step(st == 1 ? &rest : nullptr));
      for (size_t i = 0; i < twins.rows().size(); ++i) {
        const double e = twins.rows()[i];
        EXPECT_LE(e, tol) << "sequence " << i << ", step " << st;
        worst = std::max(worst, e);
        close += e <= kCudaTol;
        ++rows;
      }
    }
    ASSERT_TRUE(twins.clear());
  }
  if (c.fp8)
    EXPECT_GE(close, rows * 9 / 10) << close << " of " << rows;
  std::cout << "[ cuda ] " << c.plan << ": max rel |cuda - cpu| logits "
            << worst << ", " << close << " of " << rows << " rows within "
            << kCudaTol << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    KvStorage, CudaKvStoragePlans,
    ::testing::Values(
        KvCase{"tiny-hybrid-kvbf16", "tiny-hybrid"},
        KvCase{"tiny-hybrid-kvbf16-sm75", "tiny-hybrid"},
        KvCase{"pydoc-moe-kvbf16", "pydoc-moe"},
        KvCase{"tiny-hybrid-bf16-kvbf16-bf16in", "tiny-hybrid-bf16", true},
        KvCase{"tiny-hybrid-kvfp8", "tiny-hybrid", false, true},
        KvCase{"tiny-hybrid-kvfp8-sm75", "tiny-hybrid", false, true},
        KvCase{"pydoc-moe-kvfp8", "pydoc-moe", false, true},
        KvCase{"tiny-hybrid-kvtiered", "tiny-hybrid", false, true},
        KvCase{"tiny-hybrid-kvtiered-sm75", "tiny-hybrid", false, true},
        KvCase{"pydoc-moe-kvtiered", "pydoc-moe", false, true}),
    [](const ::testing::TestParamInfo<KvCase> &info) {
      std::string name = info.param.plan;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

} // namespace
