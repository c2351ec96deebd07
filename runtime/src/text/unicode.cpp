// UTF-8 decoding (keeping invalid bytes) and Rust's lossy UTF-8 repair for
// the tokenizer (contracts in unicode.h; the small hot predicates are inline
// there).
#include "text/unicode.h"

namespace nf::tok {

namespace {

// The UTF-8 lead-byte rules, shared by decodeOne and utf8Lossy: sets n to the
// length of the sequence s[i] starts (0 if it starts none) and returns how many
// bytes from i form a valid prefix of it (at least 1; n when it is complete).
size_t validPrefix(std::string_view s, size_t i, size_t &n) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  n = 0;
  unsigned char lo = 0x80, hi = 0xbf;
  if (b0 >= 0xc2 && b0 <= 0xdf)
    n = 2;
  else if (b0 == 0xe0)
    n = 3, lo = 0xa0;
  else if (b0 == 0xed)
    n = 3, hi = 0x9f;
  else if (b0 >= 0xe1 && b0 <= 0xef)
    n = 3;
  else if (b0 == 0xf0)
    n = 4, lo = 0x90;
  else if (b0 >= 0xf1 && b0 <= 0xf3)
    n = 4;
  else if (b0 == 0xf4)
    n = 4, hi = 0x8f;
  size_t k = 1;
  if (n > 0 && i + 1 < s.size()) {
    const auto b1 = static_cast<unsigned char>(s[i + 1]);
    if (b1 >= lo && b1 <= hi) {
      k = 2;
      while (k < n && i + k < s.size() &&
             (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80)
        ++k;
    }
  }
  return k;
}

} // namespace

size_t decodeOne(std::string_view s, size_t i, char32_t &out) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    out = b0;
    return 1;
  }
  size_t n = 0;
  if (validPrefix(s, i, n) != n) {
    out = kInvalidByteBase + b0;
    return 1;
  }
  char32_t cp = (n == 2) ? (b0 & 0x1f) : (n == 3) ? (b0 & 0x0f) : (b0 & 0x07);
  for (size_t k = 1; k < n; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  out = cp;
  return n;
}

std::string utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out += static_cast<char>(b0);
      ++i;
      continue;
    }
    size_t n = 0;
    const size_t k = validPrefix(s, i, n); // bytes of a valid prefix
    if (n > 0 && k == n) {
      out.append(s.substr(i, n));
    } else {
      out += "\xef\xbf\xbd";
    }
    i += k;
  }
  return out;
}

} // namespace nf::tok
