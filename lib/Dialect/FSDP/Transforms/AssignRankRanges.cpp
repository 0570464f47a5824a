//===- AssignRankRanges.cpp - Rank ranges, pieces and buffers -------------===//
#include "fsdp/Dialect/FSDP/Transforms/Passes.h"
#include "fsdp/Dialect/FSDP/IR/FSDPLimits.h"

#include "mlir/IR/Builders.h"

namespace fsdp {
#define GEN_PASS_DEF_ASSIGNRANKRANGES
#include "fsdp/Dialect/FSDP/Transforms/Passes.h.inc"
} // namespace fsdp

using namespace mlir;
using namespace fsdp;

namespace {

struct AssignRankRangesPass
    : public fsdp::impl::AssignRankRangesBase<AssignRankRangesPass> {
  void runOnOperation() override {
    ModelOp model = getOperation();
    int64_t numRanks = layout::meshSize(getLayoutMeshSizes(model.getMesh()));
    // Each group lists a range per world rank, and so does every plan:
    // refuse, before allocating, a model whose lowered IR cannot be held.
    int64_t numGroups = llvm::range_size(model.getBody().getOps<ParamGroupOp>());
    if (numGroups > 0 && numRanks > limits::kMaxRankRanges / numGroups) {
      // On the location, not the op: no dump of the whole model.
      emitError(model.getLoc())
          << "the lowered model would list " << numRanks << " ranks x " << numGroups
          << " parameter groups = " << numRanks * numGroups << " rank ranges, more than "
          << limits::kMaxRankRanges
          << " (2^27, the compiler's limit): use fewer ranks or fewer fully_shard units";
      return signalPassFailure();
    }
    Builder builder(model.getContext());
    for (ParamGroupOp group : model.getBody().getOps<ParamGroupOp>()) {
      if (!group.getChunk()) {
        group.emitOpError()
            << "is not packed; run fsdp-pack-param-groups first";
        return signalPassFailure();
      }
      std::vector<layout::Placement> placements =
          getLayoutPlacements(group.getPolicy());
      // Every world rank's range, from its rank in the unit's mesh (an
      // expert mesh for experts: each expert group holds its own experts
      // in the same layout).
      UnitMesh mesh = getGroupMesh(group);
      int64_t size = *group.getSize();
      int64_t numShards = layout::numShards(mesh.meshSizes, placements);
      int64_t shardSize = size / numShards;

      std::vector<int64_t> shardOfRank =
          layout::shardIndices(mesh.meshSizes, placements);
      SmallVector<int64_t> rankBegins(numRanks);
      for (int64_t rank = 0; rank < numRanks; ++rank)
        rankBegins[rank] = shardOfRank[mesh.meshRank(rank)] * shardSize;
      group.setShardSizeAttr(builder.getI64IntegerAttr(shardSize));
      group.setRanksAttr(builder.getDenseI64ArrayAttr(rankBegins));
      group.setBuffersAttr(getExpectedBuffers(group, model.getOptimizer()));

      // Only the shards a member touches: O(members + shards) in all.
      for (MemberOp member : group.getBody().getOps<MemberOp>()) {
        ArrayRef<int64_t> dims = member.getTensorType().getShape();
        layout::Shape shape(dims.begin(), dims.end());
        int64_t offset = *member.getOffset();
        int64_t numel = layout::numElements(shape);
        SmallVector<int64_t> pieces;
        int64_t lastShard = shardSize ? (offset + numel - 1) / shardSize : -1;
        for (int64_t shard = shardSize ? offset / shardSize : 0;
             shard <= lastShard; ++shard) {
          layout::Range range{shard * shardSize, (shard + 1) * shardSize};
          layout::Piece piece = layout::pieceOf(offset, shape, range);
          if (!piece.empty())
            pieces.append({shard, piece.rowOffset,
                           piece.rowOffset + piece.rows, piece.localOffset});
        }
        member.setPiecesAttr(builder.getDenseI64ArrayAttr(pieces));
      }
    }
  }
};

} // namespace
