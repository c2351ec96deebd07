// C API: samplers and generation.
#include "capi/capi.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

using namespace nf;
using nf::capi::fail;
using nf::capi::guard;
using nf::capi::guardValue;

namespace {

/// Removes a sequence when it goes out of scope.
class SequenceGuard {
public:
  SequenceGuard(nf_model *model, int32_t id) : model_(model), id_(id) {}
  ~SequenceGuard() {
    model_->liveSequences.erase(id_);
    (void)model_->engine->removeSequence(id_);
  }
  SequenceGuard(const SequenceGuard &) = delete;
  SequenceGuard &operator=(const SequenceGuard &) = delete;

private:
  nf_model *model_;
  int32_t id_;
};

/// The bytes that `token` adds to the text of `history` (the tokens before
/// it): the decode of a short tail with and without the token, so that
/// decoders that join or merge tokens stream correctly.
std::string newBytes(const Tokenizer &tok, const std::vector<int32_t> &history,
                     int32_t token) {
  constexpr size_t kTail = 8;
  size_t begin = history.size() > kTail ? history.size() - kTail : 0;
  std::vector<int32_t> tail(history.begin() + begin, history.end());
  std::string before = tok.decodeBytes(tail, /*skipSpecial=*/true);
  tail.push_back(token);
  std::string after = tok.decodeBytes(tail, /*skipSpecial=*/true);
  if (after.size() >= before.size() &&
      after.compare(0, before.size(), before) == 0)
    return after.substr(before.size());
  return tok.decodeBytes({token}, /*skipSpecial=*/true);
}

/// The next token of input `i` of the model's last step: from its top list
/// where the step returned lists and the list decides, else from its row.
/// The sampler's own errors (no logit above -inf) are returned; the
/// engine's (the row's copy from the device) and internal ones go to
/// `fatal`.
/// Row `row` of the step's logits (model->logits), checked.
StatusOr<std::span<const float>> logitsRow(nf_model *model, size_t row) {
  const size_t vocab = static_cast<size_t>(model->engine->info().vocabSize);
  if (model->logits.size() < (row + 1) * vocab)
    return Status::error("internal: the engine returned " +
                         std::to_string(model->logits.size()) + " logits");
  return std::span<const float>(model->logits.data() + row * vocab, vocab);
}

/// The last-token row of input `i` (row `row` of the step's logits, or,
/// after a step of top lists, fetched from the device into model->row).
StatusOr<std::span<const float>> lastRow(nf_model *model, size_t i,
                                         size_t row) {
  if (model->top.k == 0)
    return logitsRow(model, row);
  model->row.resize(static_cast<size_t>(model->engine->info().vocabSize));
  if (Status s = model->engine->lastTokenRow(i, model->row); !s)
    return s;
  return std::span<const float>(model->row);
}

/// `row`: input i's last-token row among the step's logits (i, unless the
/// step returned every token's row).
StatusOr<int32_t> sampleInput(nf_model *model, size_t i, size_t row,
                              sampling::Sampler &sampler, Status &fatal) {
  const size_t vocab = static_cast<size_t>(model->engine->info().vocabSize);
  const size_t k = static_cast<size_t>(model->top.k);
  if (k == 0) {
    auto r = logitsRow(model, row);
    if (!r) {
      fatal = r.status();
      return fatal;
    }
    return sampler.sample(*r);
  }
  if (model->top.ids.size() < (i + 1) * k ||
      model->top.values.size() < (i + 1) * k) {
    fatal =
        Status::error("internal: top lists of " +
                      std::to_string(model->top.ids.size() / k) + " sequences");
    return fatal;
  }
  // A noisy list is ranked for one draw: a sampler that appears twice in
  // the batch has moved on to the next draw by its second entry.
  const TopNoise none;
  const TopNoise &want =
      i < model->top.noise.size() ? model->top.noise[i] : none;
  const bool noisy = want.keys;
  const auto z = sampler.noiseDraw();
  const bool current =
      !noisy || (z && z->seed == want.seed && z->draw == want.draw &&
                 z->temperature == want.temperature);
  if (current) {
    StatusOr<std::optional<int32_t>> t = sampler.sampleTop(
        std::span<const int32_t>(model->top.ids.data() + i * k, k),
        std::span<const float>(model->top.values.data() + i * k, k),
        static_cast<int64_t>(vocab), noisy,
        i < model->top.totals.size()
            ? model->top.totals[i]
            : std::numeric_limits<double>::quiet_NaN());
    if (!t)
      return t.status();
    if (*t)
      return **t;
  }
  // The list cannot decide: the row, still on the device.
  model->row.resize(vocab);
  if (Status s = model->engine->lastTokenRow(i, model->row); !s) {
    fatal = s;
    return fatal;
  }
  return sampler.sample(model->row);
}

/// Steps whose rows hold this many logits in all (vocabulary x sequences)
/// get top lists for samplers that rank by the logit: fewer copy back
/// faster than the device ranks them (pydoc-moe, 4,096 tokens: 0.20 against
/// 0.24 ms a greedy step at batch 1 on the H200), more do not (pydoc-moe at
/// batch 64: 1.16 ms a greedy step with rows, 0.49 with the lists of a
/// temperature sampler; Nano, 131,072 tokens: 3.31 against 3.17 at batch
/// 1). A temperature-only sampler gets them at any size: the host's draw
/// from a row computes the noise of every token.
constexpr int64_t kTopLogitsMinRowLogits = 32768;

/// What the next step returns for samplers that read only each sequence's
/// last token: top lists where every sampler can draw from them, and the
/// vocabulary is large or a sampler's list is noisy (NF_CUDA_TOP_LOGITS=1:
/// at any size). Sets model->top.noise for the samplers' next draws.
LogitsFor logitsForSamplers(nf_model *model,
                            std::span<const sampling::Sampler *const> s) {
  model->top.noise.clear();
  const ModelInfo &info = model->engine->info();
  const int32_t k = info.topLogits;
  bool noisy = false, totals = false, any = false;
  for (const sampling::Sampler *x : s) {
    if (!x)
      continue;
    any = true;
    if (!x->samplesFromTop(k, info.topLogitsNoise, info.topLogitsTotals))
      return LogitsFor::LastTokenPerSequence;
    noisy = noisy || (info.topLogitsNoise && x->noiseDraw());
    totals = totals || x->needsRowTotal();
  }
  if (!any) // a step of prompt chunks only
    return LogitsFor::None;
  const char *env = std::getenv("NF_CUDA_TOP_LOGITS");
  if (info.vocabSize * static_cast<int64_t>(s.size()) <
          kTopLogitsMinRowLogits &&
      !noisy && !(env && std::string_view(env) == "1"))
    return LogitsFor::LastTokenPerSequence;
  if (noisy || totals)
    for (const sampling::Sampler *x : s) {
      TopNoise z;
      if (!x) {
        // nothing drawn from this entry's list
      } else if (const auto d = x->noiseDraw()) {
        z = {d->temperature, d->seed, d->draw, /*keys=*/true, /*total=*/false};
      } else if (x->needsRowTotal()) {
        z.temperature = x->params().temperature;
        z.total = true;
      }
      model->top.noise.push_back(z);
    }
  return LogitsFor::LastTokenTop;
}

} // namespace

namespace nf::capi {

nf_status decodeSample(nf_model *model, const nf_batch *batch,
                       nf_sampler *const *samplers, int32_t *tokensOut,
                       std::span<EntryOptions> options) {
  if (!model || !batch || !samplers || !tokensOut)
    return fail(NF_ERR_INVALID_ARGUMENT,
                "nf_decode_sample: NULL model, batch, samplers or tokens");
  if (batch->n_seqs <= 0 || !batch->seqs)
    return fail(NF_ERR_INVALID_ARGUMENT,
                "nf_decode_sample: the batch needs at least one sequence");
  if (!options.empty() && options.size() != static_cast<size_t>(batch->n_seqs))
    return fail(NF_ERR_INTERNAL, "nf_decode_sample: options for " +
                                     std::to_string(options.size()) + " of " +
                                     std::to_string(batch->n_seqs) +
                                     " entries");
  // NULL entries draw nothing (prompt chunks before their last).
  std::vector<const sampling::Sampler *> s;
  for (int32_t i = 0; i < batch->n_seqs; ++i)
    s.push_back(samplers[i] ? &samplers[i]->sampler : nullptr);
  // Entries whose row is adjusted on the host before the draw.
  auto penalized = [&](size_t i) {
    if (options.empty() || !samplers[i])
      return false;
    const EntryOptions &o = options[i];
    return (o.penalties && o.penalties->active()) || o.constraint;
  };
  bool anyPenalized = false;
  for (size_t i = 0; i < s.size(); ++i)
    anyPenalized = anyPenalized || penalized(i);
  const bool everyRow =
      std::any_of(options.begin(), options.end(),
                  [](const EntryOptions &e) { return !e.fedTargets.empty(); });
  const LogitsFor which = everyRow       ? LogitsFor::AllTokens
                          : anyPenalized ? LogitsFor::LastTokenPerSequence
                                         : logitsForSamplers(model, s);
  if (nf_status st =
          runStep(model, batch->seqs, batch->n_seqs, which, batch->expert_calls,
                  batch->expert_calls_per_layer);
      st != NF_OK)
    return st;
  auto entryError = [](int32_t i, const std::string &why) {
    return "nf_decode_sample: batch entry " + std::to_string(i) + ": " + why;
  };
  std::vector<float> adjusted; // a penalized entry's row
  size_t base = 0;             // the entry's first row among every token's
  for (int32_t i = 0; i < batch->n_seqs; ++i) {
    const size_t n = static_cast<size_t>(batch->seqs[i].n_tokens);
    const size_t row = everyRow ? base + n - 1 : static_cast<size_t>(i);
    base += n;
    if (!options.empty()) {
      EntryOptions &o = options[i];
      if (!o.fedTargets.empty() && o.fedTargets.size() != n)
        return fail(NF_ERR_INTERNAL,
                    entryError(i, "logprob targets for " +
                                      std::to_string(o.fedTargets.size()) +
                                      " of " + std::to_string(n) + " tokens"));
      for (size_t j = 0; j < o.fedTargets.size(); ++j) {
        if (o.fedTargets[j] < 0)
          continue;
        auto r = logitsRow(model, base - n + j);
        if (!r)
          return fail(NF_ERR_RUNTIME, entryError(i, r.message()));
        o.fed.add(*r, o.fedTargets[j]);
      }
    }
    if (!samplers[i]) {
      tokensOut[i] = -1;
      continue;
    }
    Status fatal = Status::success();
    StatusOr<int32_t> t = -1;
    if (penalized(static_cast<size_t>(i))) {
      auto r = logitsRow(model, row);
      if (!r)
        return fail(NF_ERR_RUNTIME, entryError(i, r.message()));
      adjusted.assign(r->begin(), r->end());
      const EntryOptions &o = options[i];
      if (o.penalties && o.penalties->active())
        o.penalties->apply(adjusted);
      if (o.constraint)
        if (Status s = o.constraint->mask(adjusted.data(), adjusted.size()); !s)
          return fail(NF_ERR_RUNTIME, entryError(i, s.message()));
      t = samplers[i]->sampler.sample(adjusted);
    } else {
      t = sampleInput(model, static_cast<size_t>(i), row, samplers[i]->sampler,
                      fatal);
      if (!fatal)
        return fail(NF_ERR_RUNTIME, entryError(i, fatal.message()));
    }
    tokensOut[i] = t ? *t : -1;
    if (!t) { // recorded, though the call succeeds
      (void)fail(NF_ERR_RUNTIME, entryError(i, t.message()));
      continue;
    }
    if (!options.empty() && options[i].wantSampled) {
      // The model's logprobs: the row before any penalty.
      auto r = lastRow(model, static_cast<size_t>(i), row);
      if (!r)
        return fail(NF_ERR_RUNTIME, entryError(i, r.message()));
      options[i].sampled.add(*r, *t);
    }
  }
  return NF_OK;
}

} // namespace nf::capi

extern "C" {

nf_status nf_decode_sample(nf_model *model, const nf_batch *batch,
                           nf_sampler *const *samplers, int32_t *tokens_out) {
  return guard([&]() -> nf_status {
    return capi::decodeSample(model, batch, samplers, tokens_out, {});
  });
}

nf_sampler_params nf_sampler_default_params(void) {
  nf_sampler_params p;
  p.temperature = 0.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 0;
  return p;
}

nf_status nf_sampler_create(const nf_sampler_params *params, nf_sampler **out) {
  return guard([&]() -> nf_status {
    if (out)
      *out = nullptr;
    if (!out)
      return fail(NF_ERR_INVALID_ARGUMENT, "nf_sampler_create: out is NULL");
    nf_sampler_params p = params ? *params : nf_sampler_default_params();
    StatusOr<sampling::Sampler> s =
        sampling::Sampler::create(capi::toSamplerParams(p));
    if (!s)
      return fail(NF_ERR_INVALID_ARGUMENT, s.status());
    *out = new nf_sampler{std::move(*s)};
    return NF_OK;
  });
}

void nf_sampler_free(nf_sampler *sampler) { delete sampler; }

void nf_sampler_reseed(nf_sampler *sampler, uint64_t seed) {
  if (sampler)
    sampler->sampler.reseed(seed);
}

int32_t nf_sample(nf_sampler *sampler, const float *logits, int32_t n_vocab) {
  return guardValue<int32_t>(-1, [&]() -> int32_t {
    if (!sampler || !logits || n_vocab <= 0) {
      fail(NF_ERR_INVALID_ARGUMENT,
           "nf_sample: NULL sampler or logits, or n_vocab <= 0");
      return -1;
    }
    StatusOr<int32_t> t = sampler->sampler.sample(
        std::span<const float>(logits, static_cast<size_t>(n_vocab)));
    if (!t) {
      fail(NF_ERR_INVALID_ARGUMENT, t.status());
      return -1;
    }
    return *t;
  });
}

nf_generate_params nf_generate_default_params(void) {
  nf_generate_params p;
  p.max_tokens = 128;
  p.sampler = nf_sampler_default_params();
  p.stop_tokens = nullptr;
  p.n_stop_tokens = 0;
  p.ignore_eos = 0;
  p.expert_budget = 0.0f;
  return p;
}

nf_status nf_generate(nf_model *model, const int32_t *prompt, size_t n_prompt,
                      const nf_generate_params *params,
                      nf_token_callback callback, void *user_data, int32_t *out,
                      size_t cap, size_t *n_out) {
  return guard([&]() -> nf_status {
    if (n_out)
      *n_out = 0;
    if (!model || !n_out || (!out && cap > 0))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_generate: NULL model, out or n_out");
    if (!prompt || n_prompt == 0)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_generate: the prompt needs at least one token");
    if (n_prompt > static_cast<size_t>(INT32_MAX))
      return fail(NF_ERR_INVALID_ARGUMENT, "nf_generate: prompt too long");
    nf_generate_params p = params ? *params : nf_generate_default_params();
    if (p.max_tokens < 0)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_generate: max_tokens must be >= 0");
    if (p.n_stop_tokens > 0 && !p.stop_tokens)
      return fail(NF_ERR_INVALID_ARGUMENT, "nf_generate: stop_tokens is NULL");
    if (!std::isfinite(p.expert_budget))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_generate: expert budget must be finite");
    StatusOr<sampling::Sampler> sampler =
        sampling::Sampler::create(capi::toSamplerParams(p.sampler));
    if (!sampler)
      return fail(NF_ERR_INVALID_ARGUMENT, sampler.status());
    const size_t limit = std::min(static_cast<size_t>(p.max_tokens), cap);
    if (limit == 0)
      return NF_OK;
    std::vector<int32_t> stops(p.stop_tokens, p.stop_tokens + p.n_stop_tokens);
    if (!p.ignore_eos)
      stops.insert(stops.end(), model->eos.begin(), model->eos.end());

    int32_t seq = -1;
    if (nf_status s = nf_seq_add(model, &seq); s != NF_OK)
      return s;
    SequenceGuard removeAtEnd(model, seq);

    nf_seq_input in;
    in.seq_id = seq;
    in.tokens = prompt;
    in.n_tokens = static_cast<int32_t>(n_prompt);
    in.expert_budget = p.expert_budget;
    in.experts_per_token = 0;
    const sampling::Sampler *const one[] = {&*sampler};
    if (nf_status s =
            capi::runStep(model, &in, 1, logitsForSamplers(model, one),
                          /*expertCalls=*/nullptr);
        s != NF_OK)
      return s;

    std::vector<int32_t> generated;
    while (true) {
      Status fatal = Status::success();
      StatusOr<int32_t> token = sampleInput(model, 0, 0, *sampler, fatal);
      if (!token)
        return fail(NF_ERR_RUNTIME, "nf_generate: " + token.message());
      out[generated.size()] = *token;
      *n_out = generated.size() + 1;
      bool stop = false;
      if (callback) {
        std::string piece;
        if (model->tokenizer)
          piece = newBytes(*model->tokenizer, generated, *token);
        stop = callback(*token, model->tokenizer ? piece.data() : nullptr,
                        piece.size(), user_data) != 0;
      }
      generated.push_back(*token);
      if (stop || generated.size() >= limit ||
          std::find(stops.begin(), stops.end(), *token) != stops.end())
        return NF_OK;
      in.tokens = &out[generated.size() - 1];
      in.n_tokens = 1;
      if (nf_status s = capi::runStep(model, &in, 1,
                                      logitsForSamplers(model, one), nullptr);
          s != NF_OK)
        return s;
    }
  });
}

} // extern "C"
