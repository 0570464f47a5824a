//===- LittleEndian.h - Fixed-width integers in file formats ----*- C++ -*-===//
//
// Our side files (the integrity index, the chunk index) store integers
// little-endian whatever the host; these append, overwrite and read them
// byte by byte, so no alignment is assumed.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_SUPPORT_LITTLEENDIAN_H
#define FSDP_SUPPORT_LITTLEENDIAN_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdp {
namespace le {

inline void putU32(std::string &out, uint32_t value) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>(value >> (8 * i)));
}
inline void putU64(std::string &out, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>(value >> (8 * i)));
}
/// Overwrites the 8 bytes at `at` (which must exist).
inline void setU64(std::string &out, size_t at, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out[at + i] = static_cast<char>(value >> (8 * i));
}
inline uint32_t getU32(const char *at) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i)
    value |= static_cast<uint32_t>(static_cast<uint8_t>(at[i])) << (8 * i);
  return value;
}
inline uint64_t getU64(const char *at) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i)
    value |= static_cast<uint64_t>(static_cast<uint8_t>(at[i])) << (8 * i);
  return value;
}

} // namespace le
} // namespace fsdp

#endif // FSDP_SUPPORT_LITTLEENDIAN_H
