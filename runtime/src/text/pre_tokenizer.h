// The pre-tokenizers of tokenizer.json (ByteLevel, Split, Digits): they cut
// each segment of text into the pieces BPE encodes one by one, exactly as
// `tokenizers` does.
#pragma once

#include "text/regex.h"
#include "text/unicode.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nf::tok {

// The GPT-2 pattern of the ByteLevel pre-tokenizer (use_regex); a Split with
// exactly this pattern runs a hand-compiled matcher instead of the regex.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior {
  Removed,
  Isolated,
  MergedWithPrevious,
  MergedWithNext,
  Contiguous
};

struct PreTokenizer {
  enum class Kind { ByteLevel, Split, Digits } kind = Kind::ByteLevel;
  // ByteLevel
  bool addPrefixSpace = true;
  bool useRegex = true;
  // Split
  std::shared_ptr<const Regex> regex; // null: GPT-2 fast path or literal
  bool gpt2 = false;
  bool literal = false;
  std::string literalText;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  // Digits
  bool individualDigits = false;
};

/// Runs one pre-tokenizer over every piece.
void preTokenize(const PreTokenizer &pt, std::vector<std::string> &pieces,
                 CpText &scratch);

} // namespace nf::tok
