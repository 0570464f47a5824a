//===- Escape.h - Names from the model, safe in each output -----*- C++ -*-===//
//
// Module, parameter, unit, mesh axis and symbol names come from a model JSON
// or an MLIR file and may hold any bytes. Each output the compiler writes
// them to has its own rules, and each has one function here (or, for the
// generated C++, in lib/Target/Cpp):
//
//   - diagnostics: `printable` (Printable.h): control bytes and invalid UTF-8
//     as \xNN, so an error stays one line and cannot drive the terminal;
//   - XML (the layout SVG): `xmlText`.
//
// Escapes read the same everywhere: \xNN for a byte (a control character or
// one that is not valid UTF-8), \u{XXXX} for a valid code point the output
// cannot or should not hold.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_SUPPORT_ESCAPE_H
#define FSDP_SUPPORT_ESCAPE_H

#include "fsdp/Support/Printable.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace fsdp {

/// The length of the valid UTF-8 sequence at `text[at]` (a lead byte >=
/// 0x80), with its code point in `code`; 0 for bytes that are not valid
/// UTF-8 (stray continuations, overlong forms, surrogates, > U+10FFFF,
/// truncated sequences).
inline size_t decodeUtf8(std::string_view text, size_t at, uint32_t &code) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  uint8_t lead = byte(at);
  size_t length = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 0;
  if (length == 0 || lead > 0xF4 || at + length > text.size())
    return 0;
  code = lead & (0x7F >> length);
  for (size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80)
      return 0;
    code = (code << 6) | (byte(at + i) & 0x3F);
  }
  static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < smallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
    return 0;
  return length;
}

/// Unicode's noncharacters: U+FDD0..U+FDEF and the last two code points of
/// every plane (U+FFFE, U+FFFF, U+1FFFE, ...).
inline bool isNoncharacter(uint32_t code) {
  return (code >= 0xFDD0 && code <= 0xFDEF) || (code & 0xFFFE) == 0xFFFE;
}

/// `\xNN`, lower-case as `printable` writes it.
inline void appendByteEscape(std::string &out, uint8_t byte) {
  static const char hex[] = "0123456789abcdef";
  out += "\\x";
  out += hex[byte >> 4];
  out += hex[byte & 15];
}

/// `\u{XXXX}`: at least four upper-case hex digits, as Unicode writes U+XXXX.
inline void appendCodePointEscape(std::string &out, uint32_t code) {
  static const char hex[] = "0123456789ABCDEF";
  std::string digits;
  for (; code || digits.size() < 4; code >>= 4)
    digits.insert(digits.begin(), hex[code & 15]);
  out += "\\u{" + digits + "}";
}

/// `text` as XML character data or an attribute value: `<>&"'` as entities;
/// tab and newline as they are (tooltips are lines); every other control
/// character (CR too, which a parser would drop), and every byte that is not
/// valid UTF-8, as \xNN; C1 controls, noncharacters (U+FFFE, U+FFFF, ...) and
/// U+FDD0..U+FDEF as \u{XXXX}. The result is well-formed XML 1.0 for any
/// input bytes.
inline std::string xmlText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    auto c = static_cast<uint8_t>(text[at]);
    if (c < 0x80) {
      switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7F)
          appendByteEscape(out, c);
        else
          out += static_cast<char>(c);
      }
      ++at;
      continue;
    }
    uint32_t code = 0;
    size_t length = decodeUtf8(text, at, code);
    if (length == 0) {
      appendByteEscape(out, c);
      ++at;
      continue;
    }
    if (code < 0xA0 || isNoncharacter(code))
      appendCodePointEscape(out, code);
    else
      out.append(text.substr(at, length));
    at += length;
  }
  return out;
}

} // namespace fsdp

#endif // FSDP_SUPPORT_ESCAPE_H
