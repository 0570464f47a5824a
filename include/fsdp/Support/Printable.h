//===- Printable.h - Bytes from files, safe to print ------------*- C++ -*-===//
//
// Keys, paths and records come from files that may be hostile: printed raw,
// they could move the cursor, recolour a terminal or split one error over
// several lines. `printable` keeps valid UTF-8 text as it is and writes every
// control character (C0, DEL, C1) and every byte that is not valid UTF-8 as
// a backslash escape, so a message stays one readable line.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_SUPPORT_PRINTABLE_H
#define FSDP_SUPPORT_PRINTABLE_H

#include <cstdint>
#include <string>
#include <string_view>

namespace fsdp {

/// The length of the valid UTF-8 sequence at `text[at]` that encodes a
/// printable code point (>= U+00A0), or 0.
inline size_t printableUtf8Length(std::string_view text, size_t at) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  uint8_t lead = byte(at);
  size_t length = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 0;
  if (length == 0 || lead > 0xF4 || at + length > text.size())
    return 0;
  uint32_t code = lead & (0x7F >> length);
  for (size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80)
      return 0;
    code = (code << 6) | (byte(at + i) & 0x3F);
  }
  static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < smallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF) ||
      code < 0xA0) // C1 controls (U+0080..U+009F) are escaped too
    return 0;
  return length;
}

inline std::string printable(std::string_view text) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    auto c = static_cast<uint8_t>(text[at]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
      ++at;
    } else if (size_t length = c >= 0x80 ? printableUtf8Length(text, at) : 0) {
      out.append(text.substr(at, length));
      at += length;
    } else {
      switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      }
      ++at;
    }
  }
  return out;
}

} // namespace fsdp

#endif // FSDP_SUPPORT_PRINTABLE_H
