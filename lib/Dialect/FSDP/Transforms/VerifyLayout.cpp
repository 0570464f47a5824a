//===- VerifyLayout.cpp - Verify the lowered layouts ----------------------===//
#include "fsdp/Dialect/FSDP/Transforms/Passes.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"

namespace fsdp {
#define GEN_PASS_DEF_VERIFYLAYOUT
#include "fsdp/Dialect/FSDP/Transforms/Passes.h.inc"
} // namespace fsdp

using namespace mlir;
using namespace fsdp;

namespace {

/// Rows per rank, "9/7": short for small meshes, elided for large ones.
static std::string formatRows(ArrayRef<int64_t> rows) {
  constexpr size_t kShown = 16;
  std::string text;
  for (size_t i = 0; i < rows.size() && i < kShown; ++i)
    text += (i ? "/" : "") + std::to_string(rows[i]);
  if (rows.size() > kShown)
    text += "/... (" + std::to_string(rows.size()) + " ranks)";
  return text;
}

struct VerifyLayoutPass
    : public fsdp::impl::VerifyLayoutBase<VerifyLayoutPass> {
  using Base::Base;

  void runOnOperation() override {
    ModelOp model = getOperation();
    // The structural rules live in the op verifiers, so that hand-written IR
    // is held to them too; run them here explicitly as well.
    if (failed(verify(model)))
      return signalPassFailure();
    NNModuleOp root = model.getRootModule();
    bool hasTrainableUnitParams = false;
    root.walk([&](ParamOp param) {
      if (cast<NNModuleOp>(param->getParentOp()).getOwningUnit())
        hasTrainableUnitParams = true;
    });
    auto groups = model.getBody().getOps<ParamGroupOp>();
    if (groups.empty() && hasTrainableUnitParams) {
      model.emitOpError()
          << "has fully_shard units but no parameter groups; run "
             "fsdp-group-params (or the fsdp-lower-fully-shard pipeline)";
      return signalPassFailure();
    }
    for (ParamGroupOp group : groups) {
      StringRef missing;
      if (!group.getChunk())
        missing = "chunk/size (run fsdp-pack-param-groups)";
      else if (!group.getRanks() || !group.getBuffers())
        missing = "rank ranges and buffers (run fsdp-assign-rank-ranges)";
      if (!missing.empty()) {
        group.emitOpError() << "is not fully lowered: missing " << missing;
        return signalPassFailure();
      }
      if (reportCanonicalMismatch)
        reportMismatches(group);
    }
  }

  /// A remark per member whose true rows differ, on some rank, from what a
  /// DTensor with canonical Shard(0) chunking assumes.
  void reportMismatches(ParamGroupOp group) {
    // Ranks of the unit's mesh (an expert mesh for experts): rank r there
    // is the world rank with that mesh rank in expert group 0.
    UnitMesh mesh = getGroupMesh(group);
    const std::vector<int64_t> &meshSizes = mesh.meshSizes;
    std::vector<layout::Placement> placements =
        getLayoutPlacements(group.getPolicy());
    int64_t numRanks = layout::meshSize(meshSizes);
    int64_t shardSize = *group.getShardSize();
    ArrayRef<int64_t> ranks = *group.getRanks();
    for (MemberOp member : group.getBody().getOps<MemberOp>()) {
      ArrayRef<int64_t> dims = member.getTensorType().getShape();
      layout::Shape shape(dims.begin(), dims.end());
      SmallVector<int64_t> trueRows, canonicalRows;
      bool differs = false;
      for (int64_t rank = 0; rank < numRanks; ++rank) {
        int64_t world = mesh.experts ? mesh.experts->worldRank(rank, 0) : rank;
        layout::Range range{ranks[world], ranks[world] + shardSize};
        int64_t rows = layout::pieceOf(*member.getOffset(), shape, range).rows;
        int64_t canonical =
            layout::canonicalRowsForCoords(dims[0], meshSizes,
                                           layout::rankCoords(rank, meshSizes),
                                           placements)
                .size();
        differs |= rows != canonical;
        trueRows.push_back(rows);
        canonicalRows.push_back(canonical);
      }
      if (differs)
        member.emitRemark()
            << "'" << member.getFQN() << "' rows per rank are "
            << formatRows(trueRows) << " but canonical Shard(0) assumes "
            << formatRows(canonicalRows)
            << ": a checkpointer that ignores the packed layout corrupts it "
               "silently";
    }
  }
};

} // namespace
