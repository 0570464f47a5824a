//===- Values.h - Deterministic test values --------------------*- C++ -*-===//
//
// `fsdp-ckpt save --fill SEED` and `load --check SEED` (docs/TestValues.md): the
// value of element i (row-major in the global tensor; 0 for a scalar) of
// checkpoint key k is a pure function of (k, i, SEED), so a load into any
// layout is checkable by anyone, PyTorch included:
//   N = ((i * 7919 + SEED * 104729 + fnv1a32(k)) mod 65521) - 32760
// computed in unsigned 64-bit arithmetic, then signed. Floating types hold
// N / 256 (exact in f32/f64; bf16/f16 round to nearest even), integer types
// hold N (wrapped modulo 2^bits for unsigned), bool holds N odd. The dtype
// casts a load uses are in Cast.h.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_VALUES_H
#define FSDP_RUNTIME_VALUES_H

#include "fsdp/Format/DcpMetadata.h"

#include <cstdint>
#include <string_view>

namespace fsdp {
namespace runtime {

uint32_t fnv1a32(std::string_view text);

/// N of the formula above, in [-32760, 32760].
int32_t testValue(uint32_t keyHash, uint64_t elementIndex, uint32_t seed);

/// Writes `count` elements of `dtype` for elements [firstElement, +count) of
/// key `keyHash` into `out` (element size from dcp::dtypeInfo). Fails for
/// dtypes without a defined test value (complex, float8).
Status fillTestValues(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement, uint64_t count,
                      uint32_t seed, void *out);

/// Checks `count` elements against fillTestValues; on the first mismatch
/// returns an error naming the element index, found and expected values.
Status checkTestValues(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement, uint64_t count,
                       uint32_t seed, const void *data);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_VALUES_H
