#include "cuda_test_util.h"

#include "backends/cuda/driver.h"

#include <algorithm>
#include <cstdlib>

namespace nf::test::gpu {

using namespace nf::test::integration;
using namespace nf::test::ref;

std::string envOr(const char *name, const std::string &fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

bool requireGpu() { return envOr("NF_CUDA_REQUIRE", "0") == "1"; }

std::string dataDir() { return envOr("NF_TEST_DATA_DIR", NF_TEST_DATA_DIR); }
std::string examplesDir() { return envOr("NF_EXAMPLES_DIR", NF_EXAMPLES_DIR); }
std::string modelDir(const std::string &name) {
  return name == "pydoc-moe" ? examplesDir() + "/pydoc-moe"
                             : dataDir() + "/fixtures/" + name;
}
std::string fakeDriver() { return envOr("NF_FAKE_CUDA", NF_FAKE_CUDA); }
std::string cudaPlan(const std::string &name) {
  return envOr("NF_CUDA_PLAN_DIR", NF_CUDA_PLAN_DIR) + "/" + name + ".nfb";
}

std::string cudaUnavailable() {
  StatusOr<const cuda::Driver *> d = cuda::loadDriver();
  if (!d)
    return d.message();
  StatusOr<cuda::DeviceInfo> dev = cuda::queryDevice(**d, 0);
  if (!dev)
    return dev.message();
  return "";
}

std::string deviceArch() {
  StatusOr<const cuda::Driver *> d = cuda::loadDriver();
  if (!d)
    return "";
  StatusOr<cuda::DeviceInfo> dev = cuda::queryDevice(**d, 0);
  return dev ? dev->arch() : "";
}

double wideDecodeDifference(Engine &single, const std::string &plan,
                            const std::string &modelDir,
                            const std::vector<Prompt> &prompts) {
  constexpr int n = 24; // > 16: the wide bucket
  const int64_t V = single.info().vocabSize;
  EngineOptions o = testOptions("cuda", modelDir);
  o.maxSequences = n;
  o.kvPages = 512;
  std::unique_ptr<Engine> wide = loadEngine(plan, o);
  EXPECT_NE(wide, nullptr);
  if (!wide)
    return -1;
  Engine &e = *wide;
  if (e.info().maxDecodeTokens < n)
    return -1;
  const std::vector<SingleRun> one =
      runOneAtATime(single, prompts, Feed::Reference);
  EXPECT_EQ(one.size(), prompts.size());
  if (one.size() != prompts.size())
    return -1;
  const size_t P = prompts.size();
  std::vector<int32_t> seqs(n);
  std::vector<SequenceInput> inputs(n);
  for (int i = 0; i < n; ++i) {
    StatusOr<int32_t> s = e.addSequence();
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s)
      return -1;
    seqs[i] = *s;
    inputs[i].sequence = seqs[i];
    inputs[i].tokens = prompts[i % P].tokens;
  }
  std::vector<float> logits;
  Status s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits);
  EXPECT_TRUE(s.ok()) << s.message();
  size_t S = prompts[0].greedyTokens.size();
  for (const Prompt &p : prompts)
    S = std::min(S, p.greedyTokens.size());
  std::vector<int32_t> next(n);
  double diff = 0;
  for (size_t st = 0; s.ok() && st < S; ++st) {
    for (int i = 0; i < n; ++i) {
      next[i] = static_cast<int32_t>(prompts[i % P].greedyTokens[st]);
      inputs[i].tokens = {&next[i], 1};
    }
    s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok() || logits.size() != size_t(n * V)) {
      ADD_FAILURE() << "wide decode step " << st << " failed";
      return -1;
    }
    for (int i = 0; i < n; ++i)
      diff = std::max(diff, relError(logits.data() + i * V,
                                     one[i % P].decode[st].data(), V));
  }
  for (int i = 0; i < n; ++i)
    EXPECT_TRUE(e.removeSequence(seqs[i]).ok());
  return diff;
}

TwinSteps::TwinSteps(Engine &gpu, Engine &cpu) : gpu_(gpu), cpu_(cpu) {}

bool TwinSteps::add(const std::vector<std::vector<int32_t>> &prompts) {
  for (const std::vector<int32_t> &p : prompts) {
    StatusOr<int32_t> g = gpu_.addSequence(), c = cpu_.addSequence();
    if (!g.ok() || !c.ok()) {
      ADD_FAILURE() << "adding a sequence: " << g.message() << c.message();
      return false;
    }
    gs_.push_back(*g);
    cs_.push_back(*c);
    tokens_.push_back(p);
  }
  return true;
}

bool TwinSteps::step(const std::vector<std::vector<int32_t>> *inputs) {
  const size_t n = gs_.size();
  const std::vector<std::vector<int32_t>> &in = inputs ? *inputs : tokens_;
  if (in.size() != n) {
    ADD_FAILURE() << in.size() << " inputs for " << n << " sequences";
    return false;
  }
  std::vector<SequenceInput> ig(n), ic(n);
  for (size_t i = 0; i < n; ++i) {
    ig[i].sequence = gs_[i];
    ic[i].sequence = cs_[i];
    ig[i].tokens = ic[i].tokens = in[i];
  }
  std::vector<float> lg, lc;
  const Status sg = gpu_.step(ig, LogitsFor::LastTokenPerSequence, lg);
  const Status sc = cpu_.step(ic, LogitsFor::LastTokenPerSequence, lc);
  const size_t V = static_cast<size_t>(cpu_.info().vocabSize);
  if (!sg.ok() || !sc.ok() || lg.size() != n * V || lc.size() != n * V) {
    ADD_FAILURE() << "step of " << n << " sequences: cuda " << sg.message()
                  << ", cpu " << sc.message() << " (" << lg.size() << " and "
                  << lc.size() << " logits)";
    return false;
  }
  rows_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    rows_[i] = ref::relError(lg.data() + i * V, lc.data() + i * V, V);
    tokens_[i] = {ref::argmax(lc.data() + i * V, static_cast<int64_t>(V))};
  }
  return true;
}

bool TwinSteps::clear() {
  bool ok = true;
  for (size_t i = 0; i < gs_.size(); ++i)
    ok = gpu_.removeSequence(gs_[i]).ok() && cpu_.removeSequence(cs_[i]).ok() &&
         ok;
  if (!ok)
    ADD_FAILURE() << "removing the sequences";
  gs_.clear();
  cs_.clear();
  tokens_.clear();
  rows_.clear();
  return ok;
}

} // namespace nf::test::gpu
