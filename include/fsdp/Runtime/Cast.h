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
