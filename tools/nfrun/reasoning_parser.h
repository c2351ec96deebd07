// nfrun serve's reasoning parser (--reasoning-parser nemotron_v3): splits a
// chat completion's text into the model's reasoning and its answer, as
// vLLM's nemotron_v3 parser does for Nemotron 3 models, whose chat template
// opens a `<think>` block in the generation prompt unless thinking is off
// (then the prompt ends with `<think></think>`).
//
// - Reasoning is the text between `<think>` (written by the template, or by
//   the model at the start of its output) and `</think>`; the rest is the
//   answer, without the whitespace right after `</think>`.
// - `<tool_call>` inside reasoning ends it too (the model sometimes omits
//   `</think>` before a tool call): the markup stays in the answer.
// - A block still open at the end (max_tokens) is all reasoning, and the
//   answer is empty.
// Text arrives in pieces (streaming); a piece that ends inside a tag is
// held back until the tag is complete or ruled out.
#pragma once

#include <string>
#include <string_view>

namespace nfrun {

/// The reasoning parsers `--reasoning-parser` accepts ("nemotron_v3");
/// true when `name` is one.
bool isReasoningParser(std::string_view name);

/// The prompt text leaves a `<think>` block open: its last `<think>` comes
/// after its last `</think>`.
bool promptOpensReasoning(std::string_view prompt);

class ReasoningParser {
public:
  /// What one piece of text adds to each part.
  struct Delta {
    std::string reasoning, content;
    bool empty() const { return reasoning.empty() && content.empty(); }
  };

  /// `inReasoning`: the prompt opened a think block (promptOpensReasoning).
  explicit ReasoningParser(bool inReasoning);

  /// The next piece of the generated text.
  Delta feed(std::string_view text);
  /// The end of the text: whatever was held back.
  Delta finish();

  /// Reasoning was seen (the response carries reasoning_content).
  bool sawReasoning() const { return sawReasoning_; }

private:
  enum class State { Start, Reasoning, AfterReasoning, Content };
  Delta drain(bool final);

  State state_;
  std::string pending_; // text not yet assigned to a part
  bool sawReasoning_ = false;
};

} // namespace nfrun
