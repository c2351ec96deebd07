// nfrun serve's structured-output fields: OpenAI's response_format, vLLM's
// structured_outputs and its older guided_* fields, read into the request's
// grammar (nf_request_params.grammar_kind; constrained decoding with
// XGrammar, runtime/src/sampling/grammar.h).
#pragma once

#include "nf/nf.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace nfrun {

/// The body's fields that structured output reads.
inline constexpr const char *kStructuredOutputFields[] = {
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "guided_whitespace_pattern"};

/// Sets `params`' grammar from the body: at most one of response_format
/// (json_object, json_schema, structural_tag in XGrammar's form),
/// structured_outputs ({json | regex | choice | grammar | json_object |
/// structural_tag} and disable_any_whitespace) and guided_json /
/// guided_regex / guided_choice / guided_grammar. An error message, or
/// nullopt.
std::optional<std::string> parseStructuredOutput(const nlohmann::json &body,
                                                 nf::RequestParams &params);

/// An EBNF grammar (XGrammar's) matching exactly one of `choices`.
std::string choiceGrammar(const std::vector<std::string> &choices);

/// tool_choice as vLLM forces it, for the request's `tools` (OpenAI's
/// [{"type": "function", "function": {name, parameters}}]): the JSON
/// schema of the named function's arguments, or of a non-empty array of
/// {"name", "parameters"} calls of any of them (at most one unless
/// `parallel`).
std::string namedToolSchema(const nlohmann::ordered_json &tools,
                            const std::string &name);
std::string requiredToolsSchema(const nlohmann::ordered_json &tools,
                                bool parallel);

} // namespace nfrun
