//===- Verify.cpp - Check every byte of a checkpoint ----------------------===//
#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Runtime/Checkpoint.h"
#include "RuntimeSupport.h"

#include <algorithm>
#include <map>

namespace fsdp {
namespace runtime {

namespace {

Result<std::string> readAll(Storage &storage, const std::string &path) {
  Result<std::unique_ptr<zip::ByteSource>> file = storage.openRead(path);
  if (!file)
    return file.failure();
  std::string bytes((*file)->size(), '\0');
  if (Status status = (*file)->read(0, bytes.data(), bytes.size()); !status)
    return status.failure();
  return bytes;
}

} // namespace

Status verifyCheckpoint(const std::string &rawDir, Storage &storage, std::string &report) {
  std::string dir = trimSlashes(rawDir);
  if (Status status = refuseStagingDir(dir); !status)
    return status;
  size_t problems = 0;
  auto problem = [&](const std::string &line) {
    report += line + "\n";
    ++problems;
  };
  Result<std::string> metadataBytes = readAll(storage, dir + "/.metadata");
  if (!metadataBytes)
    return propagate(metadataBytes, metadataBytes.error() + " (no committed checkpoint here)");
  Result<dcp::Metadata> metadata = dcp::parseMetadata(*metadataBytes);
  if (!metadata)
    problem(dir + "/.metadata: " + metadata.error());

  std::string indexPath = dir + "/" + integrity::kIndexFileName;
  if (storage.exists(indexPath)) {
    Result<std::string> indexBytes = readAll(storage, indexPath);
    Result<integrity::IntegrityIndex> index =
        indexBytes ? integrity::parseIndex(*indexBytes)
                   : Result<integrity::IntegrityIndex>(indexBytes.failure());
    if (!index)
      return propagate(index, indexPath + ": " + index.error());
    if (index->metadataLength != metadataBytes->size() ||
        index->metadataXxh3 != integrity::xxh3(metadataBytes->data(), metadataBytes->size()))
      problem(dir + "/.metadata: checksum mismatch against " + integrity::kIndexFileName);
    // Items by file, for the checksums and for the padding between them.
    std::map<std::string, std::vector<const integrity::ItemChecksum *>> byFile;
    for (const integrity::ItemChecksum &item : index->items)
      byFile[item.file].push_back(&item);
    if (metadata) {
      std::map<std::pair<std::string, uint64_t>, bool> indexed;
      for (const integrity::ItemChecksum &item : index->items)
        indexed[{item.file, item.offset}] = true;
      for (const auto &[key, info] : metadata->storageData)
        if (!indexed.count({info.relativePath, info.offset}))
          problem(dir + "/" + info.relativePath + ": item " + key.fqn + " at " +
                  std::to_string(info.offset) + " is not in the integrity index");
    }
    for (auto &[name, items] : byFile) {
      std::string path = dir + "/" + name;
      Result<std::string> bytes = readAll(storage, path);
      if (!bytes) {
        problem(bytes.error());
        continue;
      }
      std::sort(items.begin(), items.end(),
                [](auto *a, auto *b) { return a->offset < b->offset; });
      uint64_t cursor = 0;
      for (const integrity::ItemChecksum *item : items) {
        if (item->offset < cursor) {
          problem(path + ": items overlap at " + std::to_string(item->offset));
          continue;
        }
        // Padding between items must be zero: every byte is covered.
        for (uint64_t at = cursor; at < std::min<uint64_t>(item->offset, bytes->size()); ++at)
          if ((*bytes)[at] != 0) {
            problem(path + ": non-zero byte at " + std::to_string(at) + " in the padding before " +
                    item->key);
            break;
          }
        if (item->offset + item->length > bytes->size()) {
          problem(path + ": truncated: item " + item->key + " ends at " +
                  std::to_string(item->offset + item->length) + " but the file has " +
                  std::to_string(bytes->size()) + " bytes");
          cursor = bytes->size();
          continue;
        }
        if (integrity::xxh3(bytes->data() + item->offset, item->length) != item->xxh3)
          problem(path + ": checksum mismatch in item " + item->key + " at " +
                  std::to_string(item->offset));
        cursor = item->offset + item->length;
      }
      if (cursor < bytes->size())
        problem(path + ": " + std::to_string(bytes->size() - cursor) +
                " unexpected bytes after the last item");
    }
  } else if (metadata) {
    // A PyTorch checkpoint: no index, so the zip CRCs are what we have.
    for (const auto &[key, info] : metadata->storageData) {
      std::string path = dir + "/" + info.relativePath;
      Result<std::unique_ptr<zip::ByteSource>> file = storage.openRead(path);
      if (!file) {
        problem(file.error());
        continue;
      }
      if (info.offset > (*file)->size() || info.length > (*file)->size() - info.offset) {
        problem(path + ": truncated: item " + key.fqn + " lies past the end");
        continue;
      }
      zip::SliceSource slice(**file, info.offset, info.length);
      Result<std::vector<zip::Entry>> entries = zip::readDirectory(slice);
      if (!entries) {
        problem(path + ": item " + key.fqn + ": " + entries.error());
        continue;
      }
      for (const zip::Entry &entry : *entries)
        if (Status status = zip::verifyEntryCrc(slice, entry); !status)
          problem(path + ": item " + key.fqn + ": " + status.error());
    }
  }
  if (problems)
    return makeError(std::to_string(problems) + " problem" + (problems == 1 ? "" : "s") +
                     " found in " + dir);
  return Status::success();
}

} // namespace runtime
} // namespace fsdp
