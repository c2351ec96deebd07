// What the two halves of nfrun serve's request parsing share
// (serve_request.cpp: completions, tokenize; serve_chat_request.cpp: chat).
#pragma once

#include "serve_request.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <variant>

namespace nfrun::detail {

using json = nlohmann::json;

/// JSON-quoted, so control characters are escaped and invalid UTF-8
/// cannot break the one-line message.
std::string quoted(const std::string &text);
/// The sampling and length fields shared by both endpoints (see
/// serve_request.cpp); `r.params.prompt` is set. An error, or nullopt.
std::optional<std::string> parseSampling(const json &body,
                                         const RequestModel &model,
                                         const ServePolicy &policy,
                                         ParsedRequest &r);
/// Intent, priority, expert budget and cache salt.
std::optional<std::string> parseTraffic(const json &body,
                                        const TrafficHeaders &headers,
                                        const ServePolicy &policy,
                                        ParsedRequest &r);
/// The first field the server does not implement or know, as a message.
std::optional<std::string> unsupportedField(const json &body, bool chat);
/// A template's error without the server's file path that starts it.
std::string withoutTemplatePath(const std::string &message);
/// A chat request's messages, checked, as the template gets them.
std::variant<nlohmann::ordered_json, std::string>
parseMessages(const json &body);
/// The chat template's variables: the server's defaults under the
/// request's chat_template_kwargs.
std::variant<nlohmann::ordered_json, std::string>
templateVariables(const json &body, const ServePolicy &policy);
/// A count of logprob alternatives, `key` (0 to kMaxTopLogprobs).
std::optional<std::string> topLogprobs(const json &body, const char *key,
                                       int32_t &out);

} // namespace nfrun::detail
