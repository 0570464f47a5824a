//===- CheckpointReader.cpp - The one reader of a checkpoint directory ----===//
#include "fsdp/Runtime/CheckpointReader.h"
#include "RuntimeSupport.h"
#include "fsdp/Format/Pickle.h"
#include "fsdp/Layout/Overlap.h"
#include "fsdp/Support/Printable.h"

#include <algorithm>
#include <new>
#include <utility>

namespace fsdp {
namespace runtime {

namespace {

constexpr uint64_t kBlock = 1 << 20;

Error corrupt(std::string message) { return makeError(std::move(message), ErrorKind::Corrupt); }

/// [offset, offset + length) inside [0, size), without overflow.
bool inBounds(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

/// A whole file, its size taken from the file itself. When it does not fit
/// in memory, a pickle is told apart from a pickle followed by gigabytes of
/// something else (a sparse file, say) by parsing its first 64 MiB.
Result<std::string> readWholeFile(Storage &storage, const std::string &path, bool isPickle) {
  Result<std::unique_ptr<zip::ByteSource>> file = storage.openRead(path);
  if (!file)
    return file.failure();
  std::string bytes;
  try {
    bytes.resize((*file)->size());
  } catch (const std::bad_alloc &) {
    std::string prefix(std::min<uint64_t>((*file)->size(), 64u << 20), '\0');
    if (isPickle && (*file)->read(0, prefix.data(), prefix.size()))
      if (Result<pickle::Document> document = pickle::read(prefix))
        return corrupt(printable(path) + ": the pickle ends at " + std::to_string(document->end()) +
                       " but the file has " + std::to_string((*file)->size()) +
                       " bytes (PyTorch writes none after it)");
    return makeError(printable(path) + ": " + std::to_string((*file)->size()) +
                         " bytes do not fit in memory",
                     ErrorKind::IO, ENOMEM);
  }
  if (Status status = (*file)->read(0, bytes.data(), bytes.size()); !status)
    return status.failure();
  return bytes;
}

/// xxh3 of [offset, offset + length) of `source`, read in blocks.
Result<uint64_t> hashRange(const zip::ByteSource &source, uint64_t offset, uint64_t length) {
  integrity::StreamingXxh3 hash;
  if (Status status = source.readBlocks(offset, length, nullptr,
                                        [&](uint64_t, const char *block, size_t size) {
                                          hash.update(block, size);
                                          return Status::success();
                                        });
      !status)
    return status.failure();
  return hash.digest();
}

} // namespace

Status CheckpointReader::checkLoadable() {
  // The bytes each data file must hold: the end of its last item.
  std::map<std::string, uint64_t> extents;
  auto extend = [&](const std::string &file, uint64_t offset, uint64_t length) {
    uint64_t &end = extents[file];
    end = std::max(end, offset + std::min(length, UINT64_MAX - offset));
  };
  if (fromChunkIndex_) {
    // Opened from the chunk index alone: tie `.metadata` to both indexes by
    // its checksum (the open compared only its length), and read every
    // record block, each checked against its checksum.
    Result<std::unique_ptr<zip::ByteSource>> metadata = storage_.openRead(dir_ + "/.metadata");
    if (!metadata)
      return propagate(metadata, printable(metadata.error()));
    Result<uint64_t> digest = hashRange(**metadata, 0, (*metadata)->size());
    if (!digest)
      return propagate(digest, pathOf(".metadata") + ": " + printable(digest.error()));
    if (*digest != chunks_->metadataXxh3())
      return corrupt(pathOf(".metadata") + ": checksum mismatch against " +
                     chunkindex::kChunkIndexFileName + " (the file is corrupt)");
    std::string indexPath = dir_ + "/" + integrity::kIndexFileName;
    if (!storage_.exists(indexPath))
      return makeError(pathOf(integrity::kIndexFileName) +
                           " is missing (the chunk index has nothing to be checked against)",
                       ErrorKind::NotFound);
    uint64_t indexRead = 0;
    Result<integrity::IntegrityIndex> index = readIntegrityIndex(indexRead);
    if (!index)
      return index.failure();
    if (index->metadataLength != (*metadata)->size() || index->metadataXxh3 != *digest)
      return corrupt(pathOf(".metadata") + ": checksum mismatch against " +
                     integrity::kIndexFileName + " (the file is corrupt)");
    for (const integrity::ItemChecksum &item : index->items) {
      if (!isPlainFileName(item.file))
        return corrupt(pathOf(integrity::kIndexFileName) + ": item " + printable(item.key) +
                       " names the file '" + printable(item.file) +
                       "', which is not a plain name inside the checkpoint directory");
      extend(item.file, item.offset, item.length);
    }
    for (uint64_t position = 0; position < chunks_->keyCount(); ++position) {
      Result<std::vector<chunkindex::Chunk>> found = chunks_->chunks(position);
      if (!found)
        return propagate(found, printable(found.error()));
      for (const chunkindex::Chunk &chunk : *found)
        extend(chunks_->fileName(chunk.file), chunk.itemOffset, chunk.itemLength);
    }
  } else if (hasIndex_) {
    for (const integrity::ItemChecksum &item : index_.items)
      extend(item.file, item.offset, item.length);
  } else {
    for (const auto &[index, info] : metadata_.storageData)
      extend(info.relativePath, info.offset, info.length);
  }
  for (const auto &[name, end] : extents) {
    Result<std::unique_ptr<zip::ByteSource>> file = storage_.openRead(dir_ + "/" + name);
    if (!file)
      return propagate(file, printable(file.error()));
    if ((*file)->size() < end)
      return corrupt(pathOf(name) + " has " + std::to_string((*file)->size()) +
                     " bytes but its items end at " + std::to_string(end) + " (truncated)");
  }
  return Status::success();
}

bool CheckpointReader::hasOptimizerState() const {
  auto isOptimizer = [](const std::string &key) { return key.rfind("optimizer.", 0) == 0; };
  if (fromChunkIndex_) {
    for (uint64_t position = 0; position < chunks_->keyCount(); ++position)
      if (isOptimizer(chunks_->key(position).name))
        return true;
    return false;
  }
  return std::any_of(metadata_.stateDictMetadata.begin(), metadata_.stateDictMetadata.end(),
                     [&](const auto &entry) { return isOptimizer(entry.first); });
}

Result<integrity::IntegrityIndex> CheckpointReader::readIntegrityIndex(uint64_t &bytes) const {
  Result<std::string> indexBytes =
      readWholeFile(storage_, dir_ + "/" + integrity::kIndexFileName, /*isPickle=*/false);
  if (!indexBytes)
    return propagate(indexBytes, printable(indexBytes.error()));
  bytes += indexBytes->size();
  Result<integrity::IntegrityIndex> index = integrity::parseIndex(*indexBytes);
  if (!index)
    return classify(index, pathOf(integrity::kIndexFileName) + ": " + printable(index.error()),
                    ErrorKind::Corrupt);
  return index;
}

std::string CheckpointReader::pathOf(const std::string &name) const {
  return printable(dir_ + "/" + name);
}

Result<std::unique_ptr<CheckpointReader>>
CheckpointReader::open(const std::string &rawDir, Storage &storage, const ReaderOptions &options) {
  std::string dir = trimSlashes(rawDir);
  // However it is named (`D.fsdp-staging/.`, a link to it, a renamed copy),
  // a staging directory is a save that never committed.
  // (A directory that does not resolve fails below, naming `.metadata`.)
  Result<std::string> resolved = storage.realPath(dir);
  std::string real = resolved ? *resolved : dir;
  if (Status status = refuseStagingDir(real); !status)
    return makeError(printable(dir) + ": " + status.error(), ErrorKind::NotFound);
  if (storage.exists(real + "/" + kUncommittedMarker))
    return makeError(printable(dir) + ": holds " + kUncommittedMarker +
                         ": the staging directory of a save that never committed; it is "
                         "incomplete and is not read",
                     ErrorKind::NotFound);
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader(dir, storage, options));
  bool usedChunkIndex = false;
  if (options.useChunkIndex)
    if (Status status = reader->openChunkIndex(usedChunkIndex); !status)
      return status.failure();
  if (!usedChunkIndex)
    if (Status status = reader->readMetadataAndIndex(); !status)
      return status.failure();
  return reader;
}

Status CheckpointReader::openChunkIndex(bool &used) {
  used = false;
  std::string path = dir_ + "/" + chunkindex::kChunkIndexFileName;
  if (!storage_.exists(path))
    return Status::success();
  // `.metadata` is the commit point: without it there is no checkpoint. Its
  // size (not its bytes) ties it to the index: one of another size belongs
  // to another save.
  Result<std::unique_ptr<zip::ByteSource>> metadata = storage_.openRead(dir_ + "/.metadata");
  if (!metadata) {
    if (metadata.kind() == ErrorKind::NotFound)
      return propagate(metadata, printable(metadata.error()) +
                                     " (no committed checkpoint here; an interrupted save "
                                     "leaves none)");
    return propagate(metadata, printable(metadata.error()));
  }
  Result<std::unique_ptr<zip::ByteSource>> source = storage_.openRead(path);
  if (!source)
    return propagate(source, printable(source.error()));
  Result<std::unique_ptr<chunkindex::ChunkIndex>> index =
      chunkindex::ChunkIndex::open(source.take(), pathOf(chunkindex::kChunkIndexFileName));
  if (!index)
    return propagate(index, printable(index.error()));
  // An index without digests (a benchmark's) beside an integrity index:
  // the digests are there, so read everything.
  if (!(*index)->hasChecksums() && storage_.exists(dir_ + "/" + integrity::kIndexFileName))
    return Status::success();
  if ((*index)->metadataLength() != (*metadata)->size())
    return corrupt(pathOf(chunkindex::kChunkIndexFileName) + ": describes a .metadata of " +
                   std::to_string((*index)->metadataLength()) + " bytes but " +
                   pathOf(".metadata") + " has " + std::to_string((*metadata)->size()) +
                   ": the chunk index belongs to another save (stale or altered)");
  chunks_ = index.take();
  fromChunkIndex_ = true;
  used = true;
  return Status::success();
}

Status CheckpointReader::readMetadataAndIndex() {
  std::string metadataPath = dir_ + "/.metadata";
  Result<std::string> bytes = readWholeFile(storage_, metadataPath, /*isPickle=*/true);
  if (!bytes) {
    if (bytes.kind() == ErrorKind::NotFound)
      return propagate(bytes, printable(bytes.error()) +
                                  " (no committed checkpoint here; an interrupted save leaves "
                                  "none)");
    return propagate(bytes, printable(bytes.error()));
  }
  Result<dcp::Metadata> metadata = dcp::parseMetadata(*bytes);
  if (!metadata)
    return classify(metadata, pathOf(".metadata") + ": " + printable(metadata.error()),
                    ErrorKind::Corrupt);
  metadata_ = metadata.take();
  bytesRead_ += bytes->size();
  metadataSize_ = bytes->size();
  metadataXxh3_ = integrity::xxh3(bytes->data(), bytes->size());
  for (const auto &[index, info] : metadata_.storageData)
    if (!isPlainFileName(info.relativePath))
      return corrupt(pathOf(".metadata") + ": item " + printable(index.fqn) + " names the file '" +
                     printable(info.relativePath) +
                     "', which is not a plain name inside the checkpoint directory");
  for (size_t i = 0; i < metadata_.stateDictMetadata.size(); ++i)
    keys_[metadata_.stateDictMetadata[i].first] = i;
  for (const auto &[index, info] : metadata_.storageData) {
    if (index.offset)
      tensorStorage_[{index.fqn, *index.offset}] = &info;
    else
      bytesStorage_[index.fqn] = &info;
  }

  std::string indexPath = dir_ + "/" + integrity::kIndexFileName;
  if (!storage_.exists(indexPath))
    return Status::success();
  uint64_t indexRead = 0;
  Result<integrity::IntegrityIndex> index = readIntegrityIndex(indexRead);
  bytesRead_ += indexRead;
  if (!index)
    return index.failure();
  index_ = index.take();
  hasIndex_ = true;
  if (index_.metadataLength != metadataSize_ || index_.metadataXxh3 != metadataXxh3_)
    return corrupt(pathOf(".metadata") + ": checksum mismatch against " +
                   integrity::kIndexFileName + " (the file is corrupt)");
  for (const integrity::ItemChecksum &item : index_.items) {
    if (!isPlainFileName(item.file))
      return corrupt(pathOf(integrity::kIndexFileName) + ": item " + printable(item.key) +
                     " names the file '" + printable(item.file) +
                     "', which is not a plain name inside the checkpoint directory");
    checksums_[{item.file, item.offset}] = &item;
  }
  return Status::success();
}

const dcp::StorageMetadata *CheckpointReader::find(const std::string &key) const {
  auto found = keys_.find(key);
  return found == keys_.end() ? nullptr : &metadata_.stateDictMetadata[found->second].second;
}

std::optional<KeyInfo> CheckpointReader::keyInfo(const std::string &key) const {
  if (fromChunkIndex_) {
    std::optional<uint64_t> position = chunks_->find(key);
    if (!position)
      return std::nullopt;
    return chunks_->key(*position);
  }
  const dcp::StorageMetadata *saved = find(key);
  if (!saved)
    return std::nullopt;
  KeyInfo info;
  info.name = key;
  info.isBytes = saved->isBytes;
  info.chunkCount = saved->isBytes ? 1 : saved->chunks.size();
  if (!saved->isBytes) {
    info.dtype = saved->properties.dtype;
    info.shape = saved->size;
  }
  return info;
}

Result<std::vector<SavedChunk>> CheckpointReader::chunksOverlapping(const std::string &key,
                                                                    const dcp::Dims &offsets,
                                                                    const dcp::Dims &sizes) const {
  layout::Box target{offsets, sizes};
  return savedChunks(key, &target);
}

Result<std::vector<SavedChunk>> CheckpointReader::chunksOf(const std::string &key) const {
  return savedChunks(key, nullptr);
}

Result<std::vector<SavedChunk>> CheckpointReader::savedChunks(const std::string &key,
                                                              const layout::Box *target) const {
  std::vector<SavedChunk> out;
  if (fromChunkIndex_) {
    std::optional<uint64_t> position = chunks_->find(key);
    if (!position || (!target && chunks_->key(*position).isBytes))
      return out;
    Result<std::vector<chunkindex::Chunk>> found =
        target ? chunks_->overlapping(*position, target->offsets, target->sizes)
               : chunks_->chunks(*position);
    if (!found)
      return propagate(found, printable(found.error()));
    for (chunkindex::Chunk &chunk : *found) {
      out.push_back({std::move(chunk.offsets), std::move(chunk.sizes),
                     chunks_->fileName(chunk.file), chunk.itemOffset, chunk.itemLength,
                     std::nullopt});
      if (chunks_->hasChecksums())
        out.back().xxh3 = chunk.xxh3;
    }
    return out;
  }
  // `.metadata`: every chunk of the key, tested one by one.
  const dcp::StorageMetadata *saved = find(key);
  if (!saved || saved->isBytes)
    return out;
  for (const dcp::ChunkMetadata &chunk : saved->chunks) {
    if (target && !layout::intersect(layout::Box{chunk.offsets, chunk.sizes}, *target))
      continue;
    const dcp::StorageInfo *where = storageOf(key, chunk.offsets);
    if (!where)
      return corrupt(printable(key) + ": the chunk at " + dimsText(chunk.offsets) +
                     " has no storage entry in " + pathOf(".metadata"));
    out.push_back(
        {chunk.offsets, chunk.sizes, where->relativePath, where->offset, where->length, {}});
  }
  std::sort(out.begin(), out.end(),
            [](const SavedChunk &a, const SavedChunk &b) { return a.offsets < b.offsets; });
  return out;
}

std::vector<std::string> CheckpointReader::bytesKeys() const { return keysOfKind(true); }

std::vector<std::string> CheckpointReader::tensorKeys() const { return keysOfKind(false); }

std::vector<std::string> CheckpointReader::keysOfKind(bool bytes) const {
  std::vector<std::string> keys;
  if (fromChunkIndex_) {
    for (uint64_t position = 0; position < chunks_->keyCount(); ++position)
      if (KeyInfo info = chunks_->key(position); info.isBytes == bytes)
        keys.push_back(std::move(info.name));
    return keys; // the index is sorted
  }
  for (const auto &[key, saved] : metadata_.stateDictMetadata)
    if (saved.isBytes == bytes)
      keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

Result<std::vector<std::vector<SavedChunk>>>
CheckpointReader::planReads(const std::vector<plan::ReadItem> &reads) const {
  std::vector<std::vector<SavedChunk>> planned(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    const plan::ReadItem &read = reads[i];
    if (read.source != plan::ItemSource::Buffer && read.source != plan::ItemSource::Step)
      continue;
    std::optional<KeyInfo> info = keyInfo(read.key);
    if (!info || info->isBytes)
      continue;
    Result<std::vector<SavedChunk>> found =
        read.source == plan::ItemSource::Step
            ? (info->shape.empty() ? chunksOverlapping(read.key, {}, {})
                                   : Result<std::vector<SavedChunk>>(std::vector<SavedChunk>()))
            : (info->shape == read.globalShape
                   ? chunksOverlapping(read.key, read.chunkOffsets, read.chunkSizes)
                   : Result<std::vector<SavedChunk>>(std::vector<SavedChunk>()));
    if (!found)
      return found.failure();
    planned[i] = found.take();
  }
  return planned;
}

const dcp::StorageInfo *CheckpointReader::storageOf(const std::string &key,
                                                    const std::optional<dcp::Dims> &offsets) const {
  if (!offsets) {
    auto found = bytesStorage_.find(key);
    return found == bytesStorage_.end() ? nullptr : found->second;
  }
  auto found = tensorStorage_.find({key, *offsets});
  return found == tensorStorage_.end() ? nullptr : found->second;
}

Result<const zip::ByteSource *> CheckpointReader::file(const std::string &name) {
  std::lock_guard<std::mutex> lock(filesMutex_);
  auto &slot = files_[name];
  if (!slot) {
    Result<std::unique_ptr<zip::ByteSource>> opened = storage_.openRead(dir_ + "/" + name);
    if (!opened)
      return propagate(opened, printable(opened.error()));
    slot = opened.take();
    slot->allowDirectReads(options_.directReads);
  }
  return slot.get();
}

uint64_t CheckpointReader::bytesReadInPlace() const {
  std::lock_guard<std::mutex> lock(filesMutex_);
  uint64_t bytes = 0;
  for (const auto &[name, source] : files_)
    bytes += source ? source->inPlaceBytes() : 0;
  return bytes;
}

void CheckpointReader::prefetchRecords(const SavedChunk &chunk) {
  // The records before the data fit in two pages (the data starts in the
  // first or second: plan::pieceDataPageOffset), those after it in one (the
  // end record is read from the last page first: zip::readDirectory).
  constexpr uint64_t kHead = 2 * 4096, kTail = 2 * 4096;
  Result<const zip::ByteSource *> opened = file(chunk.file);
  if (!opened || chunk.itemOffset >= (*opened)->size())
    return;
  uint64_t length = std::min(chunk.itemLength, (*opened)->size() - chunk.itemOffset);
  (*opened)->prefetch(chunk.itemOffset, std::min(length, kHead));
  if (length > kHead)
    (*opened)->prefetch(chunk.itemOffset + length - std::min(length - kHead, kTail),
                        std::min(length - kHead, kTail));
}

bool CheckpointReader::cold(const SavedChunk &chunk) {
  Result<const zip::ByteSource *> opened = file(chunk.file);
  return opened && chunk.itemLength && chunk.itemOffset < (*opened)->size() &&
         (*opened)->cold(chunk.itemOffset,
                         std::min(chunk.itemLength, (*opened)->size() - chunk.itemOffset));
}

Status CheckpointReader::checkBounds(const std::string &key, const std::string &name,
                                     uint64_t offset, uint64_t length, uint64_t fileSize) const {
  if (inBounds(offset, length, fileSize))
    return Status::success();
  return corrupt(pathOf(name) + ": item " + printable(key) + " at " + std::to_string(offset) +
                 " (" + std::to_string(length) + " bytes) lies past the end of the file (" +
                 std::to_string(fileSize) + " bytes): truncated file");
}

Status CheckpointReader::checkItemAgainstKey(const TensorItem &item, const std::string &key,
                                             const dcp::Dims &sizes) const {
  std::optional<KeyInfo> saved = keyInfo(key);
  std::string where =
      item.path + ": item " + printable(key) + " at " + std::to_string(item.itemOffset);
  if (!saved || saved->isBytes)
    return corrupt(where + " is not a tensor in .metadata");
  if (item.record.dtype != saved->dtype)
    return corrupt(where + " holds " + dcp::dtypeInfo(item.record.dtype).name +
                   " but .metadata says " + dcp::dtypeInfo(saved->dtype).name);
  if (item.record.size != sizes)
    return corrupt(where + " has shape " + dimsText(item.record.size) + " but .metadata says " +
                   dimsText(sizes));
  return Status::success();
}

Result<TensorItem *> CheckpointReader::tensorItem(const std::string &key,
                                                  const dcp::ChunkMetadata &chunk) {
  const dcp::StorageInfo *where = storageOf(key, chunk.offsets);
  if (!where)
    return corrupt(printable(key) + ": the chunk at " + dimsText(chunk.offsets) +
                   " has no storage entry in " + pathOf(".metadata"));
  return tensorItem(key, SavedChunk{chunk.offsets, chunk.sizes, where->relativePath, where->offset,
                                    where->length, std::nullopt});
}

Result<TensorItem *> CheckpointReader::tensorItem(const std::string &key, const SavedChunk &where) {
  std::lock_guard<std::mutex> lock(itemsMutex_);
  auto &slot = items_[{where.file, where.itemOffset}];
  if (slot) {
    // Two keys (or chunks) may name one item: each use is checked.
    if (Status status = checkItemAgainstKey(*slot, key, where.sizes); !status)
      return status.failure();
    return slot.get();
  }
  if (!fromChunkIndex_) {
    const dcp::StorageInfo *stored = storageOf(key, where.offsets);
    if (!stored)
      return corrupt(printable(key) + ": the chunk at " + dimsText(where.offsets) +
                     " has no storage entry in " + pathOf(".metadata"));
    if (stored->transformDescriptors && !stored->transformDescriptors->empty())
      return makeError(printable(key) + ": stored with transforms (" +
                           printable(stored->transformDescriptors->front()) +
                           "), which this runtime does not read",
                       ErrorKind::Incompatible);
  }
  Result<const zip::ByteSource *> opened = file(where.file);
  if (!opened)
    return opened.failure();
  const zip::ByteSource &source = **opened;
  if (Status status =
          checkBounds(key, where.file, where.itemOffset, where.itemLength, source.size());
      !status)
    return status.failure();
  auto item = std::make_unique<TensorItem>();
  item->fileName = where.file;
  item->path = pathOf(where.file);
  item->file = &source;
  item->itemOffset = where.itemOffset;
  item->itemLength = where.itemLength;
  if (where.xxh3) {
    item->xxh3 = where.xxh3;
    item->label = itemChecksumKey(key, where.offsets, true);
  } else if (auto checksum = checksums_.find({where.file, where.itemOffset});
             checksum != checksums_.end()) {
    if (checksum->second->length != where.itemLength)
      return corrupt(item->path + ": item " + printable(key) + " is " +
                     std::to_string(where.itemLength) + " bytes in .metadata but " +
                     std::to_string(checksum->second->length) + " in the integrity index");
    item->xxh3 = checksum->second->xxh3;
    item->label = checksum->second->key;
  } else if (hasIndex_) {
    return corrupt(item->path + ": item " + printable(key) + " at " +
                   std::to_string(where.itemOffset) + " is not in the integrity index");
  }

  zip::SliceSource slice(source, where.itemOffset, where.itemLength);
  std::string prefix = item->path + ": item " + printable(key) + ": ";
  // A damaged item of ours is reported as what it is: a checksum mismatch.
  auto damaged = [&](const auto &failed) -> Error {
    if (item->xxh3) {
      Result<uint64_t> digest = hashRange(source, where.itemOffset, where.itemLength);
      if (digest && *digest != *item->xxh3)
        return corrupt(item->path + ": checksum mismatch in the item at " +
                       std::to_string(where.itemOffset) + " (" + printable(item->label) +
                       "): the file is corrupt");
    }
    return classify(failed, prefix + printable(failed.error()), ErrorKind::Corrupt);
  };
  Result<zip::TorchSaveItem> archive = zip::openTorchSaveItem(slice);
  if (!archive)
    return damaged(archive);
  Result<zip::TensorRecord> record = zip::decodeTensorPickle(archive->dataPkl);
  if (!record)
    return damaged(record);
  const zip::Entry *data = archive->findRecord("data/" + record->storageKey);
  if (!data)
    return corrupt(prefix + "no data/" + printable(record->storageKey) + " record");
  if (archive->bigEndian)
    return makeError(prefix + "big-endian items are not read", ErrorKind::Incompatible);
  // The storage record holds exactly the storage the tensor views (DCP
  // clones views of larger storages), and ends before the records after it.
  if (data->size != record->storageBytes() || data->method != 0)
    return corrupt(prefix + "the data/" + printable(record->storageKey) + " record holds " +
                   std::to_string(data->size) + " bytes but the tensor's storage is " +
                   std::to_string(record->storageBytes()));
  if (!inBounds(data->dataOffset, data->size, where.itemLength))
    return corrupt(prefix + "the storage record lies outside the item");
  for (const zip::Entry &other : archive->entries)
    if (&other != data && other.headerOffset >= data->dataOffset &&
        other.headerOffset < data->dataOffset + data->size)
      return corrupt(prefix + "the storage record overlaps the record " + printable(other.name));
  item->dataOffset = where.itemOffset + data->dataOffset;
  item->dataCrc = data->crc;
  item->record = record.take();
  int64_t expected = 1;
  for (size_t d = item->record.size.size(); d-- > 0;) {
    if (item->record.size[d] != 1 && item->record.stride[d] != expected)
      item->contiguous = false;
    expected *= item->record.size[d];
  }
  if (Status status = checkItemAgainstKey(*item, key, where.sizes); !status)
    return status.failure();
  slot = std::move(item);
  return slot.get();
}

Status CheckpointReader::readStorageRange(const TensorItem &item, uint64_t offset, uint64_t count,
                                          char *destination) {
  if (!inBounds(offset, count, item.record.storageBytes()))
    return corrupt(item.path + ": read outside the item at " + std::to_string(item.itemOffset));
  bytesRead_ += count;
  return item.file->read(item.dataOffset + offset, destination, count);
}

Status CheckpointReader::readStorage(TensorItem &item, char *destination,
                                     const Landed *landed) {
  uint64_t dataBytes = item.record.storageBytes();
  if (!needsCheck(item)) {
    bytesRead_ += dataBytes;
    Status status = item.file->read(item.dataOffset, destination, dataBytes);
    if (status && landed)
      (*landed)(destination, dataBytes);
    return status;
  }
  return readAndCheck(item, destination, landed);
}

Status CheckpointReader::streamStorage(TensorItem &item, uint64_t offset, uint64_t count,
                                       const zip::ByteSource::BlockConsumer &sink) {
  if (!inBounds(offset, count, item.record.storageBytes()))
    return corrupt(item.path + ": read outside the item at " + std::to_string(item.itemOffset));
  if (!needsCheck(item)) {
    bytesRead_ += count;
    return item.file->readBlocks(item.dataOffset + offset, count, nullptr, sink);
  }
  // The whole item passes by for its check; the range's part of each block
  // goes on.
  zip::ByteSource::BlockConsumer part = [&](uint64_t at, const char *bytes, size_t size) {
    uint64_t from = std::max(at, offset), to = std::min<uint64_t>(at + size, offset + count);
    if (from >= to)
      return Status::success();
    return sink(from - offset, bytes + (from - at), static_cast<size_t>(to - from));
  };
  return readAndCheck(item, nullptr, nullptr, &part);
}

Status CheckpointReader::checkItem(TensorItem &item) {
  if (!needsCheck(item))
    return Status::success();
  return readAndCheck(item, nullptr, nullptr);
}

Status CheckpointReader::readAndCheck(TensorItem &item, char *destination, const Landed *landed,
                                      const zip::ByteSource::BlockConsumer *sink) {
  uint64_t dataBytes = item.record.storageBytes();
  // Counted as read whatever follows: the bytes were asked of storage.
  bytesRead_ += item.xxh3 ? item.itemLength : dataBytes;
  auto mismatch = [&]() -> Status {
    return corrupt(
        item.path + ": checksum mismatch in the item at " + std::to_string(item.itemOffset) +
        (item.xxh3 ? " (" + printable(item.label) + ")" : std::string(" (zip CRC of its data)")) +
        ": the file is corrupt");
  };
  // Ours: xxh3 of the whole item (the zip records around the storage too);
  // PyTorch's: the zip CRC of the storage record. Each block is hashed
  // while it is hot; the file reads ahead of the hashing.
  integrity::StreamingXxh3 hash;
  uint32_t crc = 0;
  uint64_t dataBegin = item.dataOffset - item.itemOffset;
  std::string before(item.xxh3 ? dataBegin : 0, '\0');
  std::string after(item.xxh3 ? item.itemLength - dataBegin - dataBytes : 0, '\0');
  if (Status status = item.file->read(item.itemOffset, before.data(), before.size()); !status)
    return status;
  hash.update(before.data(), before.size());
  // A block the read copies is cast as it is copied; one read straight
  // into the destination is cast once it is hashed.
  bool landedInCopy = false;
  zip::ByteSource::BlockCopy copy;
  if (landed && landed->copy && destination)
    copy = [&](char *to, const char *from, size_t size) {
      landed->copy(to, from, size);
      landedInCopy = true;
    };
  if (Status status = item.file->readBlocks(
          item.dataOffset, dataBytes, destination,
          [&](uint64_t at, const char *block, size_t size) {
            if (item.xxh3)
              hash.update(block, size);
            else
              crc = zip::crc32(block, size, crc);
            if (landed && destination && !std::exchange(landedInCopy, false))
              (*landed)(destination + at, size);
            return sink ? (*sink)(at, block, size) : Status::success();
          },
          copy ? &copy : nullptr);
      !status)
    return status;
  if (Status status = item.file->read(item.dataOffset + dataBytes, after.data(), after.size());
      !status)
    return status;
  hash.update(after.data(), after.size());
  if (item.xxh3 ? hash.digest() != *item.xxh3 : crc != item.dataCrc)
    return mismatch();
  item.verified = true;
  return Status::success();
}

Result<SavedChunk> CheckpointReader::bytesLocation(const std::string &key) const {
  if (fromChunkIndex_) {
    std::optional<uint64_t> position = chunks_->find(key);
    if (position && chunks_->key(*position).isBytes) {
      Result<std::vector<chunkindex::Chunk>> found = chunks_->chunks(*position);
      if (!found)
        return propagate(found, printable(found.error()));
      const chunkindex::Chunk &chunk = found->front(); // one record (checked at open)
      SavedChunk where{
          {}, {}, chunks_->fileName(chunk.file), chunk.itemOffset, chunk.itemLength, std::nullopt};
      if (chunks_->hasChecksums())
        where.xxh3 = chunk.xxh3;
      return where;
    }
  } else if (const dcp::StorageInfo *stored = storageOf(key, std::nullopt)) {
    return SavedChunk{{}, {}, stored->relativePath, stored->offset, stored->length, std::nullopt};
  }
  return corrupt(printable(key) + ": no storage entry in " + pathOf(".metadata"));
}

Result<std::string> CheckpointReader::bytesItem(const std::string &key) {
  Result<SavedChunk> where = bytesLocation(key);
  if (!where)
    return where.failure();
  Result<const zip::ByteSource *> opened = file(where->file);
  if (!opened)
    return opened.failure();
  if (Status status =
          checkBounds(key, where->file, where->itemOffset, where->itemLength, (*opened)->size());
      !status)
    return status.failure();
  std::string bytes(where->itemLength, '\0'); // within the file: checked above
  if (Status status = (*opened)->read(where->itemOffset, bytes.data(), bytes.size()); !status)
    return status.failure();
  bytesRead_ += bytes.size();
  if (!options_.verifyItems)
    return bytes;
  std::string where_ = pathOf(where->file) + ": item " + printable(key);
  auto mismatch = [&](const std::string &label) {
    return corrupt(pathOf(where->file) + ": checksum mismatch in the item at " +
                   std::to_string(where->itemOffset) + " (" + printable(label) +
                   "): the file is corrupt");
  };
  if (where->xxh3) {
    if (*where->xxh3 != integrity::xxh3(bytes.data(), bytes.size()))
      return mismatch(key);
    return bytes;
  }
  auto checksum = checksums_.find({where->file, where->itemOffset});
  if (checksum != checksums_.end()) {
    if (checksum->second->length != bytes.size() ||
        checksum->second->xxh3 != integrity::xxh3(bytes.data(), bytes.size()))
      return mismatch(checksum->second->key);
    return bytes;
  }
  if (hasIndex_)
    return corrupt(where_ + " is not in the integrity index");
  zip::MemorySource source(bytes);
  Result<std::vector<zip::Entry>> entries = zip::readDirectory(source);
  if (!entries)
    return classify(entries, where_ + ": " + printable(entries.error()), ErrorKind::Corrupt);
  for (const zip::Entry &entry : *entries)
    if (Status status = zip::verifyEntryCrc(source, entry); !status)
      return classify(status, where_ + ": " + printable(status.error()), ErrorKind::Corrupt);
  return bytes;
}

Result<std::string> CheckpointReader::bytesItemRepr(const std::string &key) {
  Result<std::string> bytes = bytesItem(key);
  if (!bytes)
    return bytes.failure();
  zip::MemorySource source(*bytes);
  std::string where = pathOf(bytesLocation(key)->file) + ": item " + printable(key) + ": ";
  Result<zip::TorchSaveItem> item = zip::openTorchSaveItem(source);
  if (!item)
    return classify(item, where + printable(item.error()), ErrorKind::Corrupt);
  Result<pickle::Document> document = pickle::read(item->dataPkl);
  if (!document)
    return classify(document, where + printable(document.error()), ErrorKind::Corrupt);
  Result<std::string> repr = pickle::toPythonRepr(*document->root());
  if (!repr)
    return classify(repr, where + printable(repr.error()), ErrorKind::Corrupt);
  return repr.take();
}

Status CheckpointReader::verifyIndexed(std::string &report, size_t &problems) {
  auto problem = [&](const std::string &line) {
    report += line + "\n";
    ++problems;
  };
  for (const auto &[index, info] : metadata_.storageData) {
    auto found = checksums_.find({info.relativePath, info.offset});
    if (found == checksums_.end())
      problem(pathOf(info.relativePath) + ": item " + printable(index.fqn) + " at " +
              std::to_string(info.offset) + " is not in the integrity index");
    else if (found->second->length != info.length)
      problem(pathOf(info.relativePath) + ": item " + printable(index.fqn) + " is " +
              std::to_string(info.length) + " bytes in .metadata but " +
              std::to_string(found->second->length) + " in the integrity index");
  }
  std::map<std::string, std::vector<const integrity::ItemChecksum *>> byFile;
  for (const integrity::ItemChecksum &item : index_.items)
    byFile[item.file].push_back(&item);
  std::string block;
  for (auto &[name, items] : byFile) {
    std::string path = pathOf(name);
    Result<const zip::ByteSource *> opened = file(name);
    if (!opened) {
      problem(opened.error());
      continue;
    }
    const zip::ByteSource &source = **opened;
    uint64_t size = source.size();
    std::sort(items.begin(), items.end(), [](auto *a, auto *b) { return a->offset < b->offset; });
    uint64_t cursor = 0;
    for (const integrity::ItemChecksum *item : items) {
      if (item->offset < cursor) {
        problem(path + ": items overlap at " + std::to_string(item->offset));
        continue;
      }
      // Padding between items must be zero: every byte is covered.
      for (uint64_t at = cursor, end = std::min(item->offset, size); at < end;) {
        uint64_t count = std::min(kBlock, end - at);
        block.resize(std::max<uint64_t>(block.size(), count));
        if (Status status = source.read(at, block.data(), count); !status)
          return status;
        auto nonZero = std::find_if(block.begin(), block.begin() + count, [](char c) { return c; });
        if (nonZero != block.begin() + count) {
          problem(path + ": non-zero byte at " + std::to_string(at + (nonZero - block.begin())) +
                  " in the padding before " + printable(item->key));
          break;
        }
        at += count;
      }
      if (!inBounds(item->offset, item->length, size)) {
        problem(path + ": truncated: item " + printable(item->key) + " at " +
                std::to_string(item->offset) + " (" + std::to_string(item->length) +
                " bytes) lies past the end of the file (" + std::to_string(size) + " bytes)");
        cursor = size;
        continue;
      }
      Result<uint64_t> digest = hashRange(source, item->offset, item->length);
      if (!digest)
        return digest.failure();
      if (*digest != item->xxh3)
        problem(path + ": checksum mismatch in item " + printable(item->key) + " at " +
                std::to_string(item->offset));
      cursor = item->offset + item->length;
    }
    if (cursor < size)
      problem(path + ": " + std::to_string(size - cursor) +
              " unexpected bytes after the last item");
  }
  return Status::success();
}

Status CheckpointReader::verifyCrcs(std::string &report, size_t &problems) {
  for (const auto &[index, info] : metadata_.storageData) {
    std::string where = pathOf(info.relativePath) + ": item " + printable(index.fqn);
    Result<const zip::ByteSource *> opened = file(info.relativePath);
    if (!opened) {
      report += opened.error() + "\n";
      ++problems;
      continue;
    }
    if (Status status =
            checkBounds(index.fqn, info.relativePath, info.offset, info.length, (*opened)->size());
        !status) {
      report += status.error() + "\n";
      ++problems;
      continue;
    }
    zip::SliceSource slice(**opened, info.offset, info.length);
    Result<std::vector<zip::Entry>> entries = zip::readDirectory(slice);
    if (!entries) {
      report += where + ": " + printable(entries.error()) + "\n";
      ++problems;
      continue;
    }
    for (const zip::Entry &entry : *entries)
      if (Status status = zip::verifyEntryCrc(slice, entry); !status) {
        report += where + ": " + printable(status.error()) + "\n";
        ++problems;
      }
  }
  return Status::success();
}

Status CheckpointReader::verifyChunkIndex(std::string &report, size_t &problems) {
  const std::string name = chunkindex::kChunkIndexFileName;
  // Listed but missing: verifyIndexed reports the file it cannot open.
  if (!storage_.exists(dir_ + "/" + name))
    return Status::success();
  auto problem = [&](const std::string &line) {
    report += line + "\n";
    ++problems;
  };
  if (hasIndex_ && !checksums_.count({name, 0}))
    problem(pathOf(name) + ": not covered by the integrity index");
  Result<std::string> bytes = readWholeFile(storage_, dir_ + "/" + name, /*isPickle=*/false);
  if (!bytes) {
    problem(printable(bytes.error()));
    return Status::success();
  }
  bytesRead_ += bytes->size();
  // The index is a function of `.metadata` and the item digests: rebuilt,
  // it must be the same bytes.
  Result<std::string> expected = chunkindex::build(metadata_, hasIndex_ ? &index_.items : nullptr,
                                                   metadataSize_, metadataXxh3_);
  if (!expected) {
    problem(pathOf(name) + ": this checkpoint cannot have a chunk index (" +
            printable(expected.error()) + ")");
  } else if (*expected != *bytes) {
    size_t at =
        std::mismatch(expected->begin(),
                      expected->begin() + std::min(expected->size(), bytes->size()), bytes->begin())
            .first -
        expected->begin();
    problem(pathOf(name) + ": does not match .metadata" +
            (hasIndex_ ? std::string(" and ") + integrity::kIndexFileName : std::string()) +
            " (first difference at byte " + std::to_string(at) + " of " +
            std::to_string(bytes->size()) + ")");
  }
  return Status::success();
}

Status CheckpointReader::verifyAll(std::string &report) {
  if (fromChunkIndex_)
    return makeError("verify needs a reader opened without the chunk index");
  size_t problems = 0;
  Status walked = hasIndex_ ? verifyIndexed(report, problems) : verifyCrcs(report, problems);
  if (!walked)
    return walked;
  if (Status status = verifyChunkIndex(report, problems); !status)
    return status;
  // Every tensor item's header against what `.metadata` says of it.
  for (const auto &[key, saved] : metadata_.stateDictMetadata) {
    if (saved.isBytes)
      continue;
    for (const dcp::ChunkMetadata &chunk : saved.chunks)
      if (Result<TensorItem *> item = tensorItem(key, chunk); !item) {
        report += item.error() + "\n";
        ++problems;
      }
  }
  // Chunks tile each tensor exactly once (DCP writes no overlaps).
  for (const auto &[key, saved] : metadata_.stateDictMetadata) {
    if (saved.isBytes)
      continue;
    std::vector<layout::Box> boxes;
    for (const dcp::ChunkMetadata &chunk : saved.chunks)
      boxes.push_back({chunk.offsets, chunk.sizes});
    auto rowBegin = [](const layout::Box &box) { return box.offsets.empty() ? 0 : box.offsets[0]; };
    auto rowEnd = [](const layout::Box &box) {
      return box.offsets.empty() ? 1 : box.offsets[0] + box.sizes[0];
    };
    std::sort(boxes.begin(), boxes.end(),
              [&](const auto &a, const auto &b) { return rowBegin(a) < rowBegin(b); });
    std::vector<const layout::Box *> active;
    const layout::Box *first = nullptr, *second = nullptr;
    for (const layout::Box &box : boxes) {
      active.erase(std::remove_if(active.begin(), active.end(),
                                  [&](const layout::Box *earlier) {
                                    return rowEnd(*earlier) <= rowBegin(box);
                                  }),
                   active.end());
      for (const layout::Box *earlier : active)
        if (!first && layout::intersect(*earlier, box)) {
          first = earlier;
          second = &box;
        }
      active.push_back(&box);
    }
    if (first) {
      report += pathOf(".metadata") + ": " + printable(key) + ": the chunks at " +
                dimsText(first->offsets) + " and " + dimsText(second->offsets) + " overlap\n";
      ++problems;
    }
    if (!layout::covers(boxes, layout::Box{dcp::Dims(saved.size.size(), 0), saved.size})) {
      report += pathOf(".metadata") + ": " + printable(key) +
                ": the chunks do not cover the whole tensor\n";
      ++problems;
    }
  }
  if (problems)
    return corrupt(std::to_string(problems) + " problem" + (problems == 1 ? "" : "s") +
                   " found in " + printable(dir_));
  return Status::success();
}

} // namespace runtime
} // namespace fsdp
