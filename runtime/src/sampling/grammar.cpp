#include "sampling/grammar.h"

#include "nf/tokenizer.h"

#include <xgrammar/xgrammar.h>

#include <limits>
#include <mutex>
#include <optional>

namespace nf::sampling {

struct CompiledGrammar {
  xgrammar::CompiledGrammar grammar;
};

namespace {

/// XGrammar's error text in one line, without the "[time] file:line: "
/// its fatal errors start with.
std::string oneLine(std::string what) {
  if (!what.empty() && what.front() == '[') {
    const size_t source = what.find(".cc:");
    if (source != std::string::npos) {
      const size_t colon = what.find(": ", source + 4);
      if (colon != std::string::npos)
        what.erase(0, colon + 2);
    }
  }
  for (char &c : what)
    if (c == '\n' || c == '\r')
      c = ' ';
  while (!what.empty() && what.back() == ' ')
    what.pop_back();
  return what;
}

const char *kindName(GrammarKind kind) {
  switch (kind) {
  case GrammarKind::Json:
    return "JSON";
  case GrammarKind::JsonSchema:
    return "JSON schema";
  case GrammarKind::Regex:
    return "regex";
  case GrammarKind::Ebnf:
    return "grammar";
  case GrammarKind::StructuralTag:
    return "structural tag";
  }
  return "grammar";
}

} // namespace

struct GrammarCompiler::Impl {
  // The vocabulary is read at the first compile: most servers never get a
  // structured request, and a large vocabulary takes a while to index.
  const Tokenizer &tokenizer;
  std::vector<int32_t> stopTokens;
  std::once_flag once;
  std::optional<xgrammar::GrammarCompiler> compiler;

  xgrammar::GrammarCompiler &get(int32_t vocabSize) {
    std::call_once(once, [&] {
      // Each token's bytes; special tokens are "" (never allowed: they
      // are not part of the text a grammar constrains), stop tokens end a
      // match.
      const int32_t known = std::min(vocabSize, tokenizer.vocabSize());
      std::vector<std::string> vocab(static_cast<size_t>(known));
      for (int32_t id = 0; id < known; ++id)
        if (!tokenizer.isSpecial(id))
          vocab[static_cast<size_t>(id)] = tokenizer.decodeBytes({id}, false);
      xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, vocabSize,
                                   stopTokens);
      // The cache is bounded: every request may bring a schema of its own.
      constexpr int64_t kCacheBytes = int64_t{256} << 20;
      compiler.emplace(info, /*max_threads=*/2, /*cache_enabled=*/true,
                       kCacheBytes);
    });
    return *compiler;
  }
};

GrammarCompiler::GrammarCompiler(const Tokenizer &tokenizer, int32_t vocabSize,
                                 std::vector<int32_t> stopTokens)
    : impl_(new Impl{tokenizer, std::move(stopTokens), {}, {}}),
      vocabSize_(vocabSize) {}

GrammarCompiler::~GrammarCompiler() = default;

StatusOr<std::shared_ptr<const CompiledGrammar>>
GrammarCompiler::compile(const GrammarSpec &spec) {
  try {
    xgrammar::GrammarCompiler &c = impl_->get(vocabSize_);
    auto compiled = [&]() -> xgrammar::CompiledGrammar {
      switch (spec.kind) {
      case GrammarKind::Json:
        // An object with any members (not strict: additional properties
        // of any type), as OpenAI's json_object promises.
        return c.CompileJSONSchema(R"({"type": "object"})", spec.anyWhitespace,
                                   std::nullopt, std::nullopt,
                                   /*strict_mode=*/false);
      case GrammarKind::JsonSchema:
        // As vLLM compiles OpenAI's json_schema: strict (no properties
        // beyond the schema's unless it allows them).
        return c.CompileJSONSchema(spec.text, spec.anyWhitespace);
      case GrammarKind::Regex:
        return c.CompileRegex(spec.text);
      case GrammarKind::Ebnf:
        return c.CompileGrammar(spec.text);
      case GrammarKind::StructuralTag:
        return c.CompileStructuralTag(spec.text);
      }
      return c.CompileBuiltinJSONGrammar(); // not reached
    };
    return std::shared_ptr<const CompiledGrammar>(
        new CompiledGrammar{compiled()});
  } catch (const std::bad_alloc &) {
    throw;
  } catch (const std::exception &e) {
    return Status::error(std::string("invalid ") + kindName(spec.kind) + ": " +
                         oneLine(e.what()));
  }
}

struct TokenConstraint::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher matcher;
  int32_t vocabSize;
  // Tokens the tokenizer knows; XGrammar reads past its vocabulary for the
  // logits' padding ids, so accept() refuses them before it sees them.
  int32_t knownTokens;
  std::vector<int32_t> bitmask; // bit t: token t allowed
};

TokenConstraint::TokenConstraint(std::shared_ptr<const CompiledGrammar> grammar,
                                 int32_t vocabSize,
                                 std::vector<int32_t> stopTokens)
    : impl_(new Impl{
          grammar,
          xgrammar::GrammarMatcher(grammar->grammar, std::move(stopTokens)),
          vocabSize,
          static_cast<int32_t>(
              grammar->grammar.GetTokenizerInfo().GetDecodedVocab().size()),
          std::vector<int32_t>(
              static_cast<size_t>(xgrammar::GetBitmaskSize(vocabSize)))}) {}

TokenConstraint::~TokenConstraint() = default;
TokenConstraint::TokenConstraint(TokenConstraint &&) noexcept = default;
TokenConstraint &
TokenConstraint::operator=(TokenConstraint &&) noexcept = default;

Status TokenConstraint::mask(float *row, size_t width) try {
  Impl &m = *impl_;
  int64_t shape[1] = {static_cast<int64_t>(m.bitmask.size())};
  DLTensor t{};
  t.data = m.bitmask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  if (!m.matcher.FillNextTokenBitmask(&t))
    return Status::success(); // every token allowed
  const size_t n = std::min(width, static_cast<size_t>(m.vocabSize));
  for (size_t i = 0; i < width; ++i) {
    const bool allowed =
        i < n && (static_cast<uint32_t>(m.bitmask[i / 32]) >> (i % 32)) & 1u;
    if (!allowed)
      row[i] = -std::numeric_limits<float>::infinity();
  }
  return Status::success();
} catch (const std::bad_alloc &) {
  throw;
} catch (const std::exception &e) {
  return Status::error("structured output: " + oneLine(e.what()));
}

bool TokenConstraint::accept(int32_t token) {
  if (token < 0 || token >= impl_->knownTokens)
    return false;
  try {
    return impl_->matcher.AcceptToken(token);
  } catch (const std::exception &) {
    return false;
  }
}

bool TokenConstraint::terminated() const {
  return impl_->matcher.IsTerminated();
}

} // namespace nf::sampling
