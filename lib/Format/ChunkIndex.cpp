//===- ChunkIndex.cpp - A compact, seekable index of a checkpoint's chunks -===//
#include "fsdp/Format/ChunkIndex.h"
#include "fsdp/Support/LittleEndian.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <new>
#include <unordered_map>

namespace fsdp {
namespace chunkindex {

namespace {

constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'C', 'H', 'K', '1'};
constexpr uint64_t kHeaderSize = 128;
constexpr uint64_t kKeyEntrySize = 72;
constexpr uint64_t kFileEntrySize = 16;
constexpr uint64_t kBlockEntrySize = 16; // xxh3, first record's dim-0 offset
constexpr uint64_t kHashField = 120;     // where the directory's xxh3 sits in the header
// A directory past this is no index of ours (a 405B model's is ~1 MiB).
constexpr uint64_t kMaxDirectoryBytes = uint64_t(1) << 30;
constexpr uint32_t kFlagChecksums = 1;
constexpr uint8_t kKeyIsBytes = 1;
constexpr uint8_t kDTypeCount = static_cast<uint8_t>(dcp::DType::UInt64) + 1;

// Record fields.
constexpr uint64_t kRecordSizes = 8 * kMaxDims;
constexpr uint64_t kRecordFile = 16 * kMaxDims;
constexpr uint64_t kRecordItemOffset = kRecordFile + 8;
constexpr uint64_t kRecordItemLength = kRecordItemOffset + 8;
constexpr uint64_t kRecordXxh3 = kRecordItemLength + 8;
static_assert(kRecordXxh3 + 8 == kRecordSize, "record layout");

void putU8(std::string &out, uint8_t value) { out.push_back(static_cast<char>(value)); }
using le::getU32;
using le::getU64;
using le::putU32;
using le::putU64;
using le::setU64;
void putI64(std::string &out, int64_t value) { putU64(out, static_cast<uint64_t>(value)); }
int64_t getI64(const char *at) { return static_cast<int64_t>(getU64(at)); }

int64_t saturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum))
    return b > 0 ? INT64_MAX : INT64_MIN;
  return sum;
}

/// Where each section starts for these counts; false when it overflows.
struct Layout {
  uint64_t keyTable = kHeaderSize, fileTable = 0, pool = 0, blockTable = 0, records = 0, end = 0;
};
bool layoutFor(uint64_t keys, uint64_t files, uint64_t poolBytes, uint64_t records, Layout &out) {
  uint64_t keyBytes, fileBytes, hashBytes, recordBytes;
  uint64_t blocks = records / kRecordsPerBlock + (records % kRecordsPerBlock != 0);
  if (__builtin_mul_overflow(keys, kKeyEntrySize, &keyBytes) ||
      __builtin_mul_overflow(files, kFileEntrySize, &fileBytes) ||
      __builtin_mul_overflow(blocks, kBlockEntrySize, &hashBytes) ||
      __builtin_mul_overflow(records, uint64_t(kRecordSize), &recordBytes) ||
      __builtin_add_overflow(out.keyTable, keyBytes, &out.fileTable) ||
      __builtin_add_overflow(out.fileTable, fileBytes, &out.pool) ||
      __builtin_add_overflow(out.pool, poolBytes, &out.blockTable) ||
      out.blockTable > UINT64_MAX - 64)
    return false;
  out.blockTable = (out.blockTable + 7) / 8 * 8;
  if (__builtin_add_overflow(out.blockTable, hashBytes, &out.records) ||
      out.records > UINT64_MAX - 64)
    return false;
  out.records = (out.records + 63) / 64 * 64;
  return !__builtin_add_overflow(out.records, recordBytes, &out.end);
}

uint64_t blockCountFor(uint64_t records) {
  return records / kRecordsPerBlock + (records % kRecordsPerBlock != 0);
}

/// The same rule the reader applies to `.metadata`'s file names.
bool isPlainName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.size() <= 255 &&
         name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

/// <0, 0, >0 as `a`'s first `ndim` offsets order before, with or after `b`'s.
int compareOffsets(const char *a, const char *b, unsigned ndim) {
  for (unsigned d = 0; d < ndim; ++d) {
    int64_t x = getI64(a + 8 * d), y = getI64(b + 8 * d);
    if (x != y)
      return x < y ? -1 : 1;
  }
  return 0;
}

Error invalid(std::string message) {
  return makeError("chunk index: " + std::move(message), ErrorKind::InvalidArgument);
}

/// A storage_data entry, for lookups by (fqn, offsets); null offsets: a
/// bytes item.
struct Stored {
  std::string_view fqn;
  const dcp::Dims *offsets;
  const dcp::StorageInfo *info;
};
bool storedLess(const Stored &a, const Stored &b) {
  if (a.fqn != b.fqn)
    return a.fqn < b.fqn;
  if (!a.offsets || !b.offsets)
    return !a.offsets && b.offsets;
  return *a.offsets < *b.offsets;
}

} // namespace

//===----------------------------------------------------------------------===//
// Building
//===----------------------------------------------------------------------===//

struct Builder::State {
  std::vector<std::string> files;
  std::string keyTable, pool, records;
  uint64_t keyCount = 0, recordCount = 0;
  bool open = false; // a key is being added
  std::string name;  // the open key's
  bool isBytes = false;
  dcp::DType dtype = dcp::DType::Float32;
  dcp::Dims shape;
  uint64_t begin = 0;
  int64_t maxDim0 = 0;
  bool failed = false;
};

Builder::Builder() : state_(std::make_unique<State>()) {}
Builder::Builder(Builder &&) noexcept = default;
Builder &Builder::operator=(Builder &&) noexcept = default;
Builder::~Builder() = default;

Result<Builder> Builder::create(std::vector<std::string> files) {
  for (size_t i = 1; i < files.size(); ++i)
    if (!(files[i - 1] < files[i]))
      return makeError("chunk index: the file names are not sorted and unique",
                       ErrorKind::Internal);
  if (files.size() > UINT32_MAX)
    return invalid("too many data files");
  Builder builder;
  builder.state_->files = std::move(files);
  return builder;
}

void Builder::reserve(uint64_t keys, uint64_t records) {
  state_->keyTable.reserve(keys * kKeyEntrySize);
  // Room for the directory in front too (names of up to ~256 bytes a key
  // and file), so that finish() moves the records in place, not into a
  // second copy (576 MB at 6M chunks).
  uint64_t directory = kHeaderSize + keys * (kKeyEntrySize + 256) +
                       state_->files.size() * (kFileEntrySize + 256) +
                       blockCountFor(records) * kBlockEntrySize + 128;
  state_->records.reserve(records * kRecordSize + directory);
}

Status Builder::closeKey() {
  State &s = *state_;
  if (!s.open)
    return Status::success();
  s.open = false;
  if (s.isBytes && s.recordCount - s.begin != 1)
    return invalid("no storage entry for a chunk of " + s.name);
  size_t ndim = s.shape.size();
  putU64(s.keyTable, s.pool.size());
  putU32(s.keyTable, static_cast<uint32_t>(s.name.size()));
  s.pool += s.name;
  putU8(s.keyTable, s.isBytes ? 0 : static_cast<uint8_t>(s.dtype));
  putU8(s.keyTable, static_cast<uint8_t>(ndim));
  putU8(s.keyTable, s.isBytes ? kKeyIsBytes : 0);
  putU8(s.keyTable, 0);
  for (unsigned d = 0; d < kMaxDims; ++d)
    putI64(s.keyTable, d < ndim ? s.shape[d] : 0);
  putU64(s.keyTable, s.begin);
  putU64(s.keyTable, s.recordCount);
  putI64(s.keyTable, s.maxDim0);
  ++s.keyCount;
  return Status::success();
}

Status Builder::addKey(const std::string &name, bool isBytes, dcp::DType dtype,
                       const dcp::Dims &shape) {
  State &s = *state_;
  if (s.failed)
    return makeError("chunk index: builder used after a failure", ErrorKind::Internal);
  // Sticky: a failed builder's output would be wrong.
  auto fail = [&](Error error) -> Status {
    s.failed = true;
    return error;
  };
  bool first = !s.open && s.keyCount == 0;
  if (Status status = closeKey(); !status)
    return fail(status.failure());
  if (!first && !(s.name < name)) {
    if (name == s.name)
      return fail(invalid("the key " + name + " appears twice"));
    return fail(makeError("chunk index: keys out of order at " + name, ErrorKind::Internal));
  }
  size_t ndim = isBytes ? 0 : shape.size();
  if (ndim > kMaxDims)
    return fail(makeError("chunk index: " + name + " has " + std::to_string(ndim) +
                              " dimensions; the index holds at most " + std::to_string(kMaxDims),
                          ErrorKind::Incompatible));
  s.open = true;
  s.name = name;
  s.isBytes = isBytes;
  s.dtype = dtype;
  s.shape = isBytes ? dcp::Dims{} : shape;
  s.begin = s.recordCount;
  s.maxDim0 = 0;
  return Status::success();
}

Status Builder::addChunk(const dcp::Dims &offsets, const dcp::Dims &sizes, uint32_t file,
                         uint64_t itemOffset, uint64_t itemLength, uint64_t xxh3) {
  State &s = *state_;
  auto fail = [&](Error error) -> Status {
    s.failed = true;
    return error;
  };
  if (s.failed || !s.open || file >= s.files.size())
    return fail(makeError("chunk index: a chunk without a key or file", ErrorKind::Internal));
  size_t ndim = s.shape.size();
  if (s.isBytes) {
    if (s.recordCount != s.begin)
      return fail(invalid("two storage entries for one chunk of " + s.name));
  } else {
    if (offsets.size() != ndim || sizes.size() != ndim)
      return fail(invalid("a chunk of " + s.name + " has another rank than the tensor"));
    for (size_t d = 0; d < ndim; ++d)
      if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] > s.shape[d] - sizes[d])
        return fail(invalid("a chunk of " + s.name + " lies outside the tensor"));
    if (s.recordCount != s.begin) {
      const char *last = s.records.data() + s.records.size() - kRecordSize;
      std::string mine;
      for (unsigned d = 0; d < kMaxDims; ++d)
        putI64(mine, d < ndim ? offsets[d] : 0);
      int order = compareOffsets(last, mine.data(), static_cast<unsigned>(ndim));
      if (order == 0)
        return fail(invalid("two chunks of " + s.name + " at the same offsets"));
      if (order > 0)
        return fail(
            makeError("chunk index: chunks of " + s.name + " out of order", ErrorKind::Internal));
    }
    if (ndim)
      s.maxDim0 = std::max(s.maxDim0, sizes[0]);
  }
  for (unsigned d = 0; d < kMaxDims; ++d)
    putI64(s.records, d < ndim ? offsets[d] : 0);
  for (unsigned d = 0; d < kMaxDims; ++d)
    putI64(s.records, d < ndim ? sizes[d] : 0);
  putU32(s.records, file);
  putU32(s.records, 0);
  putU64(s.records, itemOffset);
  putU64(s.records, itemLength);
  putU64(s.records, xxh3);
  ++s.recordCount;
  return Status::success();
}

namespace {
/// Writes the block table and the directory's hash of an index whose
/// header, tables and records are in place.
void sealIndex(std::string &out, const Layout &layout, uint64_t recordCount) {
  const char *records = out.data() + layout.records;
  size_t at = layout.blockTable;
  for (uint64_t b = 0, blocks = blockCountFor(recordCount); b < blocks; ++b) {
    uint64_t first = b * kRecordsPerBlock;
    uint64_t count = std::min<uint64_t>(kRecordsPerBlock, recordCount - first);
    setU64(out, at, integrity::xxh3(records + first * kRecordSize, count * kRecordSize));
    setU64(out, at + 8, getU64(records + first * kRecordSize));
    at += kBlockEntrySize;
  }
  integrity::StreamingXxh3 hash;
  hash.update(out.data(), kHashField);
  hash.update(out.data() + kHeaderSize, layout.records - kHeaderSize);
  setU64(out, kHashField, hash.digest());
}
} // namespace

Result<std::string> Builder::finish(bool checksums, uint64_t metadataLength,
                                    uint64_t metadataXxh3) {
  State &s = *state_;
  if (s.failed)
    return makeError("chunk index: builder used after a failure", ErrorKind::Internal);
  if (Status status = closeKey(); !status)
    return status.failure();
  std::string fileTable;
  for (const std::string &name : s.files) {
    putU64(fileTable, s.pool.size());
    putU32(fileTable, static_cast<uint32_t>(name.size()));
    putU32(fileTable, 0);
    s.pool += name;
  }
  Layout layout;
  if (!layoutFor(s.keyCount, s.files.size(), s.pool.size(), s.recordCount, layout))
    return invalid("too large");
  std::string out;
  out.append(kMagic, sizeof(kMagic));
  putU32(out, kVersion);
  putU32(out, checksums ? kFlagChecksums : 0);
  putU32(out, kRecordSize);
  putU32(out, kRecordsPerBlock);
  putU64(out, s.keyCount);
  putU64(out, s.files.size());
  putU64(out, s.recordCount);
  putU64(out, s.pool.size());
  putU64(out, metadataLength);
  putU64(out, metadataXxh3);
  putU64(out, layout.keyTable);
  putU64(out, layout.fileTable);
  putU64(out, layout.pool);
  putU64(out, layout.blockTable);
  putU64(out, layout.records);
  putU64(out, 0); // reserved
  putU64(out, 0); // the directory's xxh3, set by sealIndex
  out += s.keyTable;
  out += fileTable;
  out += s.pool;
  out.resize(layout.records, '\0'); // block table zeroed; padding
  // The directory goes in front of the records, in place when reserve()
  // left room (at scale the records are the bulk: one copy, not two).
  std::string whole = std::move(s.records);
  whole.insert(0, out);
  out.clear();
  *state_ = State();
  state_->failed = true; // finished: no more use
  sealIndex(whole, layout, getU64(whole.data() + 40));
  return whole;
}

void resignForTesting(std::string &bytes) {
  if (bytes.size() < kHeaderSize)
    return;
  // The header's record count, block table offset and records offset.
  uint64_t records = getU64(bytes.data() + 40);
  uint64_t table = getU64(bytes.data() + 96);
  uint64_t at = getU64(bytes.data() + 104);
  if (at < kHeaderSize || at > bytes.size() || records > (bytes.size() - at) / kRecordSize ||
      table > at)
    return;
  for (uint64_t first = 0, b = 0; first < records; first += kRecordsPerBlock, ++b) {
    if ((at - table) / kBlockEntrySize <= b)
      return;
    uint64_t count = std::min<uint64_t>(kRecordsPerBlock, records - first);
    setU64(bytes, table + kBlockEntrySize * b,
           integrity::xxh3(bytes.data() + at + first * kRecordSize, count * kRecordSize));
  }
  integrity::StreamingXxh3 hash;
  hash.update(bytes.data(), kHashField);
  hash.update(bytes.data() + kHeaderSize, at - kHeaderSize);
  setU64(bytes, kHashField, hash.digest());
}

Result<bool> fillChecksums(std::string &index, const std::vector<integrity::ItemChecksum> &items,
                           uint64_t metadataLength, uint64_t metadataXxh3) {
  // The index comes from the plan, which was checked when it was opened;
  // still, nothing is read outside the bytes.
  auto internal = [](const std::string &what) {
    return makeError("chunk index: " + what, ErrorKind::Internal);
  };
  if (index.size() < kHeaderSize || std::memcmp(index.data(), kMagic, sizeof(kMagic)) != 0 ||
      getU32(index.data() + 8) != kVersion || getU32(index.data() + 16) != kRecordSize ||
      getU32(index.data() + 20) != kRecordsPerBlock)
    return internal("the plan's index is not an index of this version");
  const char *h = index.data();
  uint64_t keyCount = getU64(h + 24), fileCount = getU64(h + 32), recordCount = getU64(h + 40);
  uint64_t poolBytes = getU64(h + 48);
  Layout layout;
  if (keyCount > index.size() / kKeyEntrySize || fileCount > index.size() / kFileEntrySize ||
      poolBytes > index.size() || recordCount > index.size() / kRecordSize ||
      !layoutFor(keyCount, fileCount, poolBytes, recordCount, layout) ||
      layout.end != index.size() || getU64(h + 104) != layout.records)
    return internal("the plan's index does not fit its bytes");
  if (getU64(h + 56) != metadataLength || getU64(h + 64) != metadataXxh3)
    return internal("the plan's index is not of the plan's .metadata");
  auto name = [&](const char *entry) -> std::optional<std::string_view> {
    uint64_t offset = getU64(entry), length = getU32(entry + 8);
    if (offset > poolBytes || length > poolBytes - offset)
      return std::nullopt;
    return std::string_view(index).substr(layout.pool + offset, length);
  };
  std::unordered_map<std::string_view, uint32_t> fileOf;
  for (uint64_t f = 0; f < fileCount; ++f) {
    std::optional<std::string_view> file = name(h + layout.fileTable + f * kFileEntrySize);
    if (!file)
      return internal("the plan's index names a file outside its pool");
    fileOf.emplace(*file, static_cast<uint32_t>(f));
  }
  // The gathered items by (file, offset): a sorted vector, not a map of
  // millions of nodes.
  std::vector<std::pair<std::pair<uint32_t, uint64_t>, const integrity::ItemChecksum *>> byPlace;
  byPlace.reserve(items.size());
  for (const integrity::ItemChecksum &item : items) {
    auto file = fileOf.find(item.file);
    if (file != fileOf.end())
      byPlace.push_back({{file->second, item.offset}, &item});
  }
  std::sort(byPlace.begin(), byPlace.end(),
            [](const auto &a, const auto &b) { return a.first < b.first; });

  // The records by (file, offset) too, and both walked together: two sorts
  // and a merge, not a binary search per record (5.7M at 16,384 ranks).
  if (recordCount > UINT32_MAX || keyCount > UINT32_MAX)
    return internal("the plan's index has too many records");
  std::vector<uint32_t> keyOf(recordCount);
  uint64_t expectedBegin = 0;
  for (uint64_t k = 0; k < keyCount; ++k) {
    const char *entry = h + layout.keyTable + k * kKeyEntrySize;
    uint64_t begin = getU64(entry + 48), end = getU64(entry + 56);
    if (!name(entry) || begin != expectedBegin || end < begin || end > recordCount)
      return internal("the plan's index has a damaged key table");
    expectedBegin = end;
    std::fill(keyOf.begin() + begin, keyOf.begin() + end, static_cast<uint32_t>(k));
  }
  if (expectedBegin != recordCount)
    return internal("the plan's index has a damaged key table");
  auto keyName = [&](uint64_t record) {
    return std::string(*name(h + layout.keyTable + keyOf[record] * kKeyEntrySize));
  };
  char *records = index.data() + layout.records;
  struct Probe {
    uint32_t file, record;
    uint64_t offset;
  };
  std::vector<Probe> probes(recordCount);
  for (uint64_t r = 0; r < recordCount; ++r) {
    const char *record = records + r * kRecordSize;
    probes[r] = {getU32(record + kRecordFile), static_cast<uint32_t>(r),
                 getU64(record + kRecordItemOffset)};
    if (probes[r].file >= fileCount)
      return internal("the plan's index has a record of " + keyName(r) + " in no file");
  }
  std::sort(probes.begin(), probes.end(), [](const Probe &a, const Probe &b) {
    return a.file != b.file ? a.file < b.file : a.offset < b.offset;
  });
  bool lengthsMatch = true;
  auto next = byPlace.begin();
  for (const Probe &probe : probes) {
    std::pair<uint32_t, uint64_t> place{probe.file, probe.offset};
    while (next != byPlace.end() && next->first < place)
      ++next;
    if (next == byPlace.end() || next->first != place)
      return internal("no checksum for the item of " + keyName(probe.record) + " at " +
                      std::string(*name(h + layout.fileTable + probe.file * kFileEntrySize)) + ":" +
                      std::to_string(probe.offset));
    const integrity::ItemChecksum &item = *next->second;
    char *record = records + uint64_t(probe.record) * kRecordSize;
    if (item.length != getU64(record + kRecordItemLength)) {
      // Only a bytes item may change size (a payload carried over).
      const char *entry = h + layout.keyTable + keyOf[probe.record] * kKeyEntrySize;
      if (!(static_cast<uint8_t>(entry[14]) & kKeyIsBytes))
        return internal("the item of " + keyName(probe.record) + " at " + item.file + ":" +
                        std::to_string(probe.offset) + " is " + std::to_string(item.length) +
                        " bytes, not the planned " +
                        std::to_string(getU64(record + kRecordItemLength)));
      lengthsMatch = false;
      continue;
    }
    setU64(index, layout.records + uint64_t(probe.record) * kRecordSize + kRecordXxh3, item.xxh3);
  }
  if (!lengthsMatch)
    return false;
  index[12] = static_cast<char>(kFlagChecksums); // flags: little-endian u32 at 12
  sealIndex(index, layout, recordCount);
  return true;
}

Result<std::string> build(const dcp::Metadata &metadata,
                          const std::vector<integrity::ItemChecksum> *checksums,
                          uint64_t metadataLength, uint64_t metadataXxh3) {
  // Lookups by key, then by offsets among that key's entries (millions of
  // chunks at scale: hashing the key once beats comparing it log n times).
  std::unordered_map<std::string_view, std::vector<Stored>> stored;
  std::vector<std::string_view> fileNames;
  for (const auto &[index, info] : metadata.storageData) {
    // The records have no field for stream transforms: such a checkpoint is
    // read through `.metadata` (which refuses them with their name).
    if (info.transformDescriptors && !info.transformDescriptors->empty())
      return makeError("chunk index: " + index.fqn + " is stored with stream transforms",
                       ErrorKind::Incompatible);
    stored[index.fqn].push_back({index.fqn, index.offset ? &*index.offset : nullptr, &info});
    if (fileNames.empty() || fileNames.back() != info.relativePath)
      fileNames.push_back(info.relativePath);
  }
  for (auto &[key, entries] : stored) {
    std::sort(entries.begin(), entries.end(), storedLess);
    for (size_t i = 1; i < entries.size(); ++i)
      if (!storedLess(entries[i - 1], entries[i]))
        return invalid("two storage entries for one chunk of " + std::string(key));
  }
  std::sort(fileNames.begin(), fileNames.end());
  fileNames.erase(std::unique(fileNames.begin(), fileNames.end()), fileNames.end());
  if (fileNames.size() > UINT32_MAX)
    return invalid("too many data files");
  std::unordered_map<std::string_view, uint32_t> fileIndex;
  for (size_t i = 0; i < fileNames.size(); ++i)
    fileIndex[fileNames[i]] = static_cast<uint32_t>(i);

  // Checksums by file, then by offset.
  std::unordered_map<std::string_view, std::vector<const integrity::ItemChecksum *>> sums;
  if (checksums) {
    for (const integrity::ItemChecksum &item : *checksums)
      sums[item.file].push_back(&item);
    for (auto &[file, items] : sums)
      std::sort(items.begin(), items.end(),
                [](const auto *a, const auto *b) { return a->offset < b->offset; });
  }
  auto digestOf = [&](const dcp::StorageInfo &info, const std::string &key) -> Result<uint64_t> {
    if (!checksums)
      return uint64_t(0);
    auto file = sums.find(info.relativePath);
    if (file != sums.end()) {
      auto found = std::lower_bound(file->second.begin(), file->second.end(), info.offset,
                                    [](const integrity::ItemChecksum *item, uint64_t offset) {
                                      return item->offset < offset;
                                    });
      if (found != file->second.end() && (*found)->offset == info.offset &&
          (*found)->length == info.length)
        return (*found)->xxh3;
    }
    return invalid("no checksum for the item of " + key + " at " + info.relativePath + ":" +
                   std::to_string(info.offset));
  };
  auto storageOf = [&](const std::string &key,
                       const dcp::Dims *offsets) -> Result<const dcp::StorageInfo *> {
    auto entries = stored.find(key);
    if (entries != stored.end()) {
      Stored probe{key, offsets, nullptr};
      auto found =
          std::lower_bound(entries->second.begin(), entries->second.end(), probe, storedLess);
      if (found != entries->second.end() && !storedLess(probe, *found))
        return found->info;
    }
    return invalid("no storage entry for a chunk of " + key);
  };

  std::vector<const std::pair<std::string, dcp::StorageMetadata> *> keys;
  for (const auto &entry : metadata.stateDictMetadata)
    keys.push_back(&entry);
  std::sort(keys.begin(), keys.end(),
            [](const auto *a, const auto *b) { return a->first < b->first; });

  // The same builder the planner feeds, so both give the same bytes.
  Result<Builder> builder =
      Builder::create(std::vector<std::string>(fileNames.begin(), fileNames.end()));
  if (!builder)
    return builder.failure();
  builder->reserve(keys.size(), metadata.storageData.size());
  auto add = [&](const std::string &name, const dcp::Dims &offsets, const dcp::Dims &sizes,
                 const dcp::Dims *probe) -> Status {
    Result<const dcp::StorageInfo *> info = storageOf(name, probe);
    if (!info)
      return info.failure();
    Result<uint64_t> digest = digestOf(**info, name);
    if (!digest)
      return digest.failure();
    return builder->addChunk(offsets, sizes, fileIndex.find((*info)->relativePath)->second,
                             (*info)->offset, (*info)->length, *digest);
  };
  for (const auto *entry : keys) {
    const std::string &name = entry->first;
    const dcp::StorageMetadata &saved = entry->second;
    if (Status status = builder->addKey(name, saved.isBytes, saved.properties.dtype, saved.size);
        !status)
      return status.failure();
    if (saved.isBytes) {
      if (Status status = add(name, {}, {}, nullptr); !status)
        return status.failure();
      continue;
    }
    size_t ndim = saved.size.size();
    std::vector<const dcp::ChunkMetadata *> chunks;
    for (const dcp::ChunkMetadata &chunk : saved.chunks) {
      if (chunk.offsets.size() != ndim || chunk.sizes.size() != ndim)
        return invalid("a chunk of " + name + " has another rank than the tensor");
      chunks.push_back(&chunk);
    }
    std::sort(chunks.begin(), chunks.end(),
              [](const auto *a, const auto *b) { return a->offsets < b->offsets; });
    for (const dcp::ChunkMetadata *chunk : chunks)
      if (Status status = add(name, chunk->offsets, chunk->sizes, &chunk->offsets); !status)
        return status.failure();
  }
  return builder->finish(checksums != nullptr, metadataLength, metadataXxh3);
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

ChunkIndex::~ChunkIndex() = default;

Error ChunkIndex::corrupt(const std::string &what) const {
  return makeError(name_ + ": " + what + " (the chunk index is corrupt)", ErrorKind::Corrupt);
}

Result<std::unique_ptr<ChunkIndex>> ChunkIndex::open(std::unique_ptr<zip::ByteSource> source,
                                                     std::string name) {
  return openImpl(std::move(source), std::move(name), {}, false);
}

Result<std::unique_ptr<ChunkIndex>> ChunkIndex::fromBytes(std::string bytes, std::string name,
                                                          bool trusted) {
  return openImpl(nullptr, std::move(name), std::move(bytes), trusted);
}

Result<std::unique_ptr<ChunkIndex>> ChunkIndex::openImpl(std::unique_ptr<zip::ByteSource> source,
                                                         std::string name, std::string whole,
                                                         bool trusted) {
  std::unique_ptr<ChunkIndex> index(new ChunkIndex());
  ChunkIndex &self = *index;
  self.name_ = std::move(name);
  self.trusted_ = trusted;
  if (!source) {
    self.whole_ = std::move(whole);
    source = std::make_unique<zip::MemorySource>(self.whole_);
  }
  self.source_ = std::move(source);
  const zip::ByteSource &in = *self.source_;
  uint64_t size = in.size();
  auto readFailed = [&](const Status &status) {
    return classify(status, self.name_ + ": " + status.error(), ErrorKind::Corrupt);
  };
  if (size < kHeaderSize)
    return self.corrupt("truncated: " + std::to_string(size) + " bytes, less than its " +
                        std::to_string(kHeaderSize) + "-byte header");
  std::string header(kHeaderSize, '\0');
  if (Status status = in.read(0, header.data(), header.size()); !status)
    return readFailed(status);
  const char *h = header.data();
  if (std::memcmp(h, kMagic, sizeof(kMagic)) != 0)
    return self.corrupt("not a chunk index (bad magic)");
  uint32_t version = getU32(h + 8), flags = getU32(h + 12);
  if (version != kVersion)
    return self.corrupt("version " + std::to_string(version) +
                        " is not supported (this build reads version " + std::to_string(kVersion) +
                        ")");
  if ((flags & ~kFlagChecksums) != 0 || getU32(h + 16) != kRecordSize ||
      getU32(h + 20) != kRecordsPerBlock || getU64(h + 112) != 0)
    return self.corrupt("unknown flags or record geometry in the header");
  self.hasChecksums_ = flags & kFlagChecksums;
  uint64_t keyCount = getU64(h + 24), fileCount = getU64(h + 32);
  self.recordCount_ = getU64(h + 40);
  uint64_t poolBytes = getU64(h + 48);
  self.metadataLength_ = getU64(h + 56);
  self.metadataXxh3_ = getU64(h + 64);
  // Counts bounded by the file before any arithmetic or allocation.
  Layout layout;
  if (keyCount > size / kKeyEntrySize || fileCount > size / kFileEntrySize || poolBytes > size ||
      self.recordCount_ > size / kRecordSize ||
      !layoutFor(keyCount, fileCount, poolBytes, self.recordCount_, layout) || layout.end != size)
    return self.corrupt("its header counts " + std::to_string(keyCount) + " keys, " +
                        std::to_string(fileCount) + " files and " +
                        std::to_string(self.recordCount_) + " records, which do not fit its " +
                        std::to_string(size) + " bytes (truncated or altered)");
  if (getU64(h + 72) != layout.keyTable || getU64(h + 80) != layout.fileTable ||
      getU64(h + 88) != layout.pool || getU64(h + 96) != layout.blockTable ||
      getU64(h + 104) != layout.records)
    return self.corrupt("its section offsets disagree with its counts");
  if (fileCount > UINT32_MAX || layout.records > kMaxDirectoryBytes)
    return self.corrupt("its directory of " + std::to_string(layout.records) +
                        " bytes is past the bound of " + std::to_string(kMaxDirectoryBytes));
  self.recordOffset_ = layout.records;

  std::string directory;
  try {
    directory.resize(layout.records);
  } catch (const std::bad_alloc &) {
    return makeError(self.name_ + ": its directory does not fit in memory", ErrorKind::IO, ENOMEM);
  }
  if (Status status = in.read(0, directory.data(), directory.size()); !status)
    return readFailed(status);
  self.bytesRead_ += directory.size();
  integrity::StreamingXxh3 hash;
  hash.update(directory.data(), kHashField);
  hash.update(directory.data() + kHeaderSize, directory.size() - kHeaderSize);
  if (hash.digest() != getU64(directory.data() + kHashField))
    return self.corrupt("checksum mismatch in its header and tables");
  const char *d = directory.data();
  self.pool_.assign(d + layout.pool, poolBytes);

  auto nameIn = [&](uint64_t offset, uint32_t length, std::string_view &out) {
    if (offset > poolBytes || length > poolBytes - offset)
      return false;
    out = std::string_view(self.pool_).substr(offset, length);
    return true;
  };
  self.keys_.resize(keyCount);
  uint64_t expectedBegin = 0;
  std::string_view previous;
  for (uint64_t i = 0; i < keyCount; ++i) {
    const char *entry = d + layout.keyTable + i * kKeyEntrySize;
    Key &key = self.keys_[i];
    key.nameOffset = getU64(entry);
    key.nameLength = getU32(entry + 8);
    key.dtype = static_cast<uint8_t>(entry[12]);
    key.ndim = static_cast<uint8_t>(entry[13]);
    uint8_t keyFlags = static_cast<uint8_t>(entry[14]);
    key.isBytes = keyFlags & kKeyIsBytes;
    key.begin = getU64(entry + 48);
    key.end = getU64(entry + 56);
    key.maxDim0 = getI64(entry + 64);
    std::string_view keyName;
    std::string where = "key " + std::to_string(i);
    if (!nameIn(key.nameOffset, key.nameLength, keyName))
      return self.corrupt(where + ": its name lies outside the string pool");
    if (i && !(previous < keyName))
      return self.corrupt(where + ": the keys are not sorted (or one repeats)");
    previous = keyName;
    if ((keyFlags & ~kKeyIsBytes) != 0 || entry[15] != 0 || key.dtype >= kDTypeCount ||
        key.ndim > kMaxDims)
      return self.corrupt(where + ": bad flags, dtype or rank");
    for (unsigned dim = 0; dim < kMaxDims; ++dim) {
      key.shape[dim] = getI64(entry + 16 + 8 * dim);
      if (key.shape[dim] < 0 || (dim >= key.ndim && key.shape[dim] != 0))
        return self.corrupt(where + ": bad shape");
    }
    if (key.begin != expectedBegin || key.end < key.begin || key.end > self.recordCount_)
      return self.corrupt(where + ": its record range [" + std::to_string(key.begin) + ", " +
                          std::to_string(key.end) + ") does not follow the previous key's");
    expectedBegin = key.end;
    if (key.isBytes && (key.ndim != 0 || key.dtype != 0 || key.end - key.begin != 1))
      return self.corrupt(where + ": a bytes item with a shape or not one record");
    if (key.maxDim0 < 0 || (key.ndim == 0 ? key.maxDim0 != 0 : key.maxDim0 > key.shape[0]))
      return self.corrupt(where + ": bad largest chunk size");
  }
  if (expectedBegin != self.recordCount_)
    return self.corrupt("its keys own " + std::to_string(expectedBegin) + " of its " +
                        std::to_string(self.recordCount_) + " records");
  self.files_.resize(fileCount);
  for (uint64_t i = 0; i < fileCount; ++i) {
    const char *entry = d + layout.fileTable + i * kFileEntrySize;
    std::string_view fileName;
    if (!nameIn(getU64(entry), getU32(entry + 8), fileName) || getU32(entry + 12) != 0)
      return self.corrupt("file " + std::to_string(i) + ": its name lies outside the string pool");
    if (!isPlainName(fileName))
      return self.corrupt("file " + std::to_string(i) +
                          ": not a plain name inside the checkpoint directory");
    if (i && !(std::string_view(self.files_[i - 1]) < fileName))
      return self.corrupt("file " + std::to_string(i) + ": the files are not sorted");
    self.files_[i] = std::string(fileName);
  }
  // The block table: a block's first dim-0 offset (its fence) lets a query
  // find the one block to search without reading the others, so the fences
  // of the blocks that start inside a key must lie in its rows, in order.
  uint64_t blocks = blockCountFor(self.recordCount_);
  self.blockHashes_.resize(blocks);
  self.fences_.resize(blocks);
  const Key *owner = self.keys_.empty() ? nullptr : &self.keys_.front();
  for (uint64_t b = 0; b < blocks; ++b) {
    self.blockHashes_[b] = getU64(d + layout.blockTable + kBlockEntrySize * b);
    int64_t fence = self.fences_[b] = getI64(d + layout.blockTable + kBlockEntrySize * b + 8);
    uint64_t first = b * kRecordsPerBlock;
    while (owner->end <= first)
      ++owner; // every record has a key (checked above)
    bool continued = b > 0 && owner->begin < first && owner->begin <= first - kRecordsPerBlock;
    if (fence < 0 || (owner->ndim ? fence > owner->shape[0] : fence != 0) ||
        (continued && fence < self.fences_[b - 1]))
      return self.corrupt("block " + std::to_string(b) + ": its first row " +
                          std::to_string(fence) + " is out of order");
  }
  self.ready_.reset(new std::atomic<const char *>[blocks]);
  for (uint64_t b = 0; b < blocks; ++b)
    self.ready_[b].store(nullptr, std::memory_order_relaxed);
  self.owned_.resize(blocks);
  return index;
}

std::optional<uint64_t> ChunkIndex::find(std::string_view name) const {
  auto found = std::lower_bound(
      keys_.begin(), keys_.end(), name,
      [&](const Key &key, std::string_view wanted) { return keyName(key) < wanted; });
  if (found == keys_.end() || keyName(*found) != name)
    return std::nullopt;
  return static_cast<uint64_t>(found - keys_.begin());
}

KeyInfo ChunkIndex::key(uint64_t position) const {
  const Key &key = keys_[position];
  KeyInfo info;
  info.name = std::string(keyName(key));
  info.isBytes = key.isBytes;
  info.dtype = static_cast<dcp::DType>(key.dtype);
  info.shape.assign(key.shape, key.shape + key.ndim);
  info.chunkCount = key.end - key.begin;
  return info;
}

const ChunkIndex::Key &ChunkIndex::keyOf(uint64_t index) const {
  return *std::partition_point(keys_.begin(), keys_.end(),
                               [&](const Key &key) { return key.end <= index; });
}

Result<const char *> ChunkIndex::loadBlock(uint64_t block) const {
  uint64_t first = block * kRecordsPerBlock;
  uint64_t bytes = std::min<uint64_t>(kRecordsPerBlock, recordCount_ - first) * kRecordSize;
  uint64_t at = recordOffset_ + first * kRecordSize;
  const char *data;
  if (!whole_.empty()) {
    data = whole_.data() + at; // within the file: the layout was checked
  } else {
    std::unique_ptr<char[]> copy(new (std::nothrow) char[bytes]);
    if (!copy)
      return makeError(name_ + ": out of memory", ErrorKind::IO, ENOMEM);
    if (Status status = source_->read(at, copy.get(), bytes); !status)
      return classify(status, name_ + ": " + status.error(), ErrorKind::Corrupt);
    data = copy.get();
    owned_[block] = std::move(copy);
    bytesRead_ += bytes;
  }
  if (!trusted_) {
    if (integrity::xxh3(data, bytes) != blockHashes_[block]) {
      owned_[block].reset();
      return corrupt("checksum mismatch in record block " + std::to_string(block) +
                     " (records from " + std::to_string(first) + ")");
    }
    if (Status status = checkBlock(block, data); !status) {
      owned_[block].reset();
      return status.failure();
    }
  }
  ++blocksRead_;
  return data;
}

Status ChunkIndex::checkBlock(uint64_t block, const char *bytes) const {
  uint64_t first = block * kRecordsPerBlock;
  uint64_t count = std::min<uint64_t>(kRecordsPerBlock, recordCount_ - first);
  const Key *key = &keyOf(first);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t index = first + i;
    while (key->end <= index)
      ++key; // keys own consecutive ranges (checked at open)
    const char *r = bytes + i * kRecordSize;
    auto bad = [&](const std::string &what) {
      return corrupt("record " + std::to_string(index) + " (" + std::string(keyName(*key)) +
                     "): " + what);
    };
    if (getU32(r + kRecordFile) >= files_.size() || getU32(r + kRecordFile + 4) != 0)
      return bad("its file index is out of range");
    if (getU64(r + kRecordItemLength) > UINT64_MAX - getU64(r + kRecordItemOffset))
      return bad("its item's end overflows");
    if (!hasChecksums_ && getU64(r + kRecordXxh3) != 0)
      return bad("a checksum in an index without checksums");
    for (unsigned d = 0; d < kMaxDims; ++d) {
      int64_t offset = getI64(r + 8 * d), size = getI64(r + kRecordSizes + 8 * d);
      bool inside = d < key->ndim ? offset >= 0 && size >= 0 && size <= key->shape[d] &&
                                        offset <= key->shape[d] - size
                                  : offset == 0 && size == 0;
      if (!inside)
        return bad("its chunk lies outside the tensor");
    }
    if (key->ndim && getI64(r + kRecordSizes) > key->maxDim0)
      return bad("its chunk has more rows than its key's largest");
    // Ordered with the other blocks through the fences: this block's first
    // record starts at its fence, and a key that goes on in the next block
    // starts no row past that block's fence here.
    if (i == 0 && getI64(r) != fences_[block])
      return bad("it does not start at its block's first row");
    if (key->end > first + kRecordsPerBlock && getI64(r) > fences_[block + 1])
      return bad("it starts past the next block's first row");
    // Strictly increasing offsets within a key: binary searches rely on it.
    if (i && index > key->begin && compareOffsets(r - kRecordSize, r, key->ndim) >= 0)
      return bad("the records are not sorted by offsets (or one repeats)");
  }
  return Status::success();
}

Result<const char *> ChunkIndex::block(uint64_t block) const {
  if (const char *ready = ready_[block].load(std::memory_order_acquire))
    return ready;
  std::lock_guard<std::mutex> lock(loadMutex_);
  if (const char *ready = ready_[block].load(std::memory_order_relaxed))
    return ready;
  Result<const char *> bytes = loadBlock(block);
  if (bytes)
    ready_[block].store(*bytes, std::memory_order_release);
  return bytes;
}

Result<const char *> ChunkIndex::record(uint64_t index) const {
  Result<const char *> bytes = block(index / kRecordsPerBlock);
  if (!bytes)
    return bytes;
  return *bytes + (index % kRecordsPerBlock) * kRecordSize;
}

Chunk ChunkIndex::decode(const Key &key, const char *r) const {
  Chunk chunk;
  for (unsigned d = 0; d < key.ndim; ++d) {
    chunk.offsets.push_back(getI64(r + 8 * d));
    chunk.sizes.push_back(getI64(r + kRecordSizes + 8 * d));
  }
  chunk.file = getU32(r + kRecordFile);
  chunk.itemOffset = getU64(r + kRecordItemOffset);
  chunk.itemLength = getU64(r + kRecordItemLength);
  chunk.xxh3 = getU64(r + kRecordXxh3);
  return chunk;
}

Result<std::vector<Chunk>> ChunkIndex::chunks(uint64_t position) const {
  const Key &key = keys_[position];
  std::vector<Chunk> out;
  for (uint64_t index = key.begin; index < key.end; ++index) {
    Result<const char *> r = record(index);
    if (!r)
      return r.failure();
    out.push_back(decode(key, *r));
  }
  return out;
}

Result<std::vector<Chunk>> ChunkIndex::overlapping(uint64_t position, const dcp::Dims &offsets,
                                                   const dcp::Dims &sizes) const {
  const Key &key = keys_[position];
  if (key.isBytes)
    return chunks(position);
  std::vector<Chunk> out;
  if (offsets.size() != key.ndim || sizes.size() != key.ndim)
    return out;
  if (key.ndim == 0)
    return chunks(position);
  for (int64_t size : sizes)
    if (size <= 0)
      return out; // an empty box overlaps nothing
  // A chunk overlaps the rows [rowBegin, rowEnd) only when it starts before
  // rowEnd and after rowBegin - maxDim0 (no chunk has more rows).
  int64_t rowBegin = offsets[0], rowEnd = saturatingAdd(offsets[0], sizes[0]);
  int64_t lowest = saturatingAdd(saturatingAdd(rowBegin, -key.maxDim0), 1);
  // The first record starting at row `lowest` or later: first the block,
  // by the fences of the blocks that start inside the key (no block read),
  // then the record, inside that block.
  uint64_t firstBlock = key.begin / kRecordsPerBlock;
  uint64_t lowBlock = firstBlock + 1, highBlock = (key.end - 1) / kRecordsPerBlock + 1;
  while (lowBlock < highBlock) {
    uint64_t middle = lowBlock + (highBlock - lowBlock) / 2;
    if (fences_[middle] < lowest)
      lowBlock = middle + 1;
    else
      highBlock = middle;
  }
  uint64_t block = lowBlock - 1;
  uint64_t low = std::max(key.begin, block * kRecordsPerBlock);
  uint64_t high = std::min(key.end, (block + 1) * kRecordsPerBlock);
  while (low < high) {
    uint64_t middle = low + (high - low) / 2;
    Result<const char *> r = record(middle);
    if (!r)
      return r.failure();
    if (getI64(*r) < lowest)
      low = middle + 1;
    else
      high = middle;
  }
  for (uint64_t index = low; index < key.end; ++index) {
    Result<const char *> r = record(index);
    if (!r)
      return r.failure();
    if (getI64(*r) >= rowEnd)
      break;
    bool overlaps = true;
    for (unsigned d = 0; d < key.ndim && overlaps; ++d) {
      int64_t begin = getI64(*r + 8 * d), size = getI64(*r + kRecordSizes + 8 * d);
      overlaps = size > 0 && begin < saturatingAdd(offsets[d], sizes[d]) &&
                 offsets[d] < begin + size; // begin + size <= shape: no overflow
    }
    if (overlaps)
      out.push_back(decode(key, *r));
  }
  return out;
}

} // namespace chunkindex
} // namespace fsdp
