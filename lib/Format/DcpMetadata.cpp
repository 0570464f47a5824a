//===- DcpMetadata.cpp - PyTorch DCP `.metadata` as typed structs ---------===//

#include "fsdp/Format/DcpMetadata.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace fsdp {
namespace dcp {

using pickle::Kind;
using pickle::Value;

namespace {

constexpr const char *kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char *kOldPropertiesModule = "torch.distributed._shard.sharded_tensor.metadata";
constexpr const char *kFilesystemModule = "torch.distributed.checkpoint.filesystem";

const DTypeInfo kDTypes[] = {
    {DType::Float64, "float64", 8, "DoubleStorage"},
    {DType::Float32, "float32", 4, "FloatStorage"},
    {DType::Float16, "float16", 2, "HalfStorage"},
    {DType::BFloat16, "bfloat16", 2, "BFloat16Storage"},
    {DType::Int64, "int64", 8, "LongStorage"},
    {DType::Int32, "int32", 4, "IntStorage"},
    {DType::Int16, "int16", 2, "ShortStorage"},
    {DType::Int8, "int8", 1, "CharStorage"},
    {DType::UInt8, "uint8", 1, "ByteStorage"},
    {DType::Bool, "bool", 1, "BoolStorage"},
    {DType::Complex32, "complex32", 4, nullptr},
    {DType::Complex64, "complex64", 8, "ComplexFloatStorage"},
    {DType::Complex128, "complex128", 16, "ComplexDoubleStorage"},
    {DType::Float8E4M3FN, "float8_e4m3fn", 1, nullptr},
    {DType::Float8E4M3FNUZ, "float8_e4m3fnuz", 1, nullptr},
    {DType::Float8E5M2, "float8_e5m2", 1, nullptr},
    {DType::Float8E5M2FNUZ, "float8_e5m2fnuz", 1, nullptr},
    {DType::Float8E8M0FNU, "float8_e8m0fnu", 1, nullptr},
    {DType::UInt16, "uint16", 2, nullptr},
    {DType::UInt32, "uint32", 4, nullptr},
    {DType::UInt64, "uint64", 8, nullptr},
};

//===----------------------------------------------------------------------===//
// Reading helpers: each names the place in the metadata it failed at. The
// place is a chain of Where links on the stack, rendered only on error (a
// large checkpoint has millions of chunks).
//===----------------------------------------------------------------------===//

/// What converting one pickle may produce, in bytes of output: memo
/// references let a small file name one large value many times.
struct Budget {
  uint64_t left = 0;
};

struct Where {
  const Where *parent = nullptr;
  Budget *budget = nullptr; // on the root of each chain
  std::string_view text;    // appended as is: "state_dict_metadata", ".size"
  std::string_view key;     // rendered ['key'] when hasKey
  bool hasKey = false;
  int64_t index = -1; // rendered [index] when >= 0

  std::string str() const {
    std::string s = parent ? parent->str() : std::string();
    s += text;
    if (hasKey)
      s += "['" + std::string(key) + "']";
    if (index >= 0)
      s += "[" + std::to_string(index) + "]";
    return s;
  }
};

Where child(const Where &parent, std::string_view text) {
  Where w;
  w.parent = &parent;
  w.text = text;
  return w;
}

Error corruptMetadata(std::string message) {
  return makeError(std::move(message), ErrorKind::Corrupt);
}

Error bad(const Where &where, const std::string &what) {
  return corruptMetadata("dcp metadata: " + where.str() + ": " + what);
}

/// Charges `bytes` of output to the conversion's budget; false when spent.
bool spend(const Where &where, uint64_t bytes) {
  const Where *root = &where;
  while (root->parent)
    root = root->parent;
  if (!root->budget)
    return true;
  if (root->budget->left < bytes)
    return false;
  root->budget->left -= bytes;
  return true;
}

Error overBudget(const Where &where) {
  return bad(where, "the values expand past what a file of this size can hold "
                    "(memo references repeat a value too often)");
}

std::string describe(const Value *v) {
  if (!v)
    return "nothing";
  if (v->kind == Kind::Object && v->callable)
    return "a " + v->callable->text + "." + v->callable->name + " object";
  if (v->kind == Kind::Global)
    return "the global " + v->text + "." + v->name;
  if (v->kind == Kind::None)
    return "None";
  std::string kind = pickle::kindName(v->kind);
  return (kind[0] == 'i' ? "an " : "a ") + kind;
}

bool isNone(const Value *v) { return !v || v->kind == Kind::None; }

/// The argument tuple's items of an Object (empty if it has none).
const std::vector<Value *> &argsOf(const Value *v) {
  static const std::vector<Value *> none;
  return v->args ? v->args->items : none;
}

Result<std::string> toStr(const Value *v, const Where &where) {
  if (!v || v->kind != Kind::String)
    return bad(where, "expected a str, got " + describe(v));
  if (!spend(where, 32 + v->text.size()))
    return overBudget(where);
  return v->text;
}

Result<int64_t> toInt(const Value *v, const Where &where) {
  if (!v || v->kind != Kind::Int)
    return bad(where, "expected an int, got " + describe(v));
  return v->integer;
}

Result<bool> toBool(const Value *v, const Where &where) {
  if (!v || v->kind != Kind::Bool)
    return bad(where, "expected a bool, got " + describe(v));
  return v->boolean;
}

/// torch.Size(tuple), or a plain tuple/list (Megatron-FSDP writes tuples).
Result<Dims> toDims(const Value *v, const Where &where) {
  if (v && v->isObjectOf("torch", "Size")) {
    if (argsOf(v).size() != 1)
      return bad(where, "torch.Size takes one argument");
    v = argsOf(v)[0];
  }
  if (!v || (v->kind != Kind::Tuple && v->kind != Kind::List))
    return bad(where, "expected a torch.Size or a tuple of ints, got " + describe(v));
  if (!spend(where, 32 + 8 * static_cast<uint64_t>(v->items.size())))
    return overBudget(where);
  Dims dims;
  dims.reserve(v->items.size());
  for (const Value *item : v->items) {
    if (item->kind != Kind::Int)
      return bad(where, "expected ints, got " + describe(item));
    dims.push_back(item->integer);
  }
  return dims;
}

/// The BUILD dict of an object of class `module.cls` (null if no BUILD).
Result<const Value *> objectState(const Value *v, const char *module, const char *cls,
                                  const Where &where) {
  if (!v || !v->isObjectOf(module, cls))
    return bad(where, std::string("expected a ") + cls + ", got " + describe(v));
  if (v->state && v->state->kind != Kind::Dict)
    return bad(where, std::string(cls) + " state is " + describe(v->state) + ", expected a dict");
  return v->state;
}

const Value *field(const Value *state, std::string_view key) {
  return state ? state->find(key) : nullptr;
}

Result<DType> toDType(const Value *v, const Where &where) {
  if (!v || v->kind != Kind::Global || v->text != "torch")
    return bad(where, "expected a torch dtype, got " + describe(v));
  const DTypeInfo *info = findDType(v->name);
  if (!info)
    return bad(where, "unsupported dtype torch." + v->name);
  return info->dtype;
}

/// torch.strided, or torch.serialization._get_layout('torch.strided').
Result<std::string> toLayout(const Value *v, const Where &where) {
  if (v && v->kind == Kind::Global && v->text == "torch")
    return "torch." + v->name;
  if (v && v->isObjectOf("torch.serialization", "_get_layout") && argsOf(v).size() == 1 &&
      argsOf(v)[0]->kind == Kind::String)
    return argsOf(v)[0]->text;
  return bad(where, "expected a torch layout, got " + describe(v));
}

Result<int> toMemoryFormat(const Value *v, const Where &where) {
  if (v && (v->isObjectOf(kMetadataModule, "_MEM_FORMAT_ENCODING") ||
            v->isObjectOf(kOldPropertiesModule, "MEM_FORMAT_ENCODING"))) {
    if (argsOf(v).size() != 1)
      return bad(where, "_MEM_FORMAT_ENCODING takes one argument");
    v = argsOf(v)[0];
  }
  if (v && v->kind == Kind::Int && v->integer >= 0 && v->integer <= 2)
    return static_cast<int>(v->integer);
  if (v && v->kind == Kind::Global && v->text == "torch") {
    if (v->name == "contiguous_format")
      return 0;
    if (v->name == "channels_last")
      return 1;
    if (v->name == "preserve_format")
      return 2;
  }
  return bad(where, "expected a memory format, got " + describe(v));
}

Result<TensorProperties> toProperties(const Value *v, const Where &where) {
  if (!v || (!v->isObjectOf(kMetadataModule, "TensorProperties") &&
             !v->isObjectOf(kOldPropertiesModule, "TensorProperties")))
    return bad(where, "expected a TensorProperties, got " + describe(v));
  const Value *state = v->state;
  // __getstate__ gives (dtype, layout, requires_grad, memory_format,
  // pin_memory), and since PyTorch 2.15 a sixth element, the tensor's
  // strides (None when unknown); old pickles have the dataclass dict.
  static const char *const names[6] = {"dtype",         "layout",     "requires_grad",
                                       "memory_format", "pin_memory", "strides"};
  const Value *parts[6] = {};
  if (state && state->kind == Kind::Tuple &&
      (state->items.size() == 5 || state->items.size() == 6)) {
    for (size_t i = 0; i < state->items.size(); ++i)
      parts[i] = state->items[i];
  } else if (state && state->kind == Kind::Dict) {
    for (int i = 0; i < 6; ++i)
      parts[i] = state->find(names[i]);
  } else {
    return bad(where, "TensorProperties state is " + describe(state) +
                          ", expected a 5- or 6-tuple or a dict");
  }
  TensorProperties props;
  auto dtype = toDType(parts[0], child(where, ".dtype"));
  if (!dtype)
    return dtype.failure();
  props.dtype = *dtype;
  if (parts[1]) {
    auto layout = toLayout(parts[1], child(where, ".layout"));
    if (!layout)
      return layout.failure();
    props.layout = *layout;
  }
  if (parts[2]) {
    auto requiresGrad = toBool(parts[2], child(where, ".requires_grad"));
    if (!requiresGrad)
      return requiresGrad.failure();
    props.requiresGrad = *requiresGrad;
  }
  if (parts[3]) {
    auto format = toMemoryFormat(parts[3], child(where, ".memory_format"));
    if (!format)
      return format.failure();
    props.memoryFormat = *format;
  }
  if (parts[4]) {
    auto pin = toBool(parts[4], child(where, ".pin_memory"));
    if (!pin)
      return pin.failure();
    props.pinMemory = *pin;
  }
  // Strides describe the saved tensor, not a chunk; items carry their own,
  // so they are checked for form and not kept.
  if (parts[5] && !isNone(parts[5])) {
    auto strides = toDims(parts[5], child(where, ".strides"));
    if (!strides)
      return strides.failure();
  }
  return props;
}

Result<StorageMetadata> toStorageMetadata(const Value *v, const Where &where) {
  StorageMetadata out;
  if (v && v->isObjectOf(kMetadataModule, "BytesStorageMetadata")) {
    out.isBytes = true;
    return out;
  }
  auto state = objectState(v, kMetadataModule, "TensorStorageMetadata", where);
  if (!state)
    return state.failure();
  auto props = toProperties(field(*state, "properties"), child(where, ".properties"));
  if (!props)
    return props.failure();
  out.properties = *props;
  auto size = toDims(field(*state, "size"), child(where, ".size"));
  if (!size)
    return size.failure();
  out.size = size.take();
  const Value *chunks = field(*state, "chunks");
  Where chunksAt = child(where, ".chunks");
  if (!chunks || chunks->kind != Kind::List)
    return bad(chunksAt, "expected a list, got " + describe(chunks));
  out.chunks.reserve(chunks->items.size());
  for (size_t i = 0; i < chunks->items.size(); ++i) {
    Where at = chunksAt;
    at.index = static_cast<int64_t>(i);
    auto chunkState = objectState(chunks->items[i], kMetadataModule, "ChunkStorageMetadata", at);
    if (!chunkState)
      return chunkState.failure();
    ChunkMetadata chunk;
    auto offsets = toDims(field(*chunkState, "offsets"), child(at, ".offsets"));
    if (!offsets)
      return offsets.failure();
    auto sizes = toDims(field(*chunkState, "sizes"), child(at, ".sizes"));
    if (!sizes)
      return sizes.failure();
    chunk.offsets = offsets.take();
    chunk.sizes = sizes.take();
    out.chunks.push_back(std::move(chunk));
  }
  return out;
}

Result<MetadataIndex> toIndex(const Value *v, const Where &where) {
  auto state = objectState(v, kMetadataModule, "MetadataIndex", where);
  if (!state)
    return state.failure();
  MetadataIndex index;
  auto fqn = toStr(field(*state, "fqn"), child(where, ".fqn"));
  if (!fqn)
    return fqn.failure();
  index.fqn = fqn.take();
  Where named = where;
  named.key = index.fqn;
  named.hasKey = true;
  const Value *offset = field(*state, "offset");
  if (!isNone(offset)) {
    auto dims = toDims(offset, child(named, ".offset"));
    if (!dims)
      return dims.failure();
    index.offset = dims.take();
  }
  const Value *position = field(*state, "index");
  if (!isNone(position)) {
    auto i = toInt(position, child(named, ".index"));
    if (!i)
      return i.failure();
    index.index = *i;
  }
  return index;
}

Result<StorageInfo> toStorageInfo(const Value *v, const Where &where) {
  auto state = objectState(v, kFilesystemModule, "_StorageInfo", where);
  if (!state)
    return state.failure();
  StorageInfo info;
  auto path = toStr(field(*state, "relative_path"), child(where, ".relative_path"));
  if (!path)
    return path.failure();
  info.relativePath = path.take();
  auto offset = toInt(field(*state, "offset"), child(where, ".offset"));
  if (!offset)
    return offset.failure();
  auto length = toInt(field(*state, "length"), child(where, ".length"));
  if (!length)
    return length.failure();
  if (*offset < 0 || *length < 0)
    return bad(where, "negative offset or length");
  info.offset = static_cast<uint64_t>(*offset);
  info.length = static_cast<uint64_t>(*length);
  const Value *transforms = field(*state, "transform_descriptors");
  if (!isNone(transforms)) {
    Where at = child(where, ".transform_descriptors");
    if (transforms->kind != Kind::List && transforms->kind != Kind::Tuple)
      return bad(at, "expected a list, got " + describe(transforms));
    std::vector<std::string> names;
    for (const Value *item : transforms->items) {
      auto name = toStr(item, at);
      if (!name)
        return name.failure();
      names.push_back(name.take());
    }
    info.transformDescriptors = std::move(names);
  }
  return info;
}

/// A str, or a pathlib path: REDUCE(PosixPath, parts) or (3.13) one string.
Result<std::string> toPathString(const Value *v, const Where &where) {
  if (v && v->kind == Kind::String)
    return v->text;
  if (!v || v->kind != Kind::Object || !v->callable || v->callable->text.rfind("pathlib", 0) != 0)
    return bad(where, "expected a str or a pathlib path, got " + describe(v));
  std::string path;
  for (const Value *part : argsOf(v)) {
    if (part->kind != Kind::String)
      return bad(where, "path part is " + describe(part));
    if (!part->text.empty() && part->text[0] == '/')
      path = part->text;
    else if (path.empty() || path.back() == '/')
      path += part->text;
    else
      path += "/" + part->text;
  }
  return path;
}

Result<StorageMeta> toStorageMeta(const Value *v, const Where &where) {
  auto state = objectState(v, kMetadataModule, "StorageMeta", where);
  if (!state)
    return state.failure();
  StorageMeta meta;
  if (const Value *id = field(*state, "checkpoint_id"); !isNone(id)) {
    auto path = toPathString(id, child(where, ".checkpoint_id"));
    if (!path)
      return path.failure();
    meta.checkpointId = path.take();
  }
  if (const Value *saveId = field(*state, "save_id"); !isNone(saveId)) {
    auto s = toStr(saveId, child(where, ".save_id"));
    if (!s)
      return s.failure();
    meta.saveId = s.take();
  }
  if (const Value *loadId = field(*state, "load_id"); !isNone(loadId)) {
    auto s = toStr(loadId, child(where, ".load_id"));
    if (!s)
      return s.failure();
    meta.loadId = s.take();
  }
  if (const Value *modules = field(*state, "modules"); !isNone(modules)) {
    Where at = child(where, ".modules");
    if (modules->kind != Kind::List)
      return bad(at, "expected a list, got " + describe(modules));
    for (const Value *item : modules->items) {
      auto s = toStr(item, at);
      if (!s)
        return s.failure();
      meta.modules.push_back(s.take());
    }
  }
  return meta;
}

/// planner_data of the default planner; nullopt for anything else.
std::optional<std::vector<std::pair<std::string, std::vector<PathPart>>>>
toPlannerData(const Value *v, Budget &budget) {
  if (!v || v->kind != Kind::Dict)
    return std::nullopt;
  std::vector<std::pair<std::string, std::vector<PathPart>>> out;
  out.reserve(v->entries.size());
  for (const auto &[key, path] : v->entries) {
    if (key->kind != Kind::String || (path->kind != Kind::Tuple && path->kind != Kind::List))
      return std::nullopt;
    uint64_t cost = 64 + key->text.size() + 40 * static_cast<uint64_t>(path->items.size());
    if (budget.left < cost)
      return std::nullopt; // dropped like any form we do not know
    budget.left -= cost;
    std::vector<PathPart> parts;
    for (const Value *part : path->items) {
      if (part->kind == Kind::String) {
        if (budget.left < part->text.size())
          return std::nullopt;
        budget.left -= part->text.size();
        parts.emplace_back(part->text);
      } else if (part->kind == Kind::Int)
        parts.emplace_back(part->integer);
      else
        return std::nullopt;
    }
    out.emplace_back(key->text, std::move(parts));
  }
  return out;
}

std::string dimsText(const Dims &dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

//===----------------------------------------------------------------------===//
// Writing helpers
//===----------------------------------------------------------------------===//

/// MARK ... SETITEMS (or APPENDS) in batches of 1000, as CPython does, so a
/// reader never holds a million values above one MARK.
class Batched {
public:
  Batched(pickle::Writer &w, bool dict) : w_(w), dict_(dict) {}
  void beforeItem() {
    if (count_ == 0)
      w_.mark();
  }
  void afterItem() {
    if (++count_ == 1000)
      flush();
  }
  void flush() {
    if (count_ == 0)
      return;
    dict_ ? w_.setItems() : w_.appends();
    count_ = 0;
  }

private:
  pickle::Writer &w_;
  bool dict_;
  size_t count_ = 0;
};

using MemoSlot = pickle::Writer::MemoSlot;

/// Memo slots of the names every chunk and storage entry repeats: millions
/// of times in a large world's `.metadata`.
struct RepeatedNames {
  MemoSlot torchSize, chunkClass, indexClass, storageInfoClass;
  MemoSlot offsets, sizes, fqn, index, offset, relativePath, length;
};

void emitSize(pickle::Writer &w, const Dims &dims, MemoSlot &torchSize) {
  w.global("torch", "Size", torchSize);
  w.intTuple(dims);
  w.tupleOf(1);
  w.reduce();
}

void emitSize(pickle::Writer &w, const Dims &dims) {
  MemoSlot torchSize;
  emitSize(w, dims, torchSize);
}

/// cls.__new__(cls), as CPython pickles a dataclass.
void emitNewObject(pickle::Writer &w, const char *module, const char *cls, MemoSlot &slot) {
  w.global(module, cls, slot);
  w.emptyTuple();
  w.newObj();
}

void emitNewObject(pickle::Writer &w, const char *module, const char *cls) {
  MemoSlot slot;
  emitNewObject(w, module, cls, slot);
}

void emitOptionalString(pickle::Writer &w, const std::optional<std::string> &s) {
  if (s)
    w.string(*s);
  else
    w.none();
}

void emitProperties(pickle::Writer &w, const TensorProperties &p) {
  emitNewObject(w, kMetadataModule, "TensorProperties");
  w.mark();
  w.global("torch", dtypeInfo(p.dtype).name);
  w.global("torch.serialization", "_get_layout"); // as PyTorch pickles layouts
  w.sharedString(p.layout);
  w.tupleOf(1);
  w.reduce();
  w.boolean(p.requiresGrad);
  w.global(kMetadataModule, "_MEM_FORMAT_ENCODING");
  w.integer(p.memoryFormat);
  w.tupleOf(1);
  w.reduce();
  w.boolean(p.pinMemory);
  w.tupleFromMark();
  w.build();
}

/// A TensorStorageMetadata up to its (still open) chunk list; the chunks
/// follow, then closeTensorStorage.
void openTensorStorage(pickle::Writer &w, const TensorProperties &properties, const Dims &size) {
  emitNewObject(w, kMetadataModule, "TensorStorageMetadata");
  w.emptyDict();
  w.mark();
  w.sharedString("properties");
  emitProperties(w, properties);
  w.sharedString("size");
  emitSize(w, size);
  w.sharedString("chunks");
  w.emptyList();
}

void emitChunk(pickle::Writer &w, RepeatedNames &names, const Dims &offsets, const Dims &sizes) {
  emitNewObject(w, kMetadataModule, "ChunkStorageMetadata", names.chunkClass);
  w.emptyDict();
  w.mark();
  w.sharedString("offsets", names.offsets);
  emitSize(w, offsets, names.torchSize);
  w.sharedString("sizes", names.sizes);
  emitSize(w, sizes, names.torchSize);
  w.setItems();
  w.build();
}

void closeTensorStorage(pickle::Writer &w) {
  w.setItems();
  w.build();
}

/// `fqnSlot` is the key's own slot: a key recurs once per chunk.
void emitIndex(pickle::Writer &w, RepeatedNames &names, std::string_view fqn, MemoSlot &fqnSlot,
               const Dims *offsets, std::optional<int64_t> index) {
  emitNewObject(w, kMetadataModule, "MetadataIndex", names.indexClass);
  w.emptyDict();
  w.mark();
  w.sharedString("fqn", names.fqn);
  w.sharedString(fqn, fqnSlot);
  w.sharedString("index", names.index);
  if (index)
    w.integer(*index);
  else
    w.none();
  if (offsets) { // absent for bytes items, as PyTorch writes them
    w.sharedString("offset", names.offset);
    emitSize(w, *offsets, names.torchSize);
  }
  w.setItems();
  w.build();
}

/// `pathSlot` is the file name's slot: a file holds many items.
void emitStorageInfo(pickle::Writer &w, RepeatedNames &names, std::string_view relativePath,
                     MemoSlot &pathSlot, uint64_t offset, uint64_t length,
                     const std::vector<std::string> *transformDescriptors) {
  emitNewObject(w, kFilesystemModule, "_StorageInfo", names.storageInfoClass);
  w.emptyDict();
  w.mark();
  w.sharedString("relative_path", names.relativePath);
  w.sharedString(relativePath, pathSlot);
  w.sharedString("offset", names.offset);
  w.integer(static_cast<int64_t>(offset));
  w.sharedString("length", names.length);
  w.integer(static_cast<int64_t>(length));
  if (transformDescriptors) {
    w.sharedString("transform_descriptors");
    w.emptyList();
    Batched descriptors(w, /*dict=*/false);
    for (const std::string &name : *transformDescriptors) {
      descriptors.beforeItem();
      w.sharedString(name);
      descriptors.afterItem();
    }
    descriptors.flush();
  }
  w.setItems();
  w.build();
}

void emitStorageMeta(pickle::Writer &w, const StorageMeta &meta) {
  emitNewObject(w, kMetadataModule, "StorageMeta");
  w.emptyDict();
  w.mark();
  w.sharedString("checkpoint_id");
  emitOptionalString(w, meta.checkpointId); // a str, never a pathlib object
  w.sharedString("save_id");
  w.sharedString(meta.saveId);
  w.sharedString("load_id");
  emitOptionalString(w, meta.loadId);
  w.sharedString("modules");
  w.emptyList();
  Batched modules(w, /*dict=*/false);
  for (const std::string &name : meta.modules) {
    modules.beforeItem();
    w.sharedString(name);
    modules.afterItem();
  }
  modules.flush();
  w.setItems();
  w.build();
}

} // namespace

//===----------------------------------------------------------------------===//
// dtypes
//===----------------------------------------------------------------------===//

const DTypeInfo &dtypeInfo(DType dtype) {
  for (const DTypeInfo &info : kDTypes)
    if (info.dtype == dtype)
      return info;
  return kDTypes[1];
}

std::string dtypeNameOrCode(DType dtype) {
  const DTypeInfo &info = dtypeInfo(dtype);
  if (info.dtype != dtype)
    return "#" + std::to_string(static_cast<unsigned>(dtype));
  return info.name;
}

const DTypeInfo *findDType(std::string_view name) {
  if (name.substr(0, 6) == "torch.")
    name.remove_prefix(6);
  for (const DTypeInfo &info : kDTypes)
    if (name == info.name)
      return &info;
  return nullptr;
}

const DTypeInfo *findDTypeByStorage(std::string_view storageClass) {
  for (const DTypeInfo &info : kDTypes)
    if (info.legacyStorage && storageClass == info.legacyStorage)
      return &info;
  return nullptr;
}

//===----------------------------------------------------------------------===//
// Metadata
//===----------------------------------------------------------------------===//

const StorageMetadata *Metadata::find(std::string_view fqn) const {
  for (const auto &[key, value] : stateDictMetadata)
    if (key == fqn)
      return &value;
  return nullptr;
}

const StorageInfo *Metadata::findStorage(std::string_view fqn,
                                         const std::optional<Dims> &offsets) const {
  for (const auto &[index, info] : storageData)
    if (index.fqn == fqn && index.offset == offsets)
      return &info;
  return nullptr;
}

Status validateMetadata(const Metadata &metadata) {
  const auto &entries = metadata.stateDictMetadata;
  // Slot of every chunk (bytes items: one slot) in a flat "seen" table;
  // each tensor's chunk indices sorted by offsets for lookups.
  std::unordered_map<std::string_view, size_t> entryOf;
  entryOf.reserve(entries.size());
  std::vector<size_t> firstSlot(entries.size());
  std::vector<std::vector<uint32_t>> byOffsets(entries.size());
  size_t slots = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    const std::string &fqn = entries[e].first;        // (no structured bindings:
    const StorageMetadata &entry = entries[e].second; // lambdas capture these)
    if (!entryOf.emplace(fqn, e).second)
      return corruptMetadata("dcp metadata: key '" + fqn + "' appears twice");
    firstSlot[e] = slots;
    if (entry.isBytes) {
      ++slots;
      continue;
    }
    for (int64_t dim : entry.size)
      if (dim < 0)
        return corruptMetadata("dcp metadata: '" + fqn + "' has a negative size " +
                               dimsText(entry.size));
    if (entry.chunks.size() >= UINT32_MAX)
      return corruptMetadata("dcp metadata: '" + fqn + "' has too many chunks");
    auto chunkError = [&](const ChunkMetadata &chunk, const std::string &what) {
      return corruptMetadata("dcp metadata: '" + fqn + "' chunk at " + dimsText(chunk.offsets) +
                             " size " + dimsText(chunk.sizes) + ": " + what);
    };
    std::vector<uint32_t> &order = byOffsets[e];
    order.reserve(entry.chunks.size());
    for (size_t c = 0; c < entry.chunks.size(); ++c) {
      const ChunkMetadata &chunk = entry.chunks[c];
      if (chunk.offsets.size() != entry.size.size() || chunk.sizes.size() != entry.size.size())
        return chunkError(chunk, "rank differs from the tensor's " + dimsText(entry.size));
      for (size_t d = 0; d < entry.size.size(); ++d)
        if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 || chunk.offsets[d] > entry.size[d] ||
            chunk.sizes[d] > entry.size[d] - chunk.offsets[d])
          return chunkError(chunk, "outside the tensor " + dimsText(entry.size));
      order.push_back(static_cast<uint32_t>(c));
    }
    auto offsetsOf = [&](uint32_t c) -> const Dims & { return entry.chunks[c].offsets; };
    std::sort(order.begin(), order.end(),
              [&](uint32_t x, uint32_t y) { return offsetsOf(x) < offsetsOf(y); });
    for (size_t i = 1; i < order.size(); ++i)
      if (offsetsOf(order[i]) == offsetsOf(order[i - 1]))
        return chunkError(entry.chunks[order[i]], "two chunks at the same offsets");
    slots += entry.chunks.size();
  }

  std::vector<uint8_t> seen(slots, 0);
  for (const auto &item : metadata.storageData) {
    const MetadataIndex &index = item.first;
    const StorageInfo &info = item.second;
    auto where = [&]() {
      return "dcp metadata: storage_data entry '" + index.fqn + "'" +
             (index.offset ? " at " + dimsText(*index.offset) : "");
    };
    // Data files are plain names inside the checkpoint directory; a path
    // could make a reader open files outside it.
    if (info.relativePath.empty() || info.relativePath.find('/') != std::string::npos ||
        info.relativePath.find('\\') != std::string::npos || info.relativePath == "." ||
        info.relativePath == "..")
      return makeError(where() + ": relative_path '" + info.relativePath +
                       "' is not a plain file name");
    auto found = entryOf.find(index.fqn);
    std::optional<size_t> slot;
    if (found != entryOf.end()) {
      size_t e = found->second;
      const StorageMetadata &entry = entries[e].second;
      if (entry.isBytes && !index.offset) {
        slot = firstSlot[e];
      } else if (!entry.isBytes && index.offset) {
        // The position hint first (the default planner writes it), then a
        // binary search by offsets.
        if (index.index && *index.index >= 0 &&
            static_cast<uint64_t>(*index.index) < entry.chunks.size() &&
            entry.chunks[static_cast<size_t>(*index.index)].offsets == *index.offset) {
          slot = firstSlot[e] + static_cast<size_t>(*index.index);
        } else {
          const auto &order = byOffsets[e];
          auto it = std::lower_bound(
              order.begin(), order.end(), *index.offset,
              [&](uint32_t c, const Dims &offsets) { return entry.chunks[c].offsets < offsets; });
          if (it != order.end() && entry.chunks[*it].offsets == *index.offset)
            slot = firstSlot[e] + *it;
        }
      }
    }
    if (!slot)
      return makeError(where() + " matches no chunk of state_dict_metadata");
    if (seen[*slot])
      return makeError(where() + " appears twice");
    seen[*slot] = 1;
    if (info.length > std::numeric_limits<uint64_t>::max() - info.offset ||
        info.offset + info.length > uint64_t(std::numeric_limits<int64_t>::max()))
      return makeError(where() + ": byte range overflows");
  }
  for (size_t e = 0; e < entries.size(); ++e) {
    const auto &[fqn, entry] = entries[e];
    if (entry.isBytes && !seen[firstSlot[e]])
      return corruptMetadata("dcp metadata: '" + fqn + "' has no storage_data entry");
    if (!entry.isBytes)
      for (size_t c = 0; c < entry.chunks.size(); ++c)
        if (!seen[firstSlot[e] + c])
          return corruptMetadata("dcp metadata: '" + fqn + "' chunk at " +
                                 dimsText(entry.chunks[c].offsets) + " has no storage_data entry");
  }
  return Status::success();
}

Result<Metadata> metadataFromPickle(const Value &root, uint64_t budgetBytes) {
  Budget budget{budgetBytes};
  Where top;
  top.text = "Metadata";
  top.budget = &budget;
  auto state = objectState(&root, kMetadataModule, "Metadata", top);
  if (!state)
    return state.failure();
  Metadata out;

  Where sdmAt;
  sdmAt.text = "state_dict_metadata";
  sdmAt.budget = &budget;
  const Value *sdm = field(*state, "state_dict_metadata");
  if (!sdm || sdm->kind != Kind::Dict)
    return bad(sdmAt, "expected a dict, got " + describe(sdm));
  out.stateDictMetadata.reserve(sdm->entries.size());
  for (const auto &[key, value] : sdm->entries) {
    auto fqn = toStr(key, child(sdmAt, " key"));
    if (!fqn)
      return fqn.failure();
    Where at = sdmAt;
    at.key = *fqn;
    at.hasKey = true;
    auto entry = toStorageMetadata(value, at);
    if (!entry)
      return entry.failure();
    out.stateDictMetadata.emplace_back(fqn.take(), entry.take());
  }

  Where storageAt;
  storageAt.text = "storage_data";
  storageAt.budget = &budget;
  const Value *storage = field(*state, "storage_data");
  if (!isNone(storage)) {
    if (storage->kind != Kind::Dict)
      return bad(storageAt, "expected a dict, got " + describe(storage));
    out.storageData.reserve(storage->entries.size());
    for (const auto &[key, value] : storage->entries) {
      auto index = toIndex(key, child(storageAt, " key"));
      if (!index)
        return index.failure();
      Where at = storageAt;
      at.key = index->fqn;
      at.hasKey = true;
      auto info = toStorageInfo(value, at);
      if (!info)
        return info.failure();
      out.storageData.emplace_back(index.take(), info.take());
    }
  }

  out.plannerData = toPlannerData(field(*state, "planner_data"), budget);

  if (const Value *meta = field(*state, "storage_meta"); !isNone(meta)) {
    Where at;
    at.text = "storage_meta";
    at.budget = &budget;
    auto storageMeta = toStorageMeta(meta, at);
    if (!storageMeta)
      return storageMeta.failure();
    out.storageMeta = storageMeta.take();
  }

  if (const Value *version = field(*state, "version"); !isNone(version)) {
    Where at;
    at.text = "version";
    at.budget = &budget;
    auto s = toStr(version, at);
    if (!s)
      return s.failure();
    out.version = s.take();
  }

  if (Status s = validateMetadata(out); !s)
    return s.failure();
  return out;
}

Result<Metadata> parseMetadata(std::string_view bytes) {
  auto doc = pickle::read(bytes);
  if (!doc)
    return propagate(doc, "dcp metadata: " + doc.error());
  if (doc->end() != bytes.size())
    return corruptMetadata("dcp metadata: " + std::to_string(bytes.size() - doc->end()) +
                           " bytes after the pickle's end at " + std::to_string(doc->end()) +
                           " (PyTorch writes none)");
  // Output a few times the input: a real `.metadata` converts to about its
  // own size; a hostile one with memo-shared values is refused.
  return metadataFromPickle(*doc->root(), 16 * static_cast<uint64_t>(bytes.size()) + (64u << 20));
}

Result<uint64_t> writeMetadata(const Metadata &metadata, MetadataStreamWriter &writer) {
  for (const auto &[fqn, entry] : metadata.stateDictMetadata) {
    if (entry.isBytes) {
      writer.bytesItem(fqn);
      continue;
    }
    writer.tensor(fqn, entry.properties, entry.size);
    for (const ChunkMetadata &chunk : entry.chunks)
      writer.chunk(chunk.offsets, chunk.sizes);
  }
  if (metadata.plannerData) {
    writer.plannerData();
    for (const auto &[key, parts] : *metadata.plannerData)
      writer.plannerPath(key, parts);
  } else {
    writer.noPlannerData();
  }
  for (const auto &[index, info] : metadata.storageData)
    writer.storage(index.fqn, index.offset ? &*index.offset : nullptr, index.index,
                   info.relativePath, info.offset, info.length,
                   info.transformDescriptors ? &*info.transformDescriptors : nullptr);
  return writer.finish(metadata.storageMeta, metadata.version);
}

Result<std::string> serializeMetadata(const Metadata &metadata) {
  if (Status s = validateMetadata(metadata); !s)
    return s.failure();
  std::string out;
  MetadataStreamWriter writer([&](std::string_view bytes) {
    out.append(bytes);
    return Status::success();
  });
  Result<uint64_t> written = writeMetadata(metadata, writer);
  if (!written)
    return written.failure();
  return out;
}

//===----------------------------------------------------------------------===//
// Streaming
//===----------------------------------------------------------------------===//

class MetadataStreamWriter::Impl {
public:
  Impl(ByteSink sink, size_t blockBytes)
      : sink_(std::move(sink)), blockBytes_(blockBytes), entries_(w_, /*dict=*/true),
        chunks_(w_, /*dict=*/false), paths_(w_, /*dict=*/true), storage_(w_, /*dict=*/true) {
    emitNewObject(w_, kMetadataModule, "Metadata");
    w_.emptyDict();
    w_.mark();
    w_.sharedString("state_dict_metadata");
    w_.emptyDict();
  }

  void tensor(std::string_view fqn, const TensorProperties &properties, const Dims &size) {
    if (!beginEntry(fqn, /*isBytes=*/false, size))
      return;
    w_.sharedString(fqn, current_->fqnSlot);
    openTensorStorage(w_, properties, size);
    inTensor_ = true;
  }

  void chunk(const Dims &offsets, const Dims &sizes) {
    if (failed_)
      return;
    if (!inTensor_)
      return fail(makeError("dcp metadata writer: a chunk outside a tensor entry"));
    const Dims &size = current_->size;
    auto chunkError = [&](const std::string &what) {
      fail(corruptMetadata("dcp metadata: '" + current_->fqn + "' chunk at " + dimsText(offsets) +
                           " size " + dimsText(sizes) + ": " + what));
    };
    if (offsets.size() != size.size() || sizes.size() != size.size())
      return chunkError("rank differs from the tensor's " + dimsText(size));
    for (size_t d = 0; d < size.size(); ++d)
      if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] > size[d] || sizes[d] > size[d] - offsets[d])
        return chunkError("outside the tensor " + dimsText(size));
    if (++current_->chunks >= UINT32_MAX)
      return fail(corruptMetadata("dcp metadata: '" + current_->fqn + "' has too many chunks"));
    chunks_.beforeItem();
    emitChunk(w_, names_, offsets, sizes);
    chunks_.afterItem();
    drain();
  }

  void bytesItem(std::string_view fqn) {
    if (!beginEntry(fqn, /*isBytes=*/true, {}))
      return;
    w_.sharedString(fqn, current_->fqnSlot);
    emitNewObject(w_, kMetadataModule, "BytesStorageMetadata");
    entries_.afterItem();
    drain();
  }

  void plannerData(bool present) {
    if (failed_)
      return;
    if (section_ != Section::StateDict)
      return fail(makeError("dcp metadata writer: planner_data given twice or too late"));
    endStateDict();
    w_.sharedString("planner_data");
    present ? w_.emptyDict() : w_.none();
    section_ = Section::PlannerData;
    plannerIsDict_ = present;
  }

  void plannerPath(std::string_view key, const std::vector<PathPart> &parts) {
    if (failed_)
      return;
    if (section_ != Section::PlannerData || !plannerIsDict_)
      return fail(makeError("dcp metadata writer: a planner_data path outside planner_data"));
    paths_.beforeItem();
    w_.sharedString(key);
    w_.mark();
    for (const PathPart &part : parts) {
      if (const auto *s = std::get_if<std::string>(&part))
        w_.sharedString(*s);
      else
        w_.integer(std::get<int64_t>(part));
    }
    w_.tupleFromMark();
    paths_.afterItem();
    drain();
  }

  void storage(std::string_view fqn, const Dims *offsets, std::optional<int64_t> index,
               std::string_view relativePath, uint64_t offset, uint64_t length,
               const std::vector<std::string> *transformDescriptors) {
    if (failed_ || !beginStorage())
      return;
    auto where = [&]() {
      return "dcp metadata: storage_data entry '" + std::string(fqn) + "'" +
             (offsets ? " at " + dimsText(*offsets) : "");
    };
    // The checks and messages of validateMetadata, as far as one entry shows.
    if (relativePath.empty() || relativePath.find('/') != std::string_view::npos ||
        relativePath.find('\\') != std::string_view::npos || relativePath == "." ||
        relativePath == "..")
      return fail(makeError(where() + ": relative_path '" + std::string(relativePath) +
                            "' is not a plain file name"));
    lookupKey_.assign(fqn);
    auto found = keys_.find(lookupKey_);
    if (found == keys_.end() || found->second.isBytes == (offsets != nullptr) ||
        (offsets && offsets->size() != found->second.size.size()))
      return fail(makeError(where() + " matches no chunk of state_dict_metadata"));
    ++found->second.stored;
    if (length > std::numeric_limits<uint64_t>::max() - offset ||
        offset + length > uint64_t(std::numeric_limits<int64_t>::max()))
      return fail(makeError(where() + ": byte range overflows"));
    if (relativePath != lastPath_) {
      lastPath_.assign(relativePath);
      lastPathSlot_ = MemoSlot();
    }
    storage_.beforeItem();
    emitIndex(w_, names_, fqn, found->second.fqnSlot, offsets, index);
    emitStorageInfo(w_, names_, relativePath, lastPathSlot_, offset, length, transformDescriptors);
    storage_.afterItem();
    drain();
  }

  Result<uint64_t> finish(const std::optional<StorageMeta> &storageMeta,
                          const std::optional<std::string> &version) {
    if (section_ == Section::Done)
      fail(makeError("dcp metadata writer: finish called twice"));
    if (!failed_ && beginStorage()) {
      storage_.flush();
      // One storage entry per chunk (per bytes item): the counts must agree.
      for (const KeyState *key : keyOrder_) {
        uint64_t expected = key->isBytes ? 1 : key->chunks;
        if (key->stored != expected) {
          fail(corruptMetadata("dcp metadata: '" + key->fqn + "' has " + std::to_string(expected) +
                               (key->isBytes ? " item" : " chunks") + " but " +
                               std::to_string(key->stored) + " storage_data entries"));
          break;
        }
      }
    }
    if (failed_)
      return error_;
    w_.sharedString("storage_meta");
    if (storageMeta)
      emitStorageMeta(w_, *storageMeta);
    else
      w_.none();
    w_.sharedString("version");
    emitOptionalString(w_, version);
    w_.setItems();
    w_.build();
    section_ = Section::Done;
    Result<std::string> rest = w_.finish();
    if (!rest)
      return rest.failure();
    if (Status s = sink_(*rest); !s)
      return s.failure();
    written_ += rest->size();
    return written_;
  }

  Status status() const {
    if (failed_)
      return error_;
    return w_.status();
  }

private:
  enum class Section { StateDict, PlannerData, StorageData, Done };
  struct KeyState {
    std::string fqn;
    bool isBytes = false;
    Dims size;
    uint64_t chunks = 0;
    uint64_t stored = 0; // storage_data entries
    MemoSlot fqnSlot;
  };

  void fail(Error error) {
    if (!failed_) {
      failed_ = true;
      error_ = std::move(error);
    }
  }

  /// Hands the pending bytes to the sink once there is a block of them.
  void drain() {
    if (w_.pending().size() < blockBytes_ || failed_)
      return;
    if (Status s = w_.status(); !s)
      return fail(s.failure());
    if (Status s = sink_(w_.pending()); !s)
      return fail(s.failure());
    written_ += w_.pending().size();
    w_.clearPending();
  }

  bool beginEntry(std::string_view fqn, bool isBytes, const Dims &size) {
    if (failed_)
      return false;
    if (section_ != Section::StateDict) {
      fail(makeError("dcp metadata writer: state_dict_metadata entry '" + std::string(fqn) +
                     "' after planner_data"));
      return false;
    }
    closeTensor();
    auto [it, inserted] = keys_.try_emplace(std::string(fqn));
    if (!inserted) {
      fail(corruptMetadata("dcp metadata: key '" + std::string(fqn) + "' appears twice"));
      return false;
    }
    for (int64_t dim : size)
      if (dim < 0) {
        fail(corruptMetadata("dcp metadata: '" + std::string(fqn) + "' has a negative size " +
                             dimsText(size)));
        return false;
      }
    KeyState &key = it->second;
    key.fqn = it->first;
    key.isBytes = isBytes;
    key.size = size;
    keyOrder_.push_back(&key);
    current_ = &key;
    entries_.beforeItem();
    return true;
  }

  void closeTensor() {
    if (!inTensor_)
      return;
    chunks_.flush();
    closeTensorStorage(w_);
    entries_.afterItem();
    inTensor_ = false;
    drain();
  }

  void endStateDict() {
    closeTensor();
    entries_.flush();
  }

  /// Opens storage_data once planner_data is done; false (failed) before.
  bool beginStorage() {
    if (section_ == Section::StorageData)
      return true;
    if (section_ != Section::PlannerData) {
      fail(makeError("dcp metadata writer: storage_data before planner_data (call plannerData "
                     "or noPlannerData first)"));
      return false;
    }
    paths_.flush();
    w_.sharedString("storage_data");
    w_.emptyDict();
    section_ = Section::StorageData;
    return true;
  }

  pickle::Writer w_;
  ByteSink sink_;
  size_t blockBytes_;
  uint64_t written_ = 0;
  bool failed_ = false;
  Error error_;
  Section section_ = Section::StateDict;
  bool inTensor_ = false;
  bool plannerIsDict_ = false;
  Batched entries_, chunks_, paths_, storage_;
  // Node-based: pointers to values stay valid as keys are added.
  std::unordered_map<std::string, KeyState> keys_;
  std::vector<KeyState *> keyOrder_;
  KeyState *current_ = nullptr;
  std::string lookupKey_; // reused, so lookups do not allocate
  RepeatedNames names_;
  // Consecutive entries mostly share a file.
  std::string lastPath_;
  MemoSlot lastPathSlot_;
};

MetadataStreamWriter::MetadataStreamWriter(ByteSink sink, size_t blockBytes)
    : impl_(std::make_unique<Impl>(std::move(sink), blockBytes)) {}
MetadataStreamWriter::~MetadataStreamWriter() = default;

void MetadataStreamWriter::tensor(std::string_view fqn, const TensorProperties &properties,
                                  const Dims &size) {
  impl_->tensor(fqn, properties, size);
}
void MetadataStreamWriter::chunk(const Dims &offsets, const Dims &sizes) {
  impl_->chunk(offsets, sizes);
}
void MetadataStreamWriter::bytesItem(std::string_view fqn) { impl_->bytesItem(fqn); }
void MetadataStreamWriter::plannerData() { impl_->plannerData(/*present=*/true); }
void MetadataStreamWriter::noPlannerData() { impl_->plannerData(/*present=*/false); }
void MetadataStreamWriter::plannerPath(std::string_view key, const std::vector<PathPart> &parts) {
  impl_->plannerPath(key, parts);
}
void MetadataStreamWriter::storage(std::string_view fqn, const Dims *offsets,
                                   std::optional<int64_t> index, std::string_view relativePath,
                                   uint64_t offset, uint64_t length,
                                   const std::vector<std::string> *transformDescriptors) {
  impl_->storage(fqn, offsets, index, relativePath, offset, length, transformDescriptors);
}
Result<uint64_t> MetadataStreamWriter::finish(const std::optional<StorageMeta> &storageMeta,
                                              const std::optional<std::string> &version) {
  return impl_->finish(storageMeta, version);
}
Status MetadataStreamWriter::status() const { return impl_->status(); }

} // namespace dcp
} // namespace fsdp
