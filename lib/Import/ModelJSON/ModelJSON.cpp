//===- ModelJSON.cpp - Import fsdp-model-v1 JSON ---------------------------===//
//
// Reads the model description (docs/ModelDescription.md) with LLVM's JSON
// parser and builds the fsdp dialect. Every error names the JSON path at
// fault, e.g.
// `module.children[1].params[0].shape: expected a list of positive integers`.
// Each op's location is the JSON path inside the file, so verifier errors on
// imported IR point back at the description too.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Import/ModelJSON.h"
#include "fsdp/Dialect/FSDP/IR/FSDPLimits.h"
#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"
#include "fsdp/Support/Printable.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/SourceMgr.h"

using namespace mlir;
using namespace fsdp;
namespace json = llvm::json;

namespace {

/// Parsed `--mesh` / JSON mesh.
struct MeshSpec {
  SmallVector<std::string> names;
  SmallVector<int64_t> sizes;
};

class ModelImporter {
public:
  ModelImporter(MLIRContext *context, StringRef fileName, const ModelJSONImportOptions &options)
      : context(context), builder(context), fileName(fileName.str()), options(options) {}

  OwningOpRef<ModuleOp> import(StringRef text);

private:
  /// Emits "`<file>`: error: `<path>`: `<message>`" and returns failure.
  LogicalResult fail(StringRef path, const Twine &message) {
    emitError(path.empty() ? fileLoc() : locFor(path)) << message;
    return failure();
  }
  /// The description file as a whole: llvm::json keeps no line numbers.
  Location fileLoc() { return NameLoc::get(StringAttr::get(context, fileName)); }
  /// A JSON path inside the file; also each imported op's location, so
  /// verifier errors on the IR point back at the description.
  Location locFor(StringRef path) {
    return NameLoc::get(StringAttr::get(context, path), fileLoc());
  }

  LogicalResult checkKeys(const json::Object &object, StringRef path, ArrayRef<StringRef> allowed);
  const json::Object *getObject(const json::Value &value, StringRef path);
  FailureOr<std::string> getString(const json::Object &object, StringRef key, StringRef path,
                                   bool required, StringRef fallback = "");
  /// A required integer >= 1.
  FailureOr<int64_t> getPositiveInteger(const json::Object &object, StringRef key,
                                        StringRef path);
  /// A mesh's axis names as the ops hold them.
  ArrayAttr axisNamesAttr(const MeshSpec &mesh);
  FailureOr<double> getNumber(const json::Object &object, StringRef key, StringRef path,
                              double fallback);
  FailureOr<Type> parseDType(const json::Value &value, StringRef path);
  FailureOr<Type> getDType(const json::Object &object, StringRef key, StringRef path,
                           Type fallback);

  FailureOr<MeshSpec> parseMesh(const json::Value *value, StringRef path);
  FailureOr<MeshSpec> parseMeshOverride(StringRef text);
  FailureOr<SmallVector<Placement>> parsePlacementsOverride(StringRef text);
  LogicalResult buildOptimizer(const json::Value &value, StringRef path);
  LogicalResult buildModule(const json::Value &value, const std::string &path, bool isRoot);
  LogicalResult buildExpertMeshes(const json::Value &value, StringRef path);
  FailureOr<ExpertsAttr> parseExperts(const json::Value &value, const std::string &path);
  LogicalResult buildParam(const json::Value &value, const std::string &path);
  FailureOr<FullyShardAttr> parseFullyShard(const json::Value &value, const std::string &path);

  MLIRContext *context;
  OpBuilder builder;
  std::string fileName;
  const ModelJSONImportOptions &options;
  SmallVector<Placement> placementsOverride;
};

} // namespace

static std::string child(StringRef path, StringRef key) {
  return path.empty() ? key.str() : (path + "." + key).str();
}
static std::string element(StringRef path, size_t index) {
  return (path + "[" + Twine(index) + "]").str();
}

LogicalResult ModelImporter::checkKeys(const json::Object &object, StringRef path,
                                       ArrayRef<StringRef> allowed) {
  for (const auto &entry : object) {
    StringRef key = entry.first;
    if (!llvm::is_contained(allowed, key))
      return fail(child(path, key),
                  "unknown key (expected one of: " + llvm::join(allowed, ", ") + ")");
  }
  return success();
}

const json::Object *ModelImporter::getObject(const json::Value &value, StringRef path) {
  const json::Object *object = value.getAsObject();
  if (!object)
    (void)fail(path, "expected an object");
  return object;
}

FailureOr<std::string> ModelImporter::getString(const json::Object &object, StringRef key,
                                                StringRef path, bool required, StringRef fallback) {
  const json::Value *value = object.get(key);
  if (!value) {
    if (required)
      return fail(child(path, key), "missing required key");
    return fallback.str();
  }
  std::optional<StringRef> text = value->getAsString();
  if (!text)
    return fail(child(path, key), "expected a string");
  return text->str();
}

FailureOr<int64_t> ModelImporter::getPositiveInteger(const json::Object &object, StringRef key,
                                                    StringRef path) {
  const json::Value *value = object.get(key);
  if (!value)
    return fail(child(path, key), "missing required key");
  std::optional<int64_t> number = value->getAsInteger();
  if (!number || *number < 1)
    return fail(child(path, key), "expected a positive integer");
  return *number;
}

ArrayAttr ModelImporter::axisNamesAttr(const MeshSpec &mesh) {
  SmallVector<Attribute> names;
  for (const std::string &name : mesh.names)
    names.push_back(builder.getStringAttr(name));
  return builder.getArrayAttr(names);
}

FailureOr<double> ModelImporter::getNumber(const json::Object &object, StringRef key,
                                           StringRef path, double fallback) {
  const json::Value *value = object.get(key);
  if (!value)
    return fallback;
  std::optional<double> number = value->getAsNumber();
  if (!number)
    return fail(child(path, key), "expected a number");
  return *number;
}

FailureOr<Type> ModelImporter::parseDType(const json::Value &value, StringRef path) {
  std::optional<StringRef> text = value.getAsString();
  if (!text)
    return fail(path, "expected a dtype string");
  Type type = parseDTypeName(context, *text);
  if (!type)
    return fail(path, "unknown dtype '" + *text + "' (expected one of: " +
                          getSupportedDTypeNames(" ") +
                          ", or a PyTorch name such as bfloat16)");
  return type;
}

FailureOr<Type> ModelImporter::getDType(const json::Object &object, StringRef key, StringRef path,
                                        Type fallback) {
  const json::Value *value = object.get(key);
  if (!value)
    return fallback;
  return parseDType(*value, child(path, key));
}

FailureOr<MeshSpec> ModelImporter::parseMesh(const json::Value *value, StringRef path) {
  if (!value)
    return fail(path, "missing required key");
  const json::Array *axes = value->getAsArray();
  if (!axes || axes->empty())
    return fail(path, "expected a non-empty list of {\"name\", \"size\"} axes");
  MeshSpec mesh;
  for (auto [index, axisValue] : llvm::enumerate(*axes)) {
    std::string axisPath = element(path, index);
    const json::Object *axis = getObject(axisValue, axisPath);
    if (!axis || failed(checkKeys(*axis, axisPath, {"name", "size"})))
      return failure();
    FailureOr<std::string> name = getString(*axis, "name", axisPath, true);
    if (failed(name))
      return failure();
    if (name->empty())
      return fail(child(axisPath, "name"), "expected a non-empty string");
    if (llvm::is_contained(mesh.names, *name))
      return fail(child(axisPath, "name"), "duplicate mesh axis name '" + *name + "'");
    FailureOr<int64_t> sizeValue = getPositiveInteger(*axis, "size", axisPath);
    if (failed(sizeValue))
      return failure();
    mesh.names.push_back(*name);
    mesh.sizes.push_back(*sizeValue);
  }
  return mesh;
}

FailureOr<MeshSpec> ModelImporter::parseMeshOverride(StringRef text) {
  MeshSpec mesh;
  SmallVector<StringRef> items;
  text.split(items, ',');
  for (StringRef item : items) {
    auto [name, sizeText] = item.split('=');
    name = name.trim();
    int64_t size;
    if (name.empty() || sizeText.trim().getAsInteger(10, size) || size < 1)
      return fail("--mesh", "expected NAME=SIZE[,NAME=SIZE...] with positive "
                            "sizes, got '" +
                                text + "'");
    if (llvm::is_contained(mesh.names, name))
      return fail("--mesh", "duplicate mesh axis name '" + name + "'");
    mesh.names.push_back(name.str());
    mesh.sizes.push_back(size);
  }
  return mesh;
}

FailureOr<SmallVector<Placement>> ModelImporter::parsePlacementsOverride(StringRef text) {
  SmallVector<Placement> placements;
  SmallVector<StringRef> items;
  text.split(items, ',');
  for (StringRef item : items) {
    std::optional<Placement> placement = symbolizePlacement(item.trim());
    if (!placement)
      return fail("--placements", "expected shard|replicate[,...], got '" + text + "'");
    placements.push_back(*placement);
  }
  return placements;
}

LogicalResult ModelImporter::buildOptimizer(const json::Value &value, StringRef path) {
  const json::Object *object = getObject(value, path);
  if (!object)
    return failure();
  FailureOr<std::string> kindName = getString(*object, "kind", path, true);
  if (failed(kindName))
    return failure();
  std::optional<OptimizerKind> kind = symbolizeOptimizerKind(*kindName);
  if (!kind)
    return fail(child(path, "kind"),
                "unknown optimizer '" + *kindName + "' (expected adam, adamw or sgd)");
  bool sgd = *kind == OptimizerKind::SGD;
  // Each kind takes torch's own hyper-parameters, with torch's defaults.
  SmallVector<StringRef> keys = {"kind", "lr", "weight_decay", "state_dtype", "state"};
  if (sgd)
    keys.append({"momentum", "dampening", "nesterov"});
  else
    keys.append({"betas", "eps", "amsgrad"});
  if (failed(checkKeys(*object, path, keys)))
    return failure();
  double defaultDecay = *kind == OptimizerKind::AdamW ? 0.01 : 0.0;
  FailureOr<double> lr = getNumber(*object, "lr", path, 1e-3);
  FailureOr<double> decay = getNumber(*object, "weight_decay", path, defaultDecay);
  FailureOr<Type> state = getDType(*object, "state_dtype", path, Float32Type::get(context));
  if (failed(lr) || failed(decay) || failed(state))
    return failure();
  auto getFlag = [&](StringRef key) -> FailureOr<bool> {
    const json::Value *flag = object->get(key);
    if (!flag)
      return false;
    if (!flag->getAsBoolean())
      return fail(child(path, key), "expected true or false");
    return *flag->getAsBoolean();
  };
  DenseF64ArrayAttr betasAttr;
  FloatAttr epsAttr, momentumAttr, dampeningAttr;
  UnitAttr amsgradAttr, nesterovAttr;
  if (sgd) {
    FailureOr<double> momentum = getNumber(*object, "momentum", path, 0.0);
    FailureOr<double> dampening = getNumber(*object, "dampening", path, 0.0);
    FailureOr<bool> nesterov = getFlag("nesterov");
    if (failed(momentum) || failed(dampening) || failed(nesterov))
      return failure();
    momentumAttr = builder.getF64FloatAttr(*momentum);
    dampeningAttr = builder.getF64FloatAttr(*dampening);
    if (*nesterov)
      nesterovAttr = builder.getUnitAttr();
  } else {
    FailureOr<double> eps = getNumber(*object, "eps", path, 1e-8);
    FailureOr<bool> amsgrad = getFlag("amsgrad");
    if (failed(eps) || failed(amsgrad))
      return failure();
    SmallVector<double> betas = {0.9, 0.999};
    if (const json::Value *betasValue = object->get("betas")) {
      const json::Array *list = betasValue->getAsArray();
      if (!list || list->size() != 2 || !(*list)[0].getAsNumber() || !(*list)[1].getAsNumber())
        return fail(child(path, "betas"), "expected a list of two numbers");
      betas = {*(*list)[0].getAsNumber(), *(*list)[1].getAsNumber()};
    }
    betasAttr = builder.getDenseF64ArrayAttr(betas);
    epsAttr = builder.getF64FloatAttr(*eps);
    if (*amsgrad)
      amsgradAttr = builder.getUnitAttr();
  }
  auto optimizer = OptimizerOp::create(
      builder, locFor(path), OptimizerKindAttr::get(context, *kind), builder.getF64FloatAttr(*lr),
      betasAttr, epsAttr, amsgradAttr, momentumAttr, dampeningAttr, nesterovAttr,
      builder.getF64FloatAttr(*decay), TypeAttr::get(*state));
  // `state` names the state tensors the hyper-parameters imply: a check that
  // the description and the optimizer it was written from agree.
  if (const json::Value *named = object->get("state")) {
    SmallVector<std::string> expected;
    for (BufferRole role : optimizer.getStateTensors())
      expected.push_back(stringifyBufferRole(role).str());
    const json::Array *list = named->getAsArray();
    SmallVector<std::string> given;
    for (const json::Value &entry : list ? *list : json::Array())
      given.push_back(entry.getAsString() ? entry.getAsString()->str() : std::string("?"));
    if (!list || given != expected)
      return fail(child(path, "state"),
                  "expected the state tensors " + *kindName + " keeps with these hyper-parameters: [" +
                      llvm::join(expected, ", ") + "]");
  }
  return success();
}

FailureOr<FullyShardAttr> ModelImporter::parseFullyShard(const json::Value &value,
                                                         const std::string &path) {
  const json::Object *object = getObject(value, path);
  if (!object ||
      failed(checkKeys(*object, path, {"placements", "main_params_dtype", "main_grads_dtype"})))
    return failure();
  SmallVector<Placement> placements;
  if (!placementsOverride.empty()) {
    placements = placementsOverride;
  } else {
    const json::Value *list = object->get("placements");
    std::string listPath = child(path, "placements");
    if (!list)
      return fail(listPath, "missing required key");
    const json::Array *array = list->getAsArray();
    if (!array || array->empty())
      return fail(listPath, "expected a non-empty list of \"shard\" or \"replicate\"");
    for (auto [index, item] : llvm::enumerate(*array)) {
      std::optional<StringRef> text = item.getAsString();
      std::optional<Placement> placement = text ? symbolizePlacement(*text) : std::nullopt;
      if (!placement)
        return fail(element(listPath, index), "expected \"shard\" or \"replicate\"");
      placements.push_back(*placement);
    }
  }
  FailureOr<Type> mainParams =
      getDType(*object, "main_params_dtype", path, Float32Type::get(context));
  FailureOr<Type> mainGrads = getDType(*object, "main_grads_dtype", path, Type());
  if (failed(mainParams) || failed(mainGrads))
    return failure();
  // Report attribute rule violations (suffix rule, dtypes) at the JSON path.
  auto emitAttrError = [&]() { return emitError(locFor(path)); };
  if (failed(FullyShardAttr::verify(emitAttrError, placements, *mainParams, *mainGrads)))
    return failure();
  return FullyShardAttr::get(context, placements, *mainParams, *mainGrads);
}

LogicalResult ModelImporter::buildParam(const json::Value &value, const std::string &path) {
  const json::Object *object = getObject(value, path);
  if (!object ||
      failed(checkKeys(*object, path, {"name", "shape", "dtype", "requires_grad", "tied_to"})))
    return failure();
  FailureOr<std::string> name = getString(*object, "name", path, true);
  if (failed(name))
    return failure();
  if (name->empty())
    return fail(child(path, "name"), "expected a non-empty string");

  std::string shapePath = child(path, "shape");
  const json::Value *shapeValue = object->get("shape");
  if (!shapeValue)
    return fail(shapePath, "missing required key");
  const json::Array *shapeList = shapeValue->getAsArray();
  SmallVector<int64_t> shape;
  if (shapeList)
    for (const json::Value &dim : *shapeList) {
      std::optional<int64_t> size = dim.getAsInteger();
      if (!size || *size < 1) {
        shape.clear();
        break;
      }
      shape.push_back(*size);
    }
  if (!shapeList || shapeList->empty() || shape.size() != shapeList->size())
    return fail(shapePath, "expected a list of positive integers");
  int64_t elements = 1;
  for (int64_t size : shape) {
    if (size > limits::kMaxParamElements / elements)
      return fail(shapePath, "more than " + Twine(limits::kMaxParamElements) +
                                 " elements (2^60, the compiler's limit)");
    elements *= size;
  }

  const json::Value *dtypeValue = object->get("dtype");
  if (!dtypeValue)
    return fail(child(path, "dtype"), "missing required key");
  FailureOr<Type> dtype = parseDType(*dtypeValue, child(path, "dtype"));
  if (failed(dtype))
    return failure();

  bool requiresGrad = true;
  if (const json::Value *flag = object->get("requires_grad")) {
    std::optional<bool> parsed = flag->getAsBoolean();
    if (!parsed)
      return fail(child(path, "requires_grad"), "expected true or false");
    requiresGrad = *parsed;
  }
  StringAttr tiedTo;
  if (object->get("tied_to")) {
    FailureOr<std::string> target = getString(*object, "tied_to", path, true);
    if (failed(target))
      return failure();
    tiedTo = builder.getStringAttr(*target);
  }
  ParamOp::create(builder, locFor(path), builder.getStringAttr(*name),
                  TypeAttr::get(RankedTensorType::get(shape, *dtype)),
                  requiresGrad ? UnitAttr() : builder.getUnitAttr(), tiedTo);
  return success();
}

LogicalResult ModelImporter::buildModule(const json::Value &value, const std::string &path,
                                         bool isRoot) {
  const json::Object *object = getObject(value, path);
  if (!object ||
      failed(checkKeys(*object, path, {"name", "fully_shard", "experts", "params", "children"})))
    return failure();
  FailureOr<std::string> name = getString(*object, "name", path, /*required=*/!isRoot);
  if (failed(name))
    return failure();
  if (isRoot && !name->empty())
    return fail(child(path, "name"), "the root module's name must be \"\"");
  if (!isRoot && name->empty())
    return fail(child(path, "name"), "expected a non-empty string");

  FullyShardAttr fullyShard;
  if (const json::Value *unit = object->get("fully_shard")) {
    FailureOr<FullyShardAttr> parsed = parseFullyShard(*unit, child(path, "fully_shard"));
    if (failed(parsed))
      return failure();
    fullyShard = *parsed;
  }
  auto module =
      NNModuleOp::create(builder, locFor(path.empty() ? "module" : path), *name, fullyShard);
  if (const json::Value *experts = object->get("experts")) {
    FailureOr<ExpertsAttr> parsed = parseExperts(*experts, child(path, "experts"));
    if (failed(parsed))
      return failure();
    module.setExpertsAttr(*parsed);
  }
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(&module.getBody().front());

  auto forEach = [&](StringRef key, auto &&build) -> LogicalResult {
    const json::Value *listValue = object->get(key);
    if (!listValue)
      return success();
    std::string listPath = child(path, key);
    const json::Array *list = listValue->getAsArray();
    if (!list)
      return fail(listPath, "expected a list");
    for (auto [index, item] : llvm::enumerate(*list))
      if (failed(build(item, element(listPath, index))))
        return failure();
    return success();
  };
  if (failed(forEach("params",
                     [&](const json::Value &item, std::string p) { return buildParam(item, p); })))
    return failure();
  return forEach("children", [&](const json::Value &item, std::string p) {
    return buildModule(item, p, /*isRoot=*/false);
  });
}

/// "expert_meshes": [{"name": "experts", "axes": [{"name": "edp", "size": 2},
/// {"name": "ep", "size": 4}], "experts": "ep"}]: the verifier checks that
/// each view fills the world.
LogicalResult ModelImporter::buildExpertMeshes(const json::Value &value, StringRef path) {
  const json::Array *list = value.getAsArray();
  if (!list)
    return fail(path, "expected a list of {\"name\", \"axes\", \"experts\"} expert meshes");
  for (auto [index, item] : llvm::enumerate(*list)) {
    std::string itemPath = element(path, index);
    const json::Object *object = getObject(item, itemPath);
    if (!object || failed(checkKeys(*object, itemPath, {"name", "axes", "experts"})))
      return failure();
    FailureOr<std::string> name = getString(*object, "name", itemPath, true);
    if (failed(name))
      return failure();
    if (name->empty() || *name == "mesh")
      return fail(child(itemPath, "name"), "expected a non-empty name other than \"mesh\"");
    FailureOr<MeshSpec> axes = parseMesh(object->get("axes"), child(itemPath, "axes"));
    if (failed(axes))
      return failure();
    FailureOr<std::string> expertAxis = getString(*object, "experts", itemPath, true);
    if (failed(expertAxis))
      return failure();
    ExpertMeshOp::create(builder, locFor(itemPath), builder.getStringAttr(*name),
                         axisNamesAttr(*axes), builder.getDenseI64ArrayAttr(axes->sizes),
                         builder.getStringAttr(*expertAxis));
  }
  return success();
}

/// "experts": {"mesh": "experts", "count": 8, "naming": "grouped"} on a
/// fully_shard module (naming: grouped, the default, or local_experts).
FailureOr<ExpertsAttr> ModelImporter::parseExperts(const json::Value &value,
                                                   const std::string &path) {
  const json::Object *object = getObject(value, path);
  if (!object || failed(checkKeys(*object, path, {"mesh", "count", "naming"})))
    return failure();
  FailureOr<std::string> mesh = getString(*object, "mesh", path, true);
  if (failed(mesh))
    return failure();
  FailureOr<int64_t> countValue = getPositiveInteger(*object, "count", path);
  if (failed(countValue))
    return failure();
  // The verifier and the plan size tables by it: refuse it before they do.
  if (*countValue > limits::kMaxExperts)
    return fail(child(path, "count"), Twine(*countValue) + " experts, more than " +
                                          Twine(limits::kMaxExperts) +
                                          " (2^20, the compiler's limit)");
  FailureOr<std::string> naming = getString(*object, "naming", path, false, "grouped");
  if (failed(naming))
    return failure();
  std::optional<ExpertNaming> parsed = symbolizeExpertNaming(*naming);
  if (!parsed)
    return fail(child(path, "naming"),
                "expected \"grouped\" or \"local_experts\", got \"" + *naming + "\"");
  return ExpertsAttr::get(context, FlatSymbolRefAttr::get(context, *mesh), *countValue, *parsed);
}

/// The deepest nesting of arrays and objects, counted without recursion so
/// absurd inputs are refused before the recursive parser sees them.
static size_t nestingDepth(StringRef text) {
  size_t depth = 0, deepest = 0;
  bool inString = false, escaped = false;
  for (char c : text) {
    if (inString) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        inString = false;
      continue;
    }
    if (c == '"')
      inString = true;
    else if (c == '[' || c == '{')
      deepest = std::max(deepest, ++depth);
    else if ((c == ']' || c == '}') && depth > 0)
      --depth;
  }
  return deepest;
}

OwningOpRef<ModuleOp> ModelImporter::import(StringRef text) {
  constexpr size_t kMaxDepth = 512;
  if (size_t depth = nestingDepth(text); depth > kMaxDepth) {
    (void)fail("", "JSON nests " + Twine(depth) + " levels deep; at most " + Twine(kMaxDepth) +
                       " are accepted");
    return {};
  }
  llvm::Expected<json::Value> parsed = json::parse(text);
  if (!parsed) {
    (void)fail("", "invalid JSON: " + llvm::toString(parsed.takeError()));
    return {};
  }
  const json::Object *root = getObject(*parsed, "(root)");
  if (!root ||
      failed(checkKeys(*root, "", {"format", "mesh", "expert_meshes", "optimizer", "module"})))
    return {};
  FailureOr<std::string> format = getString(*root, "format", "", true);
  if (failed(format))
    return {};
  if (*format != "fsdp-model-v1") {
    (void)fail("format", "expected \"fsdp-model-v1\", got \"" + *format + "\"");
    return {};
  }

  FailureOr<MeshSpec> mesh = options.meshOverride.empty() ? parseMesh(root->get("mesh"), "mesh")
                                                          : parseMeshOverride(options.meshOverride);
  if (failed(mesh))
    return {};
  // Every rank gets a range in the lowered IR; the product must not overflow.
  int64_t ranks = 1;
  for (int64_t size : mesh->sizes) {
    if (size > limits::kMaxRanks / ranks) {
      (void)fail(options.meshOverride.empty() ? "mesh" : "--mesh",
                 "more than " + Twine(limits::kMaxRanks) +
                     " ranks in all (2^24, the compiler's limit)");
      return {};
    }
    ranks *= size;
  }
  if (!options.placementsOverride.empty()) {
    FailureOr<SmallVector<Placement>> placements =
        parsePlacementsOverride(options.placementsOverride);
    if (failed(placements))
      return {};
    placementsOverride = *placements;
  }
  const json::Value *moduleValue = root->get("module");
  if (!moduleValue) {
    (void)fail("module", "missing required key");
    return {};
  }

  OwningOpRef<ModuleOp> container = ModuleOp::create(fileLoc());
  builder.setInsertionPointToEnd(container->getBody());
  auto model = ModelOp::create(builder, fileLoc(), builder.getStringAttr("model"));
  model.getBody().emplaceBlock();
  builder.setInsertionPointToEnd(&model.getBody().front());

  MeshOp::create(builder, locFor("mesh"), builder.getStringAttr("mesh"), axisNamesAttr(*mesh),
                 builder.getDenseI64ArrayAttr(mesh->sizes));
  if (const json::Value *expertMeshes = root->get("expert_meshes"))
    if (failed(buildExpertMeshes(*expertMeshes, "expert_meshes")))
      return {};
  if (const json::Value *optimizer = root->get("optimizer"))
    if (failed(buildOptimizer(*optimizer, "optimizer")))
      return {};
  if (failed(buildModule(*moduleValue, "module", /*isRoot=*/true)))
    return {};
  if (failed(verify(*container)))
    return {};
  return container;
}

/// Prints "<file>: error: <json path>: <message>" for the locations the
/// importer creates (see ModelImporter::locFor); the generic op dump MLIR
/// would append adds nothing for a user who wrote JSON. Every diagnostic of
/// an import passes here, and each part goes through printable(): keys,
/// names, dtypes and the file's name come from the user and may hold any
/// bytes, and an error stays one line with no raw control characters.
static void printImportDiagnostic(Diagnostic &diagnostic) {
  std::string file, path;
  Location loc = diagnostic.getLocation();
  if (auto name = dyn_cast<NameLoc>(loc)) {
    if (auto fileName = dyn_cast<NameLoc>(name.getChildLoc())) {
      file = fileName.getName().str();
      path = name.getName().str();
    } else {
      file = name.getName().str();
    }
  } else {
    llvm::raw_string_ostream os(file);
    os << loc;
  }
  StringRef severity = "error";
  if (diagnostic.getSeverity() == DiagnosticSeverity::Warning)
    severity = "warning";
  else if (diagnostic.getSeverity() == DiagnosticSeverity::Note)
    severity = "note";
  else if (diagnostic.getSeverity() == DiagnosticSeverity::Remark)
    severity = "remark";
  llvm::errs() << printable(file) << ": " << severity << ": "
               << (path.empty() ? "" : printable(path) + ": ") << printable(diagnostic.str())
               << "\n";
  for (Diagnostic &note : diagnostic.getNotes())
    printImportDiagnostic(note);
}

OwningOpRef<ModuleOp> fsdp::importModelJSON(StringRef json, StringRef fileName,
                                            MLIRContext *context,
                                            const ModelJSONImportOptions &options) {
  context->getOrLoadDialect<FSDPDialect>();
  ScopedDiagnosticHandler handler(context, [](Diagnostic &diagnostic) {
    printImportDiagnostic(diagnostic);
    return success();
  });
  bool printedOp = context->shouldPrintOpOnDiagnostic();
  context->printOpOnDiagnostic(false);
  OwningOpRef<ModuleOp> model = ModelImporter(context, fileName, options).import(json);
  context->printOpOnDiagnostic(printedOp);
  return model;
}

void fsdp::registerImportModelJSONTranslation() {
  static llvm::cl::opt<std::string> meshOverride(
      "mesh",
      llvm::cl::desc("With --import-model-json: replace the mesh, "
                     "NAME=SIZE[,NAME=SIZE...]"),
      llvm::cl::init(""));
  static llvm::cl::opt<std::string> placementsOverride(
      "placements",
      llvm::cl::desc("With --import-model-json: replace every unit's "
                     "placements, shard|replicate[,...]"),
      llvm::cl::init(""));
  static TranslateToMLIRRegistration registration(
      "import-model-json", "import an fsdp-model-v1 JSON model description",
      [](llvm::SourceMgr &sourceMgr, MLIRContext *context) -> OwningOpRef<Operation *> {
        const llvm::MemoryBuffer *buffer = sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
        ModelJSONImportOptions options{meshOverride, placementsOverride};
        return importModelJSON(buffer->getBuffer(), buffer->getBufferIdentifier(), context,
                               options);
      },
      [](DialectRegistry &registry) { registry.insert<FSDPDialect>(); });
}
