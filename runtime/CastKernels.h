//===- CastKernels.h - The cast and streaming copy loops per ISA -*- C++ -*-===//
//
// castElements and copyBypassingCache run the best of these the CPU supports;
// the tests run every one of them against the scalar conversions and memcpy.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_CASTKERNELS_H
#define FSDP_RUNTIME_CASTKERNELS_H

#include <cstdint>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FSDP_CAST_HAS_X86_LEVELS 1
#else
#define FSDP_CAST_HAS_X86_LEVELS 0
#endif

namespace fsdp {
namespace runtime {

struct FloatCastKernels {
  const char *isa;
  void (*toBFloat16)(const void *in, void *out, uint64_t count);
  void (*toHalf)(const void *in, void *out, uint64_t count);
  /// toBFloat16 that also copies the f32 source to `copy` in the same pass.
  void (*copyToBFloat16)(const void *in, void *copy, void *out, uint64_t count);
  /// copyBypassingCache.
  void (*copyStreaming)(void *destination, const void *source, uint64_t bytes);
};

/// The kernels this build has and this CPU runs, the baseline first and the
/// best last.
std::vector<FloatCastKernels> runnableFloatCastKernels();

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_CASTKERNELS_H
