// Unicode and UTF-8 primitives of the tokenizer: general categories (the
// table is in unicode_table.cpp), the White_Space property, UTF-8 decoding
// that keeps invalid bytes, Rust's lossy UTF-8 repair, the simple case folding
// of (?i), and CpText, a piece of text as code points. Kept apart because the
// regex engine, the pre-tokenizers, BPE and added-token matching all use them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nf::tok {

// Unicode general categories, in the order of the table (unicode_table.cpp).
// clang-format off
enum GC : uint8_t {
  Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps, Pe, Pi, Pf, Po,
  Sm, Sc, Sk, So, Zs, Zl, Zp, Cc, Cf, Cs, Co, Cn, kNumGC
};
// clang-format on

constexpr uint32_t bit(GC c) { return 1u << c; }
inline constexpr uint32_t kLetter =
    bit(Lu) | bit(Ll) | bit(Lt) | bit(Lm) | bit(Lo);
inline constexpr uint32_t kMark = bit(Mn) | bit(Mc) | bit(Me);
inline constexpr uint32_t kNumber = bit(Nd) | bit(Nl) | bit(No);
inline constexpr uint32_t kPunct =
    bit(Pc) | bit(Pd) | bit(Ps) | bit(Pe) | bit(Pi) | bit(Pf) | bit(Po);
inline constexpr uint32_t kSymbol = bit(Sm) | bit(Sc) | bit(Sk) | bit(So);
inline constexpr uint32_t kSeparator = bit(Zs) | bit(Zl) | bit(Zp);
inline constexpr uint32_t kOther =
    bit(Cc) | bit(Cf) | bit(Cs) | bit(Co) | bit(Cn);
// Oniguruma's \w: letters, marks, decimal digits, connector punctuation.
inline constexpr uint32_t kWord = kLetter | kMark | bit(Nd) | bit(Pc);

/// General category; code points past U+10FFFF (invalid input bytes) are Cn.
uint8_t generalCategory(char32_t cp);

/// The Unicode White_Space property (Oniguruma's \s, Rust's is_whitespace).
inline bool isWhiteSpace(char32_t c) {
  if (c <= 0x20)
    return c == 0x20 || (c >= 0x09 && c <= 0x0d);
  if (c < 0x85)
    return false;
  return c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

// Invalid UTF-8 bytes in the input are carried as these pseudo code points so
// that byte offsets stay exact; they are category Cn.
inline constexpr char32_t kInvalidByteBase = 0x110000;

/// Decodes one UTF-8 sequence at s[i]; returns its length (1 for an invalid
/// byte, which is reported as kInvalidByteBase + byte).
size_t decodeOne(std::string_view s, size_t i, char32_t &out);

/// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one
/// U+FFFD.
std::string utf8Lossy(std::string_view s);

/// Simple case folding used for (?i): ASCII letters, and U+017F, U+212A to
/// lower case.
inline char32_t foldLower(char32_t c) {
  if (c >= 'A' && c <= 'Z')
    return c + 32;
  if (c == 0x17f)
    return 's';
  if (c == 0x212a)
    return 'k';
  return c;
}
inline char32_t foldUpper(char32_t c) {
  if (c >= 'a' && c <= 'z')
    return c - 32;
  return c;
}

/// A piece of text as code points, with their general categories and byte
/// offsets (offsets has one more entry: the end).
struct CpText {
  std::vector<char32_t> cp;
  std::vector<uint8_t> cat;
  std::vector<uint32_t> off;

  void assign(std::string_view s) {
    cp.clear();
    cat.clear();
    off.clear();
    size_t i = 0;
    while (i < s.size()) {
      char32_t c;
      size_t n = decodeOne(s, i, c);
      cp.push_back(c);
      cat.push_back(generalCategory(c));
      off.push_back(static_cast<uint32_t>(i));
      i += n;
    }
    off.push_back(static_cast<uint32_t>(s.size()));
  }
  size_t size() const { return cp.size(); }
};

} // namespace nf::tok
