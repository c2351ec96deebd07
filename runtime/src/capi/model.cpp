// C API: errors, version, model loading and getters, sequences, steps.
#include "capi/capi.h"
#include "nf/file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#ifndef NF_VERSION
#define NF_VERSION "unknown"
#endif

namespace {
thread_local std::string lastError;
} // namespace

namespace nf::capi {

nf_status fail(nf_status code, const std::string &message) noexcept {
  try {
    lastError = message;
  } catch (...) {
    lastError.clear(); // keeps its capacity: the assignment below fits
    lastError = "out of memory";
  }
  return code;
}

namespace {

/// The sampling defaults of a generation_config.json (none when the file
/// does not exist): temperature, top_p, top_k and min_p, as vLLM reads them
/// (do_sample is not consulted). A value of the wrong type or range is an
/// error naming the file and the key.
StatusOr<nf_generation_defaults>
readGenerationDefaults(const std::string &path) {
  nf_generation_defaults d = nf_model_generation_defaults(nullptr);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return d;
  StatusOr<std::string> text = readWholeFile(path);
  if (!text)
    return text.status();
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::error(path + ": not a JSON object");
  auto number = [&](const char *key, double lo, double hi, unsigned bit,
                    auto &out) -> Status {
    if (!j.contains(key) || j[key].is_null())
      return Status::success();
    if (!j[key].is_number() || !(j[key].get<double>() >= lo) ||
        !(j[key].get<double>() <= hi)) {
      char range[64];
      std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
      return Status::error(path + ": '" + key + "' must be a number in " +
                           range);
    }
    out = static_cast<std::remove_reference_t<decltype(out)>>(
        j[key].get<double>());
    d.set |= bit;
    return Status::success();
  };
  for (Status s :
       {number("temperature", 0.0, 100.0, NF_GEN_TEMPERATURE, d.temperature),
        number("top_p", 1e-9, 1.0, NF_GEN_TOP_P, d.top_p),
        number("top_k", -1.0, 1 << 30, NF_GEN_TOP_K, d.top_k),
        number("min_p", 0.0, 1.0, NF_GEN_MIN_P, d.min_p)})
    if (!s)
      return s;
  if (d.top_k < 0) // transformers' "no top-k" is -1 (or 0); ours is 0
    d.top_k = 0;
  return d;
}

std::string describe(const nf_model &m, const std::string &tokenizerLine,
                     const std::string &chatTemplateLine) {
  const ModelInfo &info = m.engine->info();
  std::ostringstream os;
  os << "name: " << info.name << "\n";
  os << "plan: " << m.planPath << "\n";
  os << "weights: " << info.weightsDir << "\n";
  os << "vocab: " << info.vocabSize << "\n";
  os << "hidden: " << info.hiddenSize << "\n";
  os << "layers: " << info.layerKinds << " (" << info.layerKinds.size()
     << ")\n";
  if (info.topK > 0)
    os << "experts per token: " << info.topK << " (policy " << info.expertPolicy
       << ", default budget " << info.defaultExpertBudget << ")\n";
  os << "bos: " << info.bosTokenId << "\n";
  os << "eos:";
  if (m.eos.empty())
    os << " -1";
  for (int32_t e : m.eos)
    os << " " << e;
  os << "\n";
  os << "max sequences: " << info.maxSequences << "\n";
  os << "max context: ";
  if (info.maxContext < 0)
    os << "unlimited\n";
  else
    os << info.maxContext << "\n";
  os << "backend: " << info.backend;
  if (info.backend != "cpu")
    os << " (" << info.device << ")";
  os << "\n";
  os << "prefill tokens per step: " << info.maxPrefillTokens << "\n";
  os << "decode sequences per step: " << info.maxDecodeTokens << "\n";
  os << "tokenizer: " << tokenizerLine << "\n";
  os << "chat template: " << chatTemplateLine << "\n";
  return os.str();
}

} // namespace

nf_status runStep(nf_model *model, const nf_seq_input *seqs, int32_t nSeqs,
                  LogitsFor which, int64_t *expertCalls,
                  int64_t *expertCallsPerLayer) {
  if (nSeqs <= 0 || !seqs)
    return fail(NF_ERR_INVALID_ARGUMENT,
                "nf_decode: the batch needs at least one sequence");
  const ModelInfo &info = model->engine->info();
  const int64_t vocab = info.vocabSize;
  model->inputs.clear();
  std::vector<int32_t> ids;
  ids.reserve(nSeqs);
  for (int32_t i = 0; i < nSeqs; ++i) {
    const nf_seq_input &s = seqs[i];
    std::string where = "nf_decode: batch entry " + std::to_string(i) +
                        " (sequence " + std::to_string(s.seq_id) + ")";
    if (!model->liveSequences.count(s.seq_id))
      return fail(NF_ERR_INVALID_ARGUMENT, where + ": unknown sequence id");
    ids.push_back(s.seq_id);
    if (s.n_tokens <= 0 || !s.tokens)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  where + ": needs at least one token");
    for (int32_t t = 0; t < s.n_tokens; ++t)
      if (s.tokens[t] < 0 || s.tokens[t] >= vocab)
        return fail(NF_ERR_INVALID_ARGUMENT,
                    where + ": token " + std::to_string(s.tokens[t]) +
                        " at index " + std::to_string(t) +
                        " is outside the vocabulary [0, " +
                        std::to_string(vocab) + ")");
    if (!std::isfinite(s.expert_budget))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  where + ": expert budget must be finite");
    if (s.experts_per_token < 0)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  where + ": experts_per_token must be >= 0");
    SequenceInput in;
    in.sequence = s.seq_id;
    in.tokens = std::span<const int32_t>(s.tokens, s.n_tokens);
    in.expertBudget =
        s.expert_budget > 0.0f ? s.expert_budget : info.defaultExpertBudget;
    in.expertsPerToken = s.experts_per_token;
    model->inputs.push_back(in);
  }
  std::sort(ids.begin(), ids.end());
  if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end())
    return fail(NF_ERR_INVALID_ARGUMENT,
                "nf_decode: sequence " + std::to_string(*dup) +
                    " appears more than once in the batch");

  // The budget account: each sequence's step gets the calls its budget
  // is due plus what it carries, so that over its steps a sequence spends
  // its budget on average (a one-token decode step alone could only round
  // it to whole experts). Depends on the sequence's own steps only.
  struct Due {
    double due = 0, planned = 0; // calls a MoE layer
  };
  std::vector<Due> dues(model->inputs.size());
  const bool budgeted = info.expertPolicy == "budget" && info.topK > 0;
  const double k = info.topK;
  for (size_t i = 0; budgeted && i < model->inputs.size(); ++i) {
    SequenceInput &in = model->inputs[i];
    if (in.expertsPerToken > 0)
      continue;
    const double tokens = static_cast<double>(in.tokens.size());
    const double budget = std::clamp<double>(in.expertBudget, 0.0, 1.0);
    dues[i].due = budget * k * tokens;
    dues[i].planned =
        std::clamp(std::round(dues[i].due + model->budgetCarry[in.sequence]),
                   tokens, k * tokens);
    in.expertBudget = static_cast<float>(dues[i].planned / (k * tokens));
  }

  StepStats stats;
  model->top.k = 0;
  const bool wantStats = expertCalls || expertCallsPerLayer ||
                         (budgeted && model->budgetFollowsCalls);
  Status st = model->engine->step(
      model->inputs, which, model->logits, wantStats ? &stats : nullptr,
      which == LogitsFor::LastTokenTop ? &model->top : nullptr);
  if (!st)
    return fail(NF_ERR_RUNTIME, st);
  for (size_t i = 0; budgeted && i < model->inputs.size(); ++i) {
    const SequenceInput &in = model->inputs[i];
    if (in.expertsPerToken > 0)
      continue;
    // What it ran: the planned calls, unless the step's policy (step
    // scope, the cap) may have given it others; then its calls, a MoE
    // layer on average.
    double ran = dues[i].planned;
    if (model->budgetFollowsCalls && i < stats.expertCallsPerLayer.size() &&
        info.numMoeLayers > 0) {
      ran = 0.0;
      for (int64_t c : stats.expertCallsPerLayer[i])
        ran += static_cast<double>(c);
      ran /= info.numMoeLayers;
    }
    // Bounded: the account evens out rounding, it does not bank budget.
    double &carry = model->budgetCarry[in.sequence];
    carry = std::clamp(carry + dues[i].due - ran, -k, k);
  }
  if (expertCalls)
    for (int32_t i = 0; i < nSeqs; ++i)
      expertCalls[i] = static_cast<size_t>(i) < stats.expertCalls.size()
                           ? stats.expertCalls[i]
                           : 0;
  if (expertCallsPerLayer) {
    const size_t layers = static_cast<size_t>(info.numMoeLayers);
    for (size_t i = 0; i < static_cast<size_t>(nSeqs); ++i)
      for (size_t l = 0; l < layers; ++l)
        expertCallsPerLayer[i * layers + l] =
            i < stats.expertCallsPerLayer.size() &&
                    l < stats.expertCallsPerLayer[i].size()
                ? stats.expertCallsPerLayer[i][l]
                : 0;
  }
  return NF_OK;
}

} // namespace nf::capi

using namespace nf;
using nf::capi::fail;
using nf::capi::guard;
using nf::capi::guardValue;

extern "C" {

const char *nf_status_string(nf_status status) {
  switch (status) {
  case NF_OK:
    return "NF_OK";
  case NF_ERR_INVALID_ARGUMENT:
    return "NF_ERR_INVALID_ARGUMENT";
  case NF_ERR_LOAD:
    return "NF_ERR_LOAD";
  case NF_ERR_UNSUPPORTED:
    return "NF_ERR_UNSUPPORTED";
  case NF_ERR_BUFFER_TOO_SMALL:
    return "NF_ERR_BUFFER_TOO_SMALL";
  case NF_ERR_CAPACITY:
    return "NF_ERR_CAPACITY";
  case NF_ERR_RUNTIME:
    return "NF_ERR_RUNTIME";
  case NF_ERR_OUT_OF_MEMORY:
    return "NF_ERR_OUT_OF_MEMORY";
  case NF_ERR_INTERNAL:
    return "NF_ERR_INTERNAL";
  case NF_ERR_UNAVAILABLE:
    return "NF_ERR_UNAVAILABLE";
  }
  return "NF_ERR_UNKNOWN";
}

const char *nf_last_error(void) { return lastError.c_str(); }

const char *nf_version(void) { return NF_VERSION; }

nf_model_params nf_model_default_params(void) {
  nf_model_params p;
  p.weights_dir = nullptr;
  p.tokenizer_path = nullptr;
  p.n_threads = 0;
  p.max_sequences = 0;
  p.kv_pages = 0;
  p.backend = nullptr;
  p.synthetic_weights = 0;
  p.synthetic_seed = 0;
  p.chat_template_path = nullptr;
  p.budget_scope = nullptr;
  p.distinct_expert_cap = 0.0;
  p.gpu_memory_utilization = 0.0;
  return p;
}

nf_status nf_model_load(const char *plan_path, const nf_model_params *params,
                        nf_model **out) {
  return guard([&]() -> nf_status {
    if (out)
      *out = nullptr;
    if (!plan_path || !out)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_model_load: plan_path and out must not be NULL");
    nf_model_params p = params ? *params : nf_model_default_params();
    if (p.n_threads < 0 || p.max_sequences < 0 || p.kv_pages < 0)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  std::string(plan_path) +
                      ": n_threads, max_sequences and kv_pages must be >= 0");
    if (p.n_threads > kMaxThreads)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  std::string(plan_path) + ": n_threads must be at most " +
                      std::to_string(kMaxThreads) + ", got " +
                      std::to_string(p.n_threads));
    EngineOptions options;
    options.weightsDir = p.weights_dir ? p.weights_dir : "";
    options.numThreads = p.n_threads;
    options.maxSequences = p.max_sequences;
    options.kvPages = p.kv_pages;
    if (!(p.gpu_memory_utilization >= 0.0 && p.gpu_memory_utilization <= 1.0))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  std::string(plan_path) +
                      ": gpu_memory_utilization must be in (0, 1] (0: off), "
                      "got " +
                      std::to_string(p.gpu_memory_utilization));
    if (p.gpu_memory_utilization > 0.0 && p.kv_pages > 0)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  std::string(plan_path) +
                      ": kv_pages and gpu_memory_utilization both set: the "
                      "utilisation sizes the KV cache");
    options.gpuMemoryUtilization = p.gpu_memory_utilization;
    options.backend = p.backend && *p.backend ? p.backend : "auto";
    options.syntheticWeights = p.synthetic_weights != 0;
    options.syntheticSeed = p.synthetic_seed;
    if (options.backend != "auto" && options.backend != "cpu" &&
        options.backend != "cuda")
      return fail(NF_ERR_INVALID_ARGUMENT,
                  std::string(plan_path) + ": unknown backend '" +
                      options.backend + "' (expected auto, cpu or cuda)");
    const std::string scope =
        p.budget_scope && *p.budget_scope ? p.budget_scope : "request";
    if (scope != "request" && scope != "step")
      return fail(NF_ERR_INVALID_ARGUMENT,
                  std::string(plan_path) + ": unknown budget scope '" + scope +
                      "' (expected request or step)");
    options.budgetStepScope = scope == "step";
    options.distinctExpertCap = p.distinct_expert_cap;
    StatusOr<std::unique_ptr<Engine>> engine = Engine::load(plan_path, options);
    if (!engine)
      return fail(NF_ERR_LOAD, engine.status());

    auto model = std::make_unique<nf_model>();
    model->engine = std::move(*engine);
    model->planPath = plan_path;
    // The step's policy may give a sequence other calls than its own
    // budget's: its account then follows what it ran.
    model->budgetFollowsCalls =
        options.budgetStepScope || options.distinctExpertCap > 0.0;
    const ModelInfo &info = model->engine->info();

    std::string tokenizerLine;
    std::string tokenizerPath;
    bool required = false;
    if (p.tokenizer_path && *p.tokenizer_path) {
      tokenizerPath = p.tokenizer_path;
      required = true;
    } else {
      std::string dir =
          !options.weightsDir.empty() ? options.weightsDir : info.weightsDir;
      tokenizerPath =
          (std::filesystem::path(dir.empty() ? "." : dir) / "tokenizer.json")
              .string();
    }
    std::error_code ec;
    if (required || std::filesystem::exists(tokenizerPath, ec)) {
      StatusOr<Tokenizer> tok = Tokenizer::fromFile(tokenizerPath);
      if (!tok)
        return fail(NF_ERR_LOAD, tok.status());
      model->tokenizer = std::move(*tok);
      tokenizerLine = tokenizerPath + " (vocab " +
                      std::to_string(model->tokenizer->vocabSize()) + ")";
    } else {
      model->noTokenizerReason =
          tokenizerPath + ": not found: the model has no tokenizer";
      tokenizerLine = "none (" + tokenizerPath + " not found)";
    }

    for (int64_t e : info.eosTokenIds)
      if (e >= 0 && e < info.vocabSize)
        model->eos.push_back(static_cast<int32_t>(e));
    if (model->eos.empty() && model->tokenizer)
      if (auto e = model->tokenizer->eosId(); e && *e < info.vocabSize)
        model->eos.push_back(*e);

    // The chat template and generation_config.json live with the tokenizer
    // (whether or not there is a tokenizer.json).
    const std::string chatDir =
        std::filesystem::path(tokenizerPath).parent_path().string();
    StatusOr<nf_generation_defaults> generation =
        nf::capi::readGenerationDefaults(
            (std::filesystem::path(chatDir) / "generation_config.json")
                .string());
    if (!generation)
      return fail(NF_ERR_LOAD, generation.status());
    model->generation = *generation;
    StatusOr<chat::ChatConfig> chatConfig = chat::loadChatConfig(
        chatDir, p.chat_template_path ? p.chat_template_path : "");
    if (!chatConfig)
      return fail(NF_ERR_LOAD, chatConfig.status());
    model->chat = std::move(*chatConfig);
    // Without tokenizer_config.json, the model's own BOS and EOS (special
    // tokens of tokenizer.json) stand in for bos_token and eos_token.
    auto hasToken = [&](const char *name) {
      for (const auto &t : model->chat.specialTokens)
        if (t.first == name)
          return true;
      return false;
    };
    auto addToken = [&](const char *name, int32_t id) {
      if (model->tokenizer && id >= 0 && !hasToken(name) &&
          model->tokenizer->isSpecial(id))
        model->chat.specialTokens.emplace_back(name,
                                               model->tokenizer->tokenText(id));
    };
    addToken("bos_token", nf_model_bos(model.get()));
    addToken("eos_token", model->eos.empty() ? -1 : model->eos.front());
    std::string chatTemplateLine;
    if (model->chat.chatTemplate) {
      chatTemplateLine = model->chat.chatTemplate->sourceName();
    } else if (!model->chat.templateError.empty()) {
      // Found but unusable: the model works without it.
      chatTemplateLine = "none (" + model->chat.templateError + ")";
      model->noChatTemplateReason =
          "the model's chat template cannot be used: " +
          model->chat.templateError +
          "; give one with nf_model_params.chat_template_path";
    } else {
      chatTemplateLine = "none";
      model->noChatTemplateReason =
          "the model has no chat template (no chat_template.jinja, and no "
          "chat_template in tokenizer_config.json, in " +
          (chatDir.empty() ? std::string(".") : chatDir) +
          "): give one with nf_model_params.chat_template_path";
    }
    model->infoText = capi::describe(*model, tokenizerLine, chatTemplateLine);
    *out = model.release();
    return NF_OK;
  });
}

void nf_model_free(nf_model *model) {
  try {
    delete model;
  } catch (...) {
  }
}

int32_t nf_model_vocab_size(const nf_model *model) {
  return model ? static_cast<int32_t>(model->engine->info().vocabSize) : 0;
}

int32_t nf_model_bos(const nf_model *model) {
  if (!model)
    return -1;
  const ModelInfo &info = model->engine->info();
  if (info.bosTokenId >= 0 && info.bosTokenId < info.vocabSize)
    return static_cast<int32_t>(info.bosTokenId);
  if (model->tokenizer)
    if (auto b = model->tokenizer->bosId(); b && *b < info.vocabSize)
      return *b;
  return -1;
}

int32_t nf_model_eos(const nf_model *model) {
  return model && !model->eos.empty() ? model->eos.front() : -1;
}

int nf_model_is_eos(const nf_model *model, int32_t token) {
  return model && std::find(model->eos.begin(), model->eos.end(), token) !=
                      model->eos.end();
}

const char *nf_model_name(const nf_model *model) {
  return model ? model->engine->info().name.c_str() : "";
}

const char *nf_model_layer_pattern(const nf_model *model) {
  return model ? model->engine->info().layerKinds.c_str() : "";
}

int32_t nf_model_experts_per_token(const nf_model *model) {
  return model ? model->engine->info().topK : 0;
}

int32_t nf_model_n_moe_layers(const nf_model *model) {
  return model ? model->engine->info().numMoeLayers : 0;
}

int32_t nf_model_n_experts(const nf_model *model) {
  return model ? model->engine->info().numExperts : 0;
}

nf_status nf_model_expert_utilization(const nf_model *model, int64_t *counts,
                                      size_t cap) {
  return guard([&]() -> nf_status {
    if (!model || (!counts && cap > 0))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_model_expert_utilization: model and counts must not be "
                  "NULL");
    const auto &used = model->engine->expertUtilization();
    const size_t experts =
        static_cast<size_t>(model->engine->info().numExperts);
    if (cap < used.size() * experts)
      return fail(NF_ERR_BUFFER_TOO_SMALL,
                  "nf_model_expert_utilization: needs " +
                      std::to_string(used.size() * experts) + " entries, got " +
                      std::to_string(cap));
    for (size_t l = 0; l < used.size(); ++l)
      for (size_t e = 0; e < experts; ++e)
        counts[l * experts + e] = used[l][e];
    return NF_OK;
  });
}

nf_status nf_model_reset_expert_utilization(nf_model *model) {
  return guard([&]() -> nf_status {
    if (!model)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_model_reset_expert_utilization: model is NULL");
    model->engine->resetExpertUtilization();
    return NF_OK;
  });
}

nf_generation_defaults nf_model_generation_defaults(const nf_model *model) {
  if (model)
    return model->generation;
  // None found: nf_sampler_default_params' values, no bit set.
  const nf_sampler_params p = nf_sampler_default_params();
  nf_generation_defaults d{};
  d.temperature = p.temperature;
  d.top_p = p.top_p;
  d.top_k = p.top_k;
  d.min_p = p.min_p;
  return d;
}

int32_t nf_model_max_sequences(const nf_model *model) {
  return model ? model->engine->info().maxSequences : 0;
}

const char *nf_model_backend(const nf_model *model) {
  return model ? model->engine->info().backend.c_str() : "";
}

int64_t nf_model_max_context(const nf_model *model) {
  return model ? model->engine->info().maxContext : 0;
}

int32_t nf_model_live_sequences(const nf_model *model) {
  return model ? model->engine->cacheUsage().sequences : 0;
}

int64_t nf_model_kv_pages(const nf_model *model) {
  return model ? model->engine->cacheUsage().kvPages : 0;
}

int64_t nf_model_kv_free_pages(const nf_model *model) {
  return model ? model->engine->cacheUsage().kvFreePages : 0;
}

int32_t nf_model_kv_page_size(const nf_model *model) {
  return model ? model->engine->cacheUsage().kvPageSize : 0;
}

int64_t nf_model_sequence_state_bytes(const nf_model *model) {
  return model ? model->engine->info().stateBytesPerSequence : 0;
}

int64_t nf_model_kv_page_bytes(const nf_model *model) {
  return model ? model->engine->info().kvBytesPerPage : 0;
}

int nf_model_has_tokenizer(const nf_model *model) {
  return model && model->tokenizer.has_value();
}

int nf_model_has_chat_template(const nf_model *model) {
  return model && model->chat.chatTemplate.has_value();
}

const char *nf_model_chat_template_error(const nf_model *model) {
  return model ? model->chat.templateError.c_str() : "";
}

const char *nf_model_info(const nf_model *model) {
  return model ? model->infoText.c_str() : "";
}

nf_status nf_seq_add(nf_model *model, int32_t *seq_id) {
  return guard([&]() -> nf_status {
    if (!model || !seq_id)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_seq_add: model and seq_id must not be NULL");
    StatusOr<int32_t> id = model->engine->addSequence();
    if (!id)
      return fail(NF_ERR_CAPACITY, id.status());
    model->liveSequences.insert(*id);
    model->budgetCarry[*id] = 0.0;
    *seq_id = *id;
    return NF_OK;
  });
}

nf_status nf_seq_fork(nf_model *model, int32_t seq_id, int32_t *fork_id) {
  return guard([&]() -> nf_status {
    if (!model || !fork_id)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_seq_fork: model and fork_id must not be NULL");
    if (!model->liveSequences.count(seq_id))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_seq_fork: unknown sequence id " + std::to_string(seq_id));
    StatusOr<int32_t> id = model->engine->forkSequence(seq_id);
    if (!id)
      return fail(NF_ERR_CAPACITY, id.status());
    model->liveSequences.insert(*id);
    model->budgetCarry[*id] = model->budgetCarry[seq_id];
    *fork_id = *id;
    return NF_OK;
  });
}

nf_status nf_seq_exclusive_pages(const nf_model *model, const int32_t *seq_ids,
                                 int32_t n, int64_t *pages) {
  return guard([&]() -> nf_status {
    if (!model || !pages || n < 0 || (n > 0 && !seq_ids))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_seq_exclusive_pages: model, seq_ids (for n > 0) and "
                  "pages must not be NULL, and n >= 0");
    *pages = model->engine->exclusivePages(
        std::span<const int32_t>(seq_ids, static_cast<size_t>(n)));
    return NF_OK;
  });
}

nf_status nf_seq_remove(nf_model *model, int32_t seq_id) {
  return guard([&]() -> nf_status {
    if (!model)
      return fail(NF_ERR_INVALID_ARGUMENT, "nf_seq_remove: model is NULL");
    if (!model->liveSequences.count(seq_id))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_seq_remove: unknown sequence id " +
                      std::to_string(seq_id));
    // Forgotten only once freed: a failed removal leaves the id live, so
    // that its slot and pages are not lost to a caller that retries.
    if (Status st = model->engine->removeSequence(seq_id); !st)
      return fail(NF_ERR_RUNTIME, st);
    model->liveSequences.erase(seq_id);
    model->budgetCarry.erase(seq_id);
    return NF_OK;
  });
}

int64_t nf_seq_length(const nf_model *model, int32_t seq_id) {
  return guardValue<int64_t>(-1, [&]() -> int64_t {
    if (!model || !model->liveSequences.count(seq_id))
      return -1;
    return model->engine->sequenceLength(seq_id);
  });
}

nf_status nf_decode(nf_model *model, const nf_batch *batch, float *logits_out,
                    size_t logits_cap, int logits_all) {
  return guard([&]() -> nf_status {
    if (!model || !batch)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_decode: model and batch must not be NULL");
    if (batch->n_seqs <= 0 || !batch->seqs)
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_decode: the batch needs at least one sequence");
    const size_t vocab = static_cast<size_t>(model->engine->info().vocabSize);
    size_t rows = 0;
    for (int32_t i = 0; i < batch->n_seqs; ++i)
      rows += logits_all ? static_cast<size_t>(
                               std::max<int32_t>(batch->seqs[i].n_tokens, 0))
                         : 1;
    if (logits_out && logits_cap < rows * vocab)
      return fail(
          NF_ERR_BUFFER_TOO_SMALL,
          "nf_decode: logits buffer holds " + std::to_string(logits_cap) +
              " floats, the step needs " + std::to_string(rows * vocab) + " (" +
              std::to_string(rows) + " rows of " + std::to_string(vocab) + ")");
    // No buffer: no logits copied back from the device.
    using nf::LogitsFor;
    const LogitsFor which = !logits_out  ? LogitsFor::None
                            : logits_all ? LogitsFor::AllTokens
                                         : LogitsFor::LastTokenPerSequence;
    if (nf_status s =
            capi::runStep(model, batch->seqs, batch->n_seqs, which,
                          batch->expert_calls, batch->expert_calls_per_layer);
        s != NF_OK)
      return s;
    if (logits_out && model->logits.size() != rows * vocab)
      return fail(NF_ERR_INTERNAL, "nf_decode: the engine returned " +
                                       std::to_string(model->logits.size()) +
                                       " logits, expected " +
                                       std::to_string(rows * vocab));
    if (logits_out)
      std::memcpy(logits_out, model->logits.data(),
                  rows * vocab * sizeof(float));
    return NF_OK;
  });
}

} // extern "C"
