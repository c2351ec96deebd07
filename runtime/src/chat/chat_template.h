// Hugging Face chat templates: the Jinja text that turns a conversation into
// the model's prompt, rendered as transformers' apply_chat_template renders
// it (jinja2's ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, its loopcontrols extension and {% generation %} tag, the
// tojson filter with ensure_ascii=False, raise_exception() and
// strftime_now()), byte for byte for the subset of Jinja real templates use.
//
// Supported: {{ }}, {% %}, {# #} and whitespace control; if / elif / else,
// for (with else, `if` filters, tuple unpacking, loop.*, break / continue),
// set (also namespace attributes and {% set %} blocks), macro and calls,
// with, filter blocks, raw; every expression operator; Python's str, list
// and dict methods that do not mutate; jinja2's tests and most of its
// filters. Not supported (an error naming the template line, never a wrong
// output): include / extends / import / block / call, recursive loops,
// *args in calls, printf-style `%` formatting, and the filters batch,
// format, groupby, pprint, slice, truncate, wordcount, wordwrap, xmlattr,
// urlize, .... Ints are 64-bit (overflow is an error); upper / lower case
// mapping covers Latin, Greek, Cyrillic and Armenian letters. Parsing and
// rendering are bounded against hostile templates (expression depth, string
// and list sizes, work, recursion: see jinja::Limits), failing with an
// error instead of exhausting the stack, memory or time.
#pragma once

#include "nf/status.h"

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nf::chat {

/// One message of a conversation.
struct Message {
  std::string role;
  std::string content;
};

class ChatTemplate {
public:
  /// Parses Jinja source; `sourceName` (usually the file) starts every error
  /// message: "<sourceName>: chat template line 12: unknown tag 'foo'".
  static StatusOr<ChatTemplate> parse(std::string_view source,
                                      std::string sourceName);

  /// Renders with the template variables of `context` (a JSON object: keys
  /// keep their order, as Python dicts do). A template that fails, or calls
  /// raise_exception(msg), gives an error with the line (and msg).
  StatusOr<std::string> render(const nlohmann::ordered_json &context) const;

  const std::string &sourceName() const;

  struct Impl;

private:
  explicit ChatTemplate(std::shared_ptr<const Impl> impl)
      : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// What a checkpoint says about formatting chats.
struct ChatConfig {
  std::optional<ChatTemplate> chatTemplate;
  /// Why the template found next to the tokenizer cannot be used (a file
  /// that cannot be read, a malformed tokenizer_config.json, a template
  /// that does not parse): "<file>: chat template line 3: ...". Empty when
  /// there is a template, or none was found.
  std::string templateError;
  /// bos_token, eos_token, ... as tokenizer_config.json names them: the
  /// template variables transformers passes (its special_tokens_map).
  std::vector<std::pair<std::string, std::string>> specialTokens;

  /// The variables apply_chat_template passes: messages, tools and documents
  /// (None), add_generation_prompt and the special tokens.
  nlohmann::ordered_json context(const std::vector<Message> &messages,
                                 bool addGenerationPrompt) const;
  /// The prompt of `messages`; an error without a template or for messages
  /// that are not UTF-8. `variables` (a JSON object, or null) are more
  /// template variables, as keyword arguments of apply_chat_template (e.g.
  /// {"enable_thinking": false}): they override tools, documents and the
  /// special tokens; "messages" and "add_generation_prompt" are errors.
  StatusOr<std::string>
  apply(const std::vector<Message> &messages, bool addGenerationPrompt,
        const nlohmann::ordered_json *variables = nullptr) const;
  /// The same with messages as JSON objects, as OpenAI's API and
  /// transformers give them: a "role" string each, and "content", and
  /// "tool_calls", "tool_call_id", "reasoning_content", ... as they are.
  StatusOr<std::string>
  applyJson(const nlohmann::ordered_json &messages, bool addGenerationPrompt,
            const nlohmann::ordered_json *variables = nullptr) const;
};

/// Reads the chat configuration of the tokenizer in `dir`, as transformers
/// finds it: the template from `templatePath` when it is not empty, else
/// `dir`/chat_template.jinja, else the "chat_template" of
/// `dir`/tokenizer_config.json (a string, or a list of {"name",
/// "template"} of which "default" is taken); the special tokens from
/// tokenizer_config.json (strings or {"content": ...} objects). No template
/// anywhere is not an error. A template found in `dir` that cannot be used
/// (an unreadable or malformed file, a template that does not parse) is
/// not an error either: the config has no template and says why in
/// templateError. An error (naming the file) only when `templatePath` is
/// given and it, or tokenizer_config.json, cannot be used.
StatusOr<ChatConfig> loadChatConfig(const std::string &dir,
                                    const std::string &templatePath);

} // namespace nf::chat
