// Fuzz target: nfrun serve's request parsing (tools/nfrun/serve_request.cpp),
// every JSON field of /v1/completions and /v1/chat/completions, over
// pydoc-moe's tokenizer and the ChatML template (no plan: a RequestModel of
// the tokenizer and the template).
//
// The input is one option byte and the body: byte & 1 picks the endpoint
// (completions, chat). A body is answered with a request or with one line
// of error (a 400); a request has prompt tokens in the vocabulary and within
// the context, max_tokens >= 1 (or 0, "no limit of its own": chat's
// default, or a soft limit alone) and valid sampler parameters.
#include "fuzz_util.h"
#include "nf/tokenizer.h"

#include "chat/chat_template.h"
#include "nfrun/serve_request.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>

namespace {

constexpr int64_t kContext = 4096;

/// pydoc-moe's tokenizer and ChatML, as a loaded model would give them.
class FuzzModel final : public nfrun::RequestModel {
public:
  FuzzModel() {
    auto t = nf::Tokenizer::fromFile(NF_SOURCE_DIR
                                     "/examples/pydoc-moe/tokenizer.json");
    auto c = nf::chat::loadChatConfig(NF_SOURCE_DIR "/examples/pydoc-moe",
                                      NF_SOURCE_DIR
                                      "/test/data/chat_templates/chatml.jinja");
    if (!t || !c) {
      std::fprintf(stderr, "nf fuzz: %s\n",
                   (t ? c.message() : t.message()).c_str());
      std::abort();
    }
    tokenizer_.emplace(std::move(*t));
    chat_ = std::move(*c);
  }
  bool hasTokenizer() const override { return true; }
  nf::StatusOr<std::vector<int32_t>> tokenize(const std::string &text,
                                              bool addSpecial) const override {
    return tokenizer_->encode(text, addSpecial);
  }
  int64_t vocabSize() const override { return tokenizer_->vocabSize(); }
  int64_t maxContext() const override { return kContext; }
  bool hasChatTemplate() const override { return true; }
  std::string chatTemplateError() const override { return ""; }
  nf::StatusOr<std::string>
  applyChatTemplate(const nlohmann::ordered_json &messages,
                    bool addGenerationPrompt,
                    const nlohmann::ordered_json &variables) const override {
    return chat_.applyJson(messages, addGenerationPrompt, &variables);
  }
  nf::StatusOr<std::string>
  detokenize(const std::vector<int32_t> &tokens) const override {
    return tokenizer_->decode(tokens, true);
  }
  nf_generation_defaults generationDefaults() const override {
    return nf_model_generation_defaults(nullptr); // OpenAI's
  }
  std::string tokenString(int32_t id) const override {
    return tokenizer_->decode({id}, false);
  }

private:
  std::optional<nf::Tokenizer> tokenizer_;
  nf::chat::ChatConfig chat_;
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const FuzzModel model;
  if (size == 0)
    return 0;
  const bool chat = data[0] & 1;
  const nlohmann::json body = nlohmann::json::parse(
      data + 1, data + size, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded())
    return 0; // the server answers "the body is not valid JSON"
  // The tokenizer endpoints answer or refuse every body too.
  auto tokenized = chat ? nfrun::tokenizeRequest(body, model)
                        : nfrun::detokenizeRequest(body, model);
  if (const auto *err = std::get_if<std::string>(&tokenized))
    nf::fuzz::checkError(*err, "");
  nfrun::Parsed parsed = chat ? nfrun::parseChat(body, model)
                              : nfrun::parseCompletion(body, model);
  if (const auto *err = std::get_if<std::string>(&parsed)) {
    nf::fuzz::checkError(*err, "");
    return 0;
  }
  const nf::RequestParams &r = std::get<nfrun::ParsedRequest>(parsed).params;
  if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) >= kContext ||
      r.maxTokens < 0 || (r.maxTokens == 0 && !chat && r.maxTokensSoft == 0) ||
      r.maxTokensSoft < 0 || !nf::Sampler::create(r.sampler))
    nf::fuzz::violated("an accepted request without a prompt in the "
                       "context, max_tokens or valid sampler parameters");
  for (int32_t id : r.prompt)
    if (id < 0 || id >= model.vocabSize())
      nf::fuzz::violated("a prompt token outside the vocabulary");
  return 0;
}
