//===- Xxh3Baseline.c - xxHash's XXH3 for the build's own target -----------*- C -*-===//
#define FSDP_XXH3_KERNELS fsdpXxh3Baseline
#define FSDP_XXH3_NAME "baseline"
#include "Xxh3Kernel.inc"
