//===- CheckpointPlan.cpp - Emit checkpoint plans from lowered IR ---------===//
#include "fsdp/Target/CheckpointPlan.h"
#include "fsdp/Support/Printable.h"
#include "fsdp/Dialect/FSDP/IR/FSDPUtils.h"
#include "fsdp/Plan/PlanFile.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CommandLine.h"

using namespace mlir;
using namespace fsdp;

static FailureOr<dcp::DType> toDType(Location loc, Type type) {
  if (std::optional<dcp::DType> dtype = getCheckpointDType(type))
    return *dtype;
  return emitError(loc) << "no checkpoint dtype for " << type;
}

// The IR's buffer roles (FSDP_BufferRole in FSDPBase.td) and the plan's
// (plan::BufferRole, which ModelLayout.h ties to the C header's
// fsdp_buffer_role) are one list with one numbering: a role added,
// removed or renumbered on one side only fails to build here.
#define FSDP_SAME_BUFFER_ROLE(Name)                                                      \
  static_assert(static_cast<unsigned>(BufferRole::Name) ==                               \
                    static_cast<unsigned>(plan::BufferRole::Name),                       \
                "fsdp::BufferRole::" #Name " and plan::BufferRole::" #Name " differ")
FSDP_SAME_BUFFER_ROLE(MainWeight);
FSDP_SAME_BUFFER_ROLE(ModelWeight);
FSDP_SAME_BUFFER_ROLE(MainGrad);
FSDP_SAME_BUFFER_ROLE(ExpAvg);
FSDP_SAME_BUFFER_ROLE(ExpAvgSq);
FSDP_SAME_BUFFER_ROLE(MaxExpAvgSq);
FSDP_SAME_BUFFER_ROLE(MomentumBuffer);
#undef FSDP_SAME_BUFFER_ROLE
static_assert(getMaxEnumValForBufferRole() == static_cast<unsigned>(plan::kLastBufferRole),
              "the IR has a buffer role the plan lacks: add it to plan::BufferRole");

/// The same role in the plan's terms: the same number (checked above).
static plan::BufferRole toRole(BufferRole role) {
  return static_cast<plan::BufferRole>(static_cast<unsigned>(role));
}

/// "[0: [0, 4) at 0, 1: [4, 5) at 0]", as the IR prints pieces.
template <typename Range, typename Fn>
static std::string piecesText(const Range &pieces, Fn toPiece) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "[";
  bool first = true;
  for (const auto &each : pieces) {
    MemberOp::Piece piece = toPiece(each);
    os << (first ? "" : ", ") << piece.shard << ": [" << piece.rowBegin << ", " << piece.rowEnd
       << ") at " << piece.localOffset;
    first = false;
  }
  os << "]";
  return text;
}

/// The plans place every element where the verified IR says. The planner
/// works from offsets and shapes (plan::ModelLayout carries no pieces), so
/// this is the stated check that its rank ranges and pieces are the IR's
/// `ranks` and `pieces`, which the verifier has checked against the layout
/// library. Verified IR always passes; a planner or verifier that drifts
/// apart fails here rather than writing checkpoints elsewhere than the IR
/// says. O(world size + pieces) per group.
static LogicalResult checkPlanAgreesWithIR(ArrayRef<ParamGroupOp> groups,
                                           const plan::ModelLayout &layout) {
  for (auto [index, spec] : llvm::enumerate(layout.groups)) {
    ParamGroupOp group = groups[index];
    std::vector<int64_t> planned = plan::rankRangeBegins(layout, spec);
    ArrayRef<int64_t> ranks = *group.getRanks();
    for (size_t rank = 0; rank < std::max(planned.size(), ranks.size()); ++rank)
      if (rank >= planned.size() || rank >= ranks.size() || planned[rank] != ranks[rank])
        return group.emitError()
               << "the checkpoint planner and the IR disagree on rank " << rank
               << "'s range of @" << printable(group.getSymName().str())
               << ": the plan puts it at "
               << (rank < planned.size() ? std::to_string(planned[rank]) : "no range")
               << ", ranks at "
               << (rank < ranks.size() ? std::to_string(ranks[rank]) : "no range");
    size_t m = 0;
    for (MemberOp member : group.getBody().getOps<MemberOp>()) {
      std::vector<plan::ShardPiece> plannedPieces = plan::memberPieces(spec, spec.members[m++]);
      SmallVector<MemberOp::Piece> pieces = member.getPieceList();
      auto toIR = [](const plan::ShardPiece &each) {
        return MemberOp::Piece{each.shard, each.piece.rowOffset,
                               each.piece.rowOffset + each.piece.rows, each.piece.localOffset};
      };
      auto same = [&](const plan::ShardPiece &each, const MemberOp::Piece &piece) {
        MemberOp::Piece p = toIR(each);
        return p.shard == piece.shard && p.rowBegin == piece.rowBegin &&
               p.rowEnd == piece.rowEnd && p.localOffset == piece.localOffset;
      };
      if (plannedPieces.size() != pieces.size() ||
          !std::equal(plannedPieces.begin(), plannedPieces.end(), pieces.begin(), same))
        return member.emitError()
               << "the checkpoint planner and the IR disagree on member '"
               << printable(member.getFQN())
               << "': the plan saves it as pieces " << piecesText(plannedPieces, toIR)
               << ", its pieces are "
               << piecesText(pieces, [](const MemberOp::Piece &piece) { return piece; });
    }
  }
  return success();
}

/// named_parameters() order: a module's own parameters, then its children's.
static void collectParamsInOrder(NNModuleOp module, SmallVectorImpl<ParamOp> &out) {
  for (ParamOp param : module.getBody().getOps<ParamOp>())
    out.push_back(param);
  for (NNModuleOp child : module.getBody().getOps<NNModuleOp>())
    collectParamsInOrder(child, out);
}

FailureOr<plan::ModelLayout> fsdp::buildModelLayout(ModelOp model) {
  FailureOr<SmallVector<ParamGroupOp>> groups =
      getLoweredGroups(model, "--emit-checkpoint-plan");
  if (failed(groups))
    return failure();
  plan::ModelLayout layout;
  MeshOp mesh = model.getMesh();
  for (Attribute name : mesh.getAxisNames())
    layout.meshAxisNames.push_back(cast<StringAttr>(name).str());
  layout.meshSizes = getLayoutMeshSizes(mesh);
  if (OptimizerOp optimizer = model.getOptimizer()) {
    plan::OptimizerSpec &spec = layout.optimizer;
    spec.present = true;
    switch (optimizer.getKind()) {
    case OptimizerKind::Adam:
      spec.kind = plan::OptimizerKind::Adam;
      break;
    case OptimizerKind::AdamW:
      spec.kind = plan::OptimizerKind::AdamW;
      break;
    case OptimizerKind::SGD:
      spec.kind = plan::OptimizerKind::SGD;
      break;
    }
    spec.lr = optimizer.getLr().convertToDouble();
    spec.weightDecay = optimizer.getWeightDecay().convertToDouble();
    if (std::optional<ArrayRef<double>> betas = optimizer.getBetas()) {
      spec.beta1 = (*betas)[0];
      spec.beta2 = (*betas)[1];
    }
    if (std::optional<APFloat> eps = optimizer.getEps())
      spec.eps = eps->convertToDouble();
    spec.amsgrad = optimizer.getAmsgrad();
    if (std::optional<APFloat> momentum = optimizer.getMomentum())
      spec.momentum = momentum->convertToDouble();
    if (std::optional<APFloat> dampening = optimizer.getDampening())
      spec.dampening = dampening->convertToDouble();
    spec.nesterov = optimizer.getNesterov();
    spec.stateRoles.clear();
    for (BufferRole role : optimizer.getStateTensors())
      spec.stateRoles.push_back(toRole(role));
    spec.hasStep = optimizer.hasStepState();
    FailureOr<dcp::DType> state = toDType(optimizer.getLoc(), optimizer.getState());
    if (failed(state))
      return failure();
    spec.stateDtype = *state;
  }
  llvm::StringMap<std::string> leadingFQN;
  for (ParamGroupOp group : *groups) {
    plan::GroupSpec spec;
    spec.unit = group.getUnit().str();
    FailureOr<dcp::DType> dtype = toDType(group.getLoc(), group.getDtype());
    if (failed(dtype))
      return failure();
    spec.dtype = *dtype;
    spec.requiresGrad = group.getRequiresGrad();
    spec.placements = getLayoutPlacements(group.getPolicy());
    spec.chunk = *group.getChunk();
    spec.size = *group.getSize();
    spec.shardSize = *group.getShardSize();
    for (Attribute attr : group.getBuffersAttr()) {
      auto buffer = cast<BufferAttr>(attr);
      FailureOr<dcp::DType> bufferType = toDType(group.getLoc(), buffer.getDtype());
      if (failed(bufferType))
        return failure();
      spec.buffers.push_back(
          {toRole(buffer.getRole()), *bufferType, buffer.getAliasesMainWeight()});
    }
    // An experts unit's members carry their local expert number, so the
    // plan names each under its global one.
    NNModuleOp unit = findUnit(model, group.getUnit());
    ExpertsAttr experts = unit ? unit.getExpertsAttr() : ExpertsAttr();
    layout::ExpertNaming naming = layout::ExpertNaming::Grouped;
    if (experts) {
      UnitMesh unitMesh = getUnitMesh(unit);
      if (!unitMesh.experts)
        return group.emitError() << "unit \"" << printable(group.getUnit())
                                 << "\" has experts on a mesh that does not resolve";
      int64_t perRank = experts.getCount() / unitMesh.experts->expertGroups();
      naming = experts.getNaming() == ExpertNaming::Grouped ? layout::ExpertNaming::Grouped
                                                             : layout::ExpertNaming::LocalExperts;
      spec.experts = plan::ExpertGroupSpec{*unitMesh.experts, perRank, naming};
    }
    for (MemberOp member : group.getBody().getOps<MemberOp>()) {
      plan::MemberSpec memberSpec;
      if (experts) {
        memberSpec.expert = layout::splitExpertFQN(member.getFQN(), group.getUnit(), naming);
        if (!memberSpec.expert)
          return member.emitError() << "expert parameter '" << printable(member.getFQN())
                                    << "' has no local expert number the plan can renumber";
      }
      for (Attribute fqn : member.getFqns()) {
        memberSpec.fqns.push_back(cast<StringAttr>(fqn).str());
        leadingFQN[cast<StringAttr>(fqn).getValue()] = member.getFQN().str();
      }
      ArrayRef<int64_t> shape = member.getTensorType().getShape();
      memberSpec.shape.assign(shape.begin(), shape.end());
      memberSpec.offset = *member.getOffset();
      spec.members.push_back(std::move(memberSpec));
    }
    layout.groups.push_back(std::move(spec));
  }
  // The optimizer's params: trainable parameters in named_parameters()
  // order, one entry per storage (its leading FQN).
  SmallVector<ParamOp> params;
  collectParamsInOrder(model.getRootModule(), params);
  // A parameter outside every unit has no layout: refuse rather than leave
  // it out of the checkpoint silently.
  for (ParamOp param : params)
    if (!leadingFQN.count(param.getFQN()))
      return param.emitError()
             << "'" << printable(param.getFQN())
             << "' is outside every fully_shard unit, so it has no layout and "
                "cannot be checkpointed; make an enclosing module a unit";
  llvm::StringSet<> seen;
  for (ParamOp param : params) {
    auto it = leadingFQN.find(param.getFQN());
    if (!param.getRequiresGrad() || it == leadingFQN.end())
      continue;
    if (seen.insert(it->second).second)
      layout.optimizerParams.push_back(it->second);
  }
  if (Status status = plan::checkModelLayout(layout); !status)
    return emitError(model.getLoc()) << "cannot plan: " << printable(status.error());
  if (failed(checkPlanAgreesWithIR(*groups, layout)))
    return failure();
  return layout;
}

void fsdp::registerToCheckpointPlanTranslation() {
  static llvm::cl::list<int64_t> planRanks(
      "plan-ranks",
      llvm::cl::desc("With --emit-checkpoint-plan: only these ranks' parts "
                     "(the global metadata comes with rank 0)"),
      llvm::cl::CommaSeparated);
  static llvm::cl::opt<std::string> planFormat(
      "plan-format",
      llvm::cl::desc("With --emit-checkpoint-plan: flatbuffers (default), json "
                     "(for people) or dcp-metadata (the .metadata pickle a save "
                     "commits)"),
      llvm::cl::init("flatbuffers"));
  static llvm::cl::opt<std::string> planSplitDir(
      "plan-split-dir",
      llvm::cl::desc("With --emit-checkpoint-plan: write one plan file per rank "
                     "(rank-<r>.fsdpplan) into this directory instead; the "
                     "output gets a one-line summary"),
      llvm::cl::init(""));
  // For tests: a plan file limit below FlatBuffers' 2 GiB, to reach that
  // error cheaply; and the .metadata taken out of a built plan, to compare
  // it with the streamed one.
  static llvm::cl::opt<uint64_t> planMaxFileBytes(
      "plan-max-file-bytes",
      llvm::cl::desc("With --emit-checkpoint-plan: fail past this many bytes per plan file "
                     "(for tests; default and most: FlatBuffers' 2 GiB)"),
      llvm::cl::init(plan::kMaxPlanFileBytes), llvm::cl::Hidden);
  static llvm::cl::opt<bool> planMetadataFromPlan(
      "plan-metadata-from-plan",
      llvm::cl::desc("With --plan-format=dcp-metadata: take the .metadata out of rank 0's "
                     "plan instead of streaming it (for tests: the bytes must agree)"),
      llvm::cl::init(false), llvm::cl::Hidden);
  static TranslateFromMLIRRegistration registration(
      "emit-checkpoint-plan",
      "emit the per-rank checkpoint save/load plans of a lowered model",
      [](Operation *op, raw_ostream &os) -> LogicalResult {
        ModelOp model = findModel(op);
        if (!model)
          return failure();
        if (planFormat != "flatbuffers" && planFormat != "json" &&
            planFormat != "dcp-metadata")
          return emitError(model.getLoc())
                 << "--plan-format must be flatbuffers, json or dcp-metadata, got '"
                 << planFormat << "'";
        FailureOr<plan::ModelLayout> layout = buildModelLayout(model);
        if (failed(layout))
          return failure();
        plan::PlanFileOptions options;
        options.ranks.assign(planRanks.begin(), planRanks.end());
        if (planMaxFileBytes > plan::kMaxPlanFileBytes)
          return emitError(model.getLoc())
                 << "--plan-max-file-bytes: at most " << plan::kMaxPlanFileBytes;
        options.maxFileBytes = planMaxFileBytes;
        for (int64_t rank : options.ranks)
          if (rank < 0 || rank >= layout->worldSize())
            return emitError(model.getLoc())
                   << "--plan-ranks: rank " << rank << " is outside the mesh of "
                   << layout->worldSize() << " ranks";
        if (!planSplitDir.empty()) {
          Result<uint64_t> written =
              plan::writeSplitPlanFiles(*layout, planSplitDir, options.ranks, planMaxFileBytes);
          if (!written)
            return emitError(model.getLoc()) << printable(written.error());
          os << "wrote "
             << (options.ranks.empty() ? layout->worldSize() : int64_t(options.ranks.size()))
             << " plan files, " << *written << " bytes, to " << planSplitDir << "\n";
          return success();
        }
        if (planFormat == "dcp-metadata") {
          // The .metadata covers every rank and comes with the committing one.
          if (!options.ranks.empty() && llvm::find(options.ranks, 0) == options.ranks.end())
            return emitError(model.getLoc())
                   << "--plan-format=dcp-metadata: the .metadata comes with the committing "
                      "rank, 0, which --plan-ranks leaves out";
          if (planMetadataFromPlan) {
            options.ranks = {0};
          } else {
            // Streamed from the planner: never a plan of every rank, nor the
            // whole pickle in memory (~670 MB at 16,384 ranks).
            Result<uint64_t> written =
                plan::streamGlobalMetadata(*layout, [&](std::string_view piece) {
                  os.write(piece.data(), piece.size());
                  return Status::success();
                });
            if (!written)
              return emitError(model.getLoc()) << printable(written.error());
            return success();
          }
        }
        Result<std::string> bytes = plan::buildPlanFile(*layout, options);
        if (!bytes)
          return emitError(model.getLoc()) << printable(bytes.error());
        if (planFormat != "flatbuffers") {
          Result<plan::PlanFile> file = plan::PlanFile::fromBytes(bytes.take());
          if (!file)
            return emitError(model.getLoc()) << printable(file.error());
          Result<std::string> text =
              planFormat == "json" ? file->toJSON() : file->metadataBytes();
          if (!text)
            return emitError(model.getLoc()) << printable(text.error());
          os.write(text->data(), text->size());
          return success();
        }
        os.write(bytes->data(), bytes->size());
        return success();
      },
      [](DialectRegistry &registry) { registry.insert<FSDPDialect>(); });
}
