//===- Cpp.h - Emit a model's checkpoint library as C++ ---------*- C++ -*-===//
#ifndef FSDP_TARGET_CPP_H
#define FSDP_TARGET_CPP_H

namespace fsdp {
/// Registers `--emit-cpp` (with `--emit-cpp-header`, `--cpp-namespace`,
/// `--cpp-symbol-prefix` and `--cpp-plan-file`) for fsdp-translate: C++ for
/// one lowered model, its per-rank plans embedded, a typed API over the
/// runtime and the C entry point `<prefix>_open` (docs/Embedding.md).
void registerToCppTranslation();
} // namespace fsdp

#endif // FSDP_TARGET_CPP_H
