//===- LiveItems.cpp - Writing the caller's live items at a commit --------===//
#include "LiveItems.h"
#include "RuntimeSupport.h"
#include "fsdp/Format/Zip.h"
#include "fsdp/Support/Printable.h"

#include <algorithm>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace fsdp {
namespace runtime {

namespace {

constexpr uint64_t kAlignment = 4096;

Error invalid(std::string message) {
  return makeError(std::move(message), ErrorKind::InvalidArgument);
}

/// "live item 'KEY'", the key escaped and cut short when long.
std::string named(const std::string &key) {
  constexpr size_t kShown = 200;
  std::string shown =
      key.size() > kShown ? printable(key.substr(0, kShown)) + "..." : printable(key);
  return "live item '" + shown + "'";
}

/// Strict UTF-8 (no overlong forms, no surrogates, at most U+10FFFF): what
/// a Python str encodes to, and what `.metadata`'s pickle must hold.
bool isUtf8(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    uint8_t lead = static_cast<uint8_t>(text[at]);
    if (lead < 0x80) {
      ++at;
      continue;
    }
    size_t length = lead >= 0xF0 && lead <= 0xF4  ? 4
                    : lead >= 0xE0 && lead < 0xF0 ? 3
                    : lead >= 0xC2 && lead < 0xE0 ? 2
                                                  : 0;
    if (!length || at + length > text.size())
      return false;
    uint32_t code = lead & (0x7F >> length);
    for (size_t i = 1; i < length; ++i) {
      uint8_t next = static_cast<uint8_t>(text[at + i]);
      if ((next & 0xC0) != 0x80)
        return false;
      code = (code << 6) | (next & 0x3F);
    }
    static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < smallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
      return false;
    at += length;
  }
  return true;
}

uint64_t roundUp(uint64_t value) { return (value + kAlignment - 1) / kAlignment * kAlignment; }

} // namespace

Status checkLiveItems(const std::vector<LiveItem> &items) {
  std::set<std::string_view> seen;
  uint64_t total = 0;
  for (const LiveItem &item : items) {
    if (item.key.empty())
      return invalid("a live item has an empty key");
    if (item.key.size() > kMaxLiveKeyBytes)
      return invalid(named(item.key) + ": the key has " + std::to_string(item.key.size()) +
                     " bytes (at most " + std::to_string(kMaxLiveKeyBytes) + ")");
    if (item.key.find('\0') != std::string::npos)
      return invalid(named(item.key) + ": the key holds a NUL byte");
    if (!isUtf8(item.key))
      return invalid(named(item.key) + ": the key is not valid UTF-8");
    if (!seen.insert(item.key).second)
      return invalid(named(item.key) + " is given twice");
    for (const dcp::PathPart &part : item.path)
      if (const std::string *text = std::get_if<std::string>(&part))
        if (text->size() > kMaxLiveKeyBytes || !isUtf8(*text))
          return invalid(named(item.key) +
                         ": a part of its path is not valid UTF-8 or is longer than " +
                         std::to_string(kMaxLiveKeyBytes) + " bytes");
    uint64_t itemBytes = item.data.size();
    if (item.isTensor) {
      const dcp::DTypeInfo &info = dcp::dtypeInfo(item.dtype);
      if (info.dtype != item.dtype)
        return invalid(named(item.key) + ": unknown dtype " + dcp::dtypeNameOrCode(item.dtype));
      uint64_t bytes = info.elementSize;
      bool overflow = false;
      for (int64_t dim : item.shape) {
        if (dim < 0)
          return invalid(named(item.key) + ": negative size in its shape " + dimsText(item.shape));
        overflow = overflow || __builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes);
      }
      if (overflow || bytes > uint64_t(INT64_MAX))
        return invalid(named(item.key) + ": a " + std::string(info.name) + " tensor of shape " +
                       dimsText(item.shape) + " has too many elements");
      if (bytes != item.data.size())
        return invalid(named(item.key) + ": a " + std::string(info.name) + " tensor of shape " +
                       dimsText(item.shape) + " takes " + std::to_string(bytes) +
                       " bytes, but its data has " + std::to_string(item.data.size()));
      if (bytes <= kMaxLiveItemBytes) {
        Result<zip::ItemLayout> layout = zip::planContiguousTensorItem(item.dtype, item.shape);
        if (!layout)
          return invalid(named(item.key) + ": " + layout.error());
        itemBytes = layout->totalSize;
      }
    } else if (item.data.size() <= kMaxLiveItemBytes) {
      zip::MemorySource source(item.data);
      if (Result<zip::TorchSaveItem> archive = zip::openTorchSaveItem(source); !archive)
        return invalid(named(item.key) + ": a bytes item must be a complete torch.save archive (" +
                       archive.error() + ")");
    }
    if (itemBytes > kMaxLiveItemBytes)
      return invalid(named(item.key) + ": " + std::to_string(itemBytes) + " bytes (at most " +
                     std::to_string(kMaxLiveItemBytes) + " per live item)");
    total += roundUp(itemBytes);
    if (total > kMaxLiveTotalBytes)
      return invalid("the live items take more than " + std::to_string(kMaxLiveTotalBytes) +
                     " bytes (at " + named(item.key) + ")");
  }
  return Status::success();
}

void dropKeys(dcp::Metadata &metadata,
              const std::function<bool(const std::string &, const dcp::StorageMetadata &)> &drop) {
  std::unordered_set<std::string> dropped;
  auto &entries = metadata.stateDictMetadata;
  for (const auto &[key, saved] : entries)
    if (drop(key, saved))
      dropped.insert(key);
  if (dropped.empty())
    return;
  entries.erase(std::remove_if(entries.begin(), entries.end(),
                               [&](const auto &entry) { return dropped.count(entry.first); }),
                entries.end());
  auto &storage = metadata.storageData;
  storage.erase(std::remove_if(storage.begin(), storage.end(),
                               [&](const auto &entry) { return dropped.count(entry.first.fqn); }),
                storage.end());
  if (metadata.plannerData) {
    auto &paths = *metadata.plannerData;
    paths.erase(std::remove_if(paths.begin(), paths.end(),
                               [&](const auto &entry) { return dropped.count(entry.first); }),
                paths.end());
  }
}

void dropBytesItems(dcp::Metadata &metadata) {
  dropKeys(metadata, [](const std::string &, const dcp::StorageMetadata &saved) {
    return saved.isBytes;
  });
}

Status checkLiveKeysAreNew(const dcp::Metadata &metadata, const std::vector<LiveItem> &items) {
  for (const auto &[index, info] : metadata.storageData)
    if (info.relativePath == kLiveFileName)
      return makeError(std::string("the plan writes a data file named ") + kLiveFileName +
                           ", the live items' file",
                       ErrorKind::InvalidArgument);
  std::unordered_map<std::string_view, bool> planned; // key -> is a bytes item
  for (const auto &[key, saved] : metadata.stateDictMetadata)
    planned.emplace(key, saved.isBytes);
  for (const LiveItem &item : items)
    if (auto found = planned.find(item.key); found != planned.end())
      return invalid(named(item.key) + ": the plan saves this key" +
                     (found->second ? " (liveReplacesPlannedBytes drops the plan's bytes items)"
                                    : std::string()));
  return Status::success();
}

Status writeLiveFile(Storage &storage, const std::string &dir, const std::vector<LiveItem> &items,
                     std::vector<integrity::ItemChecksum> &checksums, uint64_t &bytes) {
  Result<std::unique_ptr<WritableFile>> file = storage.create(dir + "/" + kLiveFileName);
  if (!file)
    return file.failure();
  uint64_t offset = 0;
  for (const LiveItem &item : items) {
    uint64_t length = item.data.size(), digest = 0;
    if (item.isTensor) {
      Result<zip::ItemLayout> layout = zip::planContiguousTensorItem(item.dtype, item.shape);
      if (!layout)
        return invalid(named(item.key) + ": " + layout.error());
      if (layout->dataSize != item.data.size())
        return makeError(named(item.key) + ": the item's layout does not fit its data",
                         ErrorKind::Internal);
      layout->setDataCrc(zip::crc32(item.data.data(), item.data.size()));
      integrity::StreamingXxh3 hash;
      hash.update(layout->header.data(), layout->header.size());
      hash.update(item.data.data(), item.data.size());
      hash.update(layout->trailer.data(), layout->trailer.size());
      digest = hash.digest();
      length = layout->totalSize;
      if (Status status =
              (*file)->writeAt(offset, {{layout->header.data(), layout->header.size()},
                                        {item.data.data(), item.data.size()},
                                        {layout->trailer.data(), layout->trailer.size()}});
          !status)
        return propagate(status, status.error() + " (" + named(item.key) + ")");
    } else {
      digest = integrity::xxh3(item.data.data(), item.data.size());
      if (Status status = (*file)->writeAt(offset, {{item.data.data(), item.data.size()}}); !status)
        return propagate(status, status.error() + " (" + named(item.key) + ")");
    }
    checksums.push_back({itemChecksumKey(item.key, dcp::Dims(item.shape.size(), 0), item.isTensor),
                         kLiveFileName, offset, length, digest});
    bytes += length;
    offset = roundUp(offset + length);
  }
  if (Status status = (*file)->sync(); !status)
    return status;
  return (*file)->close();
}

void addLiveItems(dcp::Metadata &metadata, const std::vector<LiveItem> &items,
                  const std::vector<integrity::ItemChecksum> &checksums) {
  for (size_t i = 0; i < items.size(); ++i) {
    const LiveItem &item = items[i];
    dcp::StorageMetadata saved;
    dcp::MetadataIndex index{item.key, std::nullopt, std::nullopt};
    saved.isBytes = !item.isTensor;
    if (item.isTensor) {
      saved.properties.dtype = item.dtype;
      saved.size = item.shape;
      dcp::Dims zeros(item.shape.size(), 0);
      saved.chunks.push_back({zeros, item.shape});
      index.offset = zeros;
      index.index = 0;
    }
    metadata.stateDictMetadata.emplace_back(item.key, std::move(saved));
    metadata.storageData.push_back(
        {std::move(index), {kLiveFileName, checksums[i].offset, checksums[i].length, {}}});
    if (metadata.plannerData)
      metadata.plannerData->emplace_back(
          item.key, item.path.empty() ? std::vector<dcp::PathPart>{item.key} : item.path);
  }
}

} // namespace runtime
} // namespace fsdp
