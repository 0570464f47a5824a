//===- Registration.h - What fsdp-opt and fsdp-translate register -*- C++ -*-===//
//
// One registration helper shared by the drivers, so fsdp-opt, fsdp-translate
// and any future tool (an LSP server) see the same dialects and passes.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_TOOLS_REGISTRATION_H
#define FSDP_TOOLS_REGISTRATION_H

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace fsdp {
/// The dialects fsdp IR may contain.
void registerFSDPToolDialects(mlir::DialectRegistry &registry);
/// Every fsdp pass and pipeline, plus the generic passes tests use.
void registerFSDPToolPasses();
/// Every fsdp-translate translation (import and emitters).
void registerFSDPToolTranslations();
} // namespace fsdp

#endif // FSDP_TOOLS_REGISTRATION_H
