// UTF-8 text of the Jinja renderer as Python sees it (see jinja_value.h):
// validation, decoding to and encoding from code points, counting them,
// str.isspace() and the simple case mappings of str.upper() and
// str.lower().
#include "chat/jinja_value.h"

#include <string>
#include <string_view>

namespace nf::jinja {

bool validUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    char32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size())
      return false;
    for (size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80)
        return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static const char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n;
  }
  return true;
}

std::u32string decodeUtf8(std::string_view s) {
  chargeBytes(s.size());
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80             ? 1
               : (c & 0xe0) == 0xc0 ? 2
               : (c & 0xf0) == 0xe0 ? 3
               : (c & 0xf8) == 0xf0 ? 4
                                    : 0;
    if (n == 0 || i + n > s.size()) {
      out += U'\ufffd'; // not reached for validated text
      ++i;
      continue;
    }
    char32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out += cp;
    i += n;
  }
  return out;
}

std::string encodeUtf8(std::u32string_view s) {
  chargeBytes(s.size());
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s)
    appendUtf8(out, c);
  return out;
}

size_t codePoints(std::string_view s) {
  chargeBytes(s.size());
  size_t n = 0;
  for (char c : s)
    n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

bool isPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 ||
         c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

namespace {

// Blocks where upper and lower case alternate code point by code point.
bool inPairs(char32_t c, char32_t lo, char32_t hi) {
  return c >= lo && c <= hi;
}

} // namespace

char32_t toUpper(char32_t c) {
  if (c < 0x80)
    return c >= 'a' && c <= 'z' ? c - 32 : c;
  if (c == 0xb5)
    return 0x39c;
  if (c >= 0xe0 && c <= 0xfe && c != 0xf7)
    return c - 32;
  if (c == 0xff)
    return 0x178;
  if (c == 0x131)
    return 'I';
  if (c == 0x17f)
    return 'S';
  if (inPairs(c, 0x100, 0x137) || inPairs(c, 0x14a, 0x177))
    return c & ~char32_t(1);
  if (inPairs(c, 0x139, 0x148) || inPairs(c, 0x179, 0x17e))
    return (c & 1) ? c : c - 1;
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2)
    return c - 32;
  if (c == 0x3c2)
    return 0x3a3;
  if (c == 0x3ac)
    return 0x386;
  if (c >= 0x3ad && c <= 0x3af)
    return c - 37;
  if (c == 0x3cc)
    return 0x38c;
  if (c == 0x3cd || c == 0x3ce)
    return c - 63;
  if (c >= 0x430 && c <= 0x44f)
    return c - 32;
  if (c >= 0x450 && c <= 0x45f)
    return c - 80;
  if (inPairs(c, 0x460, 0x481) || inPairs(c, 0x48a, 0x4bf) ||
      inPairs(c, 0x4d0, 0x52f))
    return c & ~char32_t(1);
  if (inPairs(c, 0x4c1, 0x4ce))
    return (c & 1) ? c : c - 1;
  if (c >= 0x561 && c <= 0x586)
    return c - 48;
  if (c >= 0xff41 && c <= 0xff5a)
    return c - 32;
  return c;
}

char32_t toLower(char32_t c) {
  if (c < 0x80)
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7)
    return c + 32;
  if (c == 0x178)
    return 0xff;
  if (c == 0x130)
    return 'i';
  if (inPairs(c, 0x100, 0x137) || inPairs(c, 0x14a, 0x177))
    return c | 1;
  if (inPairs(c, 0x139, 0x148) || inPairs(c, 0x179, 0x17e))
    return (c & 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2)
    return c + 32;
  if (c == 0x386)
    return 0x3ac;
  if (c >= 0x388 && c <= 0x38a)
    return c + 37;
  if (c == 0x38c)
    return 0x3cc;
  if (c == 0x38e || c == 0x38f)
    return c + 63;
  if (c >= 0x410 && c <= 0x42f)
    return c + 32;
  if (c >= 0x400 && c <= 0x40f)
    return c + 80;
  if (inPairs(c, 0x460, 0x481) || inPairs(c, 0x48a, 0x4bf) ||
      inPairs(c, 0x4d0, 0x52f))
    return c | 1;
  if (inPairs(c, 0x4c1, 0x4ce))
    return (c & 1) ? c + 1 : c;
  if (c >= 0x531 && c <= 0x556)
    return c + 48;
  if (c >= 0xff21 && c <= 0xff3a)
    return c + 32;
  return c;
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decodeUtf8(s)) {
    if (c == 0xdf)
      out += "SS";
    else
      appendUtf8(out, toUpper(c));
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decodeUtf8(s))
    appendUtf8(out, toLower(c));
  return out;
}

} // namespace nf::jinja
