//===- LayoutSVG.h - Draw lowered parameter groups as SVG -------*- C++ -*-===//
//
// `fsdp-translate --emit-layout-svg lowered.mlir -o layout.svg` draws the
// packed flat buffer of every lowered `fsdp.param_group`: one horizontal bar
// per group with a span per member (coloured by DFS index, labelled with its
// FQN when it fits, always in a <title> tooltip), holes hatched, tail padding
// dark grey, a line at every shard boundary labelled with the ranks holding
// the shard, and a table of the spans below each bar. Standalone SVG: no
// scripts, no external fonts.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_TARGET_LAYOUTSVG_H
#define FSDP_TARGET_LAYOUTSVG_H

#include "mlir/Support/LLVM.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mlir {
class Operation;
} // namespace mlir

namespace fsdp {

struct LayoutSVGOptions {
  /// When non-empty, draw only the groups of this unit FQN ("(root)" names
  /// the root unit, whose FQN is "").
  std::string unit;
};

/// Writes the SVG picture of the lowered `fsdp.model` in `op` (the model
/// itself or an op holding exactly one). Fails with one diagnostic on the
/// op at fault when the model is not lowered (run fsdp-opt
/// --fsdp-lower-fully-shard first) or the unit filter matches no group.
mlir::LogicalResult translateToLayoutSVG(mlir::Operation *op,
                                         llvm::raw_ostream &os,
                                         const LayoutSVGOptions &options);
mlir::LogicalResult translateToLayoutSVG(mlir::Operation *op,
                                         llvm::raw_ostream &os);

/// Registers `--emit-layout-svg` (with `--layout-svg-unit=FQN`) for
/// fsdp-translate.
void registerToLayoutSVGTranslation();

} // namespace fsdp

#endif // FSDP_TARGET_LAYOUTSVG_H
