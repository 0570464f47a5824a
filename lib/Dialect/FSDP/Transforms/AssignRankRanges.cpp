//===- AssignRankRanges.cpp - Rank ranges, pieces and buffers -------------===//
#include "fsdp/Dialect/FSDP/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace fsdp {
#define GEN_PASS_DEF_ASSIGNRANKRANGES
#include "fsdp/Dialect/FSDP/Transforms/Passes.h.inc"
} // namespace fsdp

using namespace mlir;
using namespace fsdp;

namespace {

/// Buffers per Megatron-FSDP v2 (reference §2.5): main weights in the
/// policy's dtype (integer parameters keep theirs: a cast would lose them),
/// model weights in the parameter dtype, aliasing main weights when equal;
/// trainable groups add main grads and, with an optimizer, its two moments.
static ArrayAttr buildBuffers(ParamGroupOp group, OptimizerOp optimizer) {
  MLIRContext *context = group.getContext();
  Type dtype = group.getDtype();
  FullyShardAttr policy = group.getPolicy();
  Type mainWeight = isSupportedFloatType(dtype) ? policy.getMainParams() : dtype;
  SmallVector<Attribute> buffers = {
      BufferAttr::get(context, BufferRole::MainWeight, mainWeight, false),
      BufferAttr::get(context, BufferRole::ModelWeight, dtype,
                      mainWeight == dtype)};
  if (group.getRequiresGrad()) {
    Type grad = policy.getMainGrads() ? policy.getMainGrads() : dtype;
    buffers.push_back(
        BufferAttr::get(context, BufferRole::MainGrad, grad, false));
    if (optimizer) {
      Type state = optimizer.getState();
      buffers.push_back(
          BufferAttr::get(context, BufferRole::ExpAvg, state, false));
      buffers.push_back(
          BufferAttr::get(context, BufferRole::ExpAvgSq, state, false));
    }
  }
  return ArrayAttr::get(context, buffers);
}

struct AssignRankRangesPass
    : public fsdp::impl::AssignRankRangesBase<AssignRankRangesPass> {
  void runOnOperation() override {
    ModelOp model = getOperation();
    std::vector<int64_t> meshSizes = getLayoutMeshSizes(model.getMesh());
    int64_t numRanks = layout::meshSize(meshSizes);
    Builder builder(model.getContext());
    for (ParamGroupOp group : model.getBody().getOps<ParamGroupOp>()) {
      if (!group.getChunk()) {
        group.emitOpError()
            << "is not packed; run fsdp-pack-param-groups first";
        return signalPassFailure();
      }
      std::vector<layout::Placement> placements =
          getLayoutPlacements(group.getPolicy());
      int64_t size = *group.getSize();
      int64_t numShards = layout::numShards(meshSizes, placements);
      int64_t shardSize = size / numShards;

      std::vector<int64_t> shardOfRank =
          layout::shardIndices(meshSizes, placements);
      SmallVector<int64_t> rankBegins(numRanks);
      for (int64_t rank = 0; rank < numRanks; ++rank)
        rankBegins[rank] = shardOfRank[rank] * shardSize;
      group.setShardSizeAttr(builder.getI64IntegerAttr(shardSize));
      group.setRanksAttr(builder.getDenseI64ArrayAttr(rankBegins));
      group.setBuffersAttr(buildBuffers(group, model.getOptimizer()));

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
