// The BPE model of tokenizer.json: the vocabulary, the merges by rank, and
// the encoding of one pre-tokenized piece (unk / fuse_unk, byte fallback,
// continuing-subword prefix and end-of-word suffix), as `tokenizers`' BPE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nf::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const {
    return std::hash<std::string_view>()(s);
  }
};
using Vocab =
    std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

/// The key of a merge pair (left id, right id).
inline uint64_t pairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
         static_cast<uint32_t>(b);
}

struct Bpe {
  Vocab vocab;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  std::optional<int32_t> unkId;
  bool fuseUnk = false;
  bool byteFallback = false;
  bool ignoreMerges = false;
  std::string prefix; // continuing_subword_prefix
  std::string suffix; // end_of_word_suffix

  std::optional<int32_t> lookup(std::string_view s) const {
    auto it = vocab.find(s);
    if (it == vocab.end())
      return std::nullopt;
    return it->second;
  }

  /// Appends the ids of one pre-tokenized piece (BPE::tokenize).
  void tokenize(std::string_view word, std::vector<int32_t> &out) const;

  /// Merges adjacent symbols, lowest rank first, then leftmost (the
  /// symbols of tokenize(); defined in bpe.cpp).
  template <class Sym> void mergeAll(std::vector<Sym> &syms) const;
};

} // namespace nf::tok
