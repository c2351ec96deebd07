// The GPT-2 byte-to-unicode mapping of byte-level BPE: every byte is shown
// as a printable code point. The ByteLevel pre-tokenizer encodes with it and
// the ByteLevel decoder maps tokens back to bytes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace nf::tok {

struct ByteMap {
  std::array<char32_t, 256> toCp{};
  std::array<std::string, 256> toUtf8;
  std::array<int16_t, 324> toByte{}; // code point -> byte, -1 if none

  ByteMap();
};

/// The mapping (built once).
const ByteMap &byteMap();

/// `s` with every byte replaced by its code point, as UTF-8.
std::string byteLevelEncode(std::string_view s);

} // namespace nf::tok
