// nfrun serve's logprobs objects: the completions API's (OpenAI's legacy
// shape, with echo's prompt positions) and the chat API's.
#pragma once

#include "serve_request.h"

#include "nf/nf.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>

namespace nfrun {

/// The completions API's `logprobs`: {"tokens", "token_logprobs",
/// "top_logprobs" (a {token string: logprob} object per position),
/// "text_offset" (where each token starts in the choice's text)}, built
/// position by position. A logprob of -inf is written as -9999.0, as
/// vLLM writes it (JSON has no infinity).
class CompletionLogprobs {
public:
  explicit CompletionLogprobs(const RequestModel &model) : model_(model) {}
  /// The echoed prompt's first token, which has no logprob (null).
  void addFirst(int32_t token);
  void add(const nf::Logprobs &positions);
  bool empty() const { return tokens_.empty(); }
  /// The object of the positions added since the last take (a streamed
  /// chunk's); text offsets keep counting.
  nlohmann::json take();

private:
  const RequestModel &model_;
  size_t offset_ = 0;
  nlohmann::json tokens_ = nlohmann::json::array(),
                 logprobs_ = nlohmann::json::array(),
                 top_ = nlohmann::json::array(),
                 offsets_ = nlohmann::json::array();
};

/// The chat API's `logprobs` of `positions`: {"content": [{"token",
/// "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
nlohmann::json chatLogprobs(const nf::Logprobs &positions,
                            const RequestModel &model);

} // namespace nfrun
