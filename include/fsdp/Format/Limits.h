//===- Limits.h - What the readers accept, known to the compiler -*- C++ -*-===//
//
// The runtime's readers bound what they accept so that a hostile file cannot
// ask for absurd allocations. The compiler refuses, at compile time, any
// model whose checkpoints would pass these bounds: one table for both.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_FORMAT_LIMITS_H
#define FSDP_FORMAT_LIMITS_H

#include <cstdint>

namespace fsdp {
namespace limits {

/// The longest string the integrity index holds: an item's checksum name is
/// its key plus "@[offsets]".
constexpr uint64_t kMaxIndexStringBytes = uint64_t(1) << 20;
/// The longest checkpoint key: the index string less room for the offsets.
constexpr uint64_t kMaxKeyBytes = kMaxIndexStringBytes - 4096;
/// The largest buffer of one role on one rank.
constexpr uint64_t kMaxBufferBytes = uint64_t(1) << 48;
/// Item offsets and lengths in a data file stay below this.
constexpr uint64_t kMaxFileOffset = uint64_t(1) << 56;

} // namespace limits
} // namespace fsdp

#endif // FSDP_FORMAT_LIMITS_H
