// Generated tokens as visible text (see text_stream.h).
#include "serving/text_stream.h"

#include <algorithm>

namespace nf::serving {

size_t findStop(const std::string &text, const std::vector<std::string> &stops,
                size_t from) {
  size_t best = std::string::npos;
  for (const std::string &s : stops)
    best = std::min(best,
                    text.find(s, from >= s.size() ? from - s.size() + 1 : 0));
  return best;
}

size_t heldBack(const std::string &text,
                const std::vector<std::string> &stops) {
  size_t hold = 0;
  for (const std::string &s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return hold;
}

size_t incompleteUtf8(const std::string &text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80)
      continue; // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

TextStream::TextStream(const Tokenizer *tokenizer,
                       std::vector<std::string> stops, Options options)
    : tokenizer_(tokenizer), stops_(std::move(stops)), options_(options) {}

/// The bytes the last of tokens_ adds to decoded_: the decode of a short
/// tail of the completion with and without it, so that the pieces come out
/// as in one decode of the whole text (the tokenizer's decoders: byte-level,
/// or none, which joins pieces with a space), at constant work per token. A
/// tail that decodes to nothing before the token (every token in it
/// skipped: specials) says nothing about the joint: then the whole
/// completion.
StatusOr<std::string> TextStream::newBytes() const {
  const bool skip = options_.skipSpecial;
  // A token that decodes to nothing alone (a skipped special token, an
  // unknown id) adds nothing in any context: answered without decoding
  // the completion (a run of them would cost a decode of it each).
  if (tokenizer_->decodeBytes({tokens_.back()}, skip).empty())
    return std::string();
  constexpr size_t kTail = 8;
  const size_t n = tokens_.size();
  const std::vector<int32_t> tail(
      tokens_.begin() +
          static_cast<ptrdiff_t>(n > kTail + 1 ? n - kTail - 1 : 0),
      tokens_.end());
  const std::string after = tokenizer_->decodeBytes(tail, skip);
  const std::string before = tokenizer_->decodeBytes(
      std::vector<int32_t>(tail.begin(), tail.end() - 1), skip);
  if (before.empty() && tail.size() < n) {
    const std::string all = tokenizer_->decodeBytes(tokens_, skip);
    if (all.compare(0, decoded_.size(), decoded_) == 0)
      return all.substr(decoded_.size());
    return tokenizer_->decodeBytes({tokens_.back()}, skip);
  }
  if (after.compare(0, before.size(), before) == 0)
    return after.substr(before.size());
  return tokenizer_->decodeBytes({tokens_.back()}, skip);
}

StatusOr<bool> TextStream::add(int32_t token) {
  if (stopped())
    return Status::error("text stream: a token added after a stop string");
  tokens_.push_back(token);
  if (!tokenizer_)
    return false;
  auto piece = newBytes();
  if (!piece)
    return piece.status();
  const size_t searched = decoded_.size();
  decoded_ += *piece;
  stopAt_ = findStop(decoded_, stops_, searched);
  if (stopped()) {
    // The stop string found there (the first listed, where two begin
    // there).
    stopEnd_ = stopAt_;
    for (const std::string &s : stops_)
      if (decoded_.compare(stopAt_, s.size(), s) == 0) {
        stopEnd_ = stopAt_ + s.size();
        break;
      }
  }
  return stopped();
}

std::string TextStream::take(bool final) {
  // The visible text only grows: a held-back tail is what a later stop
  // string would begin with, or the start of a character.
  size_t visible = decoded_.size();
  if (stopped())
    visible = options_.includeStop ? stopEnd_ : stopAt_;
  else if (!final)
    visible -= std::max(heldBack(decoded_, stops_), incompleteUtf8(decoded_));
  if (visible <= given_)
    return std::string();
  std::string out = decoded_.substr(given_, visible - given_);
  given_ = visible;
  return out;
}

} // namespace nf::serving
