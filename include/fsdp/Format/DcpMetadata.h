//===- DcpMetadata.h - PyTorch DCP `.metadata` as typed structs -*- C++ -*-===//
//
// `torch.distributed.checkpoint.metadata.Metadata` (docs/CheckpointFormat.md):
// which keys a checkpoint holds (tensor shapes, dtypes and chunk boxes, or
// opaque bytes items), where each chunk's bytes are (storage_data), the key
// nesting for dcp_to_torch_save (planner_data), storage_meta and version.
//
// Reading accepts what real writers produce: protocol 2/4/5 with memo
// sharing, torch.Size or plain tuples/lists for shapes and offsets, the
// layout as a global or as torch.serialization._get_layout('torch.strided'),
// TensorProperties state as the 5- or 6-tuple or the old dict, checkpoint_id
// as a str or a pathlib path, unknown extra attributes (ignored). Writing emits
// protocol 2 in PyTorch's field order, with torch.Size objects, the
// _get_layout form PyTorch itself pickles, and checkpoint_id as a plain str
// (never a pathlib object, which another Python version may fail to unpickle).
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_FORMAT_DCPMETADATA_H
#define FSDP_FORMAT_DCPMETADATA_H

#include "fsdp/Format/Pickle.h"
#include "fsdp/Support/Result.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace fsdp {
namespace dcp {

//===----------------------------------------------------------------------===//
// dtypes
//===----------------------------------------------------------------------===//

enum class DType : uint8_t {
  Float64,
  Float32,
  Float16,
  BFloat16,
  Int64,
  Int32,
  Int16,
  Int8,
  UInt8,
  Bool,
  Complex32,
  Complex64,
  Complex128,
  Float8E4M3FN,
  Float8E4M3FNUZ,
  Float8E5M2,
  Float8E5M2FNUZ,
  Float8E8M0FNU,
  UInt16,
  UInt32,
  UInt64,
};

struct DTypeInfo {
  DType dtype;
  const char *name;          // torch attribute: "float32"
  unsigned elementSize;      // bytes
  const char *legacyStorage; // torch.<X>Storage for _rebuild_tensor_v2, or
                             // null: saved with _rebuild_tensor_v3
};

const DTypeInfo &dtypeInfo(DType dtype);
/// The torch name ("float32"), or "#N" for a code outside the table.
std::string dtypeNameOrCode(DType dtype);
/// Looks up "float32" or "torch.float32"; null if unknown.
const DTypeInfo *findDType(std::string_view name);
/// The dtype whose legacy storage class is `storageClass` ("FloatStorage").
const DTypeInfo *findDTypeByStorage(std::string_view storageClass);

//===----------------------------------------------------------------------===//
// Metadata
//===----------------------------------------------------------------------===//

using Dims = std::vector<int64_t>;

struct TensorProperties {
  DType dtype = DType::Float32;
  std::string layout = "torch.strided";
  bool requiresGrad = false;
  /// _MEM_FORMAT_ENCODING: 0 contiguous, 1 channels_last, 2 preserve.
  int memoryFormat = 0;
  bool pinMemory = false;
  bool operator==(const TensorProperties &o) const {
    return dtype == o.dtype && layout == o.layout && requiresGrad == o.requiresGrad &&
           memoryFormat == o.memoryFormat && pinMemory == o.pinMemory;
  }
};

/// One saved box of a tensor: elements [offsets, offsets + sizes).
struct ChunkMetadata {
  Dims offsets;
  Dims sizes;
  bool operator==(const ChunkMetadata &o) const { return offsets == o.offsets && sizes == o.sizes; }
};

/// A state_dict_metadata value: TensorStorageMetadata, or
/// BytesStorageMetadata when `isBytes` (then the other fields are unused).
struct StorageMetadata {
  bool isBytes = false;
  TensorProperties properties;
  Dims size; // global shape
  std::vector<ChunkMetadata> chunks;
  bool operator==(const StorageMetadata &o) const {
    return isBytes == o.isBytes &&
           (isBytes || (properties == o.properties && size == o.size && chunks == o.chunks));
  }
};

/// MetadataIndex: a chunk's key (fqn, chunk offsets) plus a position hint;
/// bytes items have no offset and index None.
struct MetadataIndex {
  std::string fqn;
  std::optional<Dims> offset;
  std::optional<int64_t> index;
  bool operator==(const MetadataIndex &o) const {
    return fqn == o.fqn && offset == o.offset && index == o.index;
  }
};

/// _StorageInfo: the item's byte range [offset, offset + length) in
/// relative_path.
struct StorageInfo {
  std::string relativePath;
  uint64_t offset = 0;
  uint64_t length = 0;
  /// e.g. {"stream.zstd/1"}; absent unless stream transforms were used.
  std::optional<std::vector<std::string>> transformDescriptors;
  bool operator==(const StorageInfo &o) const {
    return relativePath == o.relativePath && offset == o.offset && length == o.length &&
           transformDescriptors == o.transformDescriptors;
  }
};

struct StorageMeta {
  /// A pathlib checkpoint_id is read back as its string form.
  std::optional<std::string> checkpointId;
  std::string saveId;
  std::optional<std::string> loadId;
  std::vector<std::string> modules;
  bool operator==(const StorageMeta &o) const {
    return checkpointId == o.checkpointId && saveId == o.saveId && loadId == o.loadId &&
           modules == o.modules;
  }
};

/// One part of a planner_data path: a dict key or a list index.
using PathPart = std::variant<std::string, int64_t>;

struct Metadata {
  /// In file order (PyTorch's global plan order).
  std::vector<std::pair<std::string, StorageMetadata>> stateDictMetadata;
  std::vector<std::pair<MetadataIndex, StorageInfo>> storageData;
  /// flat key -> path parts. Absent when None or in a form we do not know
  /// (custom planners); the default planner always writes it.
  std::optional<std::vector<std::pair<std::string, std::vector<PathPart>>>> plannerData;
  std::optional<StorageMeta> storageMeta;
  std::optional<std::string> version;

  /// Linear lookups; build an index for repeated use on large checkpoints.
  const StorageMetadata *find(std::string_view fqn) const;
  /// The storage of the chunk of `fqn` at `offsets` (nullopt: a bytes item).
  const StorageInfo *findStorage(std::string_view fqn, const std::optional<Dims> &offsets) const;
  bool operator==(const Metadata &o) const {
    return stateDictMetadata == o.stateDictMetadata && storageData == o.storageData &&
           plannerData == o.plannerData && storageMeta == o.storageMeta && version == o.version;
  }
};

/// Consistency a loader relies on: unique keys; every chunk has the tensor's
/// rank, non-negative offsets and sizes and lies inside the tensor; every
/// tensor chunk and every bytes key has exactly one storage_data entry with
/// the same (fqn, offsets), and every storage_data entry belongs to one.
/// Chunk overlap and coverage are the layout library's business.
Status validateMetadata(const Metadata &metadata);

/// Converts a parsed `.metadata` pickle, then validates it; fails when the
/// converted values would exceed `budgetBytes` (memo references let a small
/// pickle repeat one large value many times).
Result<Metadata> metadataFromPickle(const pickle::Value &root, uint64_t budgetBytes = uint64_t(1)
                                                                                      << 40);

/// Parses `.metadata` bytes (restricted unpickler with the DCP allow-list).
Result<Metadata> parseMetadata(std::string_view bytes);

/// Validates, then pickles (protocol 2) what torch.distributed.checkpoint
/// unpickles into an equal Metadata. Written by a MetadataStreamWriter.
Result<std::string> serializeMetadata(const Metadata &metadata);

/// Takes a streamed pickle piece by piece, in order; a failure stops the
/// writer.
using ByteSink = std::function<Status(std::string_view bytes)>;

/// Writes a `.metadata` pickle to a sink entry by entry, so a checkpoint of
/// millions of chunks is held neither as a Metadata nor as one string. The
/// bytes are serializeMetadata's for the same Metadata, which writes through
/// this class. Calls follow the pickle's order:
///   1. every state_dict_metadata entry: tensor() then each of its chunk()s,
///      or bytesItem();
///   2. plannerData() then plannerPath() per key, or noPlannerData();
///   3. storage() per storage_data entry;
///   4. finish().
/// Each call is checked as it comes: keys unique, chunks inside their tensor,
/// every storage entry naming a key of the right kind, with a plain file name
/// and a byte range that does not overflow, and at the end as many storage
/// entries per key as it has chunks. What needs the whole (no two chunks at
/// the same offsets, each entry's offsets those of one chunk) is
/// validateMetadata's. The first error stops the writer: later calls do
/// nothing and finish returns it.
class MetadataStreamWriter {
public:
  /// The sink gets blocks of about `blockBytes` (the last one shorter).
  explicit MetadataStreamWriter(ByteSink sink, size_t blockBytes = size_t(1) << 20);
  ~MetadataStreamWriter();
  MetadataStreamWriter(const MetadataStreamWriter &) = delete;
  MetadataStreamWriter &operator=(const MetadataStreamWriter &) = delete;

  void tensor(std::string_view fqn, const TensorProperties &properties, const Dims &size);
  void chunk(const Dims &offsets, const Dims &sizes);
  void bytesItem(std::string_view fqn);
  void plannerData();
  void plannerPath(std::string_view key, const std::vector<PathPart> &parts);
  void noPlannerData();
  /// A storage_data entry: MetadataIndex(fqn, offsets, index) -> its bytes.
  /// `offsets` is null for bytes items.
  void storage(std::string_view fqn, const Dims *offsets, std::optional<int64_t> index,
               std::string_view relativePath, uint64_t offset, uint64_t length,
               const std::vector<std::string> *transformDescriptors = nullptr);
  /// Ends the pickle; returns the number of bytes the sink got.
  Result<uint64_t> finish(const std::optional<StorageMeta> &storageMeta,
                          const std::optional<std::string> &version);
  /// The first error so far, if any.
  Status status() const;

  class Impl;

private:
  std::unique_ptr<Impl> impl_;
};

/// Feeds every entry of `metadata` (not validated here) to `writer` in
/// serializeMetadata's order and finishes it; the pickle's size.
Result<uint64_t> writeMetadata(const Metadata &metadata, MetadataStreamWriter &writer);

} // namespace dcp
} // namespace fsdp

#endif // FSDP_FORMAT_DCPMETADATA_H
