// Matching added tokens in the input text (see added_tokens.h).
#include "text/added_tokens.h"

#include "text/unicode.h"

#include <algorithm>

namespace nf::tok {

void TokenMatcher::build(const std::vector<AddedToken> &tokens,
                         bool normalized) {
  for (int i = 0; i < static_cast<int>(tokens.size()); ++i) {
    const AddedToken &t = tokens[i];
    if (t.content.empty() || t.normalized != normalized)
      continue;
    byFirst[static_cast<unsigned char>(t.content[0])].push_back(i);
    empty = false;
  }
  for (auto &v : byFirst)
    std::stable_sort(v.begin(), v.end(), [&](int a, int b) {
      return tokens[a].content.size() > tokens[b].content.size();
    });
}

namespace {

/// The Rust regex crate's \w, which `tokenizers` uses to decide whether a
/// single_word added token touches a word: Alphabetic (letters, Nl, and the
/// Other_Alphabetic symbols: circled/squared letters), marks, Nd, Pc and the
/// join controls.
bool isWordChar(char32_t c) {
  constexpr uint32_t kRustWord = kLetter | kMark | bit(Nd) | bit(Nl) | bit(Pc);
  if (bit(static_cast<GC>(generalCategory(c))) & kRustWord)
    return true;
  return c == 0x200c || c == 0x200d || (c >= 0x24b6 && c <= 0x24e9) ||
         (c >= 0x1f130 && c <= 0x1f149) || (c >= 0x1f150 && c <= 0x1f169) ||
         (c >= 0x1f170 && c <= 0x1f189);
}

/// The last code point of a non-empty string.
char32_t lastCp(std::string_view s) {
  if (s.empty())
    return 0;
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xc0) == 0x80 &&
         s.size() - i < 3)
    --i;
  if (i > 0)
    --i;
  char32_t c;
  decodeOne(s, i, c);
  return c;
}

} // namespace

void splitAdded(std::string_view s, const std::vector<AddedToken> &tokens,
                const TokenMatcher &m, std::vector<Segment> &out) {
  if (m.empty) {
    out.push_back({s, -1});
    return;
  }
  size_t startOffset = 0;
  size_t i = 0;
  while (i < s.size()) {
    const auto &cands = m.byFirst[static_cast<unsigned char>(s[i])];
    int hit = -1;
    for (int c : cands) {
      const std::string &content = tokens[c].content;
      if (s.compare(i, content.size(), content) == 0) {
        hit = c;
        break;
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    const AddedToken &t = tokens[hit];
    size_t start = i, stop = i + t.content.size();
    i = stop; // the next search starts after this match either way
    if (t.singleWord) {
      bool startSpace = start == 0 || !isWordChar(lastCp(s.substr(0, start)));
      char32_t next = 0;
      if (stop < s.size())
        decodeOne(s, stop, next);
      bool stopSpace = stop == s.size() || !isWordChar(next);
      if (!startSpace || !stopSpace)
        continue;
    }
    if (t.lstrip) {
      size_t ns = start;
      while (ns > 0) {
        std::string_view before = s.substr(0, ns);
        char32_t c = lastCp(before);
        if (!isWhiteSpace(c))
          break;
        size_t len = 1;
        while (len < ns &&
               (static_cast<unsigned char>(s[ns - len]) & 0xc0) == 0x80)
          ++len;
        ns -= len;
      }
      start = std::max(ns, startOffset);
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        char32_t c;
        size_t len = decodeOne(s, stop, c);
        if (!isWhiteSpace(c))
          break;
        stop += len;
      }
    }
    if (startOffset < start)
      out.push_back({s.substr(startOffset, start - startOffset), -1});
    out.push_back({s.substr(start, stop - start), t.id});
    startOffset = stop;
  }
  if (startOffset < s.size())
    out.push_back({s.substr(startOffset), -1});
}

} // namespace nf::tok
