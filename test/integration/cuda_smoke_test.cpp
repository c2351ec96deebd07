// nf::Engine's CUDA backend on the synthetic plans of cuda_smoke_plan.h
// (as PTX, and as a cubin when ptxas is found), on a GPU and on every
// machine through the fake driver (fake_cuda_driver.cpp: host memory,
// bounds-checked copies, deferred streams, graph capture): arguments,
// chunking, slots and their zeroing, page tables, Mamba/KV storage, the
// decode graph, cooperative launches, tensor maps, expert statistics,
// overrides, load errors, fallback on missing binaries. See
// cuda_test_util.h for the environment.
#include "engine/engine.h"
#include "nf_abi.h"

#include "TestUtil.h"
#include "cuda_smoke_plan.h"
#include "cuda_test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <dlfcn.h>

namespace {

using namespace nf;
using namespace nf::test::integration;
using namespace nf::test::gpu;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Smoke plans: on the GPU ("device"), and on the fake driver of
// fake_cuda_driver.cpp ("fake": every machine), which runs the same kernels
// on the host and checks every copy, free and context switch.

class CudaSmoke : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    if (GetParam() == "device")
      NF_REQUIRE_GPU();
    else
      driver_ = fakeDriver();
  }
  void TearDown() override {
    if (GetParam() != "fake")
      return;
    // Every engine is gone: the fake driver holds no allocation.
    void *h = dlopen(driver_.c_str(), RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(h, nullptr);
    auto live =
        reinterpret_cast<int (*)()>(dlsym(h, "nfFakeCudaLiveAllocations"));
    ASSERT_NE(live, nullptr);
    EXPECT_EQ(live(), 0) << "device or pinned allocations leaked";
    dlclose(h);
  }
  EngineOptions opts(const std::string &backend) const {
    EngineOptions o = testOptions(backend);
    o.cudaDriver = driver_;
    return o;
  }
  std::string arch() const {
    return GetParam() == "device" ? deviceArch() : "sm_90";
  }
  std::string driver_;
};

/// Runs `prompts` as one batched prefill (all logits) then `steps` batched
/// decode steps feeding token (step * 7 + i) % 32; returns every logits row
/// of every sequence in order: [sequence][row][V].
std::vector<std::vector<std::vector<float>>>
runBatched(Engine &e, const std::vector<std::vector<int32_t>> &prompts,
           int steps, bool oneAtATime = false) {
  const size_t n = prompts.size();
  std::vector<std::vector<std::vector<float>>> out(n);
  std::vector<int32_t> seqs(n);
  for (size_t i = 0; i < n; ++i) {
    StatusOr<int32_t> s = e.addSequence();
    EXPECT_TRUE(s.ok()) << s.message();
    seqs[i] = s ? *s : -1;
  }
  auto collect = [&](const std::vector<size_t> &which,
                     const std::vector<float> &logits,
                     const std::vector<size_t> &rows) {
    size_t r = 0;
    for (size_t k = 0; k < which.size(); ++k)
      for (size_t j = 0; j < rows[k]; ++j, ++r)
        out[which[k]].emplace_back(logits.begin() + r * kV,
                                   logits.begin() + (r + 1) * kV);
  };
  std::vector<std::vector<size_t>> groups;
  if (oneAtATime)
    for (size_t i = 0; i < n; ++i)
      groups.push_back({i});
  else {
    groups.emplace_back();
    for (size_t i = 0; i < n; ++i)
      groups[0].push_back(i);
  }
  for (const auto &g : groups) {
    std::vector<SequenceInput> in;
    std::vector<size_t> rows;
    for (size_t i : g) {
      SequenceInput s;
      s.sequence = seqs[i];
      s.tokens = prompts[i];
      in.push_back(s);
      rows.push_back(prompts[i].size());
    }
    std::vector<float> logits;
    Status st = e.step(in, LogitsFor::AllTokens, logits);
    EXPECT_TRUE(st.ok()) << st.message();
    if (st)
      collect(g, logits, rows);
  }
  std::vector<int32_t> toks(n);
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < n; ++i)
      toks[i] = static_cast<int32_t>((step * 7 + i) % kV);
    for (const auto &g : groups) {
      std::vector<SequenceInput> in;
      for (size_t i : g) {
        SequenceInput s;
        s.sequence = seqs[i];
        s.tokens = {&toks[i], 1};
        in.push_back(s);
      }
      std::vector<float> logits;
      Status st = e.step(in, LogitsFor::LastTokenPerSequence, logits);
      EXPECT_TRUE(st.ok()) << st.message();
      if (st)
        collect(g, logits, std::vector<size_t>(g.size(), 1));
    }
  }
  for (int32_t s : seqs)
    EXPECT_TRUE(e.removeSequence(s).ok());
  return out;
}

const std::vector<std::vector<int32_t>> kSmokePrompts = {
    {5, 9, 2, 30, 1, 7, 7, 12, 19, 3, 3, 28, 0},
    {11},
    {4, 8, 15, 16, 23, 31},
    {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 9}};

// Quantised weights go to the device as the kernels read them (the codes
// as stored, int4 eight to a word, then every row's or group's scale): a
// plan with an int4 and an FP8 weight loads, and runs as without them.
TEST_P(CudaSmoke, QuantisedWeightsUpload) {
  test::TempDir dir;
  SmokeSpec spec;
  spec.quantisedWeights = true;
  std::unique_ptr<Engine> gpu =
      loadEngine(writeSmokePlan(dir.path(), "quantised", spec), opts("cuda"));
  ASSERT_TRUE(gpu);
  auto rows = runBatched(*gpu, {kSmokePrompts[1]}, 1);
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(rows[0].size(), 2u);
  EXPECT_EQ(
      maxAbsDiff(rows[0][0].data(), denseRow(kSmokePrompts[1][0]).data(), kV),
      0.0);
}

TEST_P(CudaSmoke, DenseMatchesTheCpuExactly) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "dense", {});
  std::unique_ptr<Engine> gpu = loadEngine(plan, opts("cuda"));
  std::unique_ptr<Engine> cpu = loadEngine(plan, testOptions("cpu"));
  ASSERT_TRUE(gpu && cpu);
  EXPECT_EQ(gpu->info().backend, "cuda");
  EXPECT_NE(gpu->info().device.find("0 cubin, 6 PTX JIT"), std::string::npos)
      << gpu->info().device;
  std::cout << "[ cuda ] device: " << gpu->info().device << "\n";
  auto a = runBatched(*gpu, kSmokePrompts, 5);
  auto b = runBatched(*cpu, kSmokePrompts, 5);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), kSmokePrompts[i].size() + 5);
    ASSERT_EQ(a[i].size(), b[i].size());
    for (size_t r = 0; r < a[i].size(); ++r) {
      EXPECT_EQ(maxAbsDiff(a[i][r].data(), b[i][r].data(), kV), 0.0)
          << "sequence " << i << " row " << r;
      const int32_t tok =
          r < kSmokePrompts[i].size()
              ? kSmokePrompts[i][r]
              : static_cast<int32_t>(((r - kSmokePrompts[i].size()) * 7 + i) %
                                     kV);
      EXPECT_EQ(maxAbsDiff(a[i][r].data(), denseRow(tok).data(), kV), 0.0);
    }
  }
}

// Launch token ranges: each step runs the launches whose range holds its
// token count (the launch for >= 1000 tokens, which would fail, never runs),
// and the decode program is captured as one graph per bucket.
TEST_P(CudaSmoke, LaunchTokenRangesPickVariantsPerStep) {
  test::TempDir dir;
  SmokeSpec ranged;
  ranged.rangedLmHead = true;
  const std::string plan = writeSmokePlan(dir.path(), "ranged", ranged);
  std::unique_ptr<Engine> gpu = loadEngine(plan, opts("cuda"));
  EngineOptions noGraph = opts("cuda");
  noGraph.cudaGraphs = false;
  std::unique_ptr<Engine> launches = loadEngine(plan, noGraph);
  ASSERT_TRUE(gpu && launches);
  EXPECT_NE(gpu->info().device.find("decode graphs for <= 2 | <= 8 tokens"),
            std::string::npos)
      << gpu->info().device;
  // One sequence (narrow variant, 1-token decode steps) and all four (wide).
  for (const auto &prompts :
       {std::vector<std::vector<int32_t>>{kSmokePrompts[0]}, kSmokePrompts})
    for (Engine *e : {gpu.get(), launches.get()}) {
      auto a = runBatched(*e, prompts, 3);
      ASSERT_EQ(a.size(), prompts.size());
      for (size_t i = 0; i < a.size(); ++i)
        for (size_t r = 0; r < a[i].size(); ++r) {
          const int32_t tok = r < prompts[i].size()
                                  ? prompts[i][r]
                                  : static_cast<int32_t>(
                                        ((r - prompts[i].size()) * 7 + i) % kV);
          EXPECT_EQ(maxAbsDiff(a[i][r].data(), denseRow(tok).data(), kV), 0.0)
              << "sequence " << i << " row " << r;
        }
    }
}

TEST_P(CudaSmoke, ChunkedStepsGraphsAndCubins) {
  test::TempDir dir;
  SmokeSpec small;
  small.prefillTokens = 4;
  small.decodeTokens = 2;
  const std::string plan = writeSmokePlan(dir.path(), "small", small);
  std::unique_ptr<Engine> ref =
      loadEngine(writeSmokePlan(dir.path(), "dense", {}), opts("cuda"));
  std::unique_ptr<Engine> chunked = loadEngine(plan, opts("cuda"));
  EngineOptions noGraph = opts("cuda");
  noGraph.cudaGraphs = false;
  std::unique_ptr<Engine> launches = loadEngine(plan, noGraph);
  ASSERT_TRUE(ref && chunked && launches);
  EXPECT_NE(chunked->info().device.find("decode graph"), std::string::npos);
  EXPECT_NE(launches->info().device.find("decode launches"), std::string::npos);
  auto want = runBatched(*ref, kSmokePrompts, 4);
  for (Engine *e : {chunked.get(), launches.get()}) {
    auto got = runBatched(*e, kSmokePrompts, 4);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].size(), want[i].size());
      for (size_t r = 0; r < got[i].size(); ++r)
        EXPECT_EQ(maxAbsDiff(got[i][r].data(), want[i][r].data(), kV), 0.0);
    }
  }

  // The same kernels as a cubin for this device (ptxas from the toolkit).
  std::string ptxas = envOr("PTXAS", "");
  if (ptxas.empty())
    ptxas = std::system("command -v ptxas >/dev/null 2>&1") == 0
                ? "ptxas"
                : "/usr/local/cuda/bin/ptxas";
  const std::string devArch = arch();
  const std::string ptxFile = dir.file("smoke.ptx"),
                    cubinFile = dir.file("smoke.cubin");
  test::writeFile(ptxFile, kSmokePtx);
  const std::string cmd = ptxas + " -arch=" + devArch + " " + ptxFile + " -o " +
                          cubinFile + " 2>&1";
  if (std::system(cmd.c_str()) != 0 || !fs::exists(cubinFile)) {
    std::cout << "[ cuda ] no cubin test: '" << cmd << "' failed\n";
    return;
  }
  const std::string image = test::readFile(cubinFile);
  SmokeSpec cubin;
  cubin.ptx = false;
  cubin.cubins = {{"sm_10", {1, 2, 3}},
                  {devArch, std::vector<uint8_t>(image.begin(), image.end())}};
  std::unique_ptr<Engine> fromCubin =
      loadEngine(writeSmokePlan(dir.path(), "cubin", cubin), opts("cuda"));
  ASSERT_NE(fromCubin, nullptr);
  EXPECT_NE(fromCubin->info().device.find("6 cubin, 0 PTX JIT"),
            std::string::npos)
      << fromCubin->info().device;
  auto got = runBatched(*fromCubin, kSmokePrompts, 4);
  for (size_t i = 0; i < got.size(); ++i)
    for (size_t r = 0; r < got[i].size(); ++r)
      EXPECT_EQ(maxAbsDiff(got[i][r].data(), want[i][r].data(), kV), 0.0);
}

TEST_P(CudaSmoke, NoBinaryForThisDevice) {
  test::TempDir dir;
  SmokeSpec spec;
  spec.ptx = false;
  spec.cubins = {{"sm_10", {1, 2, 3}}};
  const std::string plan = writeSmokePlan(dir.path(), "foreign", spec);
  StatusOr<std::unique_ptr<Engine>> forced = Engine::load(plan, opts("cuda"));
  ASSERT_FALSE(forced.ok());
  EXPECT_NE(forced.message().find("has no cubin for " + arch() +
                                  " (only sm_10) and no PTX"),
            std::string::npos)
      << forced.message();
  testing::internal::CaptureStderr();
  std::unique_ptr<Engine> e = loadEngine(plan, opts("auto"));
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info().backend, "cpu");
  EXPECT_EQ(err.rfind("nf: CUDA unavailable (", 0), 0u) << err;
}

TEST_P(CudaSmoke, BadModulesAndLaunchesAreLoadErrors) {
  test::TempDir dir;
  auto error = [&](const SmokeSpec &spec) {
    StatusOr<std::unique_ptr<Engine>> e =
        Engine::load(writeSmokePlan(dir.path(), "bad", spec), opts("cuda"));
    EXPECT_FALSE(e.ok());
    if (!e.ok())
      std::cout << "[ cuda ] " << e.message() << "\n";
    return e.ok() ? std::string() : e.message();
  };
  SmokeSpec spec;
  spec.nopFunction = "smoke_missing";
  std::string m = error(spec);
  EXPECT_NE(m.find("prefill kernel 0 'nop' launch 0 (smoke_missing): "
                   "cuModuleGetFunction: "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("CUDA_ERROR_NOT_FOUND"), std::string::npos) << m;
  spec = {};
  spec.ptxText = "this is not PTX";
  m = error(spec);
  EXPECT_NE(m.find("prefill kernel 0 'nop': cuModuleLoadDataEx: "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("[PTX JIT]"), std::string::npos) << m;
  spec = {};
  spec.nopGrid = 1u << 20; // more blocks than can be resident at once
  m = error(spec);
  EXPECT_NE(m.find("cooperative grid of 1048576 blocks exceeds the"),
            std::string::npos)
      << m;

  // "auto": the CPU takes the plan the device refused, saying why.
  testing::internal::CaptureStderr();
  std::unique_ptr<Engine> e =
      loadEngine(writeSmokePlan(dir.path(), "bad", spec), opts("auto"));
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info().backend, "cpu");
  EXPECT_EQ(err.rfind("nf: CUDA unavailable (", 0), 0u) << err;
  EXPECT_NE(err.find("cooperative grid"), std::string::npos) << err;
}

/// PTX of the module globals that declare tensor map `d` (nf_abi.h).
std::string tensorMapPtx(const nf_tensor_map_desc &d) {
  const auto *bytes = reinterpret_cast<const unsigned char *>(&d);
  std::string s = "\n.global .align 8 .b8 nf_tensor_map_descs[" +
                  std::to_string(sizeof d) + "] = {";
  for (size_t i = 0; i < sizeof d; ++i)
    s += (i ? ", " : "") + std::to_string(bytes[i]);
  return s + "};\n.global .align 64 .b8 nf_tensor_maps[128];\n";
}

// A module that streams by TMA declares tensor maps (nf_abi.h); the engine
// encodes them when it loads the module, each checked to lie inside its
// source first: a map past the end of its weight, or of an unknown source,
// is a load error naming the kernel.
TEST_P(CudaSmoke, TensorMapsAreEncodedAndChecked) {
  test::TempDir dir;
  nf_tensor_map_desc d{};
  d.source = NF_TENSOR_MAP_WEIGHT;
  d.index = 0; // the embedding table, 32 x 8 f32: 1024 bytes
  d.dims[0] = 64;
  d.dims[1] = 1;
  d.stride = 128;
  d.box[0] = 64;
  d.box[1] = 1;
  SmokeSpec spec;
  spec.ptxText = std::string(kSmokePtx) + tensorMapPtx(d);
  {
    std::unique_ptr<Engine> e =
        loadEngine(writeSmokePlan(dir.path(), "maps", spec), opts("cuda"));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->info().backend, "cuda");
    auto rows = runBatched(*e, {kSmokePrompts[0]}, 1);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(
        maxAbsDiff(rows[0][0].data(), denseRow(kSmokePrompts[0][0]).data(), kV),
        0.0);
  }
  auto error = [&](const nf_tensor_map_desc &bad) {
    SmokeSpec s;
    s.ptxText = std::string(kSmokePtx) + tensorMapPtx(bad);
    StatusOr<std::unique_ptr<Engine>> e =
        Engine::load(writeSmokePlan(dir.path(), "bad", s), opts("cuda"));
    EXPECT_FALSE(e.ok());
    if (!e.ok())
      std::cout << "[ cuda ] " << e.message() << "\n";
    return e.ok() ? std::string() : e.message();
  };
  nf_tensor_map_desc past = d;
  past.dims[1] = 9; // 9 rows of 128 bytes
  std::string m = error(past);
  EXPECT_NE(m.find("prefill kernel 0 'nop': tensor map 0 does not fit its "
                   "source (1024 bytes)"),
            std::string::npos)
      << m;
  nf_tensor_map_desc unknown = d;
  unknown.source = 7;
  m = error(unknown);
  EXPECT_NE(m.find("prefill kernel 0 'nop': tensor map 0: unknown source 7"),
            std::string::npos)
      << m;
}

// Expert statistics need the select results in the arena when their kernel
// ends: outputs, or internal values nothing later in the kernel overwrites.
TEST_P(CudaSmoke, StatisticsNeedTheSelectResults) {
  test::TempDir dir;
  for (int variant = 0; variant < 2; ++variant) {
    SmokeSpec spec;
    spec.state = true;
    spec.selectOutputs = false;
    spec.clobberCounts = variant == 1;
    std::unique_ptr<Engine> e =
        loadEngine(writeSmokePlan(dir.path(), "stats", spec), opts("cuda"));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->info().expertStats, variant == 0);
    EXPECT_EQ(e->info().device.find("no expert statistics") !=
                  std::string::npos,
              variant == 1)
        << e->info().device;
    const int32_t seq = *e->addSequence();
    const std::vector<int32_t> toks = {1, 2, 3};
    std::vector<float> logits;
    StepStats stats;
    ASSERT_TRUE(
        stepOne(*e, seq, toks, LogitsFor::AllTokens, logits, &stats).ok());
    EXPECT_EQ(stats.expertCalls[0], variant == 0 ? 2 + 1 + 2 : 0);
    ASSERT_TRUE(e->removeSequence(seq).ok());
  }
}

/// Expected row of the state kernel for a sequence with `history` tokens
/// (the last one being the current token).
std::vector<float> stateRow(const std::vector<int32_t> &history, float budget,
                            int32_t override) {
  std::vector<float> row(kV, 0.0f);
  const int64_t pos = static_cast<int64_t>(history.size()) - 1;
  double run = 0;
  for (int32_t t : history)
    run += t;
  auto at = [&](int64_t p) { return p >= 0 ? float(history[p]) : 0.0f; };
  row[0] = float(history.back());
  row[1] = float(pos);
  row[2] = float(run);
  row[3] = float(run);
  row[4] = float(pos * (pos + 1) / 2);
  row[5] = at(pos - 2);
  row[6] = at(pos - 1);
  row[7] = at(pos);
  row[8] = budget;
  row[9] = float(override);
  row[10] = 1.0f;
  return row;
}

void checkStateRows(const std::vector<std::vector<std::vector<float>>> &got,
                    const std::vector<std::vector<int32_t>> &prompts,
                    int steps) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> history;
    ASSERT_EQ(got[i].size(), prompts[i].size() + steps);
    for (size_t r = 0; r < got[i].size(); ++r) {
      history.push_back(
          r < prompts[i].size()
              ? prompts[i][r]
              : static_cast<int32_t>(((r - prompts[i].size()) * 7 + i) % kV));
      const std::vector<float> want = stateRow(history, 1.0f, 0);
      EXPECT_EQ(maxAbsDiff(got[i][r].data(), want.data(), kV), 0.0)
          << "sequence " << i << " row " << r << ": got [" << got[i][r][0]
          << " " << got[i][r][1] << " " << got[i][r][2] << " " << got[i][r][3]
          << " " << got[i][r][4] << " " << got[i][r][5] << " " << got[i][r][6]
          << " " << got[i][r][7] << "]";
    }
  }
}

TEST_P(CudaSmoke, StateSlotsPagesAndStatistics) {
  test::TempDir dir;
  SmokeSpec spec;
  spec.state = true;
  const std::string plan = writeSmokePlan(dir.path(), "state", spec);
  std::unique_ptr<Engine> e = loadEngine(plan, opts("cuda"));
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(e->info().expertStats);
  EXPECT_EQ(e->info().topK, 2);
  EXPECT_EQ(e->info().numMoeLayers, 1);
  EXPECT_EQ(e->info().numExperts, 4);
  EXPECT_EQ(e->info().maxContext, 96 * 2);
  // Twice: the second time every slot and page has been used before (a new
  // sequence's state must start from zero).
  for (int round = 0; round < 2; ++round)
    checkStateRows(runBatched(*e, kSmokePrompts, 6), kSmokePrompts, 6);
  checkStateRows(runBatched(*e, kSmokePrompts, 3, /*oneAtATime=*/true),
                 kSmokePrompts, 3);

  // Small runs: sequences split across runs continue from their state; the
  // decode graph and plain launches agree.
  SmokeSpec small = spec;
  small.prefillTokens = 3;
  small.decodeTokens = 2;
  const std::string smallPlan = writeSmokePlan(dir.path(), "small", small);
  for (bool graphs : {true, false}) {
    EngineOptions o = opts("cuda");
    o.cudaGraphs = graphs;
    std::unique_ptr<Engine> s = loadEngine(smallPlan, o);
    ASSERT_NE(s, nullptr);
    checkStateRows(runBatched(*s, kSmokePrompts, 5), kSmokePrompts, 5);
  }

  // Statistics: counts 1 + token % 2; experts token % 4 and (token + 1) % 4.
  e->resetExpertUtilization();
  StatusOr<int32_t> a = e->addSequence(), b = e->addSequence();
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int32_t> ta = {1, 2, 3, 4, 5}, tb = {7, 7};
  std::vector<SequenceInput> in(2);
  in[0].sequence = *a;
  in[0].tokens = ta;
  in[0].expertBudget = 0.5f;
  in[1].sequence = *b;
  in[1].tokens = tb;
  in[1].expertBudget = 0.5f;
  StepStats stats;
  std::vector<float> logits;
  Status st = e->step(in, LogitsFor::AllTokens, logits, &stats);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(logits.size(), size_t(7 * kV));
  EXPECT_EQ(logits[8], 0.5f); // budget
  EXPECT_EQ(stats.expertCalls, (std::vector<int64_t>{2 + 1 + 2 + 1 + 2, 4}));
  ASSERT_EQ(stats.expertCallsPerLayer.size(), 2u);
  EXPECT_EQ(stats.expertCallsPerLayer[1], std::vector<int64_t>{4});
  EXPECT_DOUBLE_EQ(stats.budgetSpent[1], 4.0 / (2.0 * 1 * 2));
  std::vector<int64_t> used(4, 0);
  for (int32_t t : {1, 2, 3, 4, 5, 7, 7}) {
    ++used[t % 4];
    if (t % 2)
      ++used[(t + 1) % 4];
  }
  EXPECT_EQ(e->expertUtilization()[0], used);

  // Decode (graph) statistics and a static top-k override for the step.
  int32_t na = 9, nb = 10;
  in[0].tokens = {&na, 1};
  in[1].tokens = {&nb, 1};
  in[0].expertsPerToken = in[1].expertsPerToken = 1;
  st = e->step(in, LogitsFor::LastTokenPerSequence, logits, &stats);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(logits[9], 1.0f); // experts_per_token
  EXPECT_EQ(logits[kV + 9], 1.0f);
  EXPECT_EQ(stats.expertCalls, (std::vector<int64_t>{2, 1}));

  // One override per step on CUDA; nothing changes on error.
  in[1].expertsPerToken = 2;
  st = e->step(in, LogitsFor::LastTokenPerSequence, logits, &stats);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("one override per step"), std::string::npos)
      << st.message();
  EXPECT_EQ(e->sequenceLength(*a), 6);
  EXPECT_EQ(e->sequenceLength(*b), 3);
  // Overrides above the model's k are rejected as on the CPU.
  in[0].expertsPerToken = in[1].expertsPerToken = 3;
  EXPECT_FALSE(e->step(in, LogitsFor::LastTokenPerSequence, logits).ok());
  EXPECT_TRUE(e->removeSequence(*a).ok());
  EXPECT_TRUE(e->removeSequence(*b).ok());

  // Capacity errors are the CPU backend's.
  std::vector<int32_t> seqs;
  for (int i = 0; i < 8; ++i) {
    StatusOr<int32_t> s = e->addSequence();
    ASSERT_TRUE(s.ok());
    seqs.push_back(*s);
  }
  StatusOr<int32_t> ninth = e->addSequence();
  ASSERT_FALSE(ninth.ok());
  EXPECT_NE(ninth.message().find("all 8 sequence slots are in use"),
            std::string::npos);
  std::vector<int32_t> tooLong(200, 1);
  st = stepOne(*e, seqs[0], tooLong, LogitsFor::LastTokenPerSequence, logits);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exceed the context of 192"), std::string::npos)
      << st.message();
  for (int32_t s : seqs)
    EXPECT_TRUE(e->removeSequence(s).ok());
}

// A fork continues from a copy of its source's state and partly filled KV
// page (pages of 2 positions: a 3-token prefix fills page 0 and half of
// page 1), sharing page 0: both then see what a sequence that was never
// forked sees (the state kernel writes its conv window, running state and
// the sum of its K/V cells into the logits).
TEST_P(CudaSmoke, ForkedSequencesContinueFromACopy) {
  test::TempDir dir;
  SmokeSpec spec;
  spec.state = true;
  std::unique_ptr<Engine> e =
      loadEngine(writeSmokePlan(dir.path(), "fork", spec), opts("cuda"));
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prefix = {5, 9, 2};
  const std::vector<std::vector<int32_t>> next = {{7, 1}, {3}};
  std::vector<float> logits;
  // Unforked: prefix, then each continuation.
  std::vector<std::vector<float>> want;
  for (const auto &t : next) {
    StatusOr<int32_t> s = e->addSequence();
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(stepOne(*e, *s, prefix, LogitsFor::AllTokens, logits).ok());
    ASSERT_TRUE(stepOne(*e, *s, t, LogitsFor::AllTokens, logits).ok());
    want.push_back(logits);
    ASSERT_TRUE(e->removeSequence(*s).ok());
  }
  StatusOr<int32_t> a = e->addSequence();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(stepOne(*e, *a, prefix, LogitsFor::AllTokens, logits).ok());
  const int64_t freeBefore = e->cacheUsage().kvFreePages;
  StatusOr<int32_t> b = e->forkSequence(*a);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(e->cacheUsage().kvFreePages, freeBefore - 1);
  std::vector<SequenceInput> in = {{*a, next[0]}, {*b, next[1]}};
  Status st = e->step(in, LogitsFor::AllTokens, logits);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(logits.size(), size_t(3 * kV));
  EXPECT_EQ(std::vector<float>(logits.begin(), logits.begin() + 2 * kV),
            want[0]);
  EXPECT_EQ(std::vector<float>(logits.begin() + 2 * kV, logits.end()), want[1]);
  EXPECT_TRUE(e->removeSequence(*a).ok());
  EXPECT_TRUE(e->removeSequence(*b).ok());
}

// EngineOptions::gpuMemoryUtilization: the KV cache gets as many pages as
// fit in that share of the device's memory once the weights, the arena and
// the recurrent state are in place (a fake device of 600 MiB: the share
// less the sizing reserve of 256 MiB and the page tables' rows is what the
// engine may fill), and the
// steps run on them as on the plan's pages. A share that leaves nothing
// fails the load in one line.
TEST_P(CudaSmoke, KvCacheFillsTheMemoryShare) {
  if (GetParam() == "device")
    GTEST_SKIP() << "the fake device's memory is the test's";
  struct Env {
    Env() { setenv("NF_FAKE_CUDA_MEMORY_MIB", "600", 1); }
    ~Env() { unsetenv("NF_FAKE_CUDA_MEMORY_MIB"); }
  } env;
  test::TempDir dir;
  SmokeSpec spec;
  spec.state = true;
  const std::string plan = writeSmokePlan(dir.path(), "state", spec);
  void *h = dlopen(driver_.c_str(), RTLD_NOW);
  ASSERT_NE(h, nullptr);
  auto memInfo = reinterpret_cast<int (*)(size_t *, size_t *)>(
      dlsym(h, "cuMemGetInfo_v2"));
  ASSERT_NE(memInfo, nullptr);
  {
    EngineOptions o = opts("cuda");
    o.gpuMemoryUtilization = 0.5;
    std::unique_ptr<Engine> e = loadEngine(plan, o);
    ASSERT_NE(e, nullptr);
    const CacheUsage u = e->cacheUsage();
    EXPECT_GT(u.kvPages, 96) << "the plan's own count";
    // A sequence holds at most 65536 pages (the step arguments' rows).
    EXPECT_EQ(e->info().maxContext,
              std::min<int64_t>(u.kvPages, 65536) * u.kvPageSize);
    size_t free = 0, total = 0;
    ASSERT_EQ(memInfo(&free, &total), 0);
    const int64_t used = static_cast<int64_t>(total - free);
    const int64_t allowed = static_cast<int64_t>(total / 2);
    EXPECT_LE(used, allowed);
    EXPECT_GE(used, allowed - (int64_t{272} << 20)) << "pages left unused";
    for (int round = 0; round < 2; ++round)
      checkStateRows(runBatched(*e, kSmokePrompts, 6), kSmokePrompts, 6);
  }
  EngineOptions tight = opts("cuda");
  tight.gpuMemoryUtilization = 0.3; // 180 MiB: less than the reserve
  StatusOr<std::unique_ptr<Engine>> refused = Engine::load(plan, tight);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("leaves no room for the KV cache"),
            std::string::npos)
      << refused.message();
  dlclose(h);
}

INSTANTIATE_TEST_SUITE_P(Drivers, CudaSmoke,
                         ::testing::Values("device", "fake"),
                         [](const auto &info) { return info.param; });

} // namespace
