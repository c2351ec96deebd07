// nf.hpp: header-only C++ wrappers over the C API (nf/nf.h).
//
// RAII handles (nf::Model, nf::Sampler) that free themselves, and results as
// nf::Status / nf::StatusOr values: nothing here throws (except std::bad_alloc
// from the standard containers). C++17.
//
//   auto model = nf::Model::load("model.nfb");
//   if (!model) { std::cerr << model.message() << "\n"; return 1; }
//   auto prompt = model->tokenize("def ");
//   nf::GenerateParams gp;
//   gp.maxTokens = 32;
//   auto tokens = model->generate(*prompt, gp);
//   std::cout << *model->detokenize(*tokens) << "\n";
#pragma once

#include "nf/nf.h"
#include "nf/status.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nf {

/// The calling thread's last C API error as a Status.
inline Status lastError() { return Status::error(nf_last_error()); }

struct ModelParams {
  std::string weightsDir;    // empty: the checkpoint recorded in the plan
  std::string tokenizerPath; // empty: <weights dir>/tokenizer.json if present
  int32_t threads = 0;       // 0: OpenMP default
  int32_t maxSequences = 0;  // 0: the plan's state slots
  int32_t kvPages = 0;       // 0: the plan's default
  std::string backend;       // "auto" (also empty), "cpu" or "cuda"
  std::string chatTemplatePath; // empty: the tokenizer's chat template
  /// Seeded random weights of the plan's shapes (benchmarks, soak tests of
  /// model shapes whose weights are not at hand).
  bool syntheticWeights = false;
  uint64_t syntheticSeed = 0;
  std::string budgetScope;           // "request" (also empty) or "step"
  double distinctExpertCap = 0.0;    // 0: none; see nf_model_params
  double gpuMemoryUtilization = 0.0; // CUDA; 0: off; see nf_model_params
};

/// One message of a conversation (see nf_chat_message).
struct ChatMessage {
  std::string role;
  std::string content;
};

struct SamplerParams {
  float temperature = 0.0f; // 0: greedy
  int32_t topK = 0;         // 0: off
  float topP = 1.0f;        // 1: off
  float minP = 0.0f;        // 0: off
  uint64_t seed = 0;

  nf_sampler_params c() const {
    nf_sampler_params p = nf_sampler_default_params();
    p.temperature = temperature;
    p.top_k = topK;
    p.top_p = topP;
    p.min_p = minP;
    p.seed = seed;
    return p;
  }
};

struct GenerateParams {
  int32_t maxTokens = 128;
  SamplerParams sampler;
  std::vector<int32_t> stopTokens;
  bool ignoreEos = false;
  float expertBudget = 0.0f; // <= 0: the plan's default
};

/// One sequence's part of a step (see nf_seq_input).
struct SeqInput {
  int32_t seq = 0;
  std::vector<int32_t> tokens;
  float expertBudget = 0.0f;   // <= 0: the plan's default
  int32_t expertsPerToken = 0; // > 0: static top-k override
};

class Sampler {
public:
  static StatusOr<Sampler> create(const SamplerParams &params = {}) {
    nf_sampler_params p = params.c();
    nf_sampler *s = nullptr;
    if (nf_sampler_create(&p, &s) != NF_OK)
      return lastError();
    return Sampler(s);
  }
  Sampler(Sampler &&o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Sampler &operator=(Sampler &&o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  Sampler(const Sampler &) = delete;
  Sampler &operator=(const Sampler &) = delete;
  ~Sampler() { nf_sampler_free(s_); }

  /// The next token from `n` logits.
  StatusOr<int32_t> sample(const float *logits, size_t n) {
    int32_t t = nf_sample(s_, logits, static_cast<int32_t>(n));
    if (t < 0)
      return lastError();
    return t;
  }
  StatusOr<int32_t> sample(const std::vector<float> &logits) {
    return sample(logits.data(), logits.size());
  }
  void reseed(uint64_t seed) { nf_sampler_reseed(s_, seed); }
  nf_sampler *get() const { return s_; }

private:
  explicit Sampler(nf_sampler *s) : s_(s) {}
  nf_sampler *s_ = nullptr;
};

class Model {
public:
  static StatusOr<Model> load(const std::string &planPath,
                              const ModelParams &params = {}) {
    nf_model_params p = nf_model_default_params();
    p.weights_dir = params.weightsDir.c_str();
    p.tokenizer_path = params.tokenizerPath.c_str();
    p.n_threads = params.threads;
    p.max_sequences = params.maxSequences;
    p.kv_pages = params.kvPages;
    p.backend = params.backend.c_str();
    p.chat_template_path = params.chatTemplatePath.c_str();
    p.synthetic_weights = params.syntheticWeights ? 1 : 0;
    p.synthetic_seed = params.syntheticSeed;
    p.budget_scope = params.budgetScope.c_str();
    p.distinct_expert_cap = params.distinctExpertCap;
    p.gpu_memory_utilization = params.gpuMemoryUtilization;
    nf_model *m = nullptr;
    if (nf_model_load(planPath.c_str(), &p, &m) != NF_OK)
      return lastError();
    return Model(m);
  }
  Model(Model &&o) noexcept : m_(std::exchange(o.m_, nullptr)) {}
  Model &operator=(Model &&o) noexcept {
    std::swap(m_, o.m_);
    return *this;
  }
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;
  ~Model() { nf_model_free(m_); }

  nf_model *get() const { return m_; }

  int32_t vocabSize() const { return nf_model_vocab_size(m_); }
  int32_t bos() const { return nf_model_bos(m_); }
  int32_t eos() const { return nf_model_eos(m_); }
  bool isEos(int32_t token) const { return nf_model_is_eos(m_, token) != 0; }
  std::string name() const { return nf_model_name(m_); }
  std::string layerPattern() const { return nf_model_layer_pattern(m_); }
  int32_t expertsPerToken() const { return nf_model_experts_per_token(m_); }
  int32_t numMoeLayers() const { return nf_model_n_moe_layers(m_); }
  int32_t numExperts() const { return nf_model_n_experts(m_); }
  /// Tokens routed to each expert since load or reset, [layer][expert].
  StatusOr<std::vector<std::vector<int64_t>>> expertUtilization() const {
    const size_t layers = static_cast<size_t>(numMoeLayers());
    const size_t experts = static_cast<size_t>(numExperts());
    std::vector<int64_t> flat(layers * experts);
    if (nf_model_expert_utilization(m_, flat.data(), flat.size()) != NF_OK)
      return Status::error(nf_last_error());
    std::vector<std::vector<int64_t>> out(layers);
    for (size_t l = 0; l < layers; ++l)
      out[l].assign(flat.begin() + l * experts,
                    flat.begin() + (l + 1) * experts);
    return out;
  }
  Status resetExpertUtilization() {
    if (nf_model_reset_expert_utilization(m_) != NF_OK)
      return Status::error(nf_last_error());
    return Status::success();
  }
  int32_t maxSequences() const { return nf_model_max_sequences(m_); }
  /// generation_config.json's sampling defaults (nf_model_generation_defaults).
  nf_generation_defaults generationDefaults() const {
    return nf_model_generation_defaults(m_);
  }
  int64_t maxContext() const { return nf_model_max_context(m_); }
  /// Storage in use now (see nf_model_live_sequences).
  int32_t liveSequences() const { return nf_model_live_sequences(m_); }
  int64_t kvPages() const { return nf_model_kv_pages(m_); }
  int64_t sequenceStateBytes() const {
    return nf_model_sequence_state_bytes(m_);
  }
  int64_t kvPageBytes() const { return nf_model_kv_page_bytes(m_); }
  int64_t kvFreePages() const { return nf_model_kv_free_pages(m_); }
  int32_t kvPageSize() const { return nf_model_kv_page_size(m_); }
  bool hasTokenizer() const { return nf_model_has_tokenizer(m_) != 0; }
  bool hasChatTemplate() const { return nf_model_has_chat_template(m_) != 0; }
  /// Why the tokenizer's chat template cannot be used ("" when it can, or
  /// there is none): see nf_model_chat_template_error.
  std::string chatTemplateError() const {
    return nf_model_chat_template_error(m_);
  }
  /// "cpu" or "cuda".
  std::string backend() const { return nf_model_backend(m_); }
  std::string info() const { return nf_model_info(m_); }

  StatusOr<std::vector<int32_t>> tokenize(std::string_view text,
                                          bool addSpecial = false) const {
    std::vector<int32_t> ids(text.size() + 8);
    size_t n = 0;
    nf_status s = nf_tokenize(m_, text.data(), text.size(), addSpecial,
                              ids.data(), ids.size(), &n);
    if (s == NF_ERR_BUFFER_TOO_SMALL) {
      ids.resize(n);
      s = nf_tokenize(m_, text.data(), text.size(), addSpecial, ids.data(),
                      ids.size(), &n);
    }
    if (s != NF_OK)
      return lastError();
    ids.resize(n);
    return ids;
  }

  /// Text of `tokens`; `flags`: NF_DETOKENIZE_* (default: skip special).
  StatusOr<std::string>
  detokenize(const std::vector<int32_t> &tokens,
             int flags = NF_DETOKENIZE_SKIP_SPECIAL) const {
    std::string text(tokens.size() * 8 + 16, '\0');
    size_t n = 0;
    nf_status s = nf_detokenize(m_, tokens.data(), tokens.size(), flags,
                                text.data(), text.size(), &n);
    if (s == NF_ERR_BUFFER_TOO_SMALL) {
      text.resize(n);
      s = nf_detokenize(m_, tokens.data(), tokens.size(), flags, text.data(),
                        text.size(), &n);
    }
    if (s != NF_OK)
      return lastError();
    text.resize(n);
    return text;
  }

  /// The prompt text of a conversation (see nf_chat_apply_template_vars:
  /// `variablesJson`, a JSON object of more template variables or "");
  /// tokenize it with addSpecial = false. Roles and contents are C strings
  /// there: one holding a NUL character is refused (an error), not cut.
  StatusOr<std::string>
  applyChatTemplate(const std::vector<ChatMessage> &messages,
                    bool addGenerationPrompt = true,
                    const std::string &variablesJson = "") const {
    std::vector<nf_chat_message> msgs(messages.size());
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i].role.find('\0') != std::string::npos ||
          messages[i].content.find('\0') != std::string::npos)
        return Status::error("message " + std::to_string(i) +
                             ": role and content must not contain NUL "
                             "characters");
      msgs[i] = {messages[i].role.c_str(), messages[i].content.c_str()};
    }
    return rendered([&](char *out, size_t cap, size_t *n) {
      return nf_chat_apply_template_vars(m_, msgs.data(), msgs.size(),
                                         addGenerationPrompt,
                                         variablesJson.c_str(), out, cap, n);
    });
  }
  /// The same with the messages as a JSON array of objects (see
  /// nf_chat_apply_template_json): tool calls and tool results too.
  StatusOr<std::string>
  applyChatTemplateJson(const std::string &messagesJson,
                        bool addGenerationPrompt = true,
                        const std::string &variablesJson = "") const {
    return rendered([&](char *out, size_t cap, size_t *n) {
      return nf_chat_apply_template_json(m_, messagesJson.c_str(),
                                         addGenerationPrompt,
                                         variablesJson.c_str(), out, cap, n);
    });
  }

  StatusOr<int32_t> addSequence() {
    int32_t id = -1;
    if (nf_seq_add(m_, &id) != NF_OK)
      return lastError();
    return id;
  }
  /// nf_seq_fork: a new sequence continuing from `seq`.
  StatusOr<int32_t> forkSequence(int32_t seq) {
    int32_t id = -1;
    if (nf_seq_fork(m_, seq, &id) != NF_OK)
      return lastError();
    return id;
  }
  Status removeSequence(int32_t seq) {
    return nf_seq_remove(m_, seq) == NF_OK ? Status::success() : lastError();
  }
  /// -1 for an unknown sequence.
  int64_t sequenceLength(int32_t seq) const { return nf_seq_length(m_, seq); }

  /// One step; `logits` receives [rows, vocabSize()] (one row per token with
  /// `allLogits`, else one per sequence). `expertCalls`, when given, receives
  /// the routed-expert calls of each sequence.
  Status decode(const std::vector<SeqInput> &batch, bool allLogits,
                std::vector<float> &logits,
                std::vector<int64_t> *expertCalls = nullptr) {
    std::vector<nf_seq_input> seqs;
    const nf_batch b = cBatch(batch, seqs, expertCalls);
    size_t rows = 0;
    for (const SeqInput &in : batch)
      rows += allLogits ? in.tokens.size() : 1;
    logits.resize(rows * static_cast<size_t>(vocabSize()));
    nf_status s =
        nf_decode(m_, &b, logits.data(), logits.size(), allLogits ? 1 : 0);
    return s == NF_OK ? Status::success() : lastError();
  }

  /// One step and each sequence's next token drawn by samplers[i] (see
  /// nf_decode_sample): tokens[i], -1 where sampler i found no logit above
  /// -inf or is null (nothing drawn: a prompt chunk before its last).
  Status decodeSample(const std::vector<SeqInput> &batch,
                      const std::vector<Sampler *> &samplers,
                      std::vector<int32_t> &tokens,
                      std::vector<int64_t> *expertCalls = nullptr) {
    if (samplers.size() != batch.size())
      return Status::error("decodeSample: " + std::to_string(batch.size()) +
                           " sequences, " + std::to_string(samplers.size()) +
                           " samplers");
    std::vector<nf_seq_input> seqs;
    const nf_batch b = cBatch(batch, seqs, expertCalls);
    std::vector<nf_sampler *> s(batch.size());
    for (size_t i = 0; i < batch.size(); ++i)
      s[i] = samplers[i] ? samplers[i]->get() : nullptr;
    tokens.assign(batch.size(), -1);
    return nf_decode_sample(m_, &b, s.data(), tokens.data()) == NF_OK
               ? Status::success()
               : lastError();
  }

  /// Generated tokens (see nf_generate). `onToken(token, piece)` is called
  /// for each one; returning false stops generation.
  StatusOr<std::vector<int32_t>>
  generate(const std::vector<int32_t> &prompt, const GenerateParams &params,
           const std::function<bool(int32_t, std::string_view)> &onToken = {}) {
    nf_generate_params p = nf_generate_default_params();
    p.max_tokens = params.maxTokens;
    p.sampler = params.sampler.c();
    p.stop_tokens = params.stopTokens.data();
    p.n_stop_tokens = params.stopTokens.size();
    p.ignore_eos = params.ignoreEos ? 1 : 0;
    p.expert_budget = params.expertBudget;
    std::vector<int32_t> out(
        static_cast<size_t>(params.maxTokens > 0 ? params.maxTokens : 0));
    size_t n = 0;
    nf_token_callback cb = nullptr;
    void *user = nullptr;
    if (onToken) {
      cb = [](int32_t token, const char *piece, size_t len, void *u) -> int {
        const auto &f = *static_cast<
            const std::function<bool(int32_t, std::string_view)> *>(u);
        return f(token, std::string_view(piece ? piece : "", len)) ? 0 : 1;
      };
      user = const_cast<void *>(static_cast<const void *>(&onToken));
    }
    if (nf_generate(m_, prompt.data(), prompt.size(), &p, cb, user, out.data(),
                    out.size(), &n) != NF_OK)
      return lastError();
    out.resize(n);
    return out;
  }

private:
  /// Text of a render call (out, cap, n_out) that may ask for more room:
  /// each call renders anew (strftime_now may make one longer than the
  /// last), so again with the size it asked for.
  template <class Render> StatusOr<std::string> rendered(Render render) const {
    std::string text(4096, '\0');
    size_t n = 0;
    while (true) {
      const nf_status s = render(text.data(), text.size(), &n);
      if (s == NF_OK)
        break;
      if (s != NF_ERR_BUFFER_TOO_SMALL || n <= text.size())
        return lastError();
      text.resize(n);
    }
    text.resize(n);
    return text;
  }

  /// The C batch of `batch` (its entries in `seqs`); `expertCalls`, when
  /// given, is zeroed and receives the step's counts.
  static nf_batch cBatch(const std::vector<SeqInput> &batch,
                         std::vector<nf_seq_input> &seqs,
                         std::vector<int64_t> *expertCalls) {
    seqs.resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      seqs[i].seq_id = batch[i].seq;
      seqs[i].tokens = batch[i].tokens.data();
      seqs[i].n_tokens = static_cast<int32_t>(batch[i].tokens.size());
      seqs[i].expert_budget = batch[i].expertBudget;
      seqs[i].experts_per_token = batch[i].expertsPerToken;
    }
    if (expertCalls)
      expertCalls->assign(batch.size(), 0);
    nf_batch b = {};
    b.seqs = seqs.data();
    b.n_seqs = static_cast<int32_t>(seqs.size());
    b.expert_calls = expertCalls ? expertCalls->data() : nullptr;
    return b;
  }

  explicit Model(nf_model *m) : m_(m) {}
  nf_model *m_ = nullptr;
};

/// Generated tokens as visible text, piece by piece (see nf_text_stream).
class TextStream {
public:
  static StatusOr<TextStream>
  create(const Model &model, const std::vector<std::string> &stops = {}) {
    std::vector<const char *> s;
    for (const std::string &stop : stops)
      s.push_back(stop.c_str());
    nf_text_stream *t = nullptr;
    if (nf_text_stream_create(model.get(), s.data(), s.size(), &t) != NF_OK)
      return lastError();
    return TextStream(t);
  }
  TextStream(TextStream &&o) noexcept : t_(std::exchange(o.t_, nullptr)) {}
  TextStream &operator=(TextStream &&o) noexcept {
    std::swap(t_, o.t_);
    return *this;
  }
  TextStream(const TextStream &) = delete;
  TextStream &operator=(const TextStream &) = delete;
  ~TextStream() { nf_text_stream_free(t_); }

  /// The bytes `token` makes visible (all that is left with `final`);
  /// `stopped`, when given, says whether a stop string now ends the text.
  StatusOr<std::string> add(int32_t token, bool final = false,
                            bool *stopped = nullptr) {
    const char *text = nullptr;
    size_t len = 0;
    int stop = 0;
    if (nf_text_stream_add(t_, token, final ? 1 : 0, &text, &len, &stop) !=
        NF_OK)
      return lastError();
    if (stopped)
      *stopped = stop != 0;
    return std::string(text, len);
  }
  /// What was held back, at the end.
  StatusOr<std::string> finish() { return add(-1, true); }

private:
  explicit TextStream(nf_text_stream *t) : t_(t) {}
  nf_text_stream *t_ = nullptr;
};

/// Serving engine parameters (see nf_engine_params).
struct EngineParams {
  int32_t maxBatch = 0; // 0: the model's sequences
  int32_t maxQueue = 256;
  int64_t maxBatchedTokens = 2048;
  int32_t maxNewTokens = 0; // 0: no hard limit
  int64_t maxWaitMs = 0;    // 0: no promotion
  nf_engine_observer observer = nullptr;
  void *observerData = nullptr;
  bool prefixCaching = true;
  int32_t prefixCacheBlock = 0; // 0: the default, 256 tokens
};

/// One request to a serving engine (see nf_request_params).
struct RequestParams {
  std::vector<int32_t> prompt;
  int32_t maxTokens = 16; // <= 0: the engine's limit, else the context
  int32_t maxTokensSoft = 0;
  SamplerParams sampler;
  std::vector<std::string> stopStrings;
  std::vector<int32_t> stopTokens;
  bool ignoreEos = false;
  int32_t priority = 0;      // lower first
  float expertBudget = 0.0f; // <= 0: the plan's default
  void *userData = nullptr;  // for the engine's observer
  std::string cacheSalt;     // prefix caching: "" is the shared cache
  /// Log-probabilities (see nf_request_params): -1 none, else the
  /// alternatives per position (0 to 20); of the generated tokens and of
  /// the prompt's tokens after the first.
  int32_t logprobs = -1;
  int32_t promptLogprobs = -1;
  /// Penalties (see nf_request_params): 0, 0, 1, none and 0 are off.
  float presencePenalty = 0.0f, frequencyPenalty = 0.0f;
  float repetitionPenalty = 1.0f;
  std::vector<std::pair<int32_t, float>> logitBias;
  int32_t minTokens = 0;
  /// Structured output (see nf_request_params): the text the generation
  /// must match, of grammarKind (the schema, regex, EBNF or structural
  /// tag; unused for NF_GRAMMAR_JSON).
  nf_grammar_kind grammarKind = NF_GRAMMAR_NONE;
  std::string grammar;
  uint32_t grammarFlags = 0;         // NF_GRAMMAR_FLAG_*
  std::vector<int32_t> grammarAfter; // the grammar starts after these
  bool keepSpecialTokens = false;    // the text keeps special tokens' text
  bool includeStopString = false;    // the text ends after its stop string
};

/// The most alternatives a position's logprobs may list.
inline constexpr int32_t kMaxTopLogprobs = NF_MAX_TOP_LOGPROBS;

/// Positions' log-probabilities (see nf_request_output): each position's
/// token and logprob, and `top` alternatives ([position][top]).
struct Logprobs {
  int32_t top = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> topTokens;
  std::vector<float> topLogprobs;

  size_t size() const { return tokens.size(); }
  void append(const Logprobs &o) {
    if (!o.tokens.empty())
      top = o.top;
    tokens.insert(tokens.end(), o.tokens.begin(), o.tokens.end());
    logprobs.insert(logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    topTokens.insert(topTokens.end(), o.topTokens.begin(), o.topTokens.end());
    topLogprobs.insert(topLogprobs.end(), o.topLogprobs.begin(),
                       o.topLogprobs.end());
  }
  /// The positions [from, from + n).
  Logprobs slice(size_t from, size_t n) const {
    Logprobs l;
    l.top = top;
    const size_t t = static_cast<size_t>(top);
    l.tokens.assign(tokens.begin() + from, tokens.begin() + from + n);
    l.logprobs.assign(logprobs.begin() + from, logprobs.begin() + from + n);
    l.topTokens.assign(topTokens.begin() + from * t,
                       topTokens.begin() + (from + n) * t);
    l.topLogprobs.assign(topLogprobs.begin() + from * t,
                         topLogprobs.begin() + (from + n) * t);
    return l;
  }
};

/// What a request produced since the last read (see nf_request_output).
struct RequestOutput {
  std::vector<int32_t> tokens;
  std::string text;
  nf_finish_reason finishReason = NF_FINISH_NONE;
  std::string error;
  int64_t promptTokens = 0, completionTokens = 0;
  int32_t maxTokens = 0, preemptions = 0;
  int64_t expertCalls = 0;                  // so far, all MoE layers
  std::vector<int64_t> expertCallsPerLayer; // so far, per MoE layer
  float expertBudget = 0.0f;                // applied
  double expertBudgetSpent = 0.0;           // of static top-k's calls
  double queuedS = 0, prefillS = 0, decodeS = 0;
  int64_t cachedTokens = 0; // prompt tokens from the prefix cache
  /// Of `tokens` (empty unless asked for), and of the prompt positions
  /// this read brings.
  Logprobs logprobs, promptLogprobs;
  bool finished() const { return finishReason != NF_FINISH_NONE; }
  /// Joins a later read onto this one: its tokens, text and logprobs
  /// follow these; its end, usage and timings replace these.
  void join(RequestOutput next) {
    tokens.insert(tokens.end(), next.tokens.begin(), next.tokens.end());
    text += next.text;
    logprobs.append(next.logprobs);
    promptLogprobs.append(next.promptLogprobs);
    next.tokens = std::move(tokens);
    next.text = std::move(text);
    next.logprobs = std::move(logprobs);
    next.promptLogprobs = std::move(promptLogprobs);
    *this = std::move(next);
  }
};

/// A submitted request: read its output as it comes. Destroying it cancels
/// the request if it is still running.
class ServingRequest {
public:
  ServingRequest(ServingRequest &&o) noexcept
      : r_(std::exchange(o.r_, nullptr)) {}
  ServingRequest &operator=(ServingRequest &&o) noexcept {
    std::swap(r_, o.r_);
    return *this;
  }
  ServingRequest(const ServingRequest &) = delete;
  ServingRequest &operator=(const ServingRequest &) = delete;
  ~ServingRequest() { nf_request_free(r_); }

  /// Waits up to `timeout` (negative: without limit) for news.
  StatusOr<RequestOutput>
  read(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    nf_request_output o;
    const auto ms = timeout.count() < 0 ? -1
                    : timeout.count() > INT32_MAX
                        ? INT32_MAX
                        : static_cast<int32_t>(timeout.count());
    if (nf_request_read(r_, ms, &o) != NF_OK)
      return lastError();
    RequestOutput out;
    out.tokens.assign(o.tokens, o.tokens + o.n_tokens);
    out.text.assign(o.text, o.text_len);
    out.finishReason = o.finish_reason;
    out.error = o.error;
    out.promptTokens = o.prompt_tokens;
    out.completionTokens = o.completion_tokens;
    out.maxTokens = o.max_tokens;
    out.preemptions = o.preemptions;
    out.expertCalls = o.expert_calls;
    out.expertCallsPerLayer.assign(o.expert_calls_per_layer,
                                   o.expert_calls_per_layer + o.n_moe_layers);
    out.expertBudget = o.expert_budget;
    out.expertBudgetSpent = o.expert_budget_spent;
    out.queuedS = o.queued_s;
    out.prefillS = o.prefill_s;
    out.decodeS = o.decode_s;
    out.cachedTokens = o.cached_tokens;
    auto list = [](Logprobs &l, const int32_t *tokens, const float *lp,
                   size_t n, const int32_t *topTokens, const float *topLp,
                   int32_t top) {
      if (!lp)
        return;
      const size_t t = static_cast<size_t>(top);
      l.top = top;
      l.tokens.assign(tokens, tokens + n);
      l.logprobs.assign(lp, lp + n);
      l.topTokens.assign(topTokens, topTokens + n * t);
      l.topLogprobs.assign(topLp, topLp + n * t);
    };
    list(out.logprobs, o.tokens, o.token_logprobs, o.n_tokens,
         o.top_logprob_tokens, o.top_logprobs, o.n_top_logprobs);
    list(out.promptLogprobs, o.prompt_logprob_tokens, o.prompt_logprobs,
         o.n_prompt_logprobs, o.prompt_top_logprob_tokens,
         o.prompt_top_logprobs, o.n_prompt_top_logprobs);
    return out;
  }
  /// Reads until the end: every token and the whole text.
  StatusOr<RequestOutput> wait() {
    RequestOutput all;
    for (;;) {
      auto o = read();
      if (!o)
        return o;
      all.join(std::move(*o));
      if (all.finished())
        return all;
    }
  }
  void cancel() { nf_request_cancel(r_); }

private:
  friend class ServingEngine;
  explicit ServingRequest(nf_request *r) : r_(r) {}
  nf_request *r_ = nullptr;
};

/// A serving engine over a model (see nf_engine): the model must outlive
/// it, and its steps are the engine's while it exists.
class ServingEngine {
public:
  static StatusOr<ServingEngine> create(Model &model,
                                        const EngineParams &params = {}) {
    nf_engine_params p = nf_engine_default_params();
    p.max_batch = params.maxBatch;
    p.max_queue = params.maxQueue;
    p.max_batched_tokens = params.maxBatchedTokens;
    p.max_new_tokens = params.maxNewTokens;
    p.max_wait_ms = params.maxWaitMs;
    p.observer = params.observer;
    p.observer_data = params.observerData;
    p.prefix_caching = params.prefixCaching ? 1 : 0;
    p.prefix_cache_block = params.prefixCacheBlock;
    nf_engine *e = nullptr;
    if (nf_engine_create(model.get(), &p, &e) != NF_OK)
      return lastError();
    return ServingEngine(e);
  }
  ServingEngine(ServingEngine &&o) noexcept
      : e_(std::exchange(o.e_, nullptr)) {}
  ServingEngine &operator=(ServingEngine &&o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ServingEngine(const ServingEngine &) = delete;
  ServingEngine &operator=(const ServingEngine &) = delete;
  ~ServingEngine() { nf_engine_free(e_); }

  /// Queues a request; `code`, when given, receives the status (to tell a
  /// full queue, NF_ERR_CAPACITY, and shutdown, NF_ERR_UNAVAILABLE, from
  /// bad parameters).
  StatusOr<ServingRequest> submit(const RequestParams &params,
                                  nf_status *code = nullptr) {
    std::vector<const char *> stops;
    for (const std::string &s : params.stopStrings)
      stops.push_back(s.c_str());
    nf_request_params p = nf_request_default_params();
    p.prompt = params.prompt.data();
    p.n_prompt = params.prompt.size();
    p.max_tokens = params.maxTokens;
    p.max_tokens_soft = params.maxTokensSoft;
    p.sampler = params.sampler.c();
    p.stop_strings = stops.data();
    p.n_stop_strings = stops.size();
    p.stop_tokens = params.stopTokens.data();
    p.n_stop_tokens = params.stopTokens.size();
    p.ignore_eos = params.ignoreEos ? 1 : 0;
    p.priority = params.priority;
    p.expert_budget = params.expertBudget;
    p.user_data = params.userData;
    p.cache_salt = params.cacheSalt.c_str();
    p.logprobs = params.logprobs >= 0;
    p.top_logprobs = std::max(params.logprobs, 0);
    p.prompt_logprobs = params.promptLogprobs >= 0;
    p.prompt_top_logprobs = std::max(params.promptLogprobs, 0);
    p.presence_penalty = params.presencePenalty;
    p.frequency_penalty = params.frequencyPenalty;
    p.repetition_penalty = params.repetitionPenalty;
    std::vector<int32_t> biasTokens;
    std::vector<float> biasValues;
    for (const auto &[t, b] : params.logitBias) {
      biasTokens.push_back(t);
      biasValues.push_back(b);
    }
    p.logit_bias_tokens = biasTokens.data();
    p.logit_bias_values = biasValues.data();
    p.n_logit_bias = biasTokens.size();
    p.min_tokens = params.minTokens;
    p.grammar_kind = params.grammarKind;
    p.grammar = params.grammar.c_str();
    p.grammar_flags = params.grammarFlags;
    p.grammar_after = params.grammarAfter.data();
    p.n_grammar_after = params.grammarAfter.size();
    p.keep_special_tokens = params.keepSpecialTokens ? 1 : 0;
    p.include_stop_str = params.includeStopString ? 1 : 0;
    nf_request *r = nullptr;
    const nf_status st = nf_engine_submit(e_, &p, &r);
    if (code)
      *code = st;
    if (st != NF_OK)
      return lastError();
    return ServingRequest(r);
  }
  /// See nf_engine_reset_prefix_cache.
  void resetPrefixCache() { nf_engine_reset_prefix_cache(e_); }
  /// See nf_engine_shutdown.
  void shutdown(std::chrono::milliseconds grace) {
    nf_engine_shutdown(e_, grace.count());
  }
  nf_engine_stats stats() const {
    nf_engine_stats s = {};
    (void)nf_engine_get_stats(e_, &s);
    return s;
  }
  /// Tokens routed to each expert as of the engine's last step, flat
  /// [MoE layer][expert] (see nf_engine_expert_utilization).
  StatusOr<std::vector<int64_t>> expertUtilization(const Model &model) const {
    std::vector<int64_t> counts(static_cast<size_t>(model.numMoeLayers()) *
                                static_cast<size_t>(model.numExperts()));
    if (nf_engine_expert_utilization(e_, counts.data(), counts.size()) != NF_OK)
      return lastError();
    return counts;
  }
  nf_engine *get() const { return e_; }

private:
  explicit ServingEngine(nf_engine *e) : e_(e) {}
  nf_engine *e_ = nullptr;
};

} // namespace nf
