//===- PackParamGroups.cpp - Pack each group into one flat buffer ---------===//
#include "fsdp/Dialect/FSDP/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace fsdp {
#define GEN_PASS_DEF_PACKPARAMGROUPS
#include "fsdp/Dialect/FSDP/Transforms/Passes.h.inc"
} // namespace fsdp

using namespace mlir;
using namespace fsdp;

namespace {

struct PackParamGroupsPass
    : public fsdp::impl::PackParamGroupsBase<PackParamGroupsPass> {
  void runOnOperation() override {
    ModelOp model = getOperation();
    Builder builder(model.getContext());
    for (ParamGroupOp group : model.getBody().getOps<ParamGroupOp>()) {
      if (group.getChunk())
        continue; // Already packed; the verifier checks it.
      // Megatron-FSDP pads to chunk x the product of ALL the unit's mesh
      // axes, replicated ones included, so the layout is the same for FSDP,
      // HSDP and HFSDP; experts pad to their own mesh's size.
      int64_t dpSize = layout::meshSize(getGroupMesh(group).meshSizes);
      Result<layout::PackedLayout> packed =
          layout::packGroup(getMemberShapes(group), dpSize);
      if (!packed) {
        group.emitOpError() << "cannot pack: " << packed.error();
        return signalPassFailure();
      }
      group.setChunkAttr(builder.getI64IntegerAttr(packed->chunk));
      group.setSizeAttr(builder.getI64IntegerAttr(packed->size));
      for (auto [member, offset] :
           llvm::zip(group.getBody().getOps<MemberOp>(), packed->offsets))
        member.setOffsetAttr(builder.getI64IntegerAttr(offset));
    }
  }
};

} // namespace
