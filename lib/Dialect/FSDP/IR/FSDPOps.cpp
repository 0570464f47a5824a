//===- FSDPOps.cpp - fsdp dialect operations ------------------------------===//
//
// The operations themselves: the custom assembly directives, builders and
// accessors. Verifiers live in FSDPVerifiers.cpp; the grouping analysis and
// the bridge to the layout library in FSDPGrouping.cpp.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"

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

/// [0: [0, 4) at 0, 1: [4, 5) at 0] -- shard: [row begin, row end) at local
/// offset, stored flat as four numbers per piece.
static ParseResult parsePieces(OpAsmParser &parser, DenseI64ArrayAttr &pieces) {
  SmallVector<int64_t> values;
  auto parsePiece = [&]() -> ParseResult {
    int64_t shard = 0, rowBegin = 0, rowEnd = 0, localOffset = 0;
    if (parser.parseInteger(shard) || parser.parseColon() ||
        parser.parseLSquare() || parser.parseInteger(rowBegin) ||
        parser.parseComma() || parser.parseInteger(rowEnd) ||
        parser.parseRParen() || parser.parseKeyword("at") ||
        parser.parseInteger(localOffset))
      return failure();
    values.append({shard, rowBegin, rowEnd, localOffset});
    return success();
  };
  if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Square,
                                     parsePiece))
    return failure();
  pieces = parser.getBuilder().getDenseI64ArrayAttr(values);
  return success();
}

static void printPieces(OpAsmPrinter &printer, Operation *,
                        DenseI64ArrayAttr pieces) {
  ArrayRef<int64_t> values = pieces.asArrayRef();
  printer << "[";
  for (size_t i = 0; i + 3 < values.size(); i += 4) {
    if (i)
      printer << ", ";
    printer << values[i] << ": [" << values[i + 1] << ", " << values[i + 2]
            << ") at " << values[i + 3];
  }
  printer << "]";
}

#define GET_OP_CLASSES
#include "fsdp/Dialect/FSDP/IR/FSDPOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Accessors and builders
//===----------------------------------------------------------------------===//

static std::string joinFQN(StringRef prefix, StringRef name) {
  if (prefix.empty())
    return name.str();
  return (prefix + "." + name).str();
}

int64_t MeshOp::getNumRanks() {
  int64_t ranks = 1;
  for (int64_t size : getShape())
    ranks *= size;
  return ranks;
}

void NNModuleOp::build(OpBuilder &builder, OperationState &state,
                       StringRef name, FullyShardAttr fullyShard) {
  state.addAttribute(getNameAttrName(state.name), builder.getStringAttr(name));
  if (fullyShard)
    state.addAttribute(getFullyShardAttrName(state.name), fullyShard);
  Region *body = state.addRegion();
  body->emplaceBlock();
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

ExpertMeshOp NNModuleOp::getExpertMesh() {
  ExpertsAttr experts = getExpertsAttr();
  auto model = (*this)->getParentOfType<ModelOp>();
  if (!experts || !model)
    return {};
  return dyn_cast_or_null<ExpertMeshOp>(
      SymbolTable::lookupSymbolIn(model, experts.getMesh().getAttr()));
}

layout::ExpertMesh ExpertMeshOp::getLayoutMesh() {
  layout::ExpertMesh mesh;
  mesh.viewSizes.assign(getShape().begin(), getShape().end());
  for (auto [index, name] : llvm::enumerate(getAxisNames()))
    if (cast<StringAttr>(name).getValue() == getExpertAxis())
      mesh.expertAxis = static_cast<int64_t>(index);
  return mesh;
}

std::string ParamOp::getFQN() {
  return joinFQN(cast<NNModuleOp>((*this)->getParentOp()).getFQN(), getName());
}

MeshOp ModelOp::getMesh() {
  auto range = getBody().getOps<MeshOp>();
  return range.empty() ? MeshOp() : *range.begin();
}

OptimizerOp ModelOp::getOptimizer() {
  auto range = getBody().getOps<OptimizerOp>();
  return range.empty() ? OptimizerOp() : *range.begin();
}

SmallVector<BufferRole> OptimizerOp::getStateTensors() {
  if (getKind() == OptimizerKind::SGD) {
    // torch.optim.SGD keeps no state without momentum.
    if (getMomentum() && getMomentum()->convertToDouble() != 0.0)
      return {BufferRole::MomentumBuffer};
    return {};
  }
  SmallVector<BufferRole> roles = {BufferRole::ExpAvg, BufferRole::ExpAvgSq};
  if (getAmsgrad())
    roles.push_back(BufferRole::MaxExpAvgSq);
  return roles;
}

bool OptimizerOp::hasStepState() { return getKind() != OptimizerKind::SGD; }

NNModuleOp ModelOp::getRootModule() {
  auto range = getBody().getOps<NNModuleOp>();
  return range.empty() ? NNModuleOp() : *range.begin();
}

SmallVector<MemberOp::Piece> MemberOp::getPieceList() {
  SmallVector<Piece> pieces;
  if (std::optional<ArrayRef<int64_t>> values = getPieces())
    for (size_t i = 0; i + 3 < values->size(); i += 4)
      pieces.push_back({(*values)[i], (*values)[i + 1], (*values)[i + 2],
                        (*values)[i + 3]});
  return pieces;
}

BufferAttr ParamGroupOp::getBuffer(BufferRole role) {
  if (std::optional<ArrayAttr> buffers = getBuffers())
    for (Attribute attr : *buffers)
      if (auto buffer = cast<BufferAttr>(attr); buffer.getRole() == role)
        return buffer;
  return {};
}
