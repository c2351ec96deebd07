// nf::Engine's CUDA backend on particular plans compiled with `nfc compile
// --target=cuda` (GPU only): pydoc-moe with bf16 GEMM inputs in the wide
// decode bucket (CudaBf16Plans); a small arena (chunked steps), expert
// statistics, budgets, the step-wide selection and overrides against the CPU
// backend (CudaPlans). See cuda_test_util.h for the environment.
#include "engine/engine.h"

#include "ReferenceUtil.h"
#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace nf;
using namespace nf::test::ref;
using namespace nf::test::integration;
using namespace nf::test::gpu;

// pydoc-moe compiled with --matmul-inputs=bf16 (pydoc-moe-bf16): decode
// steps of more than 16 tokens read the bf16 copies of their GEMM inputs
// (the wide skinny variants), shorter ones the f32 rows; both round them the
// same way. Rounding inputs to bf16 can turn a 1e-7 difference between step
// sizes (exact plans: kBatchTol) into another expert choice (0.061 relative
// on the plans of 2026-12-01, bench/results/2026-12-01b), so the bound is
// loose: it catches copies that are stale, misplaced or never written
// (logits of another token, differences of order 1), not rounding.
// pydoc-moe-bf16-sm4: the same plan with grids sized for 4 SMs
// (NF_CUDA_SM_COUNT=4), whose layers then take the variants that only
// Nano-sized layers take on 132 SMs (items of 32 rows, 4-warp blocks).
constexpr double kBf16BatchTol = 0.2;
class CudaBf16Plans : public ::testing::TestWithParam<const char *> {};
TEST_P(CudaBf16Plans, WideDecodeMatchesOneAtATime) {
  NF_REQUIRE_GPU();
  const std::string plan = cudaPlan(GetParam());
  NF_REQUIRE_PLAN(plan);
  const std::string dir = modelDir("pydoc-moe");
  std::unique_ptr<Engine> single = loadEngine(plan, testOptions("cuda", dir));
  ASSERT_NE(single, nullptr);
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  ASSERT_FALSE(prompts.empty());
  const double diff = wideDecodeDifference(*single, plan, dir, prompts);
  ASSERT_GE(diff, 0) << "the plan decodes fewer than 24 sequences at once";
  EXPECT_LE(diff, kBf16BatchTol) << "wide decode differs from one at a time";
  std::cout << "[ cuda ] " << GetParam()
            << " wide decode (24 sequences): max rel "
            << "|batched - single| " << diff
            << (diff == 0 ? " (bit-identical)" : "") << "\n";
}
INSTANTIATE_TEST_SUITE_P(PydocMoe, CudaBf16Plans,
                         ::testing::Values("pydoc-moe-bf16",
                                           "pydoc-moe-bf16-sm4"),
                         ParamName());

// A sequence of `engine` for each prompt, and in `inputs` a step that
// prefills every prompt at once; false where a sequence cannot be added.
bool addPrompts(Engine &engine, const std::vector<Prompt> &prompts,
                std::vector<SequenceInput> &inputs) {
  for (const Prompt &p : prompts) {
    StatusOr<int32_t> seq = engine.addSequence();
    if (!seq)
      return false;
    SequenceInput in;
    in.tokens = p.tokens;
    in.sequence = *seq;
    inputs.push_back(in);
  }
  return true;
}

// Steps split into runs of 16 tokens / 2 sequences (tiny-hybrid-small).
TEST(CudaPlans, SmallArenaMatchesLargeArena) {
  NF_REQUIRE_GPU();
  const std::string small = cudaPlan("tiny-hybrid-small"),
                    large = cudaPlan("tiny-hybrid");
  NF_REQUIRE_PLAN(small);
  NF_REQUIRE_PLAN(large);
  const std::string dir = modelDir("tiny-hybrid");
  std::unique_ptr<Engine> a = loadEngine(small, testOptions("cuda", dir));
  std::unique_ptr<Engine> b = loadEngine(large, testOptions("cuda", dir));
  ASSERT_TRUE(a && b);
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  const int64_t V = a->info().vocabSize;
  // Every prompt at once (more than 16 tokens and 2 sequences), then decode.
  std::vector<float> la, lb;
  std::vector<SequenceInput> ia, ib;
  ASSERT_TRUE(addPrompts(*a, prompts, ia) && addPrompts(*b, prompts, ib));
  ASSERT_TRUE(a->step(ia, LogitsFor::AllTokens, la).ok());
  ASSERT_TRUE(b->step(ib, LogitsFor::AllTokens, lb).ok());
  ASSERT_EQ(la.size(), lb.size());
  double worst = relError(la.data(), lb.data(), la.size());
  std::vector<int32_t> next(prompts.size());
  for (size_t st = 0; st < prompts[0].greedyTokens.size(); ++st) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      next[i] = static_cast<int32_t>(prompts[i].greedyTokens[st]);
      ia[i].tokens = ib[i].tokens = {&next[i], 1};
    }
    ASSERT_TRUE(a->step(ia, LogitsFor::LastTokenPerSequence, la).ok());
    ASSERT_TRUE(b->step(ib, LogitsFor::LastTokenPerSequence, lb).ok());
    worst = std::max(worst, relError(la.data(), lb.data(), la.size()));
    for (size_t i = 0; i < prompts.size(); ++i)
      ASSERT_LE(relError(la.data() + i * V,
                         prompts[i].greedyLogits.data() + st * V, V),
                kCudaTol);
  }
  EXPECT_LE(worst, kBatchTol);
  std::cout << "[ cuda ] small arena vs large: " << worst << "\n";
}

// pydoc-moe (budget policy, default budget 1.0 = static top-4): expert calls
// of a batched prefill and of decode steps, and a budget of 0.5 spent as on
// the CPU.
TEST(CudaPlans, PydocExpertCalls) {
  NF_REQUIRE_GPU();
  const std::string plan = cudaPlan("pydoc-moe");
  NF_REQUIRE_PLAN(plan);
  const std::string dir = modelDir("pydoc-moe");
  std::unique_ptr<Engine> gpu = loadEngine(plan, testOptions("cuda", dir));
  std::unique_ptr<Engine> cpu = loadEngine(plan, testOptions("cpu", dir));
  ASSERT_TRUE(gpu && cpu);
  if (!gpu->info().expertStats)
    GTEST_SKIP() << "expert statistics unavailable on this plan";
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  const int64_t layers = gpu->info().numMoeLayers, k = gpu->info().topK;
  std::vector<SequenceInput> in(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    in[i].sequence = *gpu->addSequence();
    in[i].tokens = prompts[i].tokens;
  }
  std::vector<float> logits;
  StepStats stats;
  Status s = gpu->step(in, LogitsFor::LastTokenPerSequence, logits, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<int32_t> next(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(stats.expertCalls[i],
              int64_t(prompts[i].tokens.size()) * layers * k)
        << "p" << i;
    next[i] = argmax(logits.data() + i * gpu->info().vocabSize,
                     gpu->info().vocabSize);
    in[i].tokens = {&next[i], 1};
  }
  s = gpu->step(in, LogitsFor::LastTokenPerSequence, logits, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(stats.expertCalls[i], layers * k) << "p" << i;
  for (const SequenceInput &x : in)
    ASSERT_TRUE(gpu->removeSequence(x.sequence).ok());

  // Half the budget: the same calls as the CPU's scheduler.
  for (float budget : {0.5f, 0.25f}) {
    StepStats sg, sc;
    std::vector<float> lg, lc;
    SequenceInput a;
    a.tokens = prompts[0].tokens;
    a.expertBudget = budget;
    a.sequence = *gpu->addSequence();
    ASSERT_TRUE(gpu->step({&a, 1}, LogitsFor::AllTokens, lg, &sg).ok());
    ASSERT_TRUE(gpu->removeSequence(a.sequence).ok());
    a.sequence = *cpu->addSequence();
    ASSERT_TRUE(cpu->step({&a, 1}, LogitsFor::AllTokens, lc, &sc).ok());
    ASSERT_TRUE(cpu->removeSequence(a.sequence).ok());
    EXPECT_EQ(sg.expertCalls, sc.expertCalls) << "budget " << budget;
    EXPECT_EQ(sg.expertCallsPerLayer, sc.expertCallsPerLayer);
    std::cout << "[ cuda ] pydoc-moe budget " << budget << ": "
              << sg.expertCalls[0] << " expert calls (CPU " << sc.expertCalls[0]
              << "), max rel |cuda - cpu| logits "
              << relError(lg.data(), lc.data(), lg.size()) << "\n";
  }
}

// The step budget scope and the distinct-expert cap on the device (moe_budget
// in prefill, moe_route's last block in decode): the same experts as the
// CPU backend's decision on the same plan, step after step, and logits
// within the backends' tolerance.
TEST(CudaPlans, StepWideSelectionMatchesTheCpu) {
  NF_REQUIRE_GPU();
  const std::string plan = cudaPlan("pydoc-moe");
  NF_REQUIRE_PLAN(plan);
  const std::string dir = modelDir("pydoc-moe");
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  ASSERT_GE(prompts.size(), 2u);
  struct Policy {
    bool step;
    double cap;
  };
  for (const Policy policy : {Policy{true, 0.0}, Policy{false, 0.5},
                              Policy{true, 0.5}, Policy{true, 5.0}}) {
    const std::string what = std::string(policy.step ? "step" : "request") +
                             " scope, cap " + std::to_string(policy.cap);
    EngineOptions og = testOptions("cuda", dir), oc = testOptions("cpu", dir);
    og.budgetStepScope = oc.budgetStepScope = policy.step;
    og.distinctExpertCap = oc.distinctExpertCap = policy.cap;
    std::unique_ptr<Engine> gpu = loadEngine(plan, og);
    std::unique_ptr<Engine> cpu = loadEngine(plan, oc);
    ASSERT_TRUE(gpu && cpu) << what;
    if (!gpu->info().expertStats)
      GTEST_SKIP() << "expert statistics unavailable on this plan";
    // Sequences at different budgets: a prefill step of all prompts, then
    // decode steps of one token each, fed the CPU's greedy tokens.
    const size_t n = prompts.size();
    std::vector<SequenceInput> ig(n), ic(n);
    for (size_t i = 0; i < n; ++i) {
      ig[i].sequence = *gpu->addSequence();
      ic[i].sequence = *cpu->addSequence();
      ig[i].tokens = ic[i].tokens = prompts[i].tokens;
      ig[i].expertBudget = ic[i].expertBudget = i % 2 ? 0.5f : 0.75f;
    }
    std::vector<int32_t> next(n);
    for (int step = 0; step < 4; ++step) {
      std::vector<float> lg, lc;
      StepStats sg, sc;
      Status s = gpu->step(ig, LogitsFor::LastTokenPerSequence, lg, &sg);
      ASSERT_TRUE(s.ok()) << what << ": " << s.message();
      s = cpu->step(ic, LogitsFor::LastTokenPerSequence, lc, &sc);
      ASSERT_TRUE(s.ok()) << what << ": " << s.message();
      EXPECT_EQ(sg.expertCallsPerLayer, sc.expertCallsPerLayer)
          << what << ", step " << step;
      EXPECT_EQ(gpu->expertUtilization(), cpu->expertUtilization())
          << what << ", step " << step << ": different experts";
      EXPECT_LE(relError(lg.data(), lc.data(), lg.size()), kCudaTol)
          << what << ", step " << step;
      const int32_t V = cpu->info().vocabSize;
      for (size_t i = 0; i < n; ++i) {
        next[i] = argmax(lc.data() + i * V, V);
        ig[i].tokens = ic[i].tokens = {&next[i], 1};
      }
    }
  }
  // Plans whose selection is static top-k have no budget decision to pool.
  const std::string topk = cudaPlan("tiny-hybrid-topk");
  if (!std::filesystem::exists(topk))
    return;
  EngineOptions o = testOptions("cuda", modelDir("tiny-hybrid"));
  o.budgetStepScope = true;
  StatusOr<std::unique_ptr<Engine>> e = Engine::load(topk, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("--expert-policy=budget"), std::string::npos)
      << e.message();
}

// MoE statistics and the static top-k override on a "topk" plan.
TEST(CudaPlans, ExpertStatisticsAndOverride) {
  NF_REQUIRE_GPU();
  const std::string plan = cudaPlan("tiny-hybrid-topk");
  NF_REQUIRE_PLAN(plan);
  const std::string dir = modelDir("tiny-hybrid");
  std::unique_ptr<Engine> gpu = loadEngine(plan, testOptions("cuda", dir));
  std::unique_ptr<Engine> cpu = loadEngine(plan, testOptions("cpu", dir));
  ASSERT_TRUE(gpu && cpu);
  const ModelInfo &info = gpu->info();
  ASSERT_GT(info.topK, 1);
  const int64_t layers = info.numMoeLayers;
  std::vector<int32_t> toks = {1, 5, 9, 13, 17, 21, 25, 29};
  for (int32_t k : {0, 1}) {
    std::vector<float> lg, lc;
    StepStats sg, sc;
    const int32_t g = *gpu->addSequence(), c = *cpu->addSequence();
    ASSERT_TRUE(stepOne(*gpu, g, toks, LogitsFor::AllTokens, lg, &sg, k).ok());
    ASSERT_TRUE(stepOne(*cpu, c, toks, LogitsFor::AllTokens, lc, &sc, k).ok());
    EXPECT_LE(relError(lg.data(), lc.data(), lg.size()), kCudaTol)
        << "experts per token " << k;
    const int64_t want =
        static_cast<int64_t>(toks.size()) * (k > 0 ? k : info.topK) * layers;
    EXPECT_EQ(sc.expertCalls[0], want);
    if (info.expertStats)
      EXPECT_EQ(sg.expertCalls[0], want) << "experts per token " << k;
    else
      std::cout << "[ cuda ] expert statistics unavailable on this plan "
                   "(select results stay inside kernels)\n";
    ASSERT_TRUE(gpu->removeSequence(g).ok());
    ASSERT_TRUE(cpu->removeSequence(c).ok());
  }
  // Mixed overrides in one step are rejected before anything runs.
  const int32_t a = *gpu->addSequence(), b = *gpu->addSequence();
  std::vector<SequenceInput> in(2);
  in[0].sequence = a;
  in[0].tokens = toks;
  in[0].expertsPerToken = 1;
  in[1].sequence = b;
  in[1].tokens = toks;
  std::vector<float> logits;
  Status s = gpu->step(in, LogitsFor::LastTokenPerSequence, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("one override per step"), std::string::npos);
  EXPECT_EQ(gpu->sequenceLength(a), 0);
}

} // namespace

namespace {

// Plans of FP8 weights: quantised at compile time (`nfc compile
// --weights=fp8 --quantize=all`, plan "<fixture>-fp8": FP8 E4M3 codes, a
// scale per output channel, in <plan>.weights.safetensors; likewise
// "<fixture>-int4", int4 codes with group scales), or checkpoints
// quantised by the tools themselves (tiny-nano-fp8-modelopt: per-tensor
// scales and static activation scales; tiny-nano-fp8-dynamic: per-channel
// scales and per-token activation scales), run on tiny-nano's prompts. The
// CUDA kernels read the codes and scale each output, and quantise a GEMM's
// input rows first where the checkpoint says so; the CPU backend multiplies
// the dequantised weights with its own quantised rows. Every step's logits
// within kCudaTol of the CPU on the same plan:
// 20 sequences (the fixture's prompts in turn) prefilled in one step, then
// four decode steps of all 20 (tiny-hybrid-bf16: the plane GEMMs over the
// widened codes, the skinny GEMVs' wide variant), four of the first 5 (the
// narrow variant), and four of one (row GEMVs), each step's tokens the
// CPU's greedy choices. tiny-nano's dimensions (24, 48) keep it on the f32
// paths. With FP8 activations the rows quantised are the same, bit for bit,
// where the inputs are; but an input within f32 rounding of a tie between
// two E4M3 values (the backends sum in different orders) takes the other
// code, and the random fixture amplifies that one step into about 1e-2 in
// the sequence's later logits (as against the float64 reference,
// test/lit/nfrun/Inputs/check_quant_prefill.py): there, at least 80% of the
// logits rows within kCudaTol and every row within 0.1 (scales applied
// wrongly, or the quantisation missing, put most rows at 0.05-0.9).
class CudaQuantisedPlans : public ::testing::TestWithParam<const char *> {};
TEST_P(CudaQuantisedPlans, MatchTheCpu) {
  NF_REQUIRE_GPU();
  const std::string name = GetParam();
  const std::string plan = cudaPlan(name);
  NF_REQUIRE_PLAN(plan);
  const size_t suffix = name.ends_with("-fp8")    ? 4
                        : name.ends_with("-int4") ? 5
                                                  : 0;
  const bool compiled = suffix > 0;
  const std::string dir =
      modelDir(compiled ? name.substr(0, name.size() - suffix) : name);
  const std::string promptDir = compiled ? dir : modelDir("tiny-nano");
  const bool fp8Inputs = !compiled && !name.ends_with("-w4a16");
  EngineOptions og = testOptions("cuda", dir), oc = testOptions("cpu", dir);
  og.maxSequences = oc.maxSequences = 20;
  std::unique_ptr<Engine> gpu = loadEngine(plan, og);
  std::unique_ptr<Engine> cpu = loadEngine(plan, oc);
  ASSERT_TRUE(gpu && cpu);
  RefFile ref(promptDir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  ASSERT_FALSE(prompts.empty());
  double worst = 0;
  size_t rows = 0, close = 0;
  TwinSteps twins(*gpu, *cpu);
  for (size_t batch : {size_t(20), size_t(5), size_t(1)}) {
    std::vector<std::vector<int32_t>> first;
    for (size_t i = 0; i < batch; ++i)
      first.push_back(prompts[i % prompts.size()].tokens);
    ASSERT_TRUE(twins.add(first));
    for (int st = 0; st < 5; ++st) {
      ASSERT_TRUE(twins.step());
      for (double e : twins.rows()) {
        worst = std::max(worst, e);
        close += e <= kCudaTol;
        ++rows;
      }
    }
    ASSERT_TRUE(twins.clear());
  }
  if (fp8Inputs) {
    EXPECT_GE(close, rows * 8 / 10) << close << " of " << rows;
    EXPECT_LE(worst, 0.1);
  } else {
    EXPECT_LE(worst, kCudaTol);
  }
  std::cout << "[ cuda ] " << name << ": max rel |cuda - cpu| logits " << worst
            << ", " << close << " of " << rows << " rows within " << kCudaTol
            << "\n";
}
INSTANTIATE_TEST_SUITE_P(Fp8, CudaQuantisedPlans,
                         ::testing::Values("tiny-nano-fp8",
                                           "tiny-hybrid-bf16-fp8",
                                           "tiny-nano-fp8-modelopt",
                                           "tiny-nano-fp8-dynamic"),
                         ParamName());
// int4 codes with group scales (int4_linear in every step): tiny-nano and
// tiny-hybrid-bf16 quantised at compile time (groups of 8 to 128 columns),
// and llm-compressor's W4A16 checkpoint (groups of 8).
INSTANTIATE_TEST_SUITE_P(Int4, CudaQuantisedPlans,
                         ::testing::Values("tiny-nano-int4",
                                           "tiny-hybrid-bf16-int4",
                                           "tiny-nano-w4a16"),
                         ParamName());

// tiny-hybrid-bf16 with FP8 weights and bf16 inputs: on the sm_90a cubins
// the warp-specialised prefill GEMMs widen the codes to bf16 as they load
// them (nf_wgmma.cuh, kCodesOnLoad); the same plan compiled for sm_80 runs
// its PTX on the GPU, whose GEMMs read a copy that a launch widened into
// scratch first. The products are the same (exact widening, the same bf16
// rows); the f32 sums differ in order, and a last-bit difference can round
// a later GEMM's bf16 input the other way, so the bound is that of bf16
// rounding (4e-3 a step), not kBatchTol. Wrong codes, a wrong layout or a
// stage read before it is written differ by order 1.
constexpr double kWidenTol = 2e-2;
TEST(CudaPlans, Fp8CodesWidenedOnLoadMatchWidenedScratch) {
  NF_REQUIRE_GPU();
  const std::string onLoad = cudaPlan("tiny-hybrid-bf16-fp8-bf16in"),
                    scratch = cudaPlan("tiny-hybrid-bf16-fp8-bf16in-sm80");
  NF_REQUIRE_PLAN(onLoad);
  NF_REQUIRE_PLAN(scratch);
  const std::string dir = modelDir("tiny-hybrid-bf16");
  std::unique_ptr<Engine> a = loadEngine(onLoad, testOptions("cuda", dir));
  std::unique_ptr<Engine> b = loadEngine(scratch, testOptions("cuda", dir));
  ASSERT_TRUE(a && b);
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  ASSERT_FALSE(prompts.empty());
  // Every prompt in one prefill step (rows of many experts a GEMM).
  std::vector<SequenceInput> ia, ib;
  ASSERT_TRUE(addPrompts(*a, prompts, ia) && addPrompts(*b, prompts, ib));
  std::vector<float> la, lb;
  ASSERT_TRUE(a->step(ia, LogitsFor::AllTokens, la).ok());
  ASSERT_TRUE(b->step(ib, LogitsFor::AllTokens, lb).ok());
  ASSERT_EQ(la.size(), lb.size());
  const double diff = relError(la.data(), lb.data(), la.size());
  EXPECT_LE(diff, kWidenTol);
  std::cout << "[ cuda ] FP8 codes widened on load vs widened scratch "
               "(prefill logits): max rel "
            << diff << (diff == 0 ? " (bit-identical)" : "") << "\n";
}

} // namespace
