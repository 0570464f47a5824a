//===- Xxh3Avx2.c - xxHash's XXH3 for AVX2 ----------------------------*- C -*-===//
#define FSDP_XXH3_KERNELS fsdpXxh3Avx2
#define FSDP_XXH3_NAME "avx2"
#include "Xxh3Kernel.inc"
