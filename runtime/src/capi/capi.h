// Internals of the C API (include/nf/nf.h): the handle types and the
// exception barrier every entry point goes through.
#pragma once

#include "chat/chat_template.h"
#include "engine/engine.h"
#include "nf/nf.h"
#include "nf/status.h"
#include "nf/tokenizer.h"
#include "sampling/grammar.h"
#include "sampling/logprobs.h"
#include "sampling/penalties.h"
#include "sampling/sampler.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <vector>

struct nf_model {
  std::unique_ptr<nf::Engine> engine;
  std::optional<nf::Tokenizer> tokenizer;
  /// Why there is no tokenizer (for NF_ERR_UNSUPPORTED messages).
  std::string noTokenizerReason;
  /// The chat template (if any) and the special tokens it is rendered with.
  nf::chat::ChatConfig chat;
  std::string noChatTemplateReason;
  std::string planPath;
  std::string infoText;
  std::vector<int32_t> eos;
  /// Grammars compiled against the vocabulary (structured output), made at
  /// the first request that needs one.
  std::mutex grammarsMu;
  std::unique_ptr<nf::sampling::GrammarCompiler> grammars;
  nf_generation_defaults generation{};
  std::set<int32_t> liveSequences;
  /// Each sequence's expert-budget account (budget plans): routed-expert
  /// calls per MoE layer it was due but did not run (negative: ran beyond
  /// its budget), carried into its next step.
  std::map<int32_t, double> budgetCarry;
  /// Step scope or the distinct-expert cap: the policy may give a sequence
  /// other calls than its budget's, so its account follows the calls run.
  bool budgetFollowsCalls = false;
  /// A serving engine has the model's steps (nf_engine_create).
  std::atomic<bool> engineAttached{false};
  // Scratch reused across steps.
  std::vector<nf::SequenceInput> inputs;
  std::vector<float> logits;
  nf::TopLogits top;      // LogitsFor::LastTokenTop steps
  std::vector<float> row; // a row fetched after a top step
};

struct nf_sampler {
  nf::sampling::Sampler sampler;
};

namespace nf::capi {

/// Records `message` as this thread's last error and returns `code`.
nf_status fail(nf_status code, const std::string &message) noexcept;
/// fail() with a Status's message.
inline nf_status fail(nf_status code, const Status &status) noexcept {
  return fail(code, status.message());
}

/// Runs `body` (returning nf_status) and turns any exception into a status.
template <typename F> nf_status guard(F &&body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return fail(NF_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception &e) {
    try {
      return fail(NF_ERR_INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {
      return fail(NF_ERR_INTERNAL, "internal error");
    }
  } catch (...) {
    return fail(NF_ERR_INTERNAL, "internal error: unknown exception");
  }
}

/// Like guard() for entry points returning a value: `fallback` on failure.
template <typename T, typename F> T guardValue(T fallback, F &&body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    fail(NF_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception &e) {
    try {
      fail(NF_ERR_INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {
      fail(NF_ERR_INTERNAL, "internal error");
    }
  } catch (...) {
    fail(NF_ERR_INTERNAL, "internal error: unknown exception");
  }
  return fallback;
}

/// Sampler parameters of the C API as the sampling library spells them.
inline sampling::SamplerParams toSamplerParams(const nf_sampler_params &p) {
  sampling::SamplerParams s;
  s.temperature = p.temperature;
  s.topK = p.top_k;
  s.topP = p.top_p;
  s.minP = p.min_p;
  s.seed = p.seed;
  return s;
}

/// Checks `model` and the sequence inputs and runs one engine step; the
/// logits end up in model->logits (none with LogitsFor::None), or top lists
/// in model->top (LogitsFor::LastTokenTop, where the engine returns them).
/// `expertCalls` ([sequence]) and `expertCallsPerLayer` ([sequence][MoE
/// layer]) receive the step's routed-expert calls when not null.
nf_status runStep(nf_model *model, const nf_seq_input *seqs, int32_t nSeqs,
                  nf::LogitsFor which, int64_t *expertCalls,
                  int64_t *expertCallsPerLayer = nullptr);

/// What one entry of decodeSample wants beside its token: penalties on
/// the row it draws from, and log-probabilities.
struct EntryOptions {
  /// Applied to a copy of the row before the draw (null or inactive: none);
  /// a step with such an entry returns rows, not top lists.
  const sampling::PenaltyState *penalties = nullptr;
  /// Masks the row after the penalties (null: none); as `penalties`.
  sampling::TokenConstraint *constraint = nullptr;
  /// The drawn token's, with `sampled.top` alternatives (false: none).
  bool wantSampled = false;
  /// Per token the entry feeds, the token whose logprob its row gives (the
  /// next token of the context; -1: none); empty: none. With
  /// `fed.top` alternatives.
  std::span<const int32_t> fedTargets;
  // Out: the positions asked for.
  sampling::LogprobList sampled, fed;
};

/// nf_decode_sample with `options` (empty, or one per batch entry): their
/// penalties and log-probabilities. A step where an entry wants its fed
/// tokens' rows returns every row (LogitsFor::AllTokens).
nf_status decodeSample(nf_model *model, const nf_batch *batch,
                       nf_sampler *const *samplers, int32_t *tokensOut,
                       std::span<EntryOptions> options);

} // namespace nf::capi
