//===- Zip.cpp - Stored zip archives and torch.save items -----------------===//

#include "fsdp/Format/Zip.h"

#include "fsdp/Format/Pickle.h"

#include <zlib.h>
#ifdef FSDP_HAVE_ISAL
#include <isa-l/crc.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

namespace fsdp {
namespace zip {

namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kDataDescriptorSig = 0x08074b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64EndSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr uint64_t kMax32 = 0xFFFFFFFFu;
// PyTorch's general-purpose flags: data descriptor follows (bit 3), UTF-8
// names (bit 11).
constexpr uint16_t kTorchFlags = 0x0808;
constexpr uint64_t kAlignment = kDataAlignment;

void put16(std::string &out, uint64_t v) {
  for (int i = 0; i < 2; ++i)
    out.push_back(static_cast<char>(v >> (8 * i)));
}
void put32(std::string &out, uint64_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>(v >> (8 * i)));
}
void put64(std::string &out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t get(const char *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;)
    v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

/// zip64 extended information: the listed values, in APPNOTE order.
std::string zip64Extra(bool sizes, uint64_t size, bool offset, uint64_t at) {
  std::string out;
  if (!sizes && !offset)
    return out;
  put16(out, 0x0001);
  put16(out, (sizes ? 16 : 0) + (offset ? 8 : 0));
  if (sizes) {
    put64(out, size); // uncompressed
    put64(out, size); // compressed (stored)
  }
  if (offset)
    put64(out, at);
  return out;
}

Error zipError(const std::string &message) {
  return makeError("zip: " + message, ErrorKind::Corrupt);
}

Status readAt(const ByteSource &source, uint64_t offset, void *out, size_t count,
              const char *what) {
  uint64_t size = source.size();
  if (offset > size || count > size - offset)
    return zipError(std::string("truncated archive: ") + what + " at offset " +
                    std::to_string(offset) + " runs past the end (" + std::to_string(size) +
                    " bytes)");
  return source.read(offset, out, count);
}

} // namespace

//===----------------------------------------------------------------------===//
// CRC-32
//===----------------------------------------------------------------------===//

uint32_t crc32(const void *data, size_t size, uint32_t crc) {
#ifdef FSDP_HAVE_ISAL
  // ISA-L's folding CRC: the same CRC-32 as zlib's (chaining included) at
  // several times its speed; every item a save writes or a load of a
  // PyTorch checkpoint reads goes through here.
  return crc32_gzip_refl(crc, static_cast<const unsigned char *>(data), size);
#else
  auto *p = static_cast<const Bytef *>(data);
  uLong value = crc;
  while (size > 0) { // zlib takes 32-bit lengths
    auto n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    value = ::crc32(value, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(value);
#endif
}

uint32_t crc32Combine(uint32_t crcA, uint32_t crcB, uint64_t sizeB) {
  return static_cast<uint32_t>(::crc32_combine(crcA, crcB, static_cast<z_off_t>(sizeB)));
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

void ItemLayout::setDataCrc(uint32_t crc) {
  for (size_t at : crcPositions)
    for (int i = 0; i < 4; ++i)
      trailer[at + i] = static_cast<char>(crc >> (8 * i));
}

Result<ItemLayout> planArchive(const std::vector<RecordSpec> &records) {
  if (records.size() >= 0xFFFF)
    return zipError("too many records (" + std::to_string(records.size()) + ")");
  ItemLayout layout;
  bool seenStreamed = false;
  std::string *out = &layout.header;
  uint64_t cursor = 0; // absolute position of the end of *out
  std::string central;
  std::vector<size_t> centralCrcPositions;

  for (const RecordSpec &record : records) {
    if (record.name.empty() || record.name.size() > 0xFFFF)
      return zipError("record name must be 1 to 65535 bytes");
    if (record.streamed && seenStreamed)
      return zipError("more than one streamed record");
    uint64_t size = record.streamed ? record.streamedSize : record.bytes.size();
    uint32_t crc = record.streamed ? 0 : crc32(record.bytes.data(), record.bytes.size());
    uint64_t headerAt = cursor;

    bool bigSize = size >= kMax32, bigOffset = headerAt >= kMax32;
    std::string extra64 = zip64Extra(bigSize, size, bigOffset, headerAt);
    // "FB" padding so the data starts on a 64-byte boundary, as
    // PyTorchStreamWriter::getPadding computes it.
    uint64_t start = headerAt + kLocalHeaderSize + record.name.size() + extra64.size() + 4;
    uint64_t padding = (kAlignment - start % kAlignment) % kAlignment;
    if (record.dataPageOffset) {
      if (*record.dataPageOffset >= kDataPage || *record.dataPageOffset % kAlignment)
        return zipError("data page offset " + std::to_string(*record.dataPageOffset) +
                        " is not a multiple of " + std::to_string(kAlignment) + " below " +
                        std::to_string(kDataPage));
      padding = (*record.dataPageOffset + kDataPage - start % kDataPage) % kDataPage;
    }

    put32(*out, kLocalHeaderSig);
    put16(*out, extra64.empty() ? 0 : 45); // version needed
    put16(*out, kTorchFlags);
    put16(*out, 0); // stored
    put16(*out, 0); // time
    put16(*out, 0); // date
    put32(*out, 0); // crc, sizes: in the data descriptor
    put32(*out, 0);
    put32(*out, 0);
    put16(*out, record.name.size());
    put16(*out, extra64.size() + 4 + padding);
    out->append(record.name);
    out->append(extra64);
    out->append("FB");
    put16(*out, padding);
    out->append(padding, 'Z');
    cursor += kLocalHeaderSize + record.name.size() + extra64.size() + 4 + padding;

    if (record.streamed) {
      seenStreamed = true;
      layout.dataOffset = cursor;
      layout.dataSize = size;
      cursor += size;
      out = &layout.trailer;
    } else {
      out->append(record.bytes);
      cursor += size;
    }
    size_t descriptorAt = out->size();
    put32(*out, kDataDescriptorSig);
    put32(*out, crc);
    if (extra64.empty()) {
      put32(*out, size);
      put32(*out, size);
      cursor += 16;
    } else {
      put64(*out, size);
      put64(*out, size);
      cursor += 24;
    }
    if (record.streamed)
      layout.crcPositions.push_back(descriptorAt + 4);

    // Central directory entry.
    std::string centralExtra = zip64Extra(bigSize, size, bigOffset, headerAt);
    size_t entryAt = central.size();
    put32(central, kCentralHeaderSig);
    put16(central, 0);                             // version made by
    put16(central, centralExtra.empty() ? 0 : 45); // version needed
    put16(central, kTorchFlags);
    put16(central, 0); // stored
    put16(central, 0);
    put16(central, 0);
    put32(central, crc);
    put32(central, bigSize ? kMax32 : size);
    put32(central, bigSize ? kMax32 : size);
    put16(central, record.name.size());
    put16(central, centralExtra.size());
    put16(central, 0); // comment
    put16(central, 0); // disk
    put16(central, 0); // internal attributes
    put32(central, 0); // external attributes
    put32(central, bigOffset ? kMax32 : headerAt);
    central.append(record.name);
    central.append(centralExtra);
    if (record.streamed)
      centralCrcPositions.push_back(entryAt + 16);
  }

  uint64_t centralAt = cursor;
  size_t centralInOut = out->size();
  out->append(central);
  cursor += central.size();
  for (size_t at : centralCrcPositions)
    layout.crcPositions.push_back(centralInOut + at);

  // zip64 end record and locator, always (PyTorch opens miniz with zip64).
  uint64_t zip64EndAt = cursor;
  put32(*out, kZip64EndSig);
  put64(*out, kZip64EndSize - 12);
  put16(*out, 0x031E); // made by: Unix, 3.0
  put16(*out, 45);     // needed: zip64
  put32(*out, 0);
  put32(*out, 0);
  put64(*out, records.size());
  put64(*out, records.size());
  put64(*out, central.size());
  put64(*out, centralAt);
  put32(*out, kZip64LocatorSig);
  put32(*out, 0);
  put64(*out, zip64EndAt);
  put32(*out, 1);
  put32(*out, kEndSig);
  put16(*out, 0);
  put16(*out, 0);
  put16(*out, records.size());
  put16(*out, records.size());
  put32(*out, std::min<uint64_t>(central.size(), kMax32));
  put32(*out, std::min<uint64_t>(centralAt, kMax32));
  put16(*out, 0);
  cursor += kZip64EndSize + kZip64LocatorSize + kEndSize;

  if (!seenStreamed)
    layout.dataOffset = layout.header.size();
  layout.totalSize = cursor;
  return layout;
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

Status ByteSource::readBlocks(uint64_t offset, uint64_t count, char *into,
                              const BlockConsumer &consume, const BlockCopy *copy) const {
  (void)copy; // every block is read straight into `into`
  constexpr uint64_t kBlock = 1 << 20, kAhead = uint64_t(32) << 20;
  std::string spare(into ? 0 : std::min(kBlock, count), '\0');
  prefetch(offset, std::min(kAhead, count));
  for (uint64_t at = 0; at < count; at += kBlock) {
    uint64_t size = std::min(kBlock, count - at);
    if (at + kAhead < count)
      prefetch(offset + at + kAhead, std::min(kBlock, count - at - kAhead));
    char *block = into ? into + at : spare.data();
    if (Status status = read(offset + at, block, size); !status)
      return status;
    if (Status status = consume(at, block, size); !status)
      return status;
  }
  return Status::success();
}

Status MemorySource::read(uint64_t offset, void *out, size_t count) const {
  if (offset > bytes_.size() || count > bytes_.size() - offset)
    return zipError("read past the end of the buffer");
  std::memcpy(out, bytes_.data() + offset, count);
  return Status::success();
}

uint64_t SliceSource::size() const {
  uint64_t baseSize = base_.size();
  if (offset_ >= baseSize)
    return 0;
  return std::min(length_, baseSize - offset_);
}

Status SliceSource::read(uint64_t offset, void *out, size_t count) const {
  if (offset > size() || count > size() - offset)
    return zipError("read past the end of the slice");
  return base_.read(offset_ + offset, out, count);
}

Result<std::vector<Entry>> readDirectory(const ByteSource &source) {
  uint64_t size = source.size();
  if (size < kEndSize)
    return zipError("truncated archive: " + std::to_string(size) + " bytes is too small for a zip");
  // The end record sits in the last 22 + 65535 (comment) bytes. Archives
  // without a long comment (PyTorch's, ours) have it in their last page:
  // that is read first (a load opens every item, and on a busy disk each
  // read waits behind the queue), the rest only where it is not there.
  size_t tailSize = 0, end = std::string::npos;
  uint64_t tailAt = size;
  std::string tail;
  for (uint64_t window : {uint64_t(4096), uint64_t(kEndSize + 0xFFFF)}) {
    if (tailSize == size)
      break;
    tailSize = static_cast<size_t>(std::min<uint64_t>(size, window));
    tailAt = size - tailSize;
    tail.assign(tailSize, '\0');
    if (Status s = readAt(source, tailAt, &tail[0], tailSize, "end record"); !s)
      return s.failure();
    // The last candidate whose comment runs exactly to the end: the same in
    // either window.
    for (size_t i = tailSize - kEndSize + 1; i-- > 0;) {
      if (get(&tail[i], 4) == kEndSig && i + kEndSize + get(&tail[i + 20], 2) == tailSize) {
        end = i;
        break;
      }
    }
    if (end != std::string::npos)
      break;
  }
  if (end == std::string::npos)
    return zipError("no end of central directory record (truncated or not a zip)");
  const char *e = &tail[end];
  uint64_t endAt = tailAt + end;
  uint64_t disk = get(e + 4, 2), centralDisk = get(e + 6, 2);
  uint64_t count = get(e + 10, 2), diskCount = get(e + 8, 2);
  uint64_t centralSize = get(e + 12, 4), centralAt = get(e + 16, 4);
  uint64_t centralEnd = endAt;

  char locator[kZip64LocatorSize];
  bool zip64 = false;
  if (endAt >= kZip64LocatorSize) {
    if (Status s =
            readAt(source, endAt - kZip64LocatorSize, locator, kZip64LocatorSize, "zip64 locator");
        !s)
      return s.failure();
    zip64 = get(locator, 4) == kZip64LocatorSig;
  }
  if (zip64) {
    uint64_t recordAt = get(locator + 8, 8);
    if (get(locator + 4, 4) != 0 || get(locator + 16, 4) > 1)
      return zipError("multi-disk archives are not supported");
    if (recordAt > endAt - kZip64LocatorSize ||
        endAt - kZip64LocatorSize - recordAt < kZip64EndSize)
      return zipError("zip64 end record offset " + std::to_string(recordAt) + " is out of range");
    char record[kZip64EndSize];
    if (Status s = readAt(source, recordAt, record, kZip64EndSize, "zip64 end record"); !s)
      return s.failure();
    if (get(record, 4) != kZip64EndSig)
      return zipError("bad zip64 end record signature at offset " + std::to_string(recordAt));
    disk = get(record + 16, 4);
    centralDisk = get(record + 20, 4);
    diskCount = get(record + 24, 8);
    count = get(record + 32, 8);
    centralSize = get(record + 40, 8);
    centralAt = get(record + 48, 8);
    centralEnd = recordAt;
  } else if (count == 0xFFFF || centralSize == kMax32 || centralAt == kMax32) {
    return zipError("zip64 values without a zip64 end record");
  }
  if (disk != 0 || centralDisk != 0 || diskCount != count)
    return zipError("multi-disk archives are not supported");
  if (centralAt > centralEnd || centralSize > centralEnd - centralAt)
    return zipError("central directory [" + std::to_string(centralAt) + ", +" +
                    std::to_string(centralSize) + ") is out of range");
  if (count > centralSize / kCentralHeaderSize)
    return zipError("central directory too small for " + std::to_string(count) + " entries");

  std::string central(static_cast<size_t>(centralSize), '\0');
  if (Status s = readAt(source, centralAt, &central[0], central.size(), "central directory"); !s)
    return s.failure();

  std::vector<Entry> entries;
  size_t pos = 0;
  for (uint64_t i = 0; i < count; ++i) {
    std::string where = "central directory entry " + std::to_string(i);
    if (central.size() - pos < kCentralHeaderSize)
      return zipError(where + " is truncated");
    const char *h = &central[pos];
    if (get(h, 4) != kCentralHeaderSig)
      return zipError(where + " has a bad signature");
    size_t nameSize = get(h + 28, 2), extraSize = get(h + 30, 2), commentSize = get(h + 32, 2);
    if (central.size() - pos - kCentralHeaderSize < nameSize + extraSize + commentSize)
      return zipError(where + " is truncated");
    Entry entry;
    entry.flags = static_cast<uint16_t>(get(h + 8, 2));
    entry.method = static_cast<uint16_t>(get(h + 10, 2));
    entry.crc = static_cast<uint32_t>(get(h + 16, 4));
    entry.compressedSize = get(h + 20, 4);
    entry.size = get(h + 24, 4);
    entry.headerOffset = get(h + 42, 4);
    entry.name.assign(h + kCentralHeaderSize, nameSize);
    where = "entry '" + entry.name + "'";
    if (get(h + 34, 2) != 0)
      return zipError(where + " is on another disk");
    // zip64 extended information replaces the fields saturated at 0xFFFFFFFF.
    const char *x = h + kCentralHeaderSize + nameSize;
    bool needSize = entry.size == kMax32, needCompressed = entry.compressedSize == kMax32,
         needOffset = entry.headerOffset == kMax32;
    for (size_t at = 0; at + 4 <= extraSize;) {
      size_t id = get(x + at, 2), length = get(x + at + 2, 2);
      if (at + 4 + length > extraSize)
        return zipError(where + " has a truncated extra field");
      if (id == 0x0001) {
        const char *v = x + at + 4;
        size_t left = length;
        for (auto [need, field] : {std::pair<bool, uint64_t *>{needSize, &entry.size},
                                   {needCompressed, &entry.compressedSize},
                                   {needOffset, &entry.headerOffset}}) {
          if (!need)
            continue;
          if (left < 8)
            return zipError(where + " has a short zip64 extra field");
          *field = get(v, 8);
          v += 8;
          left -= 8;
        }
        needSize = needCompressed = needOffset = false;
      }
      at += 4 + length;
    }
    if (needSize || needCompressed || needOffset)
      return zipError(where + " lacks its zip64 extra field");
    if (entry.flags & 0x0001)
      return zipError(where + " is encrypted");
    pos += kCentralHeaderSize + nameSize + extraSize + commentSize;

    // The local header must agree with the central directory.
    char local[kLocalHeaderSize];
    if (entry.headerOffset > centralAt || centralAt - entry.headerOffset < kLocalHeaderSize)
      return zipError(where + ": local header offset " + std::to_string(entry.headerOffset) +
                      " is out of range");
    if (Status s = readAt(source, entry.headerOffset, local, kLocalHeaderSize, "local header"); !s)
      return s.failure();
    if (get(local, 4) != kLocalHeaderSig)
      return zipError(where + ": bad local header signature at offset " +
                      std::to_string(entry.headerOffset));
    size_t localName = get(local + 26, 2), localExtra = get(local + 28, 2);
    if (localName != nameSize)
      return zipError(where + ": local header names another file");
    uint64_t nameAt = entry.headerOffset + kLocalHeaderSize;
    if (centralAt - nameAt < nameSize + localExtra)
      return zipError(where + ": local header runs into the central directory");
    std::string localNameBytes(nameSize, '\0');
    if (Status s = readAt(source, nameAt, &localNameBytes[0], nameSize, "local name"); !s)
      return s.failure();
    if (localNameBytes != entry.name)
      return zipError(where + ": local header names '" + localNameBytes + "'");
    if (get(local + 8, 2) != entry.method)
      return zipError(where + ": local and central compression methods differ");
    entry.dataOffset = nameAt + nameSize + localExtra;
    if (entry.compressedSize > centralAt - entry.dataOffset)
      return zipError(where + ": data [" + std::to_string(entry.dataOffset) + ", +" +
                      std::to_string(entry.compressedSize) + ") runs into the central directory");
    entries.push_back(std::move(entry));
  }
  return entries;
}

namespace {
Status checkStored(const Entry &entry) {
  if (entry.method == 8)
    return zipError("entry '" + entry.name +
                    "' is deflate-compressed; only stored entries are supported");
  if (entry.method != 0)
    return zipError("entry '" + entry.name + "' uses compression method " +
                    std::to_string(entry.method) + "; only stored entries are supported");
  if (entry.compressedSize != entry.size)
    return zipError("entry '" + entry.name + "' is stored but its sizes differ");
  return Status::success();
}

Error crcMismatch(const Entry &entry, uint32_t actual) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " (stored 0x%08x, computed 0x%08x)", entry.crc, actual);
  return zipError("CRC mismatch in entry '" + entry.name + "'" + buf);
}
} // namespace

Result<std::string> readEntry(const ByteSource &source, const Entry &entry, uint64_t maxSize,
                              bool verifyCrc) {
  if (Status s = checkStored(entry); !s)
    return s.failure();
  if (entry.size > maxSize)
    return zipError("entry '" + entry.name + "' has " + std::to_string(entry.size) +
                    " bytes, more than the " + std::to_string(maxSize) + " allowed");
  std::string bytes(static_cast<size_t>(entry.size), '\0');
  if (Status s = readAt(source, entry.dataOffset, &bytes[0], bytes.size(), "entry data"); !s)
    return s.failure();
  if (verifyCrc) {
    uint32_t actual = crc32(bytes.data(), bytes.size());
    if (actual != entry.crc)
      return crcMismatch(entry, actual);
  }
  return bytes;
}

Status verifyEntryCrc(const ByteSource &source, const Entry &entry) {
  if (Status s = checkStored(entry); !s)
    return s;
  std::string buffer(std::min<uint64_t>(entry.size, 1u << 20), '\0');
  uint32_t crc = 0;
  for (uint64_t done = 0; done < entry.size;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), entry.size - done));
    if (Status s = readAt(source, entry.dataOffset + done, &buffer[0], n, "entry data"); !s)
      return s;
    crc = crc32(buffer.data(), n, crc);
    done += n;
  }
  if (crc != entry.crc)
    return crcMismatch(entry, crc);
  return Status::success();
}

//===----------------------------------------------------------------------===//
// torch.save items
//===----------------------------------------------------------------------===//

namespace {
/// The records of a torch.save archive, in PyTorch 2.11's order; `dataBytes`
/// < 0 means no data record (a plain object).
std::vector<RecordSpec> torchSaveRecords(const std::string &dataPkl, int64_t dataBytes,
                                         const TorchSaveOptions &options) {
  std::string prefix = options.archiveName + "/";
  std::vector<RecordSpec> records;
  auto add = [&](const char *name, std::string bytes) {
    RecordSpec r;
    r.name = prefix + name;
    r.bytes = std::move(bytes);
    records.push_back(std::move(r));
  };
  add("data.pkl", dataPkl);
  add(".format_version", "1");
  add(".storage_alignment", std::to_string(kAlignment));
  add("byteorder", "little");
  if (dataBytes >= 0) {
    RecordSpec data;
    data.name = prefix + "data/0";
    data.streamed = true;
    data.streamedSize = static_cast<uint64_t>(dataBytes);
    data.dataPageOffset = options.dataPageOffset;
    records.push_back(std::move(data));
  }
  add("version", "3\n");
  add(".data/serialization_id", options.serializationId);
  return records;
}

Status checkArchiveName(const TorchSaveOptions &options) {
  if (options.archiveName.empty() || options.archiveName.find('/') != std::string::npos)
    return zipError("archive name must be one non-empty path component");
  return Status::success();
}
} // namespace

Result<ItemLayout> planTensorItem(const std::string &dataPkl, uint64_t dataBytes,
                                  const TorchSaveOptions &options) {
  if (Status s = checkArchiveName(options); !s)
    return s.failure();
  if (dataBytes > uint64_t(std::numeric_limits<int64_t>::max()))
    return zipError("tensor data too large");
  return planArchive(torchSaveRecords(dataPkl, static_cast<int64_t>(dataBytes), options));
}

Result<std::string> buildObjectItem(const std::string &dataPkl, const TorchSaveOptions &options) {
  if (Status s = checkArchiveName(options); !s)
    return s.failure();
  auto layout = planArchive(torchSaveRecords(dataPkl, -1, options));
  if (!layout)
    return layout.failure();
  return std::move(layout->header);
}

Result<TensorRecord> contiguousTensor(dcp::DType dtype, const dcp::Dims &size) {
  TensorRecord record;
  record.dtype = dtype;
  record.size = size;
  record.stride.assign(size.size(), 1);
  uint64_t elements = 1;
  const uint64_t limit =
      uint64_t(std::numeric_limits<int64_t>::max()) / dcp::dtypeInfo(dtype).elementSize;
  for (size_t d = size.size(); d-- > 0;) {
    if (size[d] < 0)
      return makeError("tensor: negative size");
    record.stride[d] = static_cast<int64_t>(elements);
    if (size[d] != 0 && elements > limit / static_cast<uint64_t>(size[d]))
      return makeError("tensor: element count overflows");
    elements *= static_cast<uint64_t>(size[d]);
  }
  record.storageElements = elements;
  return record;
}

namespace {
Error tensorError(const std::string &message) {
  return makeError("tensor data.pkl: " + message, ErrorKind::Corrupt);
}

/// Non-negative sizes and strides, and a view inside the storage.
Status checkView(const TensorRecord &record);
} // namespace

Result<std::string> encodeTensorPickle(const TensorRecord &record) {
  const dcp::DTypeInfo &info = dcp::dtypeInfo(record.dtype);
  bool v3 = info.legacyStorage == nullptr;
  if (Status s = checkView(record); !s)
    return s.failure();
  // Memoized as CPython's pickler does, so the bytes equal torch.save's.
  pickle::Writer w(pickle::Writer::Options{/*memoizeAll=*/true});
  w.global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
  w.mark();
  w.mark(); // persistent id: ('storage', storage class, key, location, numel)
  w.string("storage");
  w.global("torch", v3 ? "UntypedStorage" : info.legacyStorage);
  w.string(record.storageKey);
  w.string(record.location);
  w.integer(static_cast<int64_t>(v3 ? record.storageBytes() : record.storageElements));
  w.tupleFromMark();
  w.persistentId();
  w.integer(record.storageOffset);
  w.intTuple(record.size);
  w.intTuple(record.stride);
  w.boolean(record.requiresGrad);
  w.global("collections", "OrderedDict"); // backward hooks: always empty
  w.emptyTuple();
  w.reduce();
  if (v3)
    w.global("torch", info.name);
  w.tupleFromMark();
  w.reduce();
  return w.finish();
}

namespace {

Result<dcp::Dims> tensorDims(const pickle::Value *v, const char *what) {
  using pickle::Kind;
  if (v && v->isObjectOf("torch", "Size") && v->args->items.size() == 1)
    v = v->args->items[0];
  if (!v || v->kind != Kind::Tuple)
    return tensorError(std::string(what) + " is not a tuple");
  dcp::Dims dims;
  for (const pickle::Value *item : v->items) {
    if (item->kind != Kind::Int || item->integer < 0)
      return tensorError(std::string(what) + " holds a value that is not a "
                                             "non-negative int");
    dims.push_back(item->integer);
  }
  return dims;
}
} // namespace

Result<TensorRecord> decodeTensorPickle(std::string_view dataPkl) {
  using pickle::Kind;
  auto doc = pickle::read(dataPkl);
  if (!doc)
    return tensorError(doc.error());
  const pickle::Value *root = doc->root();
  TensorRecord record;
  std::optional<bool> parameterRequiresGrad;
  if (root->isObjectOf("torch._utils", "_rebuild_parameter")) {
    const auto &args = root->args->items;
    if (args.size() < 2 || args[1]->kind != Kind::Bool)
      return tensorError("_rebuild_parameter needs (tensor, requires_grad, ...)");
    parameterRequiresGrad = args[1]->boolean;
    root = args[0];
  }
  bool v2 = root->isObjectOf("torch._utils", "_rebuild_tensor_v2");
  bool v3 = root->isObjectOf("torch._utils", "_rebuild_tensor_v3");
  bool v1 = root->isObjectOf("torch._utils", "_rebuild_tensor");
  if (!v1 && !v2 && !v3)
    return tensorError("not a _rebuild_tensor, _rebuild_tensor_v2 or "
                       "_rebuild_tensor_v3 call");
  const auto &args = root->args->items;
  size_t minArgs = v1 ? 4 : v2 ? 6 : 7;
  if (args.size() < minArgs)
    return tensorError("too few rebuild arguments (" + std::to_string(args.size()) + ")");

  // Persistent id ('storage', storage class, key, location, numel).
  const pickle::Value *pid = args[0]->kind == Kind::PersistentId ? args[0]->args : nullptr;
  if (!pid || pid->kind != Kind::Tuple || pid->items.size() != 5 ||
      pid->items[0]->kind != Kind::String || pid->items[0]->text != "storage" ||
      pid->items[1]->kind != Kind::Global || pid->items[2]->kind != Kind::String ||
      pid->items[3]->kind != Kind::String || pid->items[4]->kind != Kind::Int ||
      pid->items[4]->integer < 0)
    return tensorError("storage is not a persistent id ('storage', class, key, "
                       "location, numel)");
  const pickle::Value *storageClass = pid->items[1];
  record.storageKey = pid->items[2]->text;
  record.location = pid->items[3]->text;
  auto numel = static_cast<uint64_t>(pid->items[4]->integer);
  // torch.UntypedStorage, or torch.storage.UntypedStorage as PyTorch 2.15
  // writes it for dtypes without a legacy storage (float8, uint16-64).
  bool untyped = storageClass->name == "UntypedStorage" &&
                 (storageClass->text == "torch" || storageClass->text == "torch.storage");
  if (storageClass->text != "torch" && !untyped)
    return tensorError("unknown storage class " + storageClass->text + "." + storageClass->name);
  if (untyped) {
    // numel counts bytes; the dtype is v3's seventh argument.
    if (!v3)
      return tensorError("an UntypedStorage needs _rebuild_tensor_v3");
    const pickle::Value *dtype = args[6];
    const dcp::DTypeInfo *info = dtype->kind == Kind::Global && dtype->text == "torch"
                                     ? dcp::findDType(dtype->name)
                                     : nullptr;
    if (!info)
      return tensorError("unsupported dtype argument");
    if (numel % info->elementSize != 0)
      return tensorError("storage bytes are not a whole number of elements");
    record.dtype = info->dtype;
    record.storageElements = numel / info->elementSize;
  } else {
    const dcp::DTypeInfo *info = dcp::findDTypeByStorage(storageClass->name);
    if (!info)
      return tensorError("unknown storage class torch." + storageClass->name);
    record.dtype = info->dtype;
    record.storageElements = numel;
    if (v3) {
      const pickle::Value *dtype = args[6];
      if (dtype->kind != Kind::Global || dtype->name != info->name)
        return tensorError("dtype argument does not match the storage class");
    }
  }

  if (args[1]->kind != Kind::Int || args[1]->integer < 0)
    return tensorError("storage offset is not a non-negative int");
  record.storageOffset = args[1]->integer;
  auto size = tensorDims(args[2], "size");
  if (!size)
    return size.failure();
  auto stride = tensorDims(args[3], "stride");
  if (!stride)
    return stride.failure();
  record.size = *size;
  record.stride = *stride;
  if (!v1) {
    if (args[4]->kind != Kind::Bool)
      return tensorError("requires_grad is not a bool");
    record.requiresGrad = args[4]->boolean;
  }
  if (parameterRequiresGrad)
    record.requiresGrad = *parameterRequiresGrad;

  if (Status s = checkView(record); !s)
    return s.failure();
  return record;
}

namespace {
Status checkView(const TensorRecord &record) {
  if (record.size.size() != record.stride.size())
    return tensorError("size and stride ranks differ");
  if (record.storageOffset < 0)
    return tensorError("negative storage offset");
  uint64_t elements = 1;
  const uint64_t maxElements =
      uint64_t(std::numeric_limits<int64_t>::max()) / dcp::dtypeInfo(record.dtype).elementSize;
  if (record.storageElements > maxElements)
    return tensorError("storage too large");
  for (size_t d = 0; d < record.size.size(); ++d) {
    int64_t s = record.size[d];
    if (s < 0 || record.stride[d] < 0)
      return tensorError("negative size or stride");
    if (s != 0 && elements > maxElements / static_cast<uint64_t>(s))
      return tensorError("the view's element count overflows");
    elements *= static_cast<uint64_t>(s);
  }

  // The view must lie inside the storage: the last element it touches is
  // storage_offset + sum((size - 1) * stride).
  if (elements != 0) {
    uint64_t last = static_cast<uint64_t>(record.storageOffset);
    bool inside = last < record.storageElements;
    for (size_t d = 0; d < record.size.size() && inside; ++d) {
      auto steps = static_cast<uint64_t>(record.size[d] - 1);
      auto stride = static_cast<uint64_t>(record.stride[d]);
      uint64_t room = record.storageElements - 1 - last;
      inside = stride == 0 || steps <= room / stride;
      if (inside)
        last += steps * stride;
    }
    if (!inside)
      return tensorError("the view (offset " + std::to_string(record.storageOffset) +
                         ", size, stride) reaches past the storage of " +
                         std::to_string(record.storageElements) + " elements");
  }
  return Status::success();
}
} // namespace

Status copyToContiguous(const TensorRecord &record, const void *storage, uint64_t storageBytes,
                        void *out, bool swapBytes) {
  if (Status s = checkView(record); !s)
    return s;
  const size_t elementSize = dcp::dtypeInfo(record.dtype).elementSize;
  if (storageBytes < record.storageBytes())
    return tensorError("storage record has " + std::to_string(storageBytes) +
                       " bytes, the pickle says " + std::to_string(record.storageBytes()));
  const size_t rank = record.size.size();
  for (int64_t s : record.size)
    if (s == 0)
      return Status::success();
  auto *src = static_cast<const unsigned char *>(storage);
  auto *dst = static_cast<unsigned char *>(out);
  std::vector<int64_t> index(rank, 0);
  const int64_t inner = rank ? record.size[rank - 1] : 1;
  const int64_t innerStride = rank ? record.stride[rank - 1] : 1;
  while (true) {
    int64_t base = record.storageOffset;
    for (size_t d = 0; d + 1 < rank; ++d)
      base += index[d] * record.stride[d];
    for (int64_t i = 0; i < inner; ++i) {
      const unsigned char *from = src + (base + i * innerStride) * elementSize;
      if (swapBytes)
        std::reverse_copy(from, from + elementSize, dst);
      else
        std::memcpy(dst, from, elementSize);
      dst += elementSize;
    }
    // Next index over the outer dims (row-major).
    size_t d = rank > 0 ? rank - 1 : 0;
    while (d > 0 && ++index[d - 1] == record.size[d - 1]) {
      index[d - 1] = 0;
      --d;
    }
    if (d == 0)
      return Status::success();
  }
}

const Entry *TorchSaveItem::findRecord(std::string_view name) const {
  for (const Entry &entry : entries)
    if (entry.name.size() == archiveName.size() + 1 + name.size() &&
        entry.name.compare(0, archiveName.size(), archiveName) == 0 &&
        entry.name[archiveName.size()] == '/' &&
        entry.name.compare(archiveName.size() + 1, name.size(), name) == 0)
      return &entry;
  return nullptr;
}

Result<TorchSaveItem> openTorchSaveItem(const ByteSource &source) {
  auto entries = readDirectory(source);
  if (!entries)
    return entries.failure();
  TorchSaveItem item;
  item.entries = entries.take();
  if (item.entries.empty())
    return zipError("torch.save archive has no records");
  size_t slash = item.entries[0].name.find('/');
  if (slash == std::string::npos || slash == 0)
    return zipError("torch.save archive: first record '" + item.entries[0].name +
                    "' is not inside a folder");
  item.archiveName = item.entries[0].name.substr(0, slash);
  for (const Entry &entry : item.entries)
    if (entry.name.compare(0, slash + 1, item.entries[0].name, 0, slash + 1) != 0)
      return zipError("torch.save archive: record '" + entry.name + "' is outside folder '" +
                      item.archiveName + "'");

  const Entry *pkl = item.findRecord("data.pkl");
  if (!pkl)
    return zipError("torch.save archive has no data.pkl");
  auto dataPkl = readEntry(source, *pkl);
  if (!dataPkl)
    return dataPkl.failure();
  item.dataPkl = dataPkl.take();

  const Entry *version = item.findRecord("version");
  if (!version)
    version = item.findRecord(".data/version");
  if (!version)
    return zipError("torch.save archive has no version record");
  auto versionText = readEntry(source, *version, 64);
  if (!versionText)
    return versionText.failure();
  std::string digits;
  for (char c : *versionText)
    if (c != '\n' && c != '\r' && c != ' ')
      digits += c;
  int64_t versionNumber = 0;
  bool numeric = !digits.empty() && digits.size() <= 3;
  for (char c : digits) {
    numeric = numeric && c >= '0' && c <= '9';
    versionNumber = versionNumber * 10 + (c - '0');
  }
  if (!numeric || versionNumber < 1 || versionNumber > 10)
    return zipError("torch.save archive: unsupported version '" + *versionText + "'");
  item.version = versionNumber;

  if (const Entry *order = item.findRecord("byteorder")) {
    auto text = readEntry(source, *order, 16);
    if (!text)
      return text.failure();
    if (*text == "big")
      item.bigEndian = true;
    else if (*text != "little")
      return zipError("torch.save archive: unknown byteorder '" + *text + "'");
  }
  return item;
}

} // namespace zip
} // namespace fsdp

namespace fsdp {
namespace zip {

Result<ItemLayout> planContiguousTensorItem(dcp::DType dtype, const dcp::Dims &size,
                                            std::optional<uint64_t> dataPageOffset) {
  Result<TensorRecord> record = contiguousTensor(dtype, size);
  if (!record)
    return record.failure();
  Result<std::string> pickled = encodeTensorPickle(*record);
  if (!pickled)
    return pickled.failure();
  TorchSaveOptions options;
  options.dataPageOffset = dataPageOffset;
  return planTensorItem(*pickled, record->storageBytes(), options);
}

} // namespace zip
} // namespace fsdp
