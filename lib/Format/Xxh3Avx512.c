//===- Xxh3Avx512.c - xxHash's XXH3 for AVX-512 -----------------------*- C -*-===//
#define FSDP_XXH3_KERNELS fsdpXxh3Avx512
#define FSDP_XXH3_NAME "avx512"
#include "Xxh3Kernel.inc"
