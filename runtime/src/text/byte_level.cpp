// The GPT-2 byte-to-unicode mapping (see byte_level.h).
#include "text/byte_level.h"

#include "utf8.h"

namespace nf::tok {

ByteMap::ByteMap() {
  toByte.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
                     (b >= 174 && b <= 255);
    toCp[b] = printable ? static_cast<char32_t>(b)
                        : static_cast<char32_t>(256 + extra++);
    toByte[toCp[b]] = static_cast<int16_t>(b);
    appendUtf8(toUtf8[b], toCp[b]);
  }
}

const ByteMap &byteMap() {
  static const ByteMap m;
  return m;
}

std::string byteLevelEncode(std::string_view s) {
  const ByteMap &m = byteMap();
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s)
    out += m.toUtf8[static_cast<unsigned char>(c)];
  return out;
}

} // namespace nf::tok
