// Generated tokens as the text a client may see, piece by piece: the
// incremental detokenizer, stop strings and the UTF-8 hold-back of every
// streaming front end (the serving engine's requests, nfrun generate).
#pragma once

#include "nf/status.h"
#include "nf/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace nf::serving {

class TextStream {
public:
  struct Options {
    /// Special tokens add no text (vLLM's skip_special_tokens).
    bool skipSpecial = true;
    /// The text ends after the stop string instead of before it (vLLM's
    /// include_stop_str_in_output).
    bool includeStop = false;
  };
  /// `tokenizer` may be null (token ids only: no text); it must outlive
  /// the stream. Stop strings must not be empty.
  TextStream(const Tokenizer *tokenizer, std::vector<std::string> stops,
             Options options);
  TextStream(const Tokenizer *tokenizer, std::vector<std::string> stops)
      : TextStream(tokenizer, std::move(stops), Options()) {}

  /// Adds a generated token's bytes (special tokens add none unless kept).
  /// Returns true when a stop string now occurs in the text: the text ends
  /// before it (or after it, with includeStop), and nothing more may be
  /// added.
  StatusOr<bool> add(int32_t token);

  /// The bytes that became visible since the last call: at the end
  /// (`final`, or after a stop string) everything up to the stop string;
  /// before, less a tail that may still begin a stop string or is part of
  /// a UTF-8 character.
  std::string take(bool final);

  bool stopped() const { return stopAt_ != std::string::npos; }
  /// The whole text decoded so far (raw bytes, stop string included).
  const std::string &decoded() const { return decoded_; }

private:
  StatusOr<std::string> newBytes() const;

  const Tokenizer *tokenizer_;
  std::vector<std::string> stops_;
  Options options_;
  std::vector<int32_t> tokens_;
  std::string decoded_;
  size_t stopAt_ = std::string::npos;  // where the first stop string begins
  size_t stopEnd_ = std::string::npos; // and where it ends
  size_t given_ = 0;                   // bytes handed out by take()
};

/// Index of the first stop string in `text` that ends after `from`, or
/// npos (text before `from` was searched at earlier tokens).
size_t findStop(const std::string &text, const std::vector<std::string> &stops,
                size_t from);
/// Longest suffix of `text` that is a proper prefix of a stop string.
size_t heldBack(const std::string &text, const std::vector<std::string> &stops);
/// Bytes at the end of `text` that begin an incomplete UTF-8 character.
size_t incompleteUtf8(const std::string &text);

} // namespace nf::serving
