// Added tokens of tokenizer.json: they are cut out of the input text before
// anything else, leftmost longest, with the single_word / lstrip / rstrip
// options of `tokenizers`' AddedVocabulary; the text between them goes on to
// the pre-tokenizers.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nf::tok {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool singleWord = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

/// Leftmost-longest matcher over a set of added tokens (what the
/// aho-corasick automaton of `tokenizers` computes).
struct TokenMatcher {
  // Per first byte: token indices, longest content first.
  std::array<std::vector<int>, 256> byFirst;
  bool empty = true;

  /// Indexes the tokens whose `normalized` flag equals `normalized`.
  void build(const std::vector<AddedToken> &tokens, bool normalized);
};

struct Segment {
  std::string_view text;
  int32_t id; // -1: ordinary text
};

/// `tokenizers`' AddedVocabulary::find_matches on one ordinary segment:
/// appends the segments of `s` (added tokens and the text between them).
void splitAdded(std::string_view s, const std::vector<AddedToken> &tokens,
                const TokenMatcher &m, std::vector<Segment> &out);

} // namespace nf::tok
