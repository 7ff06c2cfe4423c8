// CheckUtf8 follows the structure of Rust's UTF-8 validator so that the
// error (index and sequence length) is the one the reference reports: the
// first byte fixes the width, the second byte's allowed range excludes
// overlong forms, surrogates and code points above U+10FFFF, and later bytes
// must be continuation bytes (10xxxxxx).
#include "format/json_text.h"

#include <cstdint>

namespace shardsafe::internal {
namespace {

int Utf8Width(uint8_t first) {
  if (first < 0x80) return 1;
  if (first >= 0xC2 && first <= 0xDF) return 2;
  if (first >= 0xE0 && first <= 0xEF) return 3;
  if (first >= 0xF0 && first <= 0xF4) return 4;
  return 0;  // continuation byte, C0/C1 or F5..FF: never a valid first byte
}

bool SecondByteOk(uint8_t first, uint8_t second) {
  switch (first) {
    case 0xE0: return second >= 0xA0 && second <= 0xBF;  // no overlong
    case 0xED: return second >= 0x80 && second <= 0x9F;  // no surrogates
    case 0xF0: return second >= 0x90 && second <= 0xBF;  // no overlong
    case 0xF4: return second >= 0x80 && second <= 0x8F;  // <= U+10FFFF
    default: return second >= 0x80 && second <= 0xBF;
  }
}

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

std::string Invalid(int len, size_t at) {
  return "invalid utf-8 sequence of " + std::to_string(len) + " bytes from index " +
         std::to_string(at);
}

std::string Incomplete(size_t at) {
  return "incomplete utf-8 byte sequence from index " + std::to_string(at);
}

}  // namespace

std::optional<std::string> CheckUtf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const int width = Utf8Width(p[i]);
    if (width == 0) return Invalid(1, i);
    for (int k = 1; k < width; ++k) {
      if (i + k >= n) return Incomplete(i);
      const bool ok = k == 1 ? SecondByteOk(p[i], p[i + 1]) : IsContinuation(p[i + k]);
      if (!ok) return Invalid(k, i);
    }
    i += width;
  }
  return std::nullopt;
}

std::string JsonQuote(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<uint8_t>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out += kHex[u >> 4];
          out += kHex[u & 0xF];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace shardsafe::internal
