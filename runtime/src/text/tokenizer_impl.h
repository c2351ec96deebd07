// The state of a loaded nf::Tokenizer (Tokenizer::Impl), shared by the
// tokenizer.json loader (tokenizer_json.cpp) and the encode / decode paths
// (tokenizer.cpp).
#pragma once

#include "nf/file.h"
#include "nf/status.h"
#include "nf/tokenizer.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/pre_tokenizer.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nf {

namespace tok {

/// An error about `source` (a file or source name), on one line whatever
/// the file holds: control characters in the names it quotes (types, token
/// contents) are escaped.
inline Status fail(const std::string &source, const std::string &message) {
  return Status::error(printable(source + ": " + message));
}

} // namespace tok

struct Tokenizer::Impl {
  std::string source;
  tok::Bpe bpe;
  std::vector<tok::AddedToken> added;
  tok::TokenMatcher rawMatcher;        // added tokens with normalized == false
  tok::TokenMatcher normalizedMatcher; // added tokens with normalized == true
  tok::Vocab addedByContent;
  std::vector<tok::PreTokenizer> preTokenizers;
  // Post-processor template for single sequences: -1 entries stand for the
  // sequence itself. Empty when there is no post-processor.
  std::vector<int32_t> postTemplate;
  bool byteLevelDecoder = false;
  std::vector<std::string> idToToken;
  std::vector<uint8_t> known;   // id has a token
  std::vector<uint8_t> special; // id is a special added token
  std::optional<int32_t> bos, eos, pad;

  void encodeInto(std::string_view text, std::vector<int32_t> &ids) const;
  std::string decodeRaw(const std::vector<int32_t> &ids,
                        bool skipSpecial) const;
};

namespace tok {

/// Parses tokenizer.json text into a tokenizer (tokenizer_json.cpp); errors
/// name `src`. May throw nlohmann::json exceptions, which
/// Tokenizer::fromJson catches.
StatusOr<std::shared_ptr<Tokenizer::Impl>> load(std::string_view text,
                                                const std::string &src);

} // namespace tok

} // namespace nf
