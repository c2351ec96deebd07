// nfrun eval-ppl: perplexity with the protocol of the pydoc-moe model card
// (examples/pydoc-moe/card.json, eval_ppl_by_topk): the first 65,537 tokens
// of the text encoded without BOS, 128 windows w = ids[512 i : 512 i + 513],
// each run from an empty state, mean NLL of tokens 1..512 of every window.
// A window's token 512 is only a target, so 512 tokens are fed per window;
// several windows run as separate sequences of one step (--batch). With
// --decode each window is fed one token a step, teacher-forced, as a server
// decodes (the expert budget then applies to one token of each sequence a
// step), --batch windows a step.
#include "commands.h"

#include "nf/file.h"

#include "nf/nf.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <unistd.h>

namespace nfrun {
namespace {

constexpr size_t kWindowStride = 512;
constexpr size_t kWindowTokens = 513;
constexpr size_t kProtocolTokens = 65537;
constexpr size_t kProtocolWindows = 128;

} // namespace

int runEvalPpl(const EvalPplFlags &f) {
  // A regular file of bounded size (a FIFO or /dev/zero is refused).
  nf::StatusOr<std::string> read = nf::readWholeFile(f.text);
  if (!read)
    return fail(read.message());
  std::string text = std::move(*read);

  nf::ModelParams mp = modelParams(f.common);
  mp.maxSequences = f.batch;
  auto loaded = nf::Model::load(f.common.plan, mp);
  if (!loaded)
    return fail(loaded.message());
  nf::Model &model = *loaded;
  const size_t vocab = static_cast<size_t>(model.vocabSize());
  const int32_t batch = std::max(1, std::min(f.batch, model.maxSequences()));

  auto t0 = std::chrono::steady_clock::now();
  auto encoded = model.tokenize(text, /*addSpecial=*/false);
  if (!encoded)
    return fail(encoded.message());
  std::vector<int32_t> ids = std::move(*encoded);
  if (ids.size() > kProtocolTokens)
    ids.resize(kProtocolTokens);
  if (ids.size() < kWindowTokens)
    return fail(f.text + ": " + std::to_string(ids.size()) +
                " tokens; a window needs " + std::to_string(kWindowTokens));
  size_t windows = std::min(kProtocolWindows, (ids.size() - 1) / kWindowStride);
  if (f.windows > 0)
    windows = std::min(windows, static_cast<size_t>(f.windows));

  const bool progress = isatty(fileno(stderr));
  double nll = 0.0;
  size_t scored = 0;
  int64_t expertCalls = 0;
  std::vector<float> logits;
  std::vector<int64_t> calls;
  for (size_t w0 = 0; w0 < windows; w0 += batch) {
    const size_t n = std::min(static_cast<size_t>(batch), windows - w0);
    std::vector<nf::SeqInput> inputs(n);
    for (size_t i = 0; i < n; ++i) {
      auto seq = model.addSequence();
      if (!seq)
        return fail(seq.message());
      const size_t begin = (w0 + i) * kWindowStride;
      inputs[i].seq = *seq;
      // Tokens 0..511 predict tokens 1..512; token 512 needs no logits.
      inputs[i].tokens.assign(ids.begin() + begin,
                              ids.begin() + begin + kWindowStride);
      inputs[i].expertsPerToken = f.topK;
      inputs[i].expertBudget = f.expertBudget;
    }
    // The NLL of target `target` under a row of logits.
    auto score = [&](const float *row, int32_t target) {
      double m = -INFINITY;
      for (size_t v = 0; v < vocab; ++v)
        m = std::max(m, static_cast<double>(row[v]));
      double sum = 0.0;
      for (size_t v = 0; v < vocab; ++v)
        sum += std::exp(static_cast<double>(row[v]) - m);
      nll += (m + std::log(sum)) - static_cast<double>(row[target]);
      ++scored;
    };
    if (f.decode) {
      // One token of every window a step; each row predicts the next.
      std::vector<nf::SeqInput> step = inputs;
      for (size_t t = 0; t < kWindowStride; ++t) {
        for (size_t i = 0; i < n; ++i)
          step[i].tokens = {inputs[i].tokens[t]};
        if (auto st = model.decode(step, /*allLogits=*/false, logits, &calls);
            !st)
          return fail(st.message());
        for (size_t i = 0; i < n; ++i) {
          score(logits.data() + i * vocab,
                ids[(w0 + i) * kWindowStride + t + 1]);
          expertCalls += calls[i];
        }
      }
    } else {
      if (auto st = model.decode(inputs, /*allLogits=*/true, logits, &calls);
          !st)
        return fail(st.message());
      for (size_t i = 0; i < n; ++i) {
        const size_t begin = (w0 + i) * kWindowStride;
        for (size_t t = 0; t < kWindowStride; ++t)
          score(logits.data() + (i * kWindowStride + t) * vocab,
                ids[begin + t + 1]);
        expertCalls += calls[i];
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (auto st = model.removeSequence(inputs[i].seq); !st)
        return fail(st.message());
    }
    if (progress)
      std::fprintf(stderr, "\rwindow %zu/%zu", w0 + n, windows);
  }
  auto t1 = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  if (progress)
    std::fprintf(stderr, "\n");

  const double meanNll = nll / static_cast<double>(scored);
  std::printf("perplexity: %.4f\n", std::exp(meanNll));
  std::printf("mean NLL: %.5f over %zu tokens (%zu windows of %zu)\n", meanNll,
              scored, windows, kWindowTokens);
  const std::string pattern = model.layerPattern();
  const int64_t moeLayers = std::count(pattern.begin(), pattern.end(), 'E');
  const int32_t k = model.expertsPerToken();
  const int64_t fed = static_cast<int64_t>(windows * kWindowStride);
  if (moeLayers == 0 || k <= 0)
    std::printf("routed-expert FLOPs: n/a (no MoE layers)\n");
  else if (expertCalls == 0)
    std::printf("routed-expert FLOPs: n/a (no expert calls reported)\n");
  else
    std::printf("routed-expert FLOPs: %.4f of static top-%d (%lld expert "
                "calls for %lld tokens x %lld MoE layers)\n",
                static_cast<double>(expertCalls) /
                    static_cast<double>(fed * k * moeLayers),
                k, static_cast<long long>(expertCalls),
                static_cast<long long>(fed), static_cast<long long>(moeLayers));
  std::printf("time: %.2f s (%.0f tokens/s)\n", secs,
              secs > 0 ? static_cast<double>(fed) / secs : 0.0);
  std::printf("backend: %s\n", model.backend().c_str());
  return 0;
}

} // namespace nfrun
