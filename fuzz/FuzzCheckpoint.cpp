//===- FuzzCheckpoint.cpp - libFuzzer target: whole checkpoint directories -===//
//
// One input is one checkpoint directory: `.metadata`, an optional
// `.fsdp-index` and one data file `__0_0.distcp`, held in memory behind the
// Storage interface. The reader is driven as load, verify and inspect drive
// it: open, every tensor item opened and read whole (checked), every bytes
// item printed, verify, inspect as text and JSON. Everything must fail
// cleanly or succeed within bounds.
//
// Input layout: u32 metadata length, u32 index length (0xFFFFFFFF: no
// index), then the metadata bytes, the index bytes, and the data file (the
// rest). Lengths past the input are clipped.
//
// Then, when the metadata parses, its chunk index (`.fsdp-chunks`, with the
// index's checksums when those cover every item) is added, one of its bytes
// flipped when the input's last byte says so, and the reader is driven as a
// load drives it through that index: every key's chunks found by box, read
// and checked, every bytes item read.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/ChunkIndex.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/Inspect.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>

namespace {

using namespace fsdp;
using namespace fsdp::runtime;

constexpr const char *kDir = "/ckpt";

/// Read-only files in memory; everything that would write fails.
class MemoryStorage : public Storage {
public:
  std::map<std::string, std::string> files;

  Result<std::unique_ptr<Claim>> claim(const std::string &path, const std::string &) override {
    return makeError(path + ": read-only", ErrorKind::IO);
  }
  Result<std::string> realPath(const std::string &path) override { return path; }
  Result<std::unique_ptr<WritableFile>> create(const std::string &path) override {
    return makeError(path + ": read-only", ErrorKind::IO);
  }
  Result<std::unique_ptr<zip::ByteSource>> openRead(const std::string &path) override {
    auto found = files.find(path);
    if (found == files.end())
      return makeError(path + ": cannot open: No such file or directory", ErrorKind::NotFound);
    return std::unique_ptr<zip::ByteSource>(new zip::MemorySource(found->second));
  }
  bool exists(const std::string &path) override { return files.count(path) > 0; }
  Result<PathStatus> status(const std::string &path) override {
    PathStatus found;
    if (files.count(path))
      found.kind = PathStatus::Kind::RegularFile;
    return found;
  }
  Result<std::vector<std::string>> listDir(const std::string &path) override {
    return makeError(path + ": not listed");
  }
  Status link(const std::string &from, const std::string &) override {
    return makeError(from + ": read-only");
  }
  Status setMode(const std::string &path, uint32_t) override {
    return makeError(path + ": read-only");
  }
  Status makeDir(const std::string &path) override { return makeError(path + ": read-only"); }
  Status removeTree(const std::string &path) override { return makeError(path + ": read-only"); }
  Status rename(const std::string &from, const std::string &) override {
    return makeError(from + ": read-only");
  }
  Status exchange(const std::string &a, const std::string &) override {
    return makeError(a + ": read-only");
  }
  Status syncDir(const std::string &) override { return Status::success(); }
};

uint32_t readU32(const uint8_t *data) {
  uint32_t value;
  std::memcpy(&value, data, 4);
  return value;
}

void exercise(MemoryStorage &storage) {
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(kDir, storage);
  if (!reader)
    return;
  // As load: every tensor chunk's item, read whole and checked.
  for (const auto &[key, saved] : (*reader)->metadata().stateDictMetadata) {
    if (saved.isBytes) {
      (void)(*reader)->bytesItemRepr(key);
      continue;
    }
    for (const dcp::ChunkMetadata &chunk : saved.chunks) {
      Result<TensorItem *> item = (*reader)->tensorItem(key, chunk);
      if (!item)
        continue;
      // Bounded by the item's bytes in the file (checked by the reader).
      std::string storageBytes((*item)->record.storageBytes(), '\0');
      (void)(*reader)->readStorage(**item, storageBytes.data());
    }
  }
  std::string report;
  (void)(*reader)->verifyAll(report);
}

/// As a load through the chunk index: whole-tensor boxes and halves of the
/// rows, every item found read and checked, every bytes item.
void exerciseChunkIndex(MemoryStorage &storage, uint8_t flip) {
  const std::string &metadataBytes = storage.files[std::string(kDir) + "/.metadata"];
  Result<dcp::Metadata> metadata = dcp::parseMetadata(metadataBytes);
  if (!metadata)
    return;
  auto indexFile = storage.files.find(std::string(kDir) + "/.fsdp-index");
  std::optional<integrity::IntegrityIndex> index;
  if (indexFile != storage.files.end())
    if (Result<integrity::IntegrityIndex> parsed = integrity::parseIndex(indexFile->second))
      index = parsed.take();
  Result<std::string> chunks =
      chunkindex::build(*metadata, index ? &index->items : nullptr, metadataBytes.size(),
                        integrity::xxh3(metadataBytes.data(), metadataBytes.size()));
  if (!chunks && index) // an index that lacks items: none
    chunks = chunkindex::build(*metadata, nullptr, metadataBytes.size(), 0);
  if (!chunks || chunks->empty())
    return;
  if (flip & 1)
    (*chunks)[(flip >> 1) * 7919 % chunks->size()] ^= 0x20;
  storage.files[std::string(kDir) + "/" + chunkindex::kChunkIndexFileName] = chunks.take();
  ReaderOptions options;
  options.useChunkIndex = true;
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(kDir, storage, options);
  if (!reader)
    return;
  std::vector<plan::ReadItem> reads;
  for (const auto &[key, saved] : metadata->stateDictMetadata) {
    if (saved.isBytes || saved.size.size() > chunkindex::kMaxDims)
      continue;
    plan::ReadItem read;
    read.key = key;
    read.globalShape = saved.size;
    read.chunkOffsets.assign(saved.size.size(), 0);
    read.chunkSizes = saved.size;
    if (read.globalShape.empty())
      read.source = plan::ItemSource::Step;
    reads.push_back(read);
    if (!saved.size.empty() && saved.size[0] > 1) {
      read.chunkOffsets[0] = saved.size[0] / 2;
      read.chunkSizes[0] = saved.size[0] - saved.size[0] / 2;
      reads.push_back(read);
    }
  }
  Result<std::vector<std::vector<SavedChunk>>> planned = (*reader)->planReads(reads);
  if (!planned)
    return;
  for (size_t i = 0; i < reads.size(); ++i)
    for (const SavedChunk &chunk : (*planned)[i]) {
      Result<TensorItem *> item = (*reader)->tensorItem(reads[i].key, chunk);
      if (!item)
        continue;
      std::string storageBytes((*item)->record.storageBytes(), '\0');
      (void)(*reader)->readStorage(**item, storageBytes.data());
    }
  for (const std::string &key : (*reader)->bytesKeys())
    (void)(*reader)->bytesItemRepr(key);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 8)
    return 0;
  uint64_t metadataLength = std::min<uint64_t>(readU32(data), size - 8);
  uint32_t indexField = readU32(data + 4);
  bool hasIndex = indexField != 0xFFFFFFFFu;
  uint64_t indexLength = hasIndex ? std::min<uint64_t>(indexField, size - 8 - metadataLength) : 0;
  const char *cursor = reinterpret_cast<const char *>(data) + 8;
  MemoryStorage storage;
  storage.files[std::string(kDir) + "/.metadata"].assign(cursor, metadataLength);
  cursor += metadataLength;
  if (hasIndex)
    storage.files[std::string(kDir) + "/.fsdp-index"].assign(cursor, indexLength);
  cursor += indexLength;
  storage.files[std::string(kDir) + "/__0_0.distcp"].assign(cursor, size - 8 - metadataLength -
                                                                        indexLength);
  exercise(storage);
  InspectOptions options;
  options.json = data[size - 1] & 1; // text or JSON, by the last byte
  std::ostringstream out;
  (void)inspectCheckpoint(kDir, storage, options, out);
  exerciseChunkIndex(storage, data[size - 1] >> 1);
  return 0;
}
