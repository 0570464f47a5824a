//===- FSDPOps.cpp - fsdp dialect operations and verifiers ----------------===//
#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace fsdp;

//===----------------------------------------------------------------------===//
// Custom directives
//===----------------------------------------------------------------------===//

/// ["dp_outer" = 2, "dp_shard" = 4]
static ParseResult parseMeshAxes(OpAsmParser &parser, ArrayAttr &axisNames,
                                 DenseI64ArrayAttr &shape) {
  SmallVector<Attribute> names;
  SmallVector<int64_t> sizes;
  auto parseAxis = [&]() -> ParseResult {
    std::string name;
    int64_t size = 0;
    if (parser.parseString(&name) || parser.parseEqual() ||
        parser.parseInteger(size))
      return failure();
    names.push_back(parser.getBuilder().getStringAttr(name));
    sizes.push_back(size);
    return success();
  };
  if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Square, parseAxis))
    return failure();
  axisNames = parser.getBuilder().getArrayAttr(names);
  shape = parser.getBuilder().getDenseI64ArrayAttr(sizes);
  return success();
}

static void printMeshAxes(OpAsmPrinter &printer, Operation *, ArrayAttr axisNames,
                          DenseI64ArrayAttr shape) {
  printer << "[";
  for (auto [index, name] : llvm::enumerate(axisNames)) {
    if (index)
      printer << ", ";
    printer.printAttributeWithoutType(name);
    printer << " = ";
    if (index < static_cast<size_t>(shape.size()))
      printer << shape[index];
  }
  printer << "]";
}

#define GET_OP_CLASSES
#include "fsdp/Dialect/FSDP/IR/FSDPOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static std::string joinFQN(StringRef prefix, StringRef name) {
  if (prefix.empty())
    return name.str();
  return (prefix + "." + name).str();
}

/// Names of modules and parameters become FQN components.
static LogicalResult verifyComponentName(Operation *op, StringRef kind,
                                         StringRef name) {
  if (name.empty())
    return op->emitOpError() << kind << " name must not be empty";
  if (name.contains('.'))
    return op->emitOpError()
           << kind << " name '" << name
           << "' must not contain '.' (FQNs are joined with '.')";
  return success();
}

//===----------------------------------------------------------------------===//
// MeshOp
//===----------------------------------------------------------------------===//

LogicalResult MeshOp::verify() {
  ArrayRef<int64_t> shape = getShape();
  if (shape.empty())
    return emitOpError() << "mesh must have at least one axis";
  if (getAxisNames().size() != shape.size())
    return emitOpError() << "mesh has " << getAxisNames().size()
                         << " axis names but " << shape.size() << " sizes";
  llvm::StringSet<> seen;
  for (auto [name, size] : llvm::zip(getAxisNames(), shape)) {
    StringRef axis = llvm::cast<StringAttr>(name).getValue();
    if (axis.empty())
      return emitOpError() << "mesh axis name must not be empty";
    if (!seen.insert(axis).second)
      return emitOpError() << "duplicate mesh axis name '" << axis << "'";
    if (size < 1)
      return emitOpError() << "mesh axis '" << axis
                           << "' must have a positive size, got " << size;
  }
  return success();
}

int64_t MeshOp::getNumRanks() {
  int64_t ranks = 1;
  for (int64_t size : getShape())
    ranks *= size;
  return ranks;
}

//===----------------------------------------------------------------------===//
// OptimizerOp
//===----------------------------------------------------------------------===//

LogicalResult OptimizerOp::verify() {
  double lr = getLr().convertToDouble();
  if (!(lr >= 0.0))
    return emitOpError() << "lr must be a non-negative number, got " << lr;
  ArrayRef<double> betas = getBetas();
  if (betas.size() != 2)
    return emitOpError() << "betas must have exactly 2 values, got "
                         << betas.size();
  for (double beta : betas)
    if (!(beta >= 0.0 && beta < 1.0))
      return emitOpError() << "betas must lie in [0, 1), got " << beta;
  double eps = getEps().convertToDouble();
  if (!(eps >= 0.0))
    return emitOpError() << "eps must be a non-negative number, got " << eps;
  double weightDecay = getWeightDecay().convertToDouble();
  if (!(weightDecay >= 0.0))
    return emitOpError() << "weight_decay must be a non-negative number, got "
                         << weightDecay;
  if (!isSupportedFloatType(getState()))
    return emitOpError() << "optimizer state dtype must be one of f64, f32, "
                            "bf16, f16, got "
                         << getState();
  return success();
}

//===----------------------------------------------------------------------===//
// NNModuleOp
//===----------------------------------------------------------------------===//

void NNModuleOp::build(OpBuilder &builder, OperationState &state,
                       StringRef name, FullyShardAttr fullyShard) {
  state.addAttribute(getNameAttrName(state.name), builder.getStringAttr(name));
  if (fullyShard)
    state.addAttribute(getFullyShardAttrName(state.name), fullyShard);
  Region *body = state.addRegion();
  body->emplaceBlock();
}

LogicalResult NNModuleOp::verify() {
  if (isa<ModelOp>((*this)->getParentOp())) {
    if (!getName().empty())
      return emitOpError() << "the root module must be named \"\", got \""
                           << getName() << "\"";
    return success();
  }
  return verifyComponentName(*this, "module", getName());
}

std::string NNModuleOp::getFQN() {
  SmallVector<StringRef> names;
  for (NNModuleOp module = *this; module;
       module = dyn_cast_or_null<NNModuleOp>(module->getParentOp()))
    if (!module.getName().empty())
      names.push_back(module.getName());
  std::string fqn;
  for (StringRef name : llvm::reverse(names))
    fqn = joinFQN(fqn, name);
  return fqn;
}

NNModuleOp NNModuleOp::getOwningUnit() {
  for (NNModuleOp module = *this; module;
       module = dyn_cast_or_null<NNModuleOp>(module->getParentOp()))
    if (module.getFullyShard())
      return module;
  return {};
}

//===----------------------------------------------------------------------===//
// ParamOp
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  if (failed(verifyComponentName(*this, "parameter", getName())))
    return failure();
  RankedTensorType type = getTensorType();
  if (type.getRank() == 0)
    return emitOpError() << "parameter '" << getName()
                         << "' must have at least one dimension (0-d "
                            "parameters cannot be packed by rows)";
  for (auto [dim, size] : llvm::enumerate(type.getShape()))
    if (ShapedType::isDynamic(size) || size <= 0)
      return emitOpError() << "parameter '" << getName() << "' dimension "
                           << dim << " must be a positive static size, got "
                           << (ShapedType::isDynamic(size)
                                   ? std::string("?")
                                   : std::to_string(size));
  if (!isSupportedElementType(type.getElementType()))
    return emitOpError() << "parameter '" << getName()
                         << "' has unsupported element type "
                         << type.getElementType()
                         << " (supported: f64, f32, bf16, f16, i64, i32, i16, "
                            "i8, ui8, i1)";
  return success();
}

std::string ParamOp::getFQN() {
  return joinFQN(cast<NNModuleOp>((*this)->getParentOp()).getFQN(), getName());
}

//===----------------------------------------------------------------------===//
// ModelOp
//===----------------------------------------------------------------------===//

MeshOp ModelOp::getMesh() {
  auto range = getBody().getOps<MeshOp>();
  return range.empty() ? MeshOp() : *range.begin();
}

OptimizerOp ModelOp::getOptimizer() {
  auto range = getBody().getOps<OptimizerOp>();
  return range.empty() ? OptimizerOp() : *range.begin();
}

NNModuleOp ModelOp::getRootModule() {
  auto range = getBody().getOps<NNModuleOp>();
  return range.empty() ? NNModuleOp() : *range.begin();
}

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
                 .append("duplicate name '", name, "' in module \"",
                         module.getFQN(), "\"")
                 .attachNote(it->second->getLoc())
             << "first defined here";
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
  WalkResult walk = roots.front().walk<WalkOrder::PreOrder>(
      [&](Operation *op) -> WalkResult {
        if (auto module = dyn_cast<NNModuleOp>(op)) {
          if (failed(verifyUniqueChildNames(module)))
            return WalkResult::interrupt();
          if (FullyShardAttr unit = module.getFullyShardAttr();
              unit && unit.getPlacements().size() != meshRank)
            return module.emitOpError()
                   << "fully_shard has " << unit.getPlacements().size()
                   << " placements but mesh @" << mesh.getSymName() << " has "
                   << meshRank << " axes";
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
        return param.emitOpError()
               << "is tied to unknown parameter '" << *tiedTo << "'";
      ParamOp target = it->second;
      if (target == param)
        return param.emitOpError() << "is tied to itself";
      if (target.getTiedTo())
        return param.emitOpError()
               << "is tied to '" << *tiedTo << "', which is itself tied to '"
               << *target.getTiedTo() << "'; tie to the storage owner instead";
      if (target.getTensorType() != param.getTensorType())
        return param.emitOpError()
               << "is tied to '" << *tiedTo << "' of type "
               << target.getTensorType() << " but has type "
               << param.getTensorType();
      if (target.getFrozen() != param.getFrozen())
        return param.emitOpError()
               << "is tied to '" << *tiedTo
               << "' but differs from it in requires_grad";
      auto targetOwner =
          cast<NNModuleOp>(target->getParentOp()).getOwningUnit();
      if (owner != targetOwner)
        return param.emitOpError()
               << "is tied to '" << *tiedTo
               << "', which belongs to another fully_shard unit; tied "
                  "parameters share one buffer entry and must have the "
                  "same owner";
    }
    if (param.getRequiresGrad() && !owner)
      return param.emitOpError()
             << "'" << param.getFQN()
             << "' is trainable but no enclosing module is a fully_shard unit";
  }
  return success();
}
