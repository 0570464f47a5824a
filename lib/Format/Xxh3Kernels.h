//===- Xxh3Kernels.h - xxh3-64 built for each x86-64 vector width -*- C -*-===//
//
// The xxHash library's own XXH3 code, compiled once per instruction set
// (Xxh3Kernel.inc in the Xxh3*.c files, each with its compiler flags):
// Debian's libxxhash is built for baseline x86-64 (SSE2) and hashes about
// 20 GB/s from L2 here, its code built for AVX2 51 and for AVX-512 55. Every
// checked load and every save hashes all of its bytes. IntegrityIndex.cpp
// picks the widest the CPU runs.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_FORMAT_XXH3KERNELS_H
#define FSDP_FORMAT_XXH3KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FsdpXxh3Kernels {
  const char *name;
  uint64_t (*hash)(const void *data, size_t size);
  /// A streaming state, reset; null when out of memory.
  void *(*createState)(void);
  void (*freeState)(void *state);
  void (*update)(void *state, const void *data, size_t size);
  uint64_t (*digest)(const void *state);
} FsdpXxh3Kernels;

extern const FsdpXxh3Kernels fsdpXxh3Baseline;
#if defined(__x86_64__) && defined(FSDP_XXH3_X86_KERNELS)
extern const FsdpXxh3Kernels fsdpXxh3Avx2;
extern const FsdpXxh3Kernels fsdpXxh3Avx512;
#endif

#ifdef __cplusplus
}
#endif

#endif // FSDP_FORMAT_XXH3KERNELS_H
