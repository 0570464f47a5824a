//===- FSDPVerifiers.cpp - fsdp dialect verifiers -------------------------===//
//
// Every op's verify() and verifyRegions(): the one place that recomputes the
// packed layout, rank ranges and pieces to check what the passes wrote.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"
#include "fsdp/Dialect/FSDP/IR/FSDPLimits.h"
#include "fsdp/Support/Printable.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace fsdp;

// Names (modules, parameters, FQNs, units, symbols, mesh axes) come from the
// user's files and may hold any bytes: every diagnostic writes them through
// printable(), so an error stays one line with no raw control characters.

/// Names of modules and parameters become FQN components.
static LogicalResult verifyComponentName(Operation *op, StringRef kind,
                                         StringRef name) {
  if (name.empty())
    return op->emitOpError() << kind << " name must not be empty";
  if (name.contains('.'))
    return op->emitOpError() << kind << " name '" << printable(name)
                             << "' must not contain '.' (FQNs are joined with '.')";
  return success();
}

//===----------------------------------------------------------------------===//
// MeshOp
//===----------------------------------------------------------------------===//

/// Named axes of positive size, the names unique (meshes and expert meshes).
static LogicalResult verifyMeshAxes(Operation *op, ArrayAttr names, ArrayRef<int64_t> shape) {
  if (shape.empty())
    return op->emitOpError() << "mesh must have at least one axis";
  if (names.size() != shape.size())
    return op->emitOpError() << "mesh has " << names.size() << " axis names but "
                             << shape.size() << " sizes";
  llvm::StringSet<> seen;
  for (auto [name, size] : llvm::zip(names, shape)) {
    StringRef axis = llvm::cast<StringAttr>(name).getValue();
    if (axis.empty())
      return op->emitOpError() << "mesh axis name must not be empty";
    if (!seen.insert(axis).second)
      return op->emitOpError() << "duplicate mesh axis name '" << printable(axis) << "'";
    if (size < 1)
      return op->emitOpError() << "mesh axis '" << printable(axis)
                               << "' must have a positive size, got " << size;
  }
  return success();
}

LogicalResult MeshOp::verify() {
  ArrayRef<int64_t> shape = getShape();
  if (failed(verifyMeshAxes(*this, getAxisNames(), shape)))
    return failure();
  // Every rank is listed in the lowered IR: keep the world to what a job
  // can have, and its product from overflowing.
  int64_t ranks = 1;
  for (int64_t size : shape) {
    if (size > limits::kMaxRanks / ranks)
      return emitOpError() << "mesh has more than " << limits::kMaxRanks
                           << " ranks (2^24, the compiler's limit)";
    ranks *= size;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// ExpertMeshOp
//===----------------------------------------------------------------------===//

LogicalResult ExpertMeshOp::verify() {
  if (failed(verifyMeshAxes(*this, getAxisNames(), getShape())))
    return failure();
  layout::ExpertMesh view = getLayoutMesh();
  if (!llvm::is_contained(getAxisNames().getAsValueRange<StringAttr>(), getExpertAxis()))
    return emitOpError() << "expert axis '" << printable(getExpertAxis())
                         << "' is not one of its axes";
  if (getShape().size() < 2)
    return emitOpError() << "needs an axis besides the expert axis: the experts' data-parallel "
                            "mesh (e.g. [\"edp\" = 2, \"ep\" = 4] experts \"ep\")";
  auto model = (*this)->getParentOfType<ModelOp>();
  MeshOp world = model ? model.getMesh() : MeshOp();
  if (!world)
    return success(); // The model verifier reports the missing mesh.
  if (Status status = layout::checkExpertMesh(view, world.getNumRanks()); !status)
    return emitOpError() << "is not a view of mesh @" << printable(world.getSymName()) << ": "
                         << status.error();
  return success();
}

//===----------------------------------------------------------------------===//
// OptimizerOp
//===----------------------------------------------------------------------===//

LogicalResult OptimizerOp::verify() {
  double lr = getLr().convertToDouble();
  if (!(lr >= 0.0))
    return emitOpError() << "lr must be a non-negative number, got " << lr;
  bool adam = getKind() != OptimizerKind::SGD;
  StringRef kind = stringifyOptimizerKind(getKind());
  // Each kind takes exactly torch's hyper-parameters: one of another kind is
  // a description error, not something to carry silently.
  auto refuse = [&](StringRef name) {
    return emitOpError() << kind << " has no '" << name << "' hyper-parameter";
  };
  if (adam) {
    if (!getBetas() || !getEps())
      return emitOpError() << kind << " needs betas and eps";
    if (getMomentum())
      return refuse("momentum");
    if (getDampening())
      return refuse("dampening");
    if (getNesterov())
      return refuse("nesterov");
    ArrayRef<double> betas = *getBetas();
    if (betas.size() != 2)
      return emitOpError() << "betas must have exactly 2 values, got " << betas.size();
    for (double beta : betas)
      if (!(beta >= 0.0 && beta < 1.0))
        return emitOpError() << "betas must lie in [0, 1), got " << beta;
    double eps = getEps()->convertToDouble();
    if (!(eps >= 0.0))
      return emitOpError() << "eps must be a non-negative number, got " << eps;
  } else {
    if (getBetas())
      return refuse("betas");
    if (getEps())
      return refuse("eps");
    if (getAmsgrad())
      return refuse("amsgrad");
    if (!getMomentum() || !getDampening())
      return emitOpError() << "sgd needs momentum and dampening";
    double momentum = getMomentum()->convertToDouble();
    double dampening = getDampening()->convertToDouble();
    if (!(momentum >= 0.0))
      return emitOpError() << "momentum must be a non-negative number, got " << momentum;
    if (!(dampening >= 0.0 && dampening <= 1.0))
      return emitOpError() << "dampening must lie in [0, 1], got " << dampening;
    // torch.optim.SGD's own rule.
    if (getNesterov() && (momentum <= 0.0 || dampening != 0.0))
      return emitOpError() << "nesterov needs a momentum and zero dampening";
  }
  double weightDecay = getWeightDecay().convertToDouble();
  if (!(weightDecay >= 0.0))
    return emitOpError() << "weight_decay must be a non-negative number, got "
                         << weightDecay;
  if (!isSupportedFloatType(getState()))
    return emitOpError() << "optimizer state dtype must be one of "
                         << getSupportedTypesText(/*floatsOnly=*/true) << ", got "
                         << getState();
  return success();
}


//===----------------------------------------------------------------------===//
// NNModuleOp
//===----------------------------------------------------------------------===//

LogicalResult NNModuleOp::verify() {
  if (isa<ModelOp>((*this)->getParentOp())) {
    if (!getName().empty())
      return emitOpError() << "the root module must be named \"\", got \"" << printable(getName())
                           << "\"";
    return success();
  }
  return verifyComponentName(*this, "module", getName());
}

//===----------------------------------------------------------------------===//
// ParamOp
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  if (failed(verifyComponentName(*this, "parameter", getName())))
    return failure();
  RankedTensorType type = getTensorType();
  if (type.getRank() == 0)
    return emitOpError() << "parameter '" << printable(getName())
                         << "' must have at least one dimension (0-d "
                            "parameters cannot be packed by rows)";
  for (auto [dim, size] : llvm::enumerate(type.getShape()))
    if (ShapedType::isDynamic(size) || size <= 0)
      return emitOpError() << "parameter '" << printable(getName()) << "' dimension " << dim
                           << " must be a positive static size, got "
                           << (ShapedType::isDynamic(size) ? std::string("?")
                                                           : std::to_string(size));
  // Its bytes and its padded place in a packed buffer must fit in 64 bits.
  int64_t elements = 1;
  for (int64_t size : type.getShape()) {
    if (size > limits::kMaxParamElements / elements)
      return emitOpError() << "parameter '" << printable(getName()) << "' has more than "
                           << limits::kMaxParamElements
                           << " elements (2^60, the compiler's limit)";
    elements *= size;
  }
  if (!isSupportedElementType(type.getElementType()))
    return emitOpError() << "parameter '" << printable(getName())
                         << "' has unsupported element type " << type.getElementType()
                         << " (supported: " << getSupportedTypesText(/*floatsOnly=*/false) << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// ModelOp
//===----------------------------------------------------------------------===//

/// Sibling modules and parameters share one namespace: FQNs must be unique.
static LogicalResult verifyUniqueChildNames(NNModuleOp module) {
  llvm::StringMap<Operation *> seen;
  for (Operation &child : module.getBody().front()) {
    StringRef name;
    if (auto childModule = dyn_cast<NNModuleOp>(child))
      name = childModule.getName();
    else if (auto param = dyn_cast<ParamOp>(child))
      name = param.getName();
    else
      continue;
    auto [it, inserted] = seen.try_emplace(name, &child);
    if (!inserted)
      return child.emitOpError()
                 .append("duplicate name '", printable(name), "' in module \"",
                         printable(module.getFQN()), "\"")
                 .attachNote(it->second->getLoc())
             << "first defined here";
  }
  return success();
}

/// An experts unit (docs/Experts.md): its mesh resolves and fills the world,
/// its placements fit that mesh, the experts divide among its expert groups,
/// and the names of its parameters hold each local expert exactly once, every
/// expert alike, so each global expert is held once per replica.
/// `tensors` is set to the unit's global expert tensors (count x the
/// parameters of one expert), each a checkpoint key.
static LogicalResult verifyExperts(NNModuleOp unit, int64_t &tensors) {
  ExpertsAttr experts = unit.getExpertsAttr();
  FullyShardAttr policy = unit.getFullyShardAttr();
  if (!policy)
    return unit.emitOpError() << "has experts but is not a fully_shard unit: experts are "
                                 "fully_shard-ed on their expert mesh";
  // Refused before anything is sized by it.
  if (experts.getCount() > limits::kMaxExperts)
    return unit.emitOpError() << "has " << experts.getCount() << " experts, more than "
                              << limits::kMaxExperts << " (2^20, the compiler's limit)";
  ExpertMeshOp meshOp = unit.getExpertMesh();
  if (!meshOp)
    return unit.emitOpError() << "experts name @" << printable(experts.getMesh().getValue())
                              << ", which is no 'fsdp.expert_mesh' of the model";
  layout::ExpertMesh mesh = meshOp.getLayoutMesh();
  size_t axes = mesh.viewSizes.size() - 1;
  if (policy.getPlacements().size() != axes)
    return unit.emitOpError() << "fully_shard has " << policy.getPlacements().size()
                              << " placements but expert mesh @"
                              << printable(meshOp.getSymName()) << " has " << axes
                              << " axes besides its expert axis";
  int64_t groups = mesh.expertGroups();
  if (experts.getCount() < 1 || experts.getCount() % groups != 0)
    return unit.emitOpError() << "has " << experts.getCount() << " experts, which do not divide "
                              << "among the " << groups << " expert-parallel ranks of @"
                              << printable(meshOp.getSymName())
                              << " (the count must be a positive multiple of "
                              << groups << ")";
  int64_t perRank = experts.getCount() / groups;
  std::string unitName = "\"" + printable(unit.getFQN()) + "\"";
  // Each parameter's path inside the unit with its local expert number
  // taken out; every path must hold experts 0 .. perRank-1, alike. The
  // numbers seen are a set, so memory follows the parameters, not perRank.
  struct Slot {
    llvm::DenseSet<int64_t> seen;
    Type type;
  };
  llvm::StringMap<Slot> slots;
  auto record = [&](ParamOp param, StringRef path, int64_t index) -> LogicalResult {
    if (param.getTiedTo())
      return param.emitOpError() << "'" << printable(param.getFQN())
                                 << "' is an expert parameter and cannot be tied";
    if (index < 0 || index >= perRank)
      return param.emitOpError() << "'" << printable(param.getFQN()) << "' is local expert "
                                 << index << " but each rank holds experts 0 to "
                                 << perRank - 1 << " (" << experts.getCount() << " over "
                                 << groups << " expert-parallel ranks)";
    Slot &slot = slots[path];
    if (slot.seen.empty()) {
      slot.type = param.getTensorType();
    } else if (slot.type != param.getTensorType()) {
      return param.emitOpError() << "'" << printable(param.getFQN()) << "' has type "
                                 << param.getTensorType() << " but the other experts' "
                                 << printable(path) << " have " << slot.type
                                 << ": every expert must be alike";
    }
    slot.seen.insert(index);
    return success();
  };
  bool grouped = experts.getNaming() == ExpertNaming::Grouped;
  NNModuleOp localExperts;
  if (!grouped) {
    for (NNModuleOp child : unit.getBody().getOps<NNModuleOp>())
      if (child.getName() == "local_experts")
        localExperts = child;
    if (!localExperts)
      return unit.emitOpError() << "names its experts local_experts but has no child module "
                                   "'local_experts' (one child '<i>' per local expert)";
  }
  WalkResult walk = unit.walk([&](Operation *op) -> WalkResult {
    if (auto module = dyn_cast<NNModuleOp>(op)) {
      if (module != unit && module.getFullyShard())
        return module.emitOpError() << "is a fully_shard unit inside experts unit " << unitName
                                    << ": an experts unit owns all its parameters";
      return WalkResult::advance();
    }
    auto param = dyn_cast<ParamOp>(op);
    if (!param)
      return WalkResult::advance();
    // The FQN below the unit ("a.b.weight0" in unit "a": "b.weight0").
    std::string unitFQN = unit.getFQN();
    std::string relative =
        StringRef(param.getFQN()).drop_front(unitFQN.empty() ? 0 : unitFQN.size() + 1).str();
    if (grouped) {
      std::optional<layout::ExpertNumber> number =
          layout::trailingExpertNumber(param.getName());
      if (!number)
        return param.emitOpError()
               << "'" << printable(param.getFQN()) << "' has no local expert number: grouped "
               << "experts are named <stem><i> (weight0, weight1, ...) without leading zeros";
      std::string path = relative.substr(0, relative.size() - param.getName().size()) +
                         param.getName().take_front(number->position).str();
      return failed(record(param, path, number->local)) ? WalkResult::interrupt()
                                                        : WalkResult::advance();
    }
    // local_experts.<i>.<rest>: the module right below local_experts.
    Operation *expert = param;
    while (expert->getParentOp() && expert->getParentOp() != localExperts)
      expert = expert->getParentOp();
    int64_t index;
    auto expertModule = dyn_cast_or_null<NNModuleOp>(expert);
    if (!expert->getParentOp() || !expertModule ||
        expertModule.getName().getAsInteger(10, index) ||
        (expertModule.getName().size() > 1 && expertModule.getName().front() == '0'))
      return param.emitOpError() << "'" << printable(param.getFQN())
                                 << "' is not under local_experts.<i> of experts unit "
                                 << unitName;
    std::string prefix = expertModule.getFQN() + ".";
    std::string path = "local_experts.<i>." + StringRef(param.getFQN()).drop_front(prefix.size()).str();
    return failed(record(param, path, index)) ? WalkResult::interrupt() : WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  if (slots.empty())
    return unit.emitOpError() << "has experts but no parameters";
  for (auto &entry : slots) {
    // Numbers are unique and below perRank: a short set lacks one, and the
    // first it lacks is at most its size.
    const llvm::DenseSet<int64_t> &seen = entry.getValue().seen;
    if (static_cast<int64_t>(seen.size()) == perRank)
      continue;
    int64_t index = 0;
    while (seen.contains(index))
      ++index;
    return unit.emitOpError() << "lacks local expert " << index << " of "
                              << printable(entry.getKey()) << ": each rank holds experts "
                              << "0 to " << perRank - 1 << ", each exactly once";
  }
  tensors = experts.getCount() * static_cast<int64_t>(slots.size());
  return success();
}

/// Parameter groups name real units and parameters, and once lowered, every
/// parameter a unit owns is in exactly one member of one of its groups.
static LogicalResult verifyParamGroups(ModelOp model,
                                       const llvm::StringMap<ParamOp> &params,
                                       ArrayRef<ParamOp> paramsInOrder) {
  auto groups = model.getBody().getOps<ParamGroupOp>();
  if (groups.empty())
    return success();
  llvm::StringMap<NNModuleOp> unitsByFQN;
  model.getRootModule().walk([&](NNModuleOp module) {
    if (module.getFullyShard())
      unitsByFQN[module.getFQN()] = module;
  });
  llvm::StringMap<MemberOp> memberOfFQN;
  llvm::StringMap<SmallVector<ParamGroupOp>> groupsOfUnit;
  for (ParamGroupOp group : groups) {
    NNModuleOp unit = unitsByFQN.lookup(group.getUnit());
    if (!unit)
      return group.emitOpError() << "names unit \"" << printable(group.getUnit())
                                 << "\", which is not a fully_shard module";
    groupsOfUnit[group.getUnit()].push_back(group);
    if (group.getBody().getOps<MemberOp>().empty())
      return group.emitOpError() << "has no members";
    if (ArrayAttr buffers = group.getBuffersAttr()) {
      ArrayAttr expected = getExpectedBuffers(group, model.getOptimizer());
      if (buffers != expected)
        return group.emitOpError()
               << "buffers " << buffers << " differ from what the policy and the optimizer give: "
               << expected;
    }
    if (unit.getFullyShardAttr() != group.getPolicy())
      return group.emitOpError() << "policy " << group.getPolicy() << " differs from unit \""
                                 << printable(group.getUnit()) << "\"'s "
                                 << unit.getFullyShardAttr();
    for (MemberOp member : group.getBody().getOps<MemberOp>()) {
      for (Attribute attr : member.getFqns()) {
        StringRef fqn = cast<StringAttr>(attr).getValue();
        ParamOp param = params.lookup(fqn);
        if (!param)
          return member.emitOpError() << "names unknown parameter '" << printable(fqn) << "'";
        if (param.getTensorType() != member.getTensorType())
          return member.emitOpError() << "has type " << member.getTensorType() << " but '"
                                      << printable(fqn) << "' has type " << param.getTensorType();
        if (param.getRequiresGrad() != group.getRequiresGrad())
          return member.emitOpError()
                 << "'" << printable(fqn) << "' differs from its group in requires_grad";
        if (cast<NNModuleOp>(param->getParentOp()).getOwningUnit() != unit)
          return member.emitOpError() << "'" << printable(fqn) << "' is not owned by unit \""
                                      << printable(group.getUnit()) << "\"";
        auto [it, inserted] = memberOfFQN.try_emplace(fqn, member);
        if (!inserted)
          return member.emitOpError()
                     .append("'", printable(fqn), "' is already a member")
                     .attachNote(it->second.getLoc())
                 << "first listed here";
      }
    }
  }
  for (ParamOp param : paramsInOrder)
    if (cast<NNModuleOp>(param->getParentOp()).getOwningUnit() &&
        !memberOfFQN.count(param.getFQN()))
      return param.emitOpError() << "'" << printable(param.getFQN())
                                 << "' is in no parameter group of its unit";
  // Each unit's groups and members are exactly Megatron-FSDP's: the same
  // groups in first-occurrence order, members in named_parameters() order,
  // tied parameters (and only they) sharing one member.
  for (auto &entry : groupsOfUnit) {
    NNModuleOp unit = unitsByFQN.lookup(entry.getKey());
    SmallVector<UnitGroup> expected = computeUnitGroups(unit, params);
    SmallVector<ParamGroupOp> &actual = entry.getValue();
    if (actual.size() != expected.size())
      return actual.front().emitOpError()
             << "unit \"" << printable(entry.getKey()) << "\" has " << actual.size()
             << " parameter groups but its parameters form " << expected.size()
             << " (one per dtype and requires_grad)";
    for (auto [group, want] : llvm::zip(actual, expected)) {
      if (group.getDtype() != want.dtype || group.getRequiresGrad() != want.requiresGrad)
        return group.emitOpError()
               << "groups of unit \"" << printable(entry.getKey())
               << "\" must follow the first occurrence of each (dtype, requires_grad); expected "
               << want.dtype << (want.requiresGrad ? "" : " frozen") << " here";
      auto members = llvm::to_vector(group.getBody().getOps<MemberOp>());
      for (size_t i = 0; i < std::max(members.size(), want.members.size()); ++i) {
        if (i >= members.size() || i >= want.members.size())
          return group.emitOpError() << "has " << members.size() << " members, expected "
                                     << want.members.size();
        SmallVector<std::string> fqns;
        for (Attribute fqn : members[i].getFqns())
          fqns.push_back(cast<StringAttr>(fqn).str());
        if (ArrayRef<std::string>(fqns) != ArrayRef<std::string>(want.members[i].fqns)) {
          std::string wanted;
          for (const std::string &fqn : want.members[i].fqns)
            wanted += (wanted.empty() ? "" : ", ") + fqn;
          return members[i].emitOpError()
                 << "member " << i << " of group @" << printable(group.getSymName()) << " must be ["
                 << printable(wanted)
                 << "]: members follow named_parameters() order and only tied "
                    "parameters share a member";
        }
      }
    }
  }
  return success();
}

LogicalResult ModelOp::verifyRegions() {
  Block &body = getBody().front();
  auto meshes = llvm::to_vector(body.getOps<MeshOp>());
  auto optimizers = llvm::to_vector(body.getOps<OptimizerOp>());
  auto roots = llvm::to_vector(body.getOps<NNModuleOp>());
  if (meshes.size() != 1)
    return emitOpError() << "expects exactly one 'fsdp.mesh', found "
                         << meshes.size();
  if (optimizers.size() > 1)
    return optimizers[1].emitOpError()
           << "duplicate optimizer: a model has at most one";
  if (roots.size() != 1)
    return emitOpError() << "expects exactly one root 'fsdp.module', found "
                         << roots.size();
  MeshOp mesh = meshes.front();
  size_t meshRank = mesh.getShape().size();

  // Walk the tree in DFS order (pre-order), as named_parameters() does.
  llvm::StringMap<ParamOp> paramsByFQN;
  SmallVector<ParamOp> params;
  int64_t expertTensors = 0;
  WalkResult walk = roots.front().walk<WalkOrder::PreOrder>(
      [&](Operation *op) -> WalkResult {
        if (auto module = dyn_cast<NNModuleOp>(op)) {
          if (failed(verifyUniqueChildNames(module)))
            return WalkResult::interrupt();
          if (module.getExpertsAttr()) {
            int64_t tensors = 0;
            if (failed(verifyExperts(module, tensors)))
              return WalkResult::interrupt();
            // A checkpoint key per global expert tensor, in every plan.
            if (tensors > limits::kMaxExpertTensors - expertTensors)
              return module.emitOpError()
                     << "brings the model's global expert tensors (experts x parameters of "
                        "one expert, over all experts units) past "
                     << limits::kMaxExpertTensors << " (2^24, the compiler's limit) with its "
                     << module.getExpertsAttr().getCount() << " experts x "
                     << tensors / module.getExpertsAttr().getCount() << " parameters";
            expertTensors += tensors;
          } else if (FullyShardAttr unit = module.getFullyShardAttr();
                     unit && unit.getPlacements().size() != meshRank)
            return module.emitOpError()
                   << "fully_shard has " << unit.getPlacements().size() << " placements but mesh @"
                   << printable(mesh.getSymName()) << " has " << meshRank << " axes";
        } else if (auto param = dyn_cast<ParamOp>(op)) {
          paramsByFQN[param.getFQN()] = param;
          params.push_back(param);
        }
        return WalkResult::advance();
      });
  if (walk.wasInterrupted())
    return failure();

  for (ParamOp param : params) {
    auto owner = cast<NNModuleOp>(param->getParentOp()).getOwningUnit();
    if (std::optional<StringRef> tiedTo = param.getTiedTo()) {
      auto it = paramsByFQN.find(*tiedTo);
      if (it == paramsByFQN.end())
        return param.emitOpError() << "is tied to unknown parameter '" << printable(*tiedTo) << "'";
      ParamOp target = it->second;
      if (target == param)
        return param.emitOpError() << "is tied to itself";
      if (target.getTiedTo())
        return param.emitOpError()
               << "is tied to '" << printable(*tiedTo) << "', which is itself tied to '"
               << printable(*target.getTiedTo()) << "'; tie to the storage owner instead";
      if (target.getTensorType() != param.getTensorType())
        return param.emitOpError()
               << "is tied to '" << printable(*tiedTo) << "' of type " << target.getTensorType()
               << " but has type " << param.getTensorType();
      if (target.getFrozen() != param.getFrozen())
        return param.emitOpError()
               << "is tied to '" << printable(*tiedTo) << "' but differs from it in requires_grad";
      auto targetOwner =
          cast<NNModuleOp>(target->getParentOp()).getOwningUnit();
      if (owner != targetOwner)
        return param.emitOpError() << "is tied to '" << printable(*tiedTo)
                                   << "', which belongs to another fully_shard unit; tied "
                                      "parameters share one buffer entry and must have the "
                                      "same owner";
    }
    if (param.getRequiresGrad() && !owner)
      return param.emitOpError() << "'" << printable(param.getFQN())
                                 << "' is trainable but no enclosing module is a fully_shard unit";
  }
  return verifyParamGroups(*this, paramsByFQN, params);
}

//===----------------------------------------------------------------------===//
// MemberOp
//===----------------------------------------------------------------------===//

LogicalResult MemberOp::verify() {
  if (getFqns().empty())
    return emitOpError() << "needs at least one FQN";
  llvm::StringSet<> seen;
  for (Attribute fqn : getFqns())
    if (!seen.insert(cast<StringAttr>(fqn).getValue()).second)
      return emitOpError() << "lists FQN '" << printable(cast<StringAttr>(fqn).getValue())
                           << "' twice";
  RankedTensorType type = getTensorType();
  if (type.getRank() == 0 || !type.hasStaticShape() ||
      llvm::any_of(type.getShape(), [](int64_t size) { return size <= 0; }))
    return emitOpError() << "member '" << printable(getFQN())
                         << "' needs a static shape of positive dimensions, got " << type;
  if (std::optional<int64_t> offset = getOffset(); offset && *offset < 0)
    return emitOpError() << "member '" << printable(getFQN()) << "' has negative offset "
                         << *offset;
  if (std::optional<ArrayRef<int64_t>> values = getPieces();
      values && values->size() % 4 != 0)
    return emitOpError() << "pieces must hold four numbers each (shard, row "
                            "begin, row end, local offset)";
  return success();
}

//===----------------------------------------------------------------------===//
// ParamGroupOp
//===----------------------------------------------------------------------===//

/// Rewrites the layout library's "tensor N" into the member's FQN.
static std::string nameTensors(std::string message,
                               MutableArrayRef<MemberOp> members) {
  std::string out;
  size_t pos = 0;
  static constexpr StringLiteral kTensor = "tensor ";
  while (true) {
    size_t found = message.find(kTensor, pos);
    if (found == std::string::npos)
      break;
    size_t digits = found + kTensor.size();
    size_t end = digits;
    while (end < message.size() && llvm::isDigit(message[end]))
      ++end;
    out += message.substr(pos, found - pos);
    unsigned index;
    if (end > digits &&
        !StringRef(message).slice(digits, end).getAsInteger(10, index) &&
        index < members.size())
      out += "member '" + printable(members[index].getFQN()) + "'";
    else
      out += message.substr(found, end - found);
    pos = end;
  }
  return out + message.substr(pos);
}

LogicalResult ParamGroupOp::verifyRegions() {
  auto model = (*this)->getParentOfType<ModelOp>();
  MeshOp mesh = model ? model.getMesh() : MeshOp();
  if (!mesh)
    return success(); // The model verifier reports the missing mesh.
  // The unit's mesh: the world's, or an expert mesh without its expert axis.
  UnitMesh unitMesh = getGroupMesh(*this);
  const std::vector<int64_t> &meshSizes = unitMesh.meshSizes;
  std::vector<layout::Placement> placements = getLayoutPlacements(getPolicy());
  if (Status status = layout::checkPlacements(meshSizes, placements); !status)
    return emitOpError() << "policy does not fit "
                         << (unitMesh.experts ? "its unit's expert mesh" : "mesh @" +
                                                    printable(mesh.getSymName()))
                         << ": " << status.error();

  SmallVector<MemberOp> members = llvm::to_vector(getBody().getOps<MemberOp>());
  for (MemberOp member : members)
    if (member.getTensorType().getElementType() != getDtype())
      return member.emitOpError() << "member '" << printable(member.getFQN())
                                  << "' has element type "
                                  << member.getTensorType().getElementType() << " but group @"
                                  << printable(getSymName()) << " holds " << getDtype();

  // Packing: chunk, size and every member's offset come together.
  bool packed = getChunk() && getSize();
  if (getChunk().has_value() != getSize().has_value())
    return emitOpError() << "chunk and size must be given together";
  for (MemberOp member : members)
    if (member.getOffset().has_value() != packed)
      return member.emitOpError() << "member '" << printable(member.getFQN()) << "' "
                                  << (packed ? "has no offset in a packed group"
                                             : "has an offset but its group is not packed");
  bool assigned = getShardSize() || getRanks();
  if (assigned && !packed)
    return emitOpError() << "rank ranges need a packed group (chunk, size)";
  if (!packed)
    return success();

  std::vector<layout::Shape> shapes = getMemberShapes(*this);
  layout::PackedLayout layout;
  layout.chunk = *getChunk();
  layout.size = *getSize();
  for (MemberOp member : members)
    layout.offsets.push_back(*member.getOffset());
  if (Status status =
          layout::verifyLayout(shapes, layout, meshSizes, placements);
      !status)
    return emitOpError() << "invalid packed layout: "
                         << nameTensors(status.error(), members);

  // The layout must be Megatron-FSDP's: the same bytes where it puts them.
  Result<layout::PackedLayout> expected =
      layout::packGroup(shapes, layout::meshSize(meshSizes));
  if (!expected)
    return emitOpError() << expected.error();
  if (expected->chunk != layout.chunk || expected->size != layout.size)
    return emitOpError() << "layout differs from Megatron-FSDP's packing: "
                         << "chunk " << layout.chunk << " size " << layout.size
                         << ", expected chunk " << expected->chunk << " size "
                         << expected->size;
  for (auto [index, member] : llvm::enumerate(members))
    if (expected->offsets[index] != layout.offsets[index])
      return member.emitOpError() << "member '" << printable(member.getFQN()) << "' at offset "
                                  << layout.offsets[index]
                                  << " differs from Megatron-FSDP's packing, which puts it at "
                                  << expected->offsets[index];

  if (!assigned)
    return success();
  if (!getShardSize() || !getRanks())
    return emitOpError() << "shard_size and ranks must be given together";
  int64_t numShards = layout::numShards(meshSizes, placements);
  int64_t shardSize = layout.size / numShards;
  if (*getShardSize() != shardSize)
    return emitOpError() << "shard_size " << *getShardSize()
                         << " does not split size " << layout.size << " into "
                         << numShards << " shards (expected " << shardSize
                         << ")";
  ArrayRef<int64_t> ranks = *getRanks();
  // One range per world rank, whatever mesh the unit is sharded on.
  int64_t numRanks = mesh.getNumRanks();
  if (static_cast<int64_t>(ranks.size()) != numRanks)
    return emitOpError() << "ranks lists " << ranks.size() << " ranges but mesh @"
                         << printable(mesh.getSymName()) << " has " << numRanks << " ranks";
  std::vector<int64_t> shardOfRank = layout::shardIndices(meshSizes, placements);
  for (int64_t rank = 0; rank < numRanks; ++rank) {
    int64_t expectedBegin = shardOfRank[unitMesh.meshRank(rank)] * shardSize;
    if (ranks[rank] != expectedBegin)
      return emitOpError() << "rank " << rank << " range begins at "
                           << ranks[rank] << ", but the mesh and placements "
                           << "put it at " << expectedBegin;
  }

  // Pieces: each member's rows tiled exactly, in shard order, whole rows,
  // each piece inside its shard and where the member's offset puts it.
  for (MemberOp member : members) {
    if (!member.getPieces())
      return member.emitOpError() << "member '" << printable(member.getFQN())
                                  << "' has no pieces in an assigned group";
    ArrayRef<int64_t> shape = member.getTensorType().getShape();
    int64_t rowSize = layout::rowSize(layout::Shape(shape.begin(), shape.end()));
    int64_t offset = *member.getOffset();
    int64_t nextRow = 0, lastShard = -1;
    for (MemberOp::Piece piece : member.getPieceList()) {
      auto fail = [&]() {
        return member.emitOpError()
               << "member '" << printable(member.getFQN()) << "' piece " << piece.shard << ": ["
               << piece.rowBegin << ", " << piece.rowEnd << ") at " << piece.localOffset << " ";
      };
      if (piece.shard <= lastShard || piece.shard >= numShards)
        return fail() << "names shard " << piece.shard
                      << ", expected shards in increasing order below "
                      << numShards;
      if (piece.rowBegin != nextRow)
        return fail() << (piece.rowBegin > nextRow ? "leaves rows [" : "overlaps rows [")
                      << std::min(nextRow, piece.rowBegin) << ", "
                      << std::max(nextRow, piece.rowBegin)
                      << ") " << (piece.rowBegin > nextRow ? "uncovered" : "twice");
      if (piece.rowEnd <= piece.rowBegin || piece.rowEnd > shape[0])
        return fail() << "is not a non-empty row range inside [0, "
                      << shape[0] << ")";
      int64_t shardBegin = piece.shard * shardSize;
      int64_t bufferBegin = offset + piece.rowBegin * rowSize;
      int64_t bufferEnd = offset + piece.rowEnd * rowSize;
      if (bufferBegin < shardBegin || bufferEnd > shardBegin + shardSize)
        return fail() << "lies outside its shard's range [" << shardBegin
                      << ", " << shardBegin + shardSize << ")";
      if (piece.localOffset != bufferBegin - shardBegin)
        return fail() << "has local offset " << piece.localOffset
                      << " but the member's offset puts it at "
                      << bufferBegin - shardBegin;
      nextRow = piece.rowEnd;
      lastShard = piece.shard;
    }
    if (nextRow != shape[0])
      return member.emitOpError() << "member '" << printable(member.getFQN())
                                  << "' pieces leave rows [" << nextRow << ", " << shape[0]
                                  << ") uncovered";
  }

  // Buffers: each role once; main_weight always; model_weight in the
  // group's dtype.
  if (std::optional<ArrayAttr> buffers = getBuffers()) {
    llvm::SmallDenseSet<unsigned> roles;
    for (Attribute attr : *buffers) {
      auto buffer = cast<BufferAttr>(attr);
      if (!roles.insert(static_cast<unsigned>(buffer.getRole())).second)
        return emitOpError() << "lists buffer "
                             << stringifyBufferRole(buffer.getRole())
                             << " twice";
      if (!isSupportedElementType(buffer.getDtype()))
        return emitOpError() << "buffer " << stringifyBufferRole(buffer.getRole())
                             << " has unsupported dtype " << buffer.getDtype();
    }
    if (!getBuffer(BufferRole::MainWeight))
      return emitOpError() << "has no main_weight buffer";
    if (BufferAttr model = getBuffer(BufferRole::ModelWeight)) {
      if (model.getDtype() != getDtype())
        return emitOpError() << "model_weight buffer has dtype "
                             << model.getDtype() << " but the group holds "
                             << getDtype();
      if (model.getAliasesMainWeight() !=
          (getBuffer(BufferRole::MainWeight).getDtype() == getDtype()))
        return emitOpError() << "model_weight aliases main_weight exactly "
                                "when their dtypes match";
    }
  }
  return success();
}
