// Hugging Face `tokenizer.json` byte-level BPE tokenizers: encode and decode.
//
// What is implemented (anything else in a tokenizer.json is refused with a
// Status naming the file and the feature, never silently ignored):
//   - normalizer: null (or an empty "Sequence");
//   - pre_tokenizer: null, "ByteLevel" (add_prefix_space, use_regex with the
//     GPT-2 pattern), "Split" (Regex or String pattern, every behavior,
//     invert), "Digits", and "Sequence" of those. Split patterns run on a
//     small backtracking engine with Oniguruma's meaning of \s, \d, \w,
//     \p{..} (Unicode 16.0 general categories, as in `tokenizers` 0.23),
//     lookahead and (?i:..) (simple case folding only);
//   - model: "BPE" with vocab, merges ("a b" strings or [a, b] pairs),
//     unk_token, fuse_unk, byte_fallback, ignore_merges,
//     continuing_subword_prefix, end_of_word_suffix (dropout must be null/0);
//   - added_tokens: matched as whole tokens in the input text, leftmost
//     longest, with single_word / lstrip / rstrip;
//   - post_processor: null, "ByteLevel", "TemplateProcessing" (single),
//     "RobertaProcessing", "BertProcessing", "Sequence" of those;
//   - decoder: null (tokens joined by spaces) or "ByteLevel".
// Encoding results are identical to the `tokenizers` library on these
// features (test/unit/tokenizer_test.cpp checks that against reference ids).
#pragma once

#include "nf/status.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nf {

class Tokenizer {
public:
  /// Loads `path` (a tokenizer.json). Errors name the file.
  static StatusOr<Tokenizer> fromFile(const std::string &path);
  /// Loads tokenizer.json text; `sourceName` is used in error messages.
  static StatusOr<Tokenizer> fromJson(std::string_view jsonText,
                                      const std::string &sourceName);

  /// Token ids of `text` (UTF-8; invalid bytes are encoded as single bytes).
  /// Added/special tokens written in the text are recognized as such.
  /// `addSpecial` applies the post-processor (e.g. a BOS template); with a
  /// null post_processor it adds nothing, like the `tokenizers` library.
  std::vector<int32_t> encode(std::string_view text,
                              bool addSpecial = false) const;

  /// Text of `ids`, as `tokenizers` decodes it: unknown ids are skipped,
  /// special tokens too when `skipSpecial`, and byte sequences that are not
  /// valid UTF-8 become U+FFFD.
  std::string decode(const std::vector<int32_t> &ids,
                     bool skipSpecial = true) const;
  /// Like decode() but returns the raw bytes without UTF-8 repair: for
  /// streaming, where a character may be split across calls.
  std::string decodeBytes(const std::vector<int32_t> &ids,
                          bool skipSpecial = true) const;

  /// The vocabulary string of `id` (byte-level form, e.g. "Ġthe"); empty for
  /// an unknown id.
  std::string tokenText(int32_t id) const;
  /// The id of a vocabulary string (model vocab or added token).
  std::optional<int32_t> tokenId(std::string_view token) const;
  /// One past the largest id (model vocabulary and added tokens).
  int32_t vocabSize() const;
  /// True for added tokens marked "special".
  bool isSpecial(int32_t id) const;

  /// Ids of conventionally named special tokens, when the vocabulary has them
  /// (tokenizer.json itself does not say which token is BOS/EOS/PAD):
  /// BOS: <s>, <|begin_of_text|>, <bos>, <|startoftext|>;
  /// EOS: </s>, <|end_of_text|>, <eos>, <|endoftext|>;
  /// PAD: <pad>, <|pad|>, [PAD].
  std::optional<int32_t> bosId() const;
  std::optional<int32_t> eosId() const;
  std::optional<int32_t> padId() const;

  /// The path (or source name) the tokenizer was loaded from.
  const std::string &source() const;

  struct Impl; // implementation detail (runtime/src/text/)

private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl)
      : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

} // namespace nf
