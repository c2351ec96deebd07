#include "engine_test_util.h"

#include <cmath>

namespace nf::test::integration {

using namespace nf::test::ref;

EngineOptions testOptions(const std::string &backend,
                          const std::string &weightsDir) {
  EngineOptions o;
  o.backend = backend;
  o.weightsDir = weightsDir;
  o.numThreads = 1;
  o.kvPages = 96;
  o.maxSequences = 8;
  return o;
}

std::unique_ptr<Engine> loadEngine(const std::string &plan,
                                   const EngineOptions &o) {
  StatusOr<std::unique_ptr<Engine>> e = Engine::load(plan, o);
  EXPECT_TRUE(e.ok()) << e.message();
  return e ? std::move(*e) : nullptr;
}

Status stepOne(Engine &e, int32_t seq, std::span<const int32_t> tokens,
               LogitsFor which, std::vector<float> &logits, StepStats *stats,
               int32_t expertsPerToken) {
  SequenceInput in;
  in.sequence = seq;
  in.tokens = tokens;
  in.expertsPerToken = expertsPerToken;
  return e.step({&in, 1}, which, logits, stats);
}

double maxAbsDiff(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i)
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

std::vector<SingleRun>
runOneAtATime(Engine &e, const std::vector<Prompt> &prompts, Feed feed) {
  const int64_t V = e.info().vocabSize;
  std::vector<SingleRun> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    StatusOr<int32_t> seq = e.addSequence();
    EXPECT_TRUE(seq.ok()) << seq.message();
    if (!seq)
      return {};
    Status s = stepOne(e, *seq, prompts[i].tokens, LogitsFor::AllTokens,
                       out[i].prefill);
    EXPECT_TRUE(s.ok()) << s.message();
    int32_t tok = argmax(
        out[i].prefill.data() + int64_t(prompts[i].tokens.size() - 1) * V, V);
    for (size_t st = 0; st < prompts[i].greedyTokens.size(); ++st) {
      if (feed == Feed::Reference)
        tok = static_cast<int32_t>(prompts[i].greedyTokens[st]);
      std::vector<float> l;
      s = stepOne(e, *seq, {&tok, 1}, LogitsFor::LastTokenPerSequence, l);
      EXPECT_TRUE(s.ok()) << s.message();
      if (feed == Feed::Argmax)
        tok = argmax(l.data(), V);
      out[i].decode.push_back(std::move(l));
    }
    EXPECT_TRUE(e.removeSequence(*seq).ok());
  }
  return out;
}

} // namespace nf::test::integration
