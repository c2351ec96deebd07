// Structured output: constrained decoding with XGrammar (third_party/
// xgrammar), the grammar engine vLLM, SGLang and TensorRT-LLM use. A
// request's grammar (a JSON schema, any JSON, a regex, an EBNF grammar or a
// structural tag) is compiled against the model's vocabulary once; its
// matcher then masks, before each draw, every token that cannot continue a
// match, and follows the drawn tokens. The model's EOS (and the request's
// stop tokens) can be drawn only where the match is complete.
//
// Why XGrammar: a C++ core that builds with this project's toolchain (no
// Rust, as llguidance would need), masks a large vocabulary in tens of
// microseconds by precomputing context-independent tokens, and is the
// default structured-output backend of vLLM and SGLang, so grammars and
// schemas behave as they do there.
#pragma once

#include "nf/status.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nf {
class Tokenizer;
}

namespace nf::sampling {

enum class GrammarKind {
  Json,          // any JSON object (OpenAI's json_object)
  JsonSchema,    // text: a JSON schema
  Regex,         // text: a regular expression
  Ebnf,          // text: an EBNF grammar (XGrammar's / GBNF), rule "root"
  StructuralTag, // text: an XGrammar structural tag (JSON)
};

struct GrammarSpec {
  GrammarKind kind = GrammarKind::Json;
  std::string text;
  /// JSON kinds: whitespace between tokens (vLLM's default); false: only
  /// the separators ", " and ": ".
  bool anyWhitespace = true;
};

/// A grammar compiled against a vocabulary (XGrammar's CompiledGrammar).
struct CompiledGrammar;

/// The model's vocabulary as the grammar engine reads it, and the
/// grammars compiled against it (cached by their text, up to 256 MiB,
/// least recently used first out). Thread-safe.
class GrammarCompiler {
public:
  /// `vocabSize`: the logits' width (may exceed the tokenizer's; the rest
  /// are never allowed). `stopTokens`: the model's EOS tokens.
  GrammarCompiler(const Tokenizer &tokenizer, int32_t vocabSize,
                  std::vector<int32_t> stopTokens);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler &) = delete;
  GrammarCompiler &operator=(const GrammarCompiler &) = delete;

  /// Errors name the problem in the spec (an invalid schema, regex or
  /// grammar) in one line.
  StatusOr<std::shared_ptr<const CompiledGrammar>>
  compile(const GrammarSpec &spec);
  int32_t vocabSize() const { return vocabSize_; }

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int32_t vocabSize_;
};

/// One request's position in its grammar (XGrammar's GrammarMatcher).
class TokenConstraint {
public:
  /// `stopTokens`: the tokens that end a complete match (the model's EOS
  /// and the request's stop tokens).
  TokenConstraint(std::shared_ptr<const CompiledGrammar> grammar,
                  int32_t vocabSize, std::vector<int32_t> stopTokens);
  ~TokenConstraint();
  TokenConstraint(TokenConstraint &&) noexcept;
  TokenConstraint &operator=(TokenConstraint &&) noexcept;

  /// Sets the logits of the tokens the grammar does not allow next to
  /// -inf. Not const: it fills the matcher's mask.
  Status mask(float *row, size_t n);
  /// Follows a drawn token; false when the grammar does not allow it.
  bool accept(int32_t token);
  /// Whether a stop token ended the match.
  bool terminated() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace nf::sampling
