// The C API of text streams and the serving engine (nf.h): handles over
// serving/text_stream.h and serving/scheduler.h.
#include "capi/capi.h"
#include "serving/scheduler.h"
#include "serving/text_stream.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>

struct nf_text_stream {
  nf::serving::TextStream stream;
  std::string piece; // the last call's visible bytes
};

struct nf_engine {
  nf_model *model = nullptr;
  int32_t maxNewTokens = 0;
  std::unique_ptr<nf::serving::Scheduler> scheduler;
};

struct nf_request {
  std::shared_ptr<nf::serving::Request> r;
  int32_t expertsPerToken = 0; // the model's k
  // What the last read handed out.
  std::string text;
  std::vector<int32_t> tokens;
  std::string error;
  std::vector<int64_t> expertCallsPerLayer;
  nf::sampling::LogprobList logprobs, promptLogprobs;
};

using nf::capi::fail;
using nf::capi::guard;

namespace {

/// The longest duration the engine takes (~11.6 days); longer ones are cut
/// to it, so that deadlines never overflow.
constexpr int64_t kMaxMs = 1'000'000'000;

/// Copies stop strings, refusing NULL or empty ones.
nf_status stopStrings(const char *const *stops, size_t n, const char *what,
                      std::vector<std::string> &out) {
  if (n > 0 && !stops)
    return fail(NF_ERR_INVALID_ARGUMENT,
                std::string(what) + ": NULL stop strings");
  for (size_t i = 0; i < n; ++i) {
    if (!stops[i] || !*stops[i])
      return fail(NF_ERR_INVALID_ARGUMENT, std::string(what) +
                                               ": stop string " +
                                               std::to_string(i) + " is empty");
    out.emplace_back(stops[i]);
  }
  return NF_OK;
}

} // namespace

extern "C" {

nf_status nf_text_stream_create(const nf_model *model, const char *const *stops,
                                size_t n_stops, nf_text_stream **out) {
  return guard([&]() -> nf_status {
    if (out)
      *out = nullptr;
    if (!model || !out)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_text_stream_create: NULL model or out");
    if (!model->tokenizer)
      return fail(NF_ERR_UNSUPPORTED, model->noTokenizerReason);
    std::vector<std::string> s;
    if (nf_status st = stopStrings(stops, n_stops, "nf_text_stream_create", s);
        st != NF_OK)
      return st;
    *out = new nf_text_stream{
        nf::serving::TextStream(&*model->tokenizer, std::move(s)), {}};
    return NF_OK;
  });
}

void nf_text_stream_free(nf_text_stream *stream) { delete stream; }

nf_status nf_text_stream_add(nf_text_stream *stream, int32_t token, int final,
                             const char **text, size_t *len, int *stopped) {
  return guard([&]() -> nf_status {
    if (!stream || !text || !len)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_text_stream_add: NULL stream, text or len");
    stream->piece.clear();
    *text = stream->piece.c_str();
    *len = 0;
    if (token >= 0 && !stream->stream.stopped()) {
      auto s = stream->stream.add(token);
      if (!s)
        return fail(NF_ERR_INVALID_ARGUMENT, s.status());
    }
    stream->piece = stream->stream.take(final != 0);
    *text = stream->piece.c_str();
    *len = stream->piece.size();
    if (stopped)
      *stopped = stream->stream.stopped() ? 1 : 0;
    return NF_OK;
  });
}

const char *nf_finish_reason_string(nf_finish_reason reason) {
  switch (reason) {
  case NF_FINISH_NONE:
    return nullptr;
  case NF_FINISH_STOP:
    return "stop";
  case NF_FINISH_LENGTH:
    return "length";
  case NF_FINISH_CANCELLED:
    return "cancelled";
  case NF_FINISH_ERROR:
    return "error";
  case NF_FINISH_UNAVAILABLE:
    return "unavailable";
  }
  return nullptr;
}

nf_engine_params nf_engine_default_params(void) {
  nf_engine_params p = {};
  p.max_batch = 0;
  p.max_queue = 256;
  p.max_batched_tokens = 2048;
  p.max_new_tokens = 0;
  p.max_wait_ms = 0;
  p.prefix_caching = 1;
  p.prefix_cache_block = 0;
  return p;
}

nf_status nf_engine_create(nf_model *model, const nf_engine_params *params,
                           nf_engine **out) {
  return guard([&]() -> nf_status {
    if (out)
      *out = nullptr;
    if (!model || !out)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_engine_create: NULL model or out");
    const nf_engine_params p = params ? *params : nf_engine_default_params();
    const int32_t slots = nf_model_max_sequences(model);
    if (p.max_batch < 0 || p.max_queue < 0 || p.max_batched_tokens < 0 ||
        p.max_new_tokens < 0 || p.max_wait_ms < 0 || p.prefix_cache_block < 0)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_engine_create: negative max_batch, max_queue, "
                  "max_batched_tokens, max_new_tokens, max_wait_ms or "
                  "prefix_cache_block");
    if (p.max_batch > slots)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_engine_create: max_batch " + std::to_string(p.max_batch) +
                      " exceeds the model's " + std::to_string(slots) +
                      " sequences (nf_model_max_sequences)");
    if (!model->liveSequences.empty())
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_engine_create: the model has live sequences; an engine "
                  "needs the model's steps to itself");
    if (model->engineAttached.exchange(true))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_engine_create: the model already has an engine; free "
                  "it first");
    nf::serving::SchedulerOptions o;
    o.maxBatch = std::max(1, p.max_batch > 0 ? p.max_batch : slots);
    o.maxQueue = p.max_queue > 0 ? p.max_queue : 256;
    // A step's chunks are counted in int32 token counts.
    o.stepTokens = std::clamp<int64_t>(
        p.max_batched_tokens > 0 ? p.max_batched_tokens : 2048, o.maxBatch,
        INT32_MAX);
    // Durations beyond ~11 days mean "never" (and would overflow).
    o.maxWaitMs = std::min<int64_t>(p.max_wait_ms, kMaxMs);
    o.observer = p.observer;
    o.observerData = p.observer_data;
    o.prefixCaching = p.prefix_caching != 0;
    o.prefixBlock = p.prefix_cache_block > 0 ? p.prefix_cache_block : 256;
    struct Detach { // the flag goes back if the engine is not made
      nf_model *m;
      ~Detach() {
        if (m)
          m->engineAttached = false;
      }
    } detach{model};
    auto e = std::make_unique<nf_engine>();
    e->model = model;
    e->maxNewTokens = p.max_new_tokens;
    e->scheduler = std::make_unique<nf::serving::Scheduler>(model, o);
    detach.m = nullptr;
    *out = e.release();
    return NF_OK;
  });
}

void nf_engine_free(nf_engine *engine) {
  if (!engine)
    return;
  nf_model *model = engine->model;
  try {
    delete engine;
  } catch (...) { // the scheduler's end must not throw across the C API
  }
  model->engineAttached = false;
}

namespace {

/// r's grammar constraint (structured output), compiled here, on the
/// submitting thread, so that the scheduler's steps never wait for it.
nf_status constrain(nf_model *model, const nf_request_params &p,
                    nf::serving::Request &r) {
  using nf::sampling::GrammarKind;
  GrammarKind kind;
  switch (p.grammar_kind) {
  case NF_GRAMMAR_NONE:
    return NF_OK;
  case NF_GRAMMAR_JSON:
    kind = GrammarKind::Json;
    break;
  case NF_GRAMMAR_JSON_SCHEMA:
    kind = GrammarKind::JsonSchema;
    break;
  case NF_GRAMMAR_REGEX:
    kind = GrammarKind::Regex;
    break;
  case NF_GRAMMAR_EBNF:
    kind = GrammarKind::Ebnf;
    break;
  case NF_GRAMMAR_STRUCTURAL_TAG:
    kind = GrammarKind::StructuralTag;
    break;
  default:
    return fail(NF_ERR_INVALID_ARGUMENT, "grammar_kind " +
                                             std::to_string(p.grammar_kind) +
                                             " is not an nf_grammar_kind");
  }
  if (kind != GrammarKind::Json && !p.grammar)
    return fail(NF_ERR_INVALID_ARGUMENT, "grammar is NULL");
  if (!model->tokenizer)
    return fail(NF_ERR_UNSUPPORTED,
                "structured output needs the model's tokenizer: " +
                    model->noTokenizerReason);
  const int32_t vocab = nf_model_vocab_size(model);
  nf::sampling::GrammarCompiler *compiler;
  {
    std::lock_guard<std::mutex> lock(model->grammarsMu);
    if (!model->grammars)
      model->grammars = std::make_unique<nf::sampling::GrammarCompiler>(
          *model->tokenizer, vocab, model->eos);
    compiler = model->grammars.get();
  }
  if (p.grammar_flags & ~NF_GRAMMAR_FLAG_NO_WHITESPACE)
    return fail(NF_ERR_INVALID_ARGUMENT, "grammar_flags " +
                                             std::to_string(p.grammar_flags) +
                                             " has unknown bits");
  auto grammar = compiler->compile(
      {kind, kind == GrammarKind::Json ? std::string() : p.grammar,
       (p.grammar_flags & NF_GRAMMAR_FLAG_NO_WHITESPACE) == 0});
  if (!grammar)
    return fail(NF_ERR_INVALID_ARGUMENT, grammar.status());
  std::vector<int32_t> stops = model->eos;
  stops.insert(stops.end(), r.stopTokens.begin(), r.stopTokens.end());
  r.constraint.emplace(std::move(*grammar), vocab, std::move(stops));
  if (p.n_grammar_after > 0) {
    if (!p.grammar_after)
      return fail(NF_ERR_INVALID_ARGUMENT, "grammar_after is NULL");
    for (size_t i = 0; i < p.n_grammar_after; ++i)
      if (p.grammar_after[i] < 0 || p.grammar_after[i] >= vocab)
        return fail(NF_ERR_INVALID_ARGUMENT,
                    "grammar_after: token id " +
                        std::to_string(p.grammar_after[i]) + " is not in [0, " +
                        std::to_string(vocab) + ")");
    r.constraintAfter.assign(p.grammar_after,
                             p.grammar_after + p.n_grammar_after);
    r.constraintActive = false;
  }
  return NF_OK;
}

} // namespace

nf_request_params nf_request_default_params(void) {
  nf_request_params p = {};
  p.max_tokens = 16;
  p.sampler = nf_sampler_default_params();
  return p;
}

nf_status nf_engine_submit(nf_engine *engine, const nf_request_params *params,
                           nf_request **out) {
  return guard([&]() -> nf_status {
    if (out)
      *out = nullptr;
    if (!engine || !params || !out)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_engine_submit: NULL engine, params or out");
    const nf_model *model = engine->model;
    const nf_request_params &p = *params;
    if (!p.prompt || p.n_prompt == 0)
      return fail(NF_ERR_INVALID_ARGUMENT, "the prompt has no tokens");
    const int32_t vocab = nf_model_vocab_size(model);
    for (size_t i = 0; i < p.n_prompt; ++i)
      if (p.prompt[i] < 0 || p.prompt[i] >= vocab)
        return fail(NF_ERR_INVALID_ARGUMENT,
                    "prompt: token id " + std::to_string(p.prompt[i]) +
                        " is not in [0, " + std::to_string(vocab) + ")");
    // Context left after the prompt; a model without attention has none.
    int64_t room = std::numeric_limits<int32_t>::max();
    if (const int64_t context = nf_model_max_context(model); context >= 0) {
      room = context - static_cast<int64_t>(p.n_prompt);
      if (room < 1)
        return fail(NF_ERR_INVALID_ARGUMENT,
                    "the prompt has " + std::to_string(p.n_prompt) +
                        " tokens; this model's context is " +
                        std::to_string(context));
    }
    if (engine->maxNewTokens > 0 && p.max_tokens > engine->maxNewTokens)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "max_tokens " + std::to_string(p.max_tokens) +
                      " is above this server's limit of " +
                      std::to_string(engine->maxNewTokens) +
                      " new tokens a request");
    if (p.max_tokens_soft < 0)
      return fail(NF_ERR_INVALID_ARGUMENT, "max_tokens_soft is negative");
    if (p.n_stop_tokens > 0 && !p.stop_tokens)
      return fail(NF_ERR_INVALID_ARGUMENT, "NULL stop tokens");
    constexpr int32_t kMaxTop = NF_MAX_TOP_LOGPROBS;
    for (auto [name, top] :
         {std::pair{"top_logprobs", p.top_logprobs},
          std::pair{"prompt_top_logprobs", p.prompt_top_logprobs}})
      if (top < 0 || top > kMaxTop)
        return fail(NF_ERR_INVALID_ARGUMENT,
                    std::string(name) + " " + std::to_string(top) +
                        " is not in [0, " + std::to_string(kMaxTop) + "]");
    auto r = std::make_shared<nf::serving::Request>();
    std::vector<std::string> stops;
    if (nf_status st =
            stopStrings(p.stop_strings, p.n_stop_strings, "stop", stops);
        st != NF_OK)
      return st;
    nf_sampler *sampler = nullptr;
    if (nf_status st = nf_sampler_create(&p.sampler, &sampler); st != NF_OK)
      return st;
    r->sampler.reset(sampler);
    r->prompt.assign(p.prompt, p.prompt + p.n_prompt);
    int64_t limit = p.max_tokens > 0 ? p.max_tokens
                    : engine->maxNewTokens > 0
                        ? engine->maxNewTokens
                        : std::numeric_limits<int32_t>::max();
    r->maxTokens = static_cast<int32_t>(std::min(limit, room));
    r->maxTokensSoft = p.max_tokens_soft;
    r->stopTokens.assign(p.stop_tokens, p.stop_tokens + p.n_stop_tokens);
    r->ignoreEos = p.ignore_eos != 0;
    r->priority = p.priority;
    r->expertBudget = p.expert_budget;
    r->appliedBudget = p.expert_budget > 0.0f
                           ? std::min(p.expert_budget, 1.0f)
                           : model->engine->info().defaultExpertBudget;
    r->expertCallsPerLayer.assign(
        static_cast<size_t>(nf_model_n_moe_layers(model)), 0);
    r->userData = p.user_data;
    if (p.cache_salt)
      r->cacheSalt = p.cache_salt;
    nf::sampling::Penalties pen;
    pen.presence = p.presence_penalty;
    pen.frequency = p.frequency_penalty;
    pen.repetition = p.repetition_penalty == 0.0f ? 1.0f : p.repetition_penalty;
    for (auto [name, v] : {std::pair{"presence_penalty", pen.presence},
                           std::pair{"frequency_penalty", pen.frequency}})
      if (!(v >= -2.0f && v <= 2.0f))
        return fail(NF_ERR_INVALID_ARGUMENT, std::string(name) + " " +
                                                 std::to_string(v) +
                                                 " is not in [-2, 2]");
    if (!(pen.repetition > 0.0f) || !std::isfinite(pen.repetition))
      return fail(NF_ERR_INVALID_ARGUMENT, "repetition_penalty " +
                                               std::to_string(pen.repetition) +
                                               " is not above 0");
    if (p.n_logit_bias > 0 && (!p.logit_bias_tokens || !p.logit_bias_values))
      return fail(NF_ERR_INVALID_ARGUMENT, "NULL logit_bias tokens or values");
    for (size_t i = 0; i < p.n_logit_bias; ++i) {
      const int32_t t = p.logit_bias_tokens[i];
      const float b = p.logit_bias_values[i];
      if (t < 0 || t >= vocab)
        return fail(NF_ERR_INVALID_ARGUMENT,
                    "logit_bias: token id " + std::to_string(t) +
                        " is not in [0, " + std::to_string(vocab) + ")");
      if (!(b >= -100.0f && b <= 100.0f))
        return fail(NF_ERR_INVALID_ARGUMENT,
                    "logit_bias: bias " + std::to_string(b) + " of token " +
                        std::to_string(t) + " is not in [-100, 100]");
      pen.bias.emplace_back(t, b);
    }
    if (p.min_tokens < 0)
      return fail(NF_ERR_INVALID_ARGUMENT, "min_tokens is negative");
    pen.minTokens = p.min_tokens;
    pen.stopTokens = model->eos;
    pen.stopTokens.insert(pen.stopTokens.end(), p.stop_tokens,
                          p.stop_tokens + p.n_stop_tokens);
    r->penalties = nf::sampling::PenaltyState(std::move(pen), r->prompt);
    if (nf_status st = constrain(engine->model, p, *r); st != NF_OK)
      return st;
    r->logprobs = p.logprobs ? p.top_logprobs : -1;
    r->promptLogprobs = p.prompt_logprobs ? p.prompt_top_logprobs : -1;
    nf::serving::TextStream::Options text;
    text.skipSpecial = p.keep_special_tokens == 0;
    text.includeStop = p.include_stop_str != 0;
    r->text =
        nf::serving::TextStream(model->tokenizer ? &*model->tokenizer : nullptr,
                                std::move(stops), text);
    if (!std::isfinite(p.expert_budget))
      return fail(NF_ERR_INVALID_ARGUMENT, "expert_budget is not finite");
    auto handle = std::make_unique<nf_request>();
    handle->r = r;
    handle->expertsPerToken = nf_model_experts_per_token(model);
    switch (nf_status st = engine->scheduler->submit(r)) {
    case NF_OK:
      break;
    case NF_ERR_CAPACITY:
      return fail(st, "the engine's queue of waiting requests is full");
    default:
      return fail(st, "the engine is shutting down");
    }
    *out = handle.release();
    return NF_OK;
  });
}

nf_status nf_request_read(nf_request *request, int32_t timeout_ms,
                          nf_request_output *out) {
  return guard([&]() -> nf_status {
    if (!request || !out)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_request_read: NULL request or out");
    nf::serving::Request &r = *request->r;
    std::unique_lock<std::mutex> lock(r.mu);
    auto news = [&] {
      return r.finish != NF_FINISH_NONE || !r.pendingText.empty() ||
             !r.pendingTokens.empty();
    };
    if (timeout_ms < 0)
      r.cv.wait(lock, news);
    else if (timeout_ms > 0)
      r.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), news);
    request->text.clear();
    request->tokens.clear();
    request->text.swap(r.pendingText);
    request->tokens.swap(r.pendingTokens);
    request->logprobs.clear();
    request->promptLogprobs.clear();
    std::swap(request->logprobs, r.pendingLogprobs);
    std::swap(request->promptLogprobs, r.pendingPromptLogprobs);
    request->error = r.error;
    *out = {};
    out->tokens = request->tokens.data();
    out->n_tokens = request->tokens.size();
    out->text = request->text.c_str();
    out->text_len = request->text.size();
    out->finish_reason = r.finish;
    out->error = request->error.c_str();
    out->prompt_tokens = static_cast<int64_t>(r.prompt.size());
    out->completion_tokens = r.completionTokens;
    out->max_tokens = r.grantedMaxTokens;
    out->preemptions = r.preemptions;
    out->expert_calls = r.expertCalls;
    request->expertCallsPerLayer = r.expertCallsPerLayer;
    out->expert_calls_per_layer = request->expertCallsPerLayer.data();
    out->n_moe_layers =
        static_cast<int32_t>(request->expertCallsPerLayer.size());
    out->expert_budget = r.appliedBudget;
    const double topK = static_cast<double>(request->expertsPerToken) *
                        static_cast<double>(out->n_moe_layers) *
                        static_cast<double>(r.tokensRun);
    out->expert_budget_spent =
        topK > 0 ? static_cast<double>(r.expertCalls) / topK : 0.0;
    out->queued_s = r.queuedS;
    out->prefill_s = r.prefillS;
    out->decode_s = r.decodeS;
    out->cached_tokens = r.cachedTokens;
    if (r.logprobs >= 0) {
      const nf::sampling::LogprobList &l = request->logprobs;
      out->token_logprobs = l.logprobs.data();
      out->top_logprob_tokens = l.topTokens.data();
      out->top_logprobs = l.topLogprobs.data();
      out->n_top_logprobs = r.logprobs;
    }
    if (r.promptLogprobs >= 0) {
      const nf::sampling::LogprobList &l = request->promptLogprobs;
      out->prompt_logprob_tokens = l.tokens.data();
      out->prompt_logprobs = l.logprobs.data();
      out->n_prompt_logprobs = l.size();
      out->prompt_top_logprob_tokens = l.topTokens.data();
      out->prompt_top_logprobs = l.topLogprobs.data();
      out->n_prompt_top_logprobs = r.promptLogprobs;
    }
    return NF_OK;
  });
}

void nf_request_cancel(nf_request *request) {
  if (request)
    request->r->cancelled = true;
}

void nf_request_free(nf_request *request) {
  nf_request_cancel(request);
  delete request; // its request lives on in the engine until it ends
}

void nf_engine_shutdown(nf_engine *engine, int64_t grace_ms) {
  if (engine)
    engine->scheduler->shutdown(
        nf::serving::Clock::now() +
        std::chrono::milliseconds(std::clamp<int64_t>(grace_ms, 0, kMaxMs)));
}

void nf_engine_reset_prefix_cache(nf_engine *engine) {
  if (engine)
    engine->scheduler->resetPrefixCache();
}

nf_status nf_engine_get_stats(nf_engine *engine, nf_engine_stats *out) {
  return guard([&]() -> nf_status {
    if (!engine || !out)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_engine_get_stats: NULL engine or out");
    *out = engine->scheduler->stats();
    return NF_OK;
  });
}

nf_status nf_engine_expert_utilization(nf_engine *engine, int64_t *counts,
                                       size_t cap) {
  return guard([&]() -> nf_status {
    if (!engine || (!counts && cap > 0))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_engine_expert_utilization: NULL engine or counts");
    const std::vector<int64_t> used = engine->scheduler->expertUtilization();
    const size_t need =
        static_cast<size_t>(nf_model_n_moe_layers(engine->model)) *
        static_cast<size_t>(nf_model_n_experts(engine->model));
    if (cap < need)
      return fail(NF_ERR_BUFFER_TOO_SMALL,
                  "nf_engine_expert_utilization: needs " +
                      std::to_string(need) + " entries, got " +
                      std::to_string(cap));
    std::fill(counts, counts + need, 0);
    std::copy(used.begin(), used.begin() + std::min(used.size(), need), counts);
    return NF_OK;
  });
}

} // extern "C"
