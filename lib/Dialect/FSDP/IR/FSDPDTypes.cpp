//===- FSDPDTypes.cpp - the compiler side's one dtype table ---------------===//
//
// Every dtype the compiler accepts, once: the IR element type, the name
// fsdp-model-v1 / fsdp-layout-v1 JSON and the plans use, and the checkpoint
// format's dcp::DType (whose table in lib/Format gives the PyTorch name and
// the element size, and which the runtime uses). The importer, the
// verifiers' messages, the layout emitters and the plan emitter all read it.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Dialect/FSDP/IR/FSDPAttrs.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace fsdp;

namespace {
struct DTypeEntry {
  dcp::DType dtype;
  /// The name in the JSON formats and plans.
  llvm::StringLiteral name;
  /// How the IR spells the element type.
  llvm::StringLiteral irName;
  /// PyTorch's other names for it, beyond dcp's ("float32"): "float".
  llvm::StringLiteral torchAlias;
  Type (*get)(MLIRContext *);
};

template <typename T> Type getType(MLIRContext *context) { return T::get(context); }
template <unsigned Width, IntegerType::SignednessSemantics Signedness = IntegerType::Signless>
Type getInteger(MLIRContext *context) {
  return IntegerType::get(context, Width, Signedness);
}

const DTypeEntry kDTypes[] = {
    {dcp::DType::Float64, "f64", "f64", "double", getType<Float64Type>},
    {dcp::DType::Float32, "f32", "f32", "float", getType<Float32Type>},
    {dcp::DType::BFloat16, "bf16", "bf16", "", getType<BFloat16Type>},
    {dcp::DType::Float16, "f16", "f16", "half", getType<Float16Type>},
    {dcp::DType::Int64, "i64", "i64", "long", getInteger<64>},
    {dcp::DType::Int32, "i32", "i32", "int", getInteger<32>},
    {dcp::DType::Int16, "i16", "i16", "short", getInteger<16>},
    {dcp::DType::Int8, "i8", "i8", "", getInteger<8>},
    {dcp::DType::UInt8, "u8", "ui8", "", getInteger<8, IntegerType::Unsigned>},
    {dcp::DType::Bool, "bool", "i1", "", getInteger<1>},
};

bool isFloat(const DTypeEntry &entry) {
  switch (entry.dtype) {
  case dcp::DType::Float64:
  case dcp::DType::Float32:
  case dcp::DType::BFloat16:
  case dcp::DType::Float16:
    return true;
  default:
    return false;
  }
}

const DTypeEntry *findEntry(Type type) {
  if (!type)
    return nullptr;
  for (const DTypeEntry &entry : kDTypes)
    if (entry.get(type.getContext()) == type)
      return &entry;
  return nullptr;
}
} // namespace

bool fsdp::isSupportedElementType(Type type) { return findEntry(type) != nullptr; }

bool fsdp::isSupportedFloatType(Type type) {
  const DTypeEntry *entry = findEntry(type);
  return entry && isFloat(*entry);
}

StringRef fsdp::getDTypeName(Type type) {
  const DTypeEntry *entry = findEntry(type);
  return entry ? StringRef(entry->name) : StringRef();
}

StringRef fsdp::getDTypeName(dcp::DType dtype) {
  for (const DTypeEntry &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry.name;
  return {};
}

std::optional<dcp::DType> fsdp::getCheckpointDType(Type type) {
  if (const DTypeEntry *entry = findEntry(type))
    return entry->dtype;
  return std::nullopt;
}

Type fsdp::parseDTypeName(MLIRContext *context, StringRef name) {
  name.consume_front("torch.");
  const dcp::DTypeInfo *torch =
      name.starts_with("torch.") ? nullptr
                                 : dcp::findDType(std::string_view(name.data(), name.size()));
  for (const DTypeEntry &entry : kDTypes)
    if (name == entry.name || (!entry.torchAlias.empty() && name == entry.torchAlias) ||
        (torch && torch->dtype == entry.dtype))
      return entry.get(context);
  return {};
}

std::string fsdp::getSupportedTypesText(bool floatsOnly) {
  SmallVector<StringRef> names;
  for (const DTypeEntry &entry : kDTypes)
    if (!floatsOnly || isFloat(entry))
      names.push_back(entry.irName);
  return llvm::join(names, ", ");
}

std::string fsdp::getSupportedDTypeNames(StringRef separator) {
  SmallVector<StringRef> names;
  for (const DTypeEntry &entry : kDTypes)
    names.push_back(entry.name);
  return llvm::join(names, separator);
}
