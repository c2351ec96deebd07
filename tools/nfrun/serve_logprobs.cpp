// nfrun serve's logprobs objects (see serve_logprobs.h).
#include "serve_logprobs.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace nfrun {

using json = nlohmann::json;

namespace {

/// JSON has no -inf; vLLM writes -9999.0.
double finite(float logprob) {
  return std::isfinite(logprob) ? static_cast<double>(logprob) : -9999.0;
}

/// The token string's UTF-8 bytes, as OpenAI lists them.
json bytesOf(const std::string &text) {
  json bytes = json::array();
  for (unsigned char c : text)
    bytes.push_back(static_cast<int>(c));
  return bytes;
}

} // namespace

void CompletionLogprobs::addFirst(int32_t token) {
  const std::string text = model_.tokenString(token);
  tokens_.push_back(text);
  logprobs_.push_back(nullptr);
  top_.push_back(nullptr);
  offsets_.push_back(offset_);
  offset_ += text.size();
}

void CompletionLogprobs::add(const nf::Logprobs &positions) {
  const size_t k = static_cast<size_t>(positions.top);
  for (size_t i = 0; i < positions.size(); ++i) {
    const std::string text = model_.tokenString(positions.tokens[i]);
    tokens_.push_back(text);
    logprobs_.push_back(finite(positions.logprobs[i]));
    // The position's own token is listed too, as OpenAI's and vLLM's are.
    json top = json::object();
    for (size_t j = 0; j < k; ++j)
      if (const int32_t id = positions.topTokens[i * k + j]; id >= 0)
        top.emplace(model_.tokenString(id),
                    finite(positions.topLogprobs[i * k + j]));
    top.emplace(text, finite(positions.logprobs[i]));
    top_.push_back(std::move(top));
    offsets_.push_back(offset_);
    offset_ += text.size();
  }
}

json CompletionLogprobs::take() {
  json out = {{"tokens", std::exchange(tokens_, json::array())},
              {"token_logprobs", std::exchange(logprobs_, json::array())},
              {"top_logprobs", std::exchange(top_, json::array())},
              {"text_offset", std::exchange(offsets_, json::array())}};
  return out;
}

json chatLogprobs(const nf::Logprobs &positions, const RequestModel &model) {
  const size_t k = static_cast<size_t>(positions.top);
  json content = json::array();
  auto entry = [&](int32_t id, float logprob) {
    const std::string text = model.tokenString(id);
    return json{{"token", text},
                {"logprob", finite(logprob)},
                {"bytes", bytesOf(text)}};
  };
  for (size_t i = 0; i < positions.size(); ++i) {
    json e = entry(positions.tokens[i], positions.logprobs[i]);
    json top = json::array();
    for (size_t j = 0; j < k; ++j)
      if (const int32_t id = positions.topTokens[i * k + j]; id >= 0)
        top.push_back(entry(id, positions.topLogprobs[i * k + j]));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return json{{"content", std::move(content)}};
}

} // namespace nfrun
