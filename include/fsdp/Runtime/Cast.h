//===- Cast.h - Casts between floating dtypes ------------------*- C++ -*-===//
//
// The element casts a load uses when a buffer's dtype differs from the
// checkpoint's (the model_weight refresh, safetensors export): f64, f32,
// bf16 and f16, rounded as PyTorch's `.to()` rounds. runtime/ElementBits.h
// computes the same functions on the device; its unit test compares the two
// bit for bit.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_CAST_H
#define FSDP_RUNTIME_CAST_H

#include "fsdp/Format/DcpMetadata.h"

#include <cstdint>

namespace fsdp {
namespace runtime {

/// memcpy with non-temporal stores where the CPU has them (its widest
/// vectors, four 4 KiB runs of the copy interleaved): the destination
/// goes to memory without being read into the cache first (what a plain
/// store does), as glibc does only for copies above its threshold (192 MiB
/// on this project's build machine); the source stays in cache. For copies
/// whose destination is not read again soon: an async save's snapshot (its
/// 64 MiB pieces copied with plain stores moved 1.5x the bytes: 0.27-0.30 s
/// against 0.16-0.18 s for 1.87 GB) and a warm load's blocks out of the page
/// cache (each hashed from its source, still in cache, after the copy).
void copyBypassingCache(void *destination, const void *source, uint64_t bytes);

/// f32 -> bf16 / f16 with round-to-nearest-even, as PyTorch's `.to()` does
/// (NaN stays NaN, overflow goes to infinity).
uint16_t floatToBFloat16(float value);
uint16_t floatToHalf(float value);
float bfloat16ToFloat(uint16_t value);
float halfToFloat(uint16_t value);

/// Casts `count` elements between floating dtypes (f64, f32, bf16, f16; same
/// dtype is a copy). The model_weight refresh after a load uses it.
Status castElements(dcp::DType from, const void *in, dcp::DType to, void *out, uint64_t count);

/// castElements that also copies the source's bytes to `copy` (not
/// overlapping `in` or `out`) in the same pass: a load landing a main
/// weight and casting it into its model weight reads each block once. f32
/// to bf16 is one loop; the others copy and cast a few KiB at a time.
Status copyAndCastElements(dcp::DType from, const void *in, void *copy, dcp::DType to, void *out,
                           uint64_t count);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_CAST_H
