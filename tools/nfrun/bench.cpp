// nfrun bench: decode and prefill throughput of a plan next to its roofline.
//
// Decode: B sequences with a context of C tokens, then timed single-token
// steps; the roofline is the bytes a step must move (the non-routed weights,
// the routed experts the step actually touched, recurrent state read and
// written, the KV cache read) over the device-to-device copy bandwidth given
// with --copy-bandwidth (measured in the same run, bench/run_gpu_bench.sh).
// Prefill: one prompt of L tokens; the roofline is its FLOPs (2 x active
// parameters per token + attention) over the bf16 matmul rate given with
// --matmul-rate. Speed is reported, never asserted.
#include "commands.h"

#include "nf/file.h"

#include "nf/nf.h"
#include "nf/plan_attrs.h"
#include "nf/plan_ops.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace nfrun {
namespace {

namespace pl = nf::plan;
using Clock = std::chrono::steady_clock;

int64_t dtypeBytes(pl::DType t) {
  return t == pl::DType::F32 || t == pl::DType::I32 ? 4
         : t == pl::DType::I64                      ? 8
         : t == pl::DType::F8E4M3                   ? 1
                                                    : 2;
}

/// The bytes a step reads of weight w's n elements: quantised weights their
/// codes (FP8 one byte, int4 half) and their f32 scales (FP8: one per row,
/// as the CUDA kernels read them; int4: one per row and group).
int64_t weightBytes(const pl::Weight &w, int64_t n) {
  const pl::WeightQuant *q = w.quant();
  if (!q)
    return n * dtypeBytes(w.dtype());
  const int64_t cols = w.shape()->Get(w.shape()->size() - 1);
  const int64_t rows = cols > 0 ? n / cols : 0;
  if (q->scheme() == pl::QuantScheme::Int4)
    return n / 2 +
           rows * (q->group_size() > 0 ? cols / q->group_size() : 1) * 4;
  return n + rows * 4;
}

std::vector<double> parseBudgets(const std::string &s) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty())
      out.push_back(std::stod(item));
  return out;
}

std::vector<int64_t> parseList(const std::string &s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty())
      out.push_back(std::stoll(item));
  return out;
}

/// What one token costs, read off the plan.
struct Shape {
  int64_t vocab = 0, hidden = 0;
  int64_t denseBytes = 0; // every non-expert weight but the embedding
  int64_t denseParams = 0;
  std::vector<int64_t>
      expertBytes; // per MoE layer: bytes of one routed expert (up+down)
  std::vector<int64_t> expertParams; // per MoE layer
  int64_t topK = 0;
  int64_t stateBytesPerSeq = 0;          // Mamba conv + SSM state, f32
  int64_t kvBytesPerToken = 0;           // K and V of every attention layer
  // A tiered cache (--kv-hot-window): the positions whose pages stay bf16,
  // and K and V of every layer a token there.
  int64_t hotWindow = 0, hotBytesPerToken = 0;
  int64_t attnLayers = 0, attnWidth = 0; // nq * hd
  int64_t pageSize = 16;
};

/// K and V bytes a decode step reads for a sequence of `context` tokens:
/// a tiered cache's pages that hold its last hotWindow positions (about
/// hotWindow + half a page) are bf16.
double kvBytesRead(const Shape &s, int64_t context) {
  if (s.hotWindow <= 0)
    return static_cast<double>(context) * s.kvBytesPerToken;
  const int64_t hot = std::min(context, s.hotWindow + s.pageSize / 2);
  return static_cast<double>(hot) * s.hotBytesPerToken +
         static_cast<double>(context - hot) * s.kvBytesPerToken;
}

bool readShape(const std::string &path, Shape &s, std::string &error) {
  nf::StatusOr<std::string> data = nf::readWholeFile(path, uint64_t{4} << 30);
  if (!data) {
    error = data.message();
    return false;
  }
  const std::vector<uint8_t> bytes(data->begin(), data->end());
  flatbuffers::Verifier v(bytes.data(), bytes.size(), 64, 10'000'000);
  if (bytes.size() < 8 || !pl::VerifyPlanBuffer(v)) {
    error = path + ": not a valid plan";
    return false;
  }
  const pl::Plan *plan = pl::GetPlan(bytes.data());
  s.vocab = plan->config()->vocab_size();
  s.hidden = plan->config()->hidden_size();
  std::map<std::string, int64_t> expertsByLayer; // "layers.N." -> bytes/expert
  std::map<std::string, int64_t> expertParamsByLayer;
  for (const pl::Weight *w : *plan->weights()) {
    int64_t n = 1;
    for (int64_t d : *w->shape())
      n *= d;
    const int64_t b = weightBytes(*w, n);
    const std::string first = w->tensors()->Get(0)->str();
    if (w->stacked()) {
      const int64_t e = w->shape()->Get(0);
      const std::string layer = first.substr(0, first.find(".mixer."));
      expertsByLayer[layer] += b / e;
      expertParamsByLayer[layer] += n / e;
    } else if (first.find("embeddings") == std::string::npos) {
      s.denseBytes += b;
      s.denseParams += n;
    }
  }
  for (auto &[layer, b] : expertsByLayer) {
    s.expertBytes.push_back(b);
    s.expertParams.push_back(expertParamsByLayer[layer]);
  }
  for (const pl::Storage *st : *plan->storage()) {
    if (st->kind() == pl::StorageKind::KVCache) {
      // K and V; an fp8 row has an f32 scale per kv head besides.
      s.kvBytesPerToken += 2 * st->kv_heads() *
                           (st->head_dim() * dtypeBytes(st->dtype()) +
                            (st->dtype() == pl::DType::F8E4M3 ? 4 : 0));
      s.pageSize = st->page_size();
      s.hotWindow = st->hot_window();
      s.hotBytesPerToken += 2 * st->kv_heads() * st->head_dim() * 2;
      ++s.attnLayers;
    } else {
      s.stateBytesPerSeq +=
          4 * (st->conv_dim() * st->conv_window() +
               st->num_heads() * st->head_dim() * st->state_size());
    }
  }
  for (const pl::Kernel *k : *plan->decode()->kernels())
    for (const pl::Op *op : *k->ops())
      if (pl::opCode(*op) == pl::OpCode::KvAttend)
        if (std::optional<int64_t> h = pl::intAttr(*op, pl::attr::NumHeads))
          s.attnWidth = *h;
  return true;
}

int check(nf_status st) {
  return st == NF_OK ? 0 : fail(std::string(nf_last_error()));
}

} // namespace

int runBench(const BenchFlags &f) {
  Shape shape;
  std::string error;
  if (!readShape(f.common.plan, shape, error))
    return fail(error);
  nf_model_params p = nf_model_default_params();
  p.weights_dir = f.common.weightsDir.c_str();
  p.n_threads = f.common.threads;
  p.backend = f.common.backend.c_str();
  p.budget_scope = f.common.budgetScope.c_str();
  p.distinct_expert_cap = f.common.distinctExpertCap;
  const std::vector<int64_t> batches = parseList(f.batches);
  const std::vector<int64_t> prompts = parseList(f.prefill);
  std::vector<double> budgets;
  try {
    budgets = parseBudgets(f.expertBudgets);
  } catch (const std::exception &) {
    return fail("--expert-budget: expected numbers in (0, 1], got '" +
                f.expertBudgets + "'");
  }
  for (double b : budgets)
    if (!(b > 0.0 && b <= 1.0)) {
      char text[64];
      std::snprintf(text, sizeof text, "--expert-budget: %g is outside (0, 1]",
                    b);
      return fail(text);
    }
  if (budgets.empty())
    budgets.push_back(0.0); // the plan's default
  int64_t maxB = 1;
  for (int64_t b : batches)
    maxB = std::max(maxB, b);
  p.max_sequences = static_cast<int32_t>(maxB);
  // KV pages for maxB sequences of context + timed steps of every budget
  // (they run on the same sequences, whose context grows) + warm-up.
  const int64_t timedSteps =
      f.steps * static_cast<int64_t>(std::max<size_t>(budgets.size(), 1));
  // Prefill runs one prompt at a time: at least that prompt's pages.
  int64_t longest = 0;
  for (int64_t len : prompts)
    longest = std::max(longest, len);
  auto pagesFor = [&](int64_t tokens) {
    return (tokens + shape.pageSize - 1) / shape.pageSize + 1;
  };
  // A tiered cache's pages are units, and a step allocates its pages hot,
  // two units each, before the next compresses the older ones.
  p.kv_pages = static_cast<int32_t>(
      (std::max(maxB * pagesFor(f.context + timedSteps + 4),
                pagesFor(longest)) +
       16) *
      (shape.hotWindow > 0 ? 2 : 1));
  if (f.gpuMemoryUtilization > 0.0) {
    p.kv_pages = 0;
    p.gpu_memory_utilization = f.gpuMemoryUtilization;
  }
  p.synthetic_weights = f.syntheticWeights ? 1 : 0;
  p.synthetic_seed = f.seed;
  nf_model *m = nullptr;
  if (int rc = check(nf_model_load(f.common.plan.c_str(), &p, &m)))
    return rc;
  if (f.gpuMemoryUtilization > 0.0)
    std::printf("KV cache at gpu memory utilization %.2f: %lld pages, %lld "
                "tokens of context in all, %d sequence slots\n\n",
                f.gpuMemoryUtilization,
                static_cast<long long>(nf_model_kv_pages(m)),
                static_cast<long long>(nf_model_max_context(m)),
                nf_model_max_sequences(m));
  shape.topK = nf_model_experts_per_token(m);
  const int32_t V = nf_model_vocab_size(m);
  std::mt19937 rng(static_cast<uint32_t>(f.seed));
  std::uniform_int_distribution<int32_t> token(3, V - 1);
  const int64_t E = nf_model_n_experts(m), L = nf_model_n_moe_layers(m);
  std::vector<int64_t> usedBefore(static_cast<size_t>(E * L)),
      usedAfter(static_cast<size_t>(E * L));

  std::printf("| measurement | nf tok/s | ms/step | roofline tok/s | of "
              "roofline | routed experts a step loads |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | --- |\n");

  // Prefill: one prompt, last token's logits.
  for (int64_t len : prompts) {
    std::vector<int32_t> ids(static_cast<size_t>(len));
    for (int32_t &t : ids)
      t = token(rng);
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      int32_t seq = 0;
      if (int rc = check(nf_seq_add(m, &seq)))
        return rc;
      nf_seq_input in{seq, ids.data(), static_cast<int32_t>(len), 0.0f, 0};
      nf_batch batch{&in, 1, nullptr};
      auto t0 = Clock::now();
      if (int rc = check(nf_decode(m, &batch, nullptr, 0, 0)))
        return rc;
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep > 0) // the first run warms up
        best = std::min(best, s);
      if (int rc = check(nf_seq_remove(m, seq)))
        return rc;
    }
    // FLOPs: 2 x active parameters per token, plus causal attention
    // (QK^T and PV: 2 x 2 x L^2/2 x width per layer).
    int64_t activeParams =
        shape.denseParams -
        shape.vocab * shape.hidden; // lm_head: last token only
    for (int64_t e : shape.expertParams)
      activeParams += shape.topK * e;
    const double flops =
        2.0 * activeParams * len + 2.0 * shape.vocab * shape.hidden +
        2.0 * len * len * shape.attnWidth * 128 * shape.attnLayers;
    const double roof = f.matmulRate > 0 ? f.matmulRate / flops * len : 0.0;
    std::printf("| prefill %" PRId64
                " tokens | %.0f | %.1f | %.0f | %.0f%% | |\n",
                len, len / best, best * 1e3, roof,
                roof > 0 ? 100.0 * (len / best) / roof : 0.0);
    std::fflush(stdout);
  }

  // Decode: B sequences, context C, timed single-token steps.
  for (int64_t B : batches) {
    std::vector<int32_t> seqs(static_cast<size_t>(B));
    std::vector<std::vector<int32_t>> ctx(static_cast<size_t>(B));
    std::vector<nf_seq_input> in(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) {
      if (int rc = check(nf_seq_add(m, &seqs[i])))
        return rc;
      ctx[i].resize(static_cast<size_t>(f.context));
      for (int32_t &t : ctx[i])
        t = token(rng);
      in[i] = {seqs[i], ctx[i].data(), static_cast<int32_t>(f.context), 0.0f,
               0};
    }
    nf_batch batch{in.data(), static_cast<int32_t>(B), nullptr};
    if (int rc = check(nf_decode(m, &batch, nullptr, 0, 0)))
      return rc;
    std::vector<int32_t> next(static_cast<size_t>(B));
    for (int32_t &t : next)
      t = token(rng);
    // --sample: one sampler per sequence, seeded apart; its tokens are the
    // next step's.
    std::vector<nf_sampler *> samplers;
    struct FreeSamplers {
      std::vector<nf_sampler *> &s;
      ~FreeSamplers() {
        for (nf_sampler *x : s)
          nf_sampler_free(x);
      }
    } freeSamplers{samplers};
    if (f.sample)
      for (int64_t i = 0; i < B; ++i) {
        nf_sampler_params sp = nf_sampler_default_params();
        sp.temperature = f.temperature;
        sp.top_k = f.topK;
        sp.top_p = f.topP;
        sp.seed = f.seed + static_cast<uint64_t>(i);
        nf_sampler *x = nullptr;
        if (int rc = check(nf_sampler_create(&sp, &x)))
          return rc;
        samplers.push_back(x);
      }
    std::vector<int32_t> sampled(static_cast<size_t>(B));
    float budget = 0.0f;
    auto feed = [&]() {
      for (int64_t i = 0; i < B; ++i)
        in[i] = {seqs[i], &next[i], 1, budget, 0};
      if (!f.sample) {
        for (int32_t &t : next)
          t = token(rng);
        return check(nf_decode(m, &batch, nullptr, 0, 0));
      }
      if (int rc = check(
              nf_decode_sample(m, &batch, samplers.data(), sampled.data())))
        return rc;
      for (int64_t i = 0; i < B; ++i)
        next[i] = sampled[i] >= 0 ? sampled[i] : token(rng);
      return 0;
    };
    for (int w = 0; w < 2; ++w)
      if (int rc = feed())
        return rc;
    // Each budget times its own steps on the same sequences (their
    // context grows by --steps each).
    for (double b : budgets) {
      budget = static_cast<float>(b);
      // Routed experts a step touches: the distinct experts of each timed
      // step from the utilisation counters, averaged; without counters (a
      // backend that keeps none) the expectation under uniform routing,
      // E (1 - (1 - k/E)^B).
      double distinctPerStep = 0.0; // summed over MoE layers, weighted by bytes
      double expertBytes = 0.0;
      auto t0 = Clock::now();
      double busy = 0.0;
      for (int64_t s = 0; s < f.steps; ++s) {
        if (int rc = check(nf_model_expert_utilization(m, usedBefore.data(),
                                                       usedBefore.size())))
          return rc;
        auto a = Clock::now();
        if (int rc = feed())
          return rc;
        busy += std::chrono::duration<double>(Clock::now() - a).count();
        if (int rc = check(nf_model_expert_utilization(m, usedAfter.data(),
                                                       usedAfter.size())))
          return rc;
        for (int64_t l = 0; l < L; ++l) {
          int64_t distinct = 0;
          for (int64_t e = 0; e < E; ++e)
            distinct += usedAfter[l * E + e] > usedBefore[l * E + e];
          expertBytes += static_cast<double>(distinct) * shape.expertBytes[l];
          distinctPerStep += static_cast<double>(distinct);
        }
      }
      (void)t0;
      const double step = busy / f.steps;
      expertBytes /= f.steps;
      if (distinctPerStep == 0.0 && E > 0)
        for (int64_t l = 0; l < L; ++l)
          expertBytes +=
              E *
              (1.0 - std::pow(1.0 - static_cast<double>(shape.topK) / E,
                              static_cast<double>(B))) *
              shape.expertBytes[l];
      const double bytes = static_cast<double>(shape.denseBytes) + expertBytes +
                           2.0 * B * shape.stateBytesPerSeq +
                           static_cast<double>(B) *
                               kvBytesRead(shape, f.context + f.steps / 2) +
                           static_cast<double>(B) * shape.hidden * 2;
      const double roofStep =
          f.copyBandwidth > 0 ? bytes / f.copyBandwidth : 0.0;
      char sampling[96] = "";
      if (f.sample)
        std::snprintf(sampling, sizeof sampling,
                      ", sampled: temperature %g, top-k %d, top-p %g",
                      static_cast<double>(f.temperature), f.topK,
                      static_cast<double>(f.topP));
      // The distinct experts of a MoE layer in a step, beside what a
      // load-balanced router would touch: E (1 - (1 - k/E)^B).
      char experts[128] = "";
      if (E > 0 && L > 0) {
        const double uniform =
            E * (1.0 - std::pow(1.0 - static_cast<double>(shape.topK) / E,
                                static_cast<double>(B)));
        if (distinctPerStep > 0.0)
          std::snprintf(experts, sizeof experts,
                        "%.1f of %" PRId64 " a layer (uniform routing: %.1f)",
                        distinctPerStep / (static_cast<double>(f.steps) * L), E,
                        uniform);
        else
          std::snprintf(experts, sizeof experts,
                        "not counted; roofline assumes %.1f of %" PRId64,
                        uniform, E);
      }
      char budgetText[48] = "";
      if (budget > 0.0f)
        std::snprintf(budgetText, sizeof budgetText, ", expert budget %g",
                      static_cast<double>(budget));
      std::printf("| decode batch %" PRId64 " (context %" PRId64
                  "%s%s) | %.0f | %.2f | %.0f | %.0f%% | %s |\n",
                  B, f.context, budgetText, sampling, B / step, step * 1e3,
                  roofStep > 0 ? B / roofStep : 0.0,
                  roofStep > 0 ? 100.0 * roofStep / step : 0.0, experts);
      std::fflush(stdout);
    }
    for (int32_t s : seqs)
      if (int rc = check(nf_seq_remove(m, s)))
        return rc;
  }
  nf_model_free(m);
  return 0;
}

} // namespace nfrun
