//===- Kernels.h - The CUDA backend's kernels, for plain C++ -----*- C++ -*-===//
//
// Launchers for the kernels of Kernels.cu, callable from code compiled
// without nvcc: no CUDA types (a stream is an opaque cudaStream_t passed as
// void *); each returns the launch's cudaError_t as an int (0: launched).
// The kernels run asynchronously on the stream: the caller waits for them.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_CUDA_KERNELS_H
#define FSDP_RUNTIME_CUDA_KERNELS_H

#include "../ElementBits.h"

#include <cstdint>

namespace fsdp {
namespace runtime {
namespace cudakernels {

using elementbits::ValueType;

/// Whether castKernel handles `from` -> `to`: any two of f64, f32, bf16,
/// f16 (the same type too: a copy).
bool castSupported(ValueType from, ValueType to);

/// `count` elements of `from` at `in` cast to `to` at `out` (device memory;
/// not overlapping unless the same type and the same address).
int launchCast(ValueType from, const void *in, ValueType to, void *out, uint64_t count,
               void *stream);

/// Values.h's test values of elements [first, first + count) of the key
/// whose hash is `keyHash` into `out` (device memory).
int launchFill(ValueType type, uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed,
               void *out, void *stream);

/// Compares `in` with the test values: `*mismatch` (a device word the
/// caller set to UINT64_MAX) becomes the smallest offset in [0, count)
/// whose element differs, if any.
int launchCheck(ValueType type, uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed,
                const void *in, unsigned long long *mismatch, void *stream);

} // namespace cudakernels
} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_CUDA_KERNELS_H
