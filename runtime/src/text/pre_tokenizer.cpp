// The pre-tokenizers (see pre_tokenizer.h): the hand-compiled GPT-2 split,
// Rust's is_numeric for Digits, and the split behaviors of `tokenizers`'
// NormalizedString::split.
#include "text/pre_tokenizer.h"

#include "text/byte_level.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace nf::tok {

namespace {

enum CharClass : uint8_t { kClsLetter, kClsNumber, kClsSpace, kClsOther };

CharClass classify(char32_t c, uint8_t cat) {
  if (isWhiteSpace(c))
    return kClsSpace;
  uint32_t b = bit(static_cast<GC>(cat));
  if (b & kLetter)
    return kClsLetter;
  if (b & kNumber)
    return kClsNumber;
  return kClsOther;
}

/// The GPT-2 pattern, hand-compiled: the same matches as the regex (every
/// code point is covered, so the matches tile the text). Appends match
/// ranges in code point indices.
void gpt2Split(const CpText &t,
               std::vector<std::pair<uint32_t, uint32_t>> &out) {
  const size_t n = t.size();
  std::vector<uint8_t> cls(n);
  for (size_t i = 0; i < n; ++i)
    cls[i] = classify(t.cp[i], t.cat[i]);
  const auto &cp = t.cp;
  size_t i = 0;
  while (i < n) {
    size_t end = 0;
    // 's 't 're 've 'm 'll 'd
    if (cp[i] == '\'' && i + 1 < n) {
      char32_t c1 = cp[i + 1];
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        end = i + 2;
      else if (i + 2 < n && (((c1 == 'r' || c1 == 'v') && cp[i + 2] == 'e') ||
                             (c1 == 'l' && cp[i + 2] == 'l')))
        end = i + 3;
    }
    if (end == 0) {
      // ' ?' followed by letters, numbers or "others": one greedy run.
      size_t j = i;
      if (cp[i] == ' ' && i + 1 < n && cls[i + 1] != kClsSpace)
        j = i + 1;
      if (cls[j] != kClsSpace) {
        uint8_t c = cls[j];
        end = j + 1;
        while (end < n && cls[end] == c)
          ++end;
      } else {
        // \s+(?!\S) then \s+
        size_t run = i;
        while (run < n && cls[run] == kClsSpace)
          ++run;
        if (run == n || run - i == 1)
          end = run;
        else
          end = run - 1;
      }
    }
    out.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(end));
    i = end;
  }
}

/// Rust's char::is_numeric, used by the Digits pre-tokenizer. The Rust of
/// `tokenizers` 0.23 has Unicode 17 tables, which add these numbers to the
/// Unicode 16 ones of unicode_table.cpp.
bool isRustNumeric(char32_t c, uint8_t cat) {
  return (bit(static_cast<GC>(cat)) & kNumber) ||
         (c >= 0x11de0 && c <= 0x11de9) || (c >= 0x16ff4 && c <= 0x16ff6);
}

struct Span {
  size_t begin, end;
  bool match;
};

/// Applies a split behavior to a tiling of a piece (as `tokenizers`'
/// NormalizedString::split does) and appends the non-empty pieces.
void applyBehavior(std::string_view piece, std::vector<Span> spans,
                   Behavior behavior, std::vector<std::string> &out) {
  std::vector<Span> acc;
  switch (behavior) {
  case Behavior::Isolated:
  case Behavior::Removed:
    acc = std::move(spans);
    break;
  case Behavior::MergedWithPrevious: {
    bool prevMatch = false;
    for (const Span &s : spans) {
      if (s.match && !prevMatch && !acc.empty())
        acc.back().end = s.end;
      else
        acc.push_back(s);
      prevMatch = s.match;
    }
    break;
  }
  case Behavior::MergedWithNext: {
    bool prevMatch = false;
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
      if (it->match && !prevMatch && !acc.empty())
        acc.back().begin = it->begin;
      else
        acc.push_back(*it);
      prevMatch = it->match;
    }
    std::reverse(acc.begin(), acc.end());
    break;
  }
  case Behavior::Contiguous: {
    bool prevMatch = false;
    for (const Span &s : spans) {
      if (s.match == prevMatch && !acc.empty())
        acc.back().end = s.end;
      else
        acc.push_back(s);
      prevMatch = s.match;
    }
    break;
  }
  }
  for (const Span &s : acc) {
    if (behavior == Behavior::Removed && s.match)
      continue;
    if (s.end > s.begin)
      out.emplace_back(piece.substr(s.begin, s.end - s.begin));
  }
}

/// Match ranges (code point indices) -> a tiling with gaps, in byte offsets.
std::vector<Span> tile(const CpText &t,
                       const std::vector<std::pair<uint32_t, uint32_t>> &m,
                       bool invert) {
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto &[b, e] : m) {
    size_t bb = t.off[b], eb = t.off[e];
    if (bb > prev)
      spans.push_back({prev, bb, invert});
    spans.push_back({bb, eb, !invert});
    prev = eb;
  }
  if (prev < t.off.back())
    spans.push_back({prev, t.off.back(), invert});
  return spans;
}

} // namespace

void preTokenize(const PreTokenizer &pt, std::vector<std::string> &pieces,
                 CpText &scratch) {
  std::vector<std::string> out;
  out.reserve(pieces.size());
  std::vector<std::pair<uint32_t, uint32_t>> matches;
  for (std::string &piece : pieces) {
    switch (pt.kind) {
    case PreTokenizer::Kind::ByteLevel: {
      if (pt.addPrefixSpace && !piece.empty() && piece[0] != ' ')
        piece.insert(piece.begin(), ' ');
      if (!pt.useRegex) {
        if (!piece.empty())
          out.push_back(byteLevelEncode(piece));
        break;
      }
      scratch.assign(piece);
      matches.clear();
      gpt2Split(scratch, matches);
      for (const auto &[b, e] : matches) {
        size_t bb = scratch.off[b], eb = scratch.off[e];
        if (eb > bb)
          out.push_back(
              byteLevelEncode(std::string_view(piece).substr(bb, eb - bb)));
      }
      break;
    }
    case PreTokenizer::Kind::Split: {
      if (piece.empty())
        break;
      std::vector<Span> spans;
      if (pt.literal) {
        // Non-overlapping occurrences, left to right.
        size_t prev = 0;
        if (!pt.literalText.empty()) {
          for (size_t p = piece.find(pt.literalText); p != std::string::npos;
               p = piece.find(pt.literalText, p + pt.literalText.size())) {
            if (p > prev)
              spans.push_back({prev, p, pt.invert});
            spans.push_back({p, p + pt.literalText.size(), !pt.invert});
            prev = p + pt.literalText.size();
          }
        }
        if (prev < piece.size())
          spans.push_back({prev, piece.size(), pt.invert});
      } else {
        scratch.assign(piece);
        matches.clear();
        if (pt.gpt2)
          gpt2Split(scratch, matches);
        else
          pt.regex->findAll(scratch, matches);
        spans = tile(scratch, matches, pt.invert);
      }
      applyBehavior(piece, std::move(spans), pt.behavior, out);
      break;
    }
    case PreTokenizer::Kind::Digits: {
      if (piece.empty())
        break;
      scratch.assign(piece);
      std::vector<Span> spans;
      size_t prev = 0;
      for (size_t i = 0; i < scratch.size(); ++i) {
        if (!isRustNumeric(scratch.cp[i], scratch.cat[i]))
          continue;
        size_t b = scratch.off[i], e = scratch.off[i + 1];
        if (b > prev)
          spans.push_back({prev, b, false});
        spans.push_back({b, e, true});
        prev = e;
      }
      if (prev < piece.size())
        spans.push_back({prev, piece.size(), false});
      applyBehavior(
          piece, std::move(spans),
          pt.individualDigits ? Behavior::Isolated : Behavior::Contiguous, out);
      break;
    }
    }
  }
  pieces = std::move(out);
}

} // namespace nf::tok
