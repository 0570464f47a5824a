//===- Load.cpp - Load any DCP checkpoint into a plan's layout ------------===//
#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Layout/Overlap.h"
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/Values.h"
#include "RuntimeSupport.h"

#include <chrono>
#include <cstring>
#include <unordered_map>

namespace fsdp {
namespace runtime {

namespace {

/// One saved item, opened once: where its raw data starts and how the
/// tensor views it.
struct OpenedItem {
  const zip::ByteSource *file = nullptr;
  std::string fileName;
  uint64_t itemOffset = 0, itemLength = 0;
  uint64_t dataOffset = 0; // absolute, of the storage's first byte
  zip::TensorRecord record;
  bool contiguous = true;
  std::string key;
  /// The integrity index has this item; verified once, then trusted.
  bool checksummed = false;
  bool verified = false;
};

class Loader {
public:
  Loader(const std::string &dir, Storage &storage, const LoadOptions &options)
      : dir_(dir), storage_(storage), options_(options) {}

  Status open() {
    if (Status status = refuseStagingDir(dir_); !status)
      return status;
    Result<std::unique_ptr<zip::ByteSource>> metadataFile = storage_.openRead(dir_ + "/.metadata");
    if (!metadataFile)
      return propagate(metadataFile, metadataFile.error() +
                       " (no committed checkpoint here; an interrupted save leaves none)");
    std::string bytes((*metadataFile)->size(), '\0');
    if (Status status = (*metadataFile)->read(0, bytes.data(), bytes.size()); !status)
      return status;
    Result<dcp::Metadata> metadata = dcp::parseMetadata(bytes);
    if (!metadata)
      return propagate(metadata, dir_ + "/.metadata: " + metadata.error());
    metadata_ = metadata.take();
    // Our checkpoints carry an integrity index: check `.metadata` with it.
    std::string indexPath = dir_ + "/" + integrity::kIndexFileName;
    if (options_.verifyChecksums && storage_.exists(indexPath)) {
      Result<std::unique_ptr<zip::ByteSource>> indexFile = storage_.openRead(indexPath);
      if (!indexFile)
        return indexFile.failure();
      std::string indexBytes((*indexFile)->size(), '\0');
      if (Status status = (*indexFile)->read(0, indexBytes.data(), indexBytes.size()); !status)
        return status;
      Result<integrity::IntegrityIndex> index = integrity::parseIndex(indexBytes);
      if (!index)
        return propagate(index, indexPath + ": " + index.error());
      if (index->metadataLength != bytes.size() ||
          index->metadataXxh3 != integrity::xxh3(bytes.data(), bytes.size()))
        return makeError(dir_ + "/.metadata: checksum mismatch against " +
                         integrity::kIndexFileName + " (the file is corrupt)");
      for (const integrity::ItemChecksum &item : index->items)
        checksums_[{item.file, item.offset}] = item;
    }
    for (size_t i = 0; i < metadata_.stateDictMetadata.size(); ++i)
      keys_[metadata_.stateDictMetadata[i].first] = i;
    for (const auto &[index, info] : metadata_.storageData)
      storage_info_[{index.fqn, index.offset.value_or(dcp::Dims())}] = &info;
    return Status::success();
  }

  Status loadPiece(const plan::ReadItem &read, RankBuffers &buffers) {
    const dcp::StorageMetadata *saved = find(read.key);
    if (!saved)
      return makeError(read.key + ": missing in " + dir_ + "/.metadata");
    if (saved->isBytes)
      return makeError(read.key + ": " + dir_ + " holds a bytes item, the plan expects a tensor");
    if (saved->size != read.globalShape)
      return makeError(read.key + ": shape mismatch: " + dir_ + " has " + dimsText(saved->size) +
                       ", the plan expects " + dimsText(read.globalShape));
    if (saved->properties.dtype != read.dtype)
      return makeError(read.key + ": dtype mismatch: " + dir_ + " has " +
                       dcp::dtypeInfo(saved->properties.dtype).name + ", the plan expects " +
                       dcp::dtypeInfo(read.dtype).name);
    Result<BufferView> view = buffers.get(read.buffer.group, read.buffer.role);
    if (!view)
      return propagate(view, read.key + ": " + view.error());
    uint64_t elementSize = dcp::dtypeInfo(read.dtype).elementSize;
    if (view->dtype != read.dtype ||
        static_cast<uint64_t>(read.buffer.localOffset + read.buffer.elements) * elementSize >
            view->bytes)
      return makeError(read.key + ": the plan's piece does not fit its buffer");
    char *base = static_cast<char *>(view->data) + read.buffer.localOffset * elementSize;

    layout::Box target{read.chunkOffsets, read.chunkSizes};
    std::vector<layout::Box> covered;
    for (const dcp::ChunkMetadata &chunk : saved->chunks) {
      layout::Box source{chunk.offsets, chunk.sizes};
      std::optional<layout::Box> overlap = layout::intersect(source, target);
      if (!overlap)
        continue;
      covered.push_back(*overlap);
      Result<OpenedItem *> item = openItem(read.key, chunk);
      if (!item)
        return item.failure();
      if (Status status = copyOverlap(**item, source, target, elementSize, base); !status)
        return propagate(status, read.key + ": " + status.error());
    }
    if (!layout::covers(covered, target))
      return makeError(read.key + ": no saved chunk in " + dir_ + " covers part of rows [" +
                       std::to_string(target.offsets.empty() ? 0 : target.offsets[0]) + ", " +
                       std::to_string(target.offsets.empty() ? 0 : target.offsets[0] + target.sizes[0]) +
                       "): the checkpoint does not tile the tensor");
    bytesRead_ += static_cast<uint64_t>(read.buffer.elements) * elementSize;
    return Status::success();
  }

  Result<float> loadStep(const plan::ReadItem &read) {
    const dcp::StorageMetadata *saved = find(read.key);
    if (!saved)
      return makeError(read.key + ": missing in " + dir_ + "/.metadata");
    if (saved->isBytes || !saved->size.empty() || saved->chunks.size() != 1 ||
        saved->properties.dtype != dcp::DType::Float32)
      return makeError(read.key + ": expected a 0-d float32 tensor in " + dir_);
    Result<OpenedItem *> item = openItem(read.key, saved->chunks[0]);
    if (!item)
      return item.failure();
    std::string storage((*item)->record.storageBytes(), '\0');
    if (Status status = readStorage(**item, storage.data()); !status)
      return propagate(status, read.key + ": " + status.error());
    float step = 0;
    std::memcpy(&step, storage.data() + (*item)->record.storageOffset * sizeof(float), sizeof(step));
    return step;
  }

  /// Every bytes item's raw archive, verified: what a reshard carries over.
  Result<std::map<std::string, std::string>> bytesItems() {
    std::map<std::string, std::string> out;
    for (const auto &[key, storage] : metadata_.stateDictMetadata) {
      if (!storage.isBytes)
        continue;
      auto info = storage_info_.find({key, dcp::Dims()});
      if (info == storage_info_.end())
        return makeError(key + ": no storage entry in " + dir_ + "/.metadata");
      Result<const zip::ByteSource *> file = openFile(info->second->relativePath);
      if (!file)
        return file.failure();
      std::string bytes(info->second->length, '\0');
      if (Status status = (*file)->read(info->second->offset, bytes.data(), bytes.size()); !status)
        return propagate(status, key + ": " + status.error());
      if (Status status = checkItem(info->second->relativePath, info->second->offset, bytes); !status)
        return propagate(status, key + ": " + status.error());
      out[key] = std::move(bytes);
    }
    return out;
  }

  uint64_t bytesRead() const { return bytesRead_; }

private:
  static std::string dimsText(const dcp::Dims &dims) {
    std::string text = "[";
    for (size_t i = 0; i < dims.size(); ++i)
      text += (i ? ", " : "") + std::to_string(dims[i]);
    return text + "]";
  }

  const dcp::StorageMetadata *find(const std::string &key) const {
    auto found = keys_.find(key);
    return found == keys_.end() ? nullptr : &metadata_.stateDictMetadata[found->second].second;
  }

  Result<const zip::ByteSource *> openFile(const std::string &name) {
    auto &slot = files_[name];
    if (!slot) {
      Result<std::unique_ptr<zip::ByteSource>> file = storage_.openRead(dir_ + "/" + name);
      if (!file)
        return file.failure();
      slot = file.take();
    }
    return slot.get();
  }

  /// Verifies an item against the integrity index, if it has the item.
  Status checkItem(const std::string &file, uint64_t offset, const std::string &bytes) {
    auto found = checksums_.find({file, offset});
    if (found == checksums_.end())
      return Status::success();
    if (found->second.length != bytes.size() ||
        found->second.xxh3 != integrity::xxh3(bytes.data(), bytes.size()))
      return makeError(dir_ + "/" + file + ": checksum mismatch in the item at " +
                       std::to_string(offset) + " (" + found->second.key + "): the file is corrupt");
    return Status::success();
  }

  Result<OpenedItem *> openItem(const std::string &key, const dcp::ChunkMetadata &chunk) {
    auto info = storage_info_.find({key, chunk.offsets});
    if (info == storage_info_.end())
      return makeError(key + ": the chunk at " + dimsText(chunk.offsets) + " has no storage entry in " +
                       dir_ + "/.metadata");
    const dcp::StorageInfo &where = *info->second;
    auto &slot = items_[{where.relativePath, where.offset}];
    if (slot)
      return slot.get();
    if (where.transformDescriptors && !where.transformDescriptors->empty())
      return makeError(key + ": stored with transforms (" + where.transformDescriptors->front() +
                       "), which this runtime does not read");
    Result<const zip::ByteSource *> file = openFile(where.relativePath);
    if (!file)
      return file.failure();
    std::string path = dir_ + "/" + where.relativePath;
    if (where.offset > (*file)->size() || where.length > (*file)->size() - where.offset)
      return makeError(path + ": item " + key + " at " + std::to_string(where.offset) + " (" +
                       std::to_string(where.length) + " bytes) lies past the end of the file (" +
                       std::to_string((*file)->size()) + " bytes): truncated file");
    zip::SliceSource slice(**file, where.offset, where.length);
    // A damaged item of ours is reported as what it is: a checksum mismatch.
    auto damaged = [&](const std::string &error) -> Error {
      if (checksums_.count({where.relativePath, where.offset})) {
        std::string bytes(where.length, '\0');
        if ((*file)->read(where.offset, bytes.data(), bytes.size()))
          if (Status status = checkItem(where.relativePath, where.offset, bytes); !status)
            return propagate(status, key + ": " + status.error());
      }
      return makeError(path + ": item " + key + ": " + error);
    };
    Result<zip::TorchSaveItem> opened = zip::openTorchSaveItem(slice);
    if (!opened)
      return damaged(opened.error());
    Result<zip::TensorRecord> record = zip::decodeTensorPickle(opened->dataPkl);
    if (!record)
      return damaged(record.error());
    const zip::Entry *data = opened->findRecord("data/" + record->storageKey);
    if (!data)
      return makeError(path + ": item " + key + " has no data/" + record->storageKey + " record");
    if (record->dtype != find(key)->properties.dtype)
      return makeError(path + ": item " + key + " holds " + dcp::dtypeInfo(record->dtype).name +
                       " but .metadata says " + dcp::dtypeInfo(find(key)->properties.dtype).name);
    if (record->size != chunk.sizes)
      return makeError(path + ": item " + key + " has shape " + dimsText(record->size) +
                       " but .metadata says " + dimsText(chunk.sizes));
    if (data->size < record->storageBytes() || opened->bigEndian)
      return makeError(path + ": item " + key + ": storage record too short or big-endian");
    auto item = std::make_unique<OpenedItem>();
    item->file = *file;
    item->fileName = path;
    item->itemOffset = where.offset;
    item->itemLength = where.length;
    item->dataOffset = where.offset + data->dataOffset;
    item->record = *record;
    item->key = key;
    item->checksummed = checksums_.count({where.relativePath, where.offset}) > 0;
    // C order?
    int64_t expected = 1;
    for (size_t d = record->size.size(); d-- > 0;) {
      if (record->size[d] != 1 && record->stride[d] != expected)
        item->contiguous = false;
      expected *= record->size[d];
    }
    slot = std::move(item);
    return slot.get();
  }

  /// Compares an item's hash with the index; marks it verified.
  Status settle(OpenedItem &item, uint64_t digest) {
    const integrity::ItemChecksum &expected =
        checksums_.at({baseName(item.fileName), item.itemOffset});
    if (expected.length != item.itemLength || expected.xxh3 != digest)
      return makeError(item.fileName + ": checksum mismatch in the item at " +
                       std::to_string(item.itemOffset) + " (" + expected.key +
                       "): the file is corrupt");
    item.verified = true;
    return Status::success();
  }

  bool needsCheck(const OpenedItem &item) const {
    return item.checksummed && !item.verified && options_.verifyChecksums;
  }

  /// The item's whole storage into `destination`, checked against the
  /// index the first time the item is read.
  Status readStorage(OpenedItem &item, char *destination) {
    if (!needsCheck(item))
      return item.file->read(item.dataOffset, destination, item.record.storageBytes());
    return readAndVerify(item, destination);
  }

  /// Reads the item's storage into `destination` in cache-sized blocks,
  /// hashing each block while it is hot, and checks the item's checksum.
  Status readAndVerify(OpenedItem &item, char *destination) {
    uint64_t dataBegin = item.dataOffset - item.itemOffset;
    uint64_t dataBytes = item.record.storageBytes();
    if (dataBegin > item.itemLength || dataBytes > item.itemLength - dataBegin)
      return makeError(item.fileName + ": item " + item.key + " is malformed");
    std::string before(dataBegin, '\0'), after(item.itemLength - dataBegin - dataBytes, '\0');
    if (Status status = item.file->read(item.itemOffset, before.data(), before.size()); !status)
      return status;
    integrity::StreamingXxh3 hash;
    hash.update(before.data(), before.size());
    constexpr uint64_t kBlock = 1 << 20;
    for (uint64_t at = 0; at < dataBytes; at += kBlock) {
      uint64_t size = std::min(kBlock, dataBytes - at);
      if (Status status = item.file->read(item.dataOffset + at, destination + at, size); !status)
        return status;
      hash.update(destination + at, size);
    }
    if (Status status = item.file->read(item.dataOffset + dataBytes, after.data(), after.size());
        !status)
      return status;
    hash.update(after.data(), after.size());
    return settle(item, hash.digest());
  }

  /// Copies source ∩ target into the target piece at `base`.
  Status copyOverlap(OpenedItem &item, const layout::Box &source, const layout::Box &target,
                     uint64_t elementSize, char *base) {
    std::vector<layout::CopyRun> runs;
    layout::overlapRuns(source, target, runs);
    // The whole saved chunk lands contiguously in the piece (a load into the
    // layout it was saved from): one read straight into the buffer, hashed
    // there.
    if (item.contiguous && item.record.storageOffset == 0 && runs.size() == 1 &&
        runs[0].srcElementOffset == 0 &&
        static_cast<uint64_t>(runs[0].count) == item.record.storageElements) {
      return readStorage(item, base + runs[0].dstElementOffset * elementSize);
    }
    if (item.contiguous && !needsCheck(item)) {
      // Row-range chunks: exactly one run, one contiguous read.
      for (const layout::CopyRun &run : runs)
        if (Status status = item.file->read(
                item.dataOffset + (item.record.storageOffset + run.srcElementOffset) * elementSize,
                base + run.dstElementOffset * elementSize, run.count * elementSize);
            !status)
          return status;
      return Status::success();
    }
    // Read (and check) the storage once; serve the runs from memory, in C
    // order (PyTorch may save strided views).
    std::string storage(item.record.storageBytes(), '\0');
    if (Status status = readStorage(item, storage.data()); !status)
      return status;
    std::string dense;
    const char *elements = storage.data() + item.record.storageOffset * elementSize;
    if (!item.contiguous) {
      dense.assign(item.record.elementCount() * elementSize, '\0');
      if (Status status = zip::copyToContiguous(item.record, storage.data(), storage.size(),
                                                dense.data());
          !status)
        return status;
      elements = dense.data();
    }
    for (const layout::CopyRun &run : runs)
      std::memcpy(base + run.dstElementOffset * elementSize,
                  elements + run.srcElementOffset * elementSize, run.count * elementSize);
    return Status::success();
  }

  std::string dir_;
  Storage &storage_;
  const LoadOptions &options_;
  dcp::Metadata metadata_;
  std::unordered_map<std::string, size_t> keys_;
  std::map<std::pair<std::string, dcp::Dims>, const dcp::StorageInfo *> storage_info_;
  std::map<std::pair<std::string, uint64_t>, integrity::ItemChecksum> checksums_;
  std::map<std::string, std::unique_ptr<zip::ByteSource>> files_;
  std::map<std::pair<std::string, uint64_t>, std::unique_ptr<OpenedItem>> items_;
  uint64_t bytesRead_ = 0;
};

Status refreshModelWeights(const plan::RankPlan &plan, RankBuffers &buffers) {
  for (const plan::LocalBuffer &buffer : plan.buffers) {
    if (buffer.role != plan::BufferRole::ModelWeight || buffer.aliasesMainWeight)
      continue;
    Result<BufferView> main = buffers.get(buffer.group, plan::BufferRole::MainWeight);
    Result<BufferView> model = buffers.get(buffer.group, plan::BufferRole::ModelWeight);
    if (!main || !model)
      return makeError(!main ? main.error() : model.error());
    if (Status status = castElements(main->dtype, main->data, model->dtype, model->data,
                                     static_cast<uint64_t>(std::min(main->elements, model->elements)));
        !status)
      return makeError("refreshing model_weight of group " + std::to_string(buffer.group) + ": " +
                       status.error());
  }
  return Status::success();
}

} // namespace

Result<LoadResult> loadCheckpoint(const plan::RankPlan &plan, RankBuffers &buffers,
                                  const std::string &dir, Communicator &comm, Storage &storage,
                                  const LoadOptions &options) {
  auto start = std::chrono::steady_clock::now();
  LoadResult result;
  Loader loader(trimSlashes(dir), storage, options);
  Status status = loader.open();
  uint64_t total = 0, reported = 0;
  for (const plan::ReadItem &read : plan.reads)
    total += read.source == plan::ItemSource::Buffer ? read.dataLength : 0;
  for (const plan::ReadItem &read : plan.reads) {
    if (!status)
      break;
    if (read.source == plan::ItemSource::Buffer) {
      status = loader.loadPiece(read, buffers);
      ++result.stats.items;
    } else if (read.source == plan::ItemSource::Step) {
      Result<float> step = loader.loadStep(read);
      if (!step)
        status = step.failure();
      else if (!result.step)
        result.step = *step;
      ++result.stats.items;
    }
    if (status && options.progress && (loader.bytesRead() - reported > (256u << 20))) {
      reported = loader.bytesRead();
      options.progress({loader.bytesRead(), total,
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
    }
  }
  if (status) {
    Result<std::map<std::string, std::string>> bytes = loader.bytesItems();
    if (!bytes)
      status = bytes.failure();
    else
      result.bytesItems = bytes.take();
  }
  if (status && options.syncModelWeights)
    status = refreshModelWeights(plan, buffers);
  if (Status agreed = agree(comm, status, 0); !agreed)
    return propagate(agreed, "load from " + trimSlashes(dir) + " failed: " + agreed.error());
  result.stats.bytes = loader.bytesRead();
  result.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.progress)
    options.progress({loader.bytesRead(), total, result.stats.seconds});
  return result;
}

} // namespace runtime
} // namespace fsdp
