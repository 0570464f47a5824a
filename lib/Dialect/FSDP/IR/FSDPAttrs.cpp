//===- FSDPAttrs.cpp - fsdp dialect attributes ----------------------------===//
#include "fsdp/Dialect/FSDP/IR/FSDPAttrs.h"
#include "fsdp/Dialect/FSDP/IR/FSDPDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace fsdp;

#include "fsdp/Dialect/FSDP/IR/FSDPEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "fsdp/Dialect/FSDP/IR/FSDPAttrs.cpp.inc"

void FSDPDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "fsdp/Dialect/FSDP/IR/FSDPAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// FullyShardAttr: <[replicate, shard], main_params = f32, main_grads = bf16>
//===----------------------------------------------------------------------===//

Attribute FullyShardAttr::parse(AsmParser &parser, Type) {
  SmallVector<Placement> placements;
  Type mainParams, mainGrads;
  auto parsePlacement = [&]() -> ParseResult {
    StringRef keyword;
    SMLoc loc = parser.getCurrentLocation();
    if (parser.parseKeyword(&keyword))
      return failure();
    std::optional<Placement> placement = symbolizePlacement(keyword);
    if (!placement)
      return parser.emitError(loc, "unknown placement '")
             << keyword << "', expected 'shard' or 'replicate'";
    placements.push_back(*placement);
    return success();
  };
  if (parser.parseLess() ||
      parser.parseCommaSeparatedList(AsmParser::Delimiter::Square,
                                     parsePlacement) ||
      parser.parseComma() || parser.parseKeyword("main_params") ||
      parser.parseEqual() || parser.parseType(mainParams))
    return {};
  if (succeeded(parser.parseOptionalComma()) &&
      (parser.parseKeyword("main_grads") || parser.parseEqual() ||
       parser.parseType(mainGrads)))
    return {};
  if (parser.parseGreater())
    return {};
  return parser.getChecked<FullyShardAttr>(parser.getContext(), placements,
                                           mainParams, mainGrads);
}

void FullyShardAttr::print(AsmPrinter &printer) const {
  printer << "<[";
  llvm::interleaveComma(getPlacements(), printer, [&](Placement placement) {
    printer << stringifyPlacement(placement);
  });
  printer << "], main_params = " << getMainParams();
  if (getMainGrads())
    printer << ", main_grads = " << getMainGrads();
  printer << ">";
}

LogicalResult
FullyShardAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                       ArrayRef<Placement> placements, Type mainParams,
                       Type mainGrads) {
  if (placements.empty())
    return emitError() << "fully_shard needs one placement per mesh axis, "
                          "got none";
  bool seenShard = false;
  for (Placement placement : placements) {
    if (placement == Placement::Shard)
      seenShard = true;
    else if (seenShard)
      return emitError()
             << "fully_shard placements must have their 'shard' axes as a "
                "suffix (a flat-sharded buffer cannot be replicated on a "
                "finer axis), got [" << [&] {
                  std::string text;
                  llvm::raw_string_ostream os(text);
                  llvm::interleaveComma(placements, os, [&](Placement p) {
                    os << stringifyPlacement(p);
                  });
                  return text;
                }() << "]";
  }
  if (!mainParams || !isSupportedFloatType(mainParams))
    return emitError() << "fully_shard main_params must be one of "
                       << getSupportedTypesText(/*floatsOnly=*/true) << ", got "
                       << mainParams;
  if (mainGrads && !isSupportedFloatType(mainGrads))
    return emitError() << "fully_shard main_grads must be one of "
                       << getSupportedTypesText(/*floatsOnly=*/true) << ", got "
                       << mainGrads;
  return success();
}

//===----------------------------------------------------------------------===//
// BufferAttr: <model_weight : f32, aliases main_weight>
//===----------------------------------------------------------------------===//

Attribute BufferAttr::parse(AsmParser &parser, Type) {
  StringRef roleName;
  Type dtype;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseLess() || parser.parseKeyword(&roleName))
    return {};
  std::optional<BufferRole> role = symbolizeBufferRole(roleName);
  if (!role) {
    parser.emitError(loc, "unknown buffer role '") << roleName << "'";
    return {};
  }
  if (parser.parseColon() || parser.parseType(dtype))
    return {};
  bool aliases = false;
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("aliases") || parser.parseKeyword("main_weight"))
      return {};
    aliases = true;
  }
  if (parser.parseGreater())
    return {};
  return BufferAttr::get(parser.getContext(), *role, dtype, aliases);
}

void BufferAttr::print(AsmPrinter &printer) const {
  printer << "<" << stringifyBufferRole(getRole()) << " : " << getDtype();
  if (getAliasesMainWeight())
    printer << ", aliases main_weight";
  printer << ">";
}
