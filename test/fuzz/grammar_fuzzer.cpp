// Fuzz target: structured output's grammars (runtime/src/sampling/grammar,
// XGrammar), compiled against pydoc-moe's vocabulary, then a matcher fed
// tokens.
//
// The input is one option byte, the grammar text, and after a NUL the token
// ids to feed (two bytes each). byte % 5 picks the kind (JSON, JSON schema,
// regex, EBNF, structural tag), byte & 8 the JSON whitespace flag. A
// grammar either compiles or is refused with one line naming it; a
// compiled one masks a row without touching the allowed tokens' logits,
// and a token it masks out is one it rejects.
#include "fuzz_util.h"
#include "nf/tokenizer.h"
#include "sampling/grammar.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

namespace {

struct Vocabulary {
  Vocabulary() {
    auto t = nf::Tokenizer::fromFile(NF_SOURCE_DIR
                                     "/examples/pydoc-moe/tokenizer.json");
    if (!t) {
      std::fprintf(stderr, "nf fuzz: %s\n", t.message().c_str());
      std::abort();
    }
    tokenizer.emplace(std::move(*t));
    // Two columns past the tokenizer's: the logits' padding.
    vocab = tokenizer->vocabSize() + 2;
    compiler = std::make_unique<nf::sampling::GrammarCompiler>(
        *tokenizer, vocab, std::vector<int32_t>{2});
  }
  std::optional<nf::Tokenizer> tokenizer;
  int32_t vocab = 0;
  std::unique_ptr<nf::sampling::GrammarCompiler> compiler;
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static Vocabulary v;
  if (size == 0)
    return 0;
  const std::string_view in(reinterpret_cast<const char *>(data + 1), size - 1);
  const size_t nul = in.find('\0');
  nf::sampling::GrammarSpec spec;
  spec.kind = static_cast<nf::sampling::GrammarKind>(data[0] % 5);
  spec.anyWhitespace = (data[0] & 8) == 0;
  spec.text = std::string(in.substr(0, nul));
  auto grammar = v.compiler->compile(spec);
  if (!grammar) {
    const std::string &m = grammar.message();
    if (m.empty() || m.find('\n') != std::string::npos ||
        m.rfind("invalid ", 0) != 0)
      nf::fuzz::violated("a refusal that is not one line naming the "
                         "grammar: " +
                         m);
    return 0;
  }
  nf::sampling::TokenConstraint c(*grammar, v.vocab, {2});
  const std::string_view tokens =
      nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  std::vector<float> row(static_cast<size_t>(v.vocab));
  for (size_t i = 0; i + 1 < tokens.size() && i < 64; i += 2) {
    const int32_t t = (static_cast<uint8_t>(tokens[i]) |
                       (static_cast<uint8_t>(tokens[i + 1]) << 8)) %
                      v.vocab;
    for (size_t k = 0; k < row.size(); ++k)
      row[k] = static_cast<float>(k % 7);
    if (!c.mask(row.data(), row.size()))
      nf::fuzz::violated("mask failed");
    for (size_t k = 0; k < row.size(); ++k)
      if (!std::isinf(row[k]) && row[k] != static_cast<float>(k % 7))
        nf::fuzz::violated("the mask changed an allowed logit");
    const bool allowed = !std::isinf(row[static_cast<size_t>(t)]);
    const bool accepted = c.accept(t);
    if (accepted != allowed)
      nf::fuzz::violated(
          "token " + std::to_string(t) + " was " +
          (allowed ? "allowed but rejected" : "masked out but accepted"));
    if (!accepted || c.terminated())
      break;
  }
  return 0;
}
