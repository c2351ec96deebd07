// nfrun serve's request parsing (see serve_request.cpp).
#pragma once

#include "nf/nf.hpp"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <variant>

namespace nfrun {

/// What request parsing reads of the model (nf::Model in the server; the
/// fuzz target gives a tokenizer and a chat template without a plan).
class RequestModel {
public:
  virtual ~RequestModel() = default;
  virtual bool hasTokenizer() const = 0;
  virtual nf::StatusOr<std::vector<int32_t>>
  tokenize(const std::string &text, bool addSpecial) const = 0;
  virtual int64_t vocabSize() const = 0;
  /// Tokens a sequence may hold; -1: unlimited.
  virtual int64_t maxContext() const = 0;
  virtual bool hasChatTemplate() const = 0;
  /// Why the chat template cannot be used ("" when it can or there is none).
  virtual std::string chatTemplateError() const = 0;
  virtual nf::StatusOr<std::string>
  applyChatTemplate(const std::vector<nf::ChatMessage> &messages) const = 0;
};

/// RequestModel over a loaded model.
class LoadedRequestModel final : public RequestModel {
public:
  explicit LoadedRequestModel(const nf::Model &model) : model_(model) {}
  bool hasTokenizer() const override { return model_.hasTokenizer(); }
  nf::StatusOr<std::vector<int32_t>> tokenize(const std::string &text,
                                              bool addSpecial) const override {
    return model_.tokenize(text, addSpecial);
  }
  int64_t vocabSize() const override { return model_.vocabSize(); }
  int64_t maxContext() const override { return model_.maxContext(); }
  bool hasChatTemplate() const override { return model_.hasChatTemplate(); }
  std::string chatTemplateError() const override {
    return model_.chatTemplateError();
  }
  nf::StatusOr<std::string> applyChatTemplate(
      const std::vector<nf::ChatMessage> &messages) const override {
    return model_.applyChatTemplate(messages, true);
  }

private:
  const nf::Model &model_;
};

/// A validated request: what the serving engine runs, and how to answer.
struct ParsedRequest {
  nf::RequestParams params;
  bool stream = false;
  bool returnTokenIds = false; // the response lists the token ids
  bool chat = false;           // /v1/chat/completions
};

/// A validated request, or the one-line message of a 400 answer.
using Parsed = std::variant<ParsedRequest, std::string>;

/// A /v1/completions body: prompt (text or token ids), max_tokens,
/// temperature, top_p, top_k, min_p, seed, n, stream, stop,
/// return_token_ids.
Parsed parseCompletion(const nlohmann::json &body, const RequestModel &model);
/// A /v1/chat/completions body: messages rendered with the model's chat
/// template (and the generation prompt), then the fields of
/// /v1/completions (and max_completion_tokens).
Parsed parseChat(const nlohmann::json &body, const RequestModel &model);

} // namespace nfrun
