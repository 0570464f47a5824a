//===- Zip.h - Stored zip archives and torch.save items ---------*- C++ -*-===//
//
// Every DCP item is a complete `torch.save` zip (docs/CheckpointFormat.md):
// records `<archive>/data.pkl`, `.format_version`, `.storage_alignment`,
// `byteorder`, `data/0` (tensors only), `version`, `.data/serialization_id`,
// all stored (never compressed).
//
// The writer reproduces PyTorch's own layout (checked byte for byte against
// a real PyTorch 2.11 checkpoint): local headers with sizes and CRC zero and
// a data descriptor after the data (general-purpose flags 0x0808), an "FB"
// extra field of 'Z' bytes that starts every record's data at a multiple of
// 64, zip64 extra fields only where a size or offset reaches 0xFFFFFFFF, and
// always a zip64 end record + locator before the classic one. Because CRCs
// live only after the data, an item is planned before its tensor bytes
// exist: planTensorItem returns the bytes before the data (fixed), the data
// offset, and the bytes after it, whose CRC fields are filled once the data
// has been streamed (ItemLayout::setDataCrc).
//
// The reader parses the central directory (zip64 included), checks every
// local header against it, refuses compressed, encrypted and multi-disk
// archives, and bounds-checks every size and offset against the source.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_FORMAT_ZIP_H
#define FSDP_FORMAT_ZIP_H

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Support/Result.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {
namespace zip {

//===----------------------------------------------------------------------===//
// CRC-32 (zlib)
//===----------------------------------------------------------------------===//

/// CRC-32 of `size` bytes, continuing from `crc` (0 to start).
uint32_t crc32(const void *data, size_t size, uint32_t crc = 0);
/// CRC-32 of A followed by B, from crc(A), crc(B) and B's length: lets
/// pieces of one record be checksummed in parallel.
uint32_t crc32Combine(uint32_t crcA, uint32_t crcB, uint64_t sizeB);

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

/// One record of an archive, in archive order.
struct RecordSpec {
  std::string name;  // full name, e.g. "archive/data.pkl"
  std::string bytes; // contents, unless streamed
  /// At most one record is streamed: the caller writes its `streamedSize`
  /// bytes at ItemLayout::dataOffset.
  bool streamed = false;
  uint64_t streamedSize = 0;
  /// Where in a kDataPage-byte page of the file this record's data starts (a
  /// multiple of 64; its archive starts a page): a loader reads the data
  /// with direct I/O straight into a buffer at the same place in its page.
  /// Unset: at the next multiple of 64, as PyTorch's writer puts it.
  std::optional<uint64_t> dataPageOffset;
};

/// Every record's data starts at a multiple of this, as in PyTorch's files.
constexpr uint64_t kDataAlignment = 64;
/// The page RecordSpec::dataPageOffset places data in: direct I/O's widest
/// alignment.
constexpr uint64_t kDataPage = 4096;

/// A planned archive: header, then the streamed record's data, then trailer.
/// Without a streamed record the header is the whole archive.
struct ItemLayout {
  std::string header;      // archive bytes [0, dataOffset)
  uint64_t dataOffset = 0; // multiple of 64
  uint64_t dataSize = 0;
  std::string trailer; // archive bytes [dataOffset + dataSize, totalSize)
  uint64_t totalSize = 0;
  /// Where the streamed record's CRC goes in `trailer` (its data descriptor
  /// and its central directory entry); zero until setDataCrc.
  std::vector<size_t> crcPositions;

  void setDataCrc(uint32_t crc);
};

/// Lays out `records` (names 1..65535 bytes, at most one streamed, fewer
/// than 65535 records) as PyTorch's writer does.
Result<ItemLayout> planArchive(const std::vector<RecordSpec> &records);

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

/// Random access to the bytes of one archive (e.g. one item's window of a
/// data file).
class ByteSource {
public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  /// Reads exactly `count` bytes at `offset` (the caller stays in bounds).
  virtual Status read(uint64_t offset, void *out, size_t count) const = 0;
  /// A hint that [offset, offset + count) will be read soon: a file starts
  /// reading it in the background. Sources in memory ignore it.
  virtual void prefetch(uint64_t offset, uint64_t count) const {
    (void)offset;
    (void)count;
  }
  /// True when reading [offset, offset + count) would wait on a device: a
  /// file whose page cache lacks much of it. Sources in memory never are.
  virtual bool cold(uint64_t offset, uint64_t count) const {
    (void)offset;
    (void)count;
    return false;
  }
  /// Called with each block of a streamed read, in order: its position
  /// from the start of the read, its bytes (valid during the call: those
  /// that landed, or the source's that were copied there), its size.
  using BlockConsumer = std::function<Status(uint64_t at, const char *bytes, size_t size)>;
  /// Copies `size` bytes from `from` to `to` (which do not overlap), doing
  /// more in the same pass where its caller wants (a load casts a main
  /// weight into its model weight as it copies it).
  using BlockCopy = std::function<void(char *to, const char *from, size_t size)>;
  /// Reads [offset, offset + count) in order, block by block, each block
  /// handed to `consume` while it is hot (what a checked read hashes).
  /// With `into` set the bytes also land at `into + at`: a block copied
  /// there (out of a mapping or a staging block) is copied by `copy` when
  /// that is given, before `consume` hears of it; one read straight there
  /// is not. A file may read ahead of the consumer, with direct I/O on a
  /// cold cache; here: blocks of 1 MiB read straight into `into`, each read
  /// ahead of 32 MiB by `prefetch`.
  virtual Status readBlocks(uint64_t offset, uint64_t count, char *into,
                            const BlockConsumer &consume,
                            const BlockCopy *copy = nullptr) const;
  /// Whether cold ranges may bypass the page cache (direct I/O, where the
  /// source has it). Set before the first read.
  virtual void allowDirectReads(bool allowed) { (void)allowed; }
  /// Bytes read with direct I/O straight into readBlocks' `into` (neither
  /// staged nor copied); 0 for sources without direct I/O.
  virtual uint64_t inPlaceBytes() const { return 0; }
};

/// Bytes in memory (not copied; must outlive the source).
class MemorySource : public ByteSource {
public:
  explicit MemorySource(std::string_view bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  Status read(uint64_t offset, void *out, size_t count) const override;

private:
  std::string_view bytes_;
};

/// The window [offset, offset + length) of another source.
class SliceSource : public ByteSource {
public:
  SliceSource(const ByteSource &base, uint64_t offset, uint64_t length)
      : base_(base), offset_(offset), length_(length) {}
  uint64_t size() const override;
  Status read(uint64_t offset, void *out, size_t count) const override;

private:
  const ByteSource &base_;
  uint64_t offset_, length_;
};

struct Entry {
  std::string name;
  uint16_t method = 0; // 0 stored, 8 deflate
  uint16_t flags = 0;
  uint32_t crc = 0;
  uint64_t size = 0;           // uncompressed
  uint64_t compressedSize = 0; // bytes on disk
  uint64_t headerOffset = 0;   // local header
  uint64_t dataOffset = 0;     // first data byte
};

/// Lists the archive's entries in central directory order.
Result<std::vector<Entry>> readDirectory(const ByteSource &source);

/// Reads a stored entry of at most `maxSize` bytes, checking its CRC unless
/// told not to. Compressed entries are refused.
Result<std::string> readEntry(const ByteSource &source, const Entry &entry,
                              uint64_t maxSize = uint64_t(64) << 20, bool verifyCrc = true);

/// Checks a stored entry's CRC, reading it in pieces (any size).
Status verifyEntryCrc(const ByteSource &source, const Entry &entry);

//===----------------------------------------------------------------------===//
// torch.save items
//===----------------------------------------------------------------------===//

struct TorchSaveOptions {
  std::string archiveName = "archive";
  /// `.data/serialization_id`; torch writes 40 decimal digits.
  std::string serializationId = "0000000000000000000000000000000000000000";
  /// RecordSpec::dataPageOffset of the tensor data.
  std::optional<uint64_t> dataPageOffset;
};

/// A tensor item: its data.pkl and `dataBytes` bytes of `data/0` streamed by
/// the caller at the returned dataOffset.
Result<ItemLayout> planTensorItem(const std::string &dataPkl, uint64_t dataBytes,
                                  const TorchSaveOptions &options = {});

/// A bytes (BYTE_IO) item: torch.save of a plain object, no data records.
Result<std::string> buildObjectItem(const std::string &dataPkl,
                                    const TorchSaveOptions &options = {});

/// What data.pkl of a tensor item describes: a view of storage `data/<key>`.
struct TensorRecord {
  dcp::DType dtype = dcp::DType::Float32;
  std::string storageKey = "0";
  std::string location = "cpu";
  uint64_t storageElements = 0; // length of the storage in elements
  int64_t storageOffset = 0;    // in elements
  dcp::Dims size;
  dcp::Dims stride; // in elements
  bool requiresGrad = false;

  uint64_t storageBytes() const { return storageElements * dcp::dtypeInfo(dtype).elementSize; }
  /// Elements of the view (product of `size`); decodeTensorPickle checks
  /// that its byte count fits in int64_t.
  uint64_t elementCount() const {
    uint64_t n = 1;
    for (int64_t d : size)
      n *= static_cast<uint64_t>(d);
    return n;
  }
};

/// A C-contiguous tensor of `size` filling its own storage, as a DCP item.
/// Fails if the element count overflows.
Result<TensorRecord> contiguousTensor(dcp::DType dtype, const dcp::Dims &size);

/// The whole item of a C-contiguous tensor of `size`: what the planner sizes
/// and the runtime writes, so their offsets agree by construction. With
/// `dataPageOffset`, the data starts there in its page (see RecordSpec).
Result<ItemLayout> planContiguousTensorItem(dcp::DType dtype, const dcp::Dims &size,
                                            std::optional<uint64_t> dataPageOffset = {});

/// The data.pkl torch.save writes for `record`, byte for byte:
/// _rebuild_tensor_v2 with a legacy typed storage, or _rebuild_tensor_v3
/// with an UntypedStorage (numel in bytes) for dtypes without one.
Result<std::string> encodeTensorPickle(const TensorRecord &record);

/// Reads a tensor data.pkl: _rebuild_tensor_v2, _rebuild_tensor_v3 and the
/// old _rebuild_tensor, optionally wrapped in _rebuild_parameter. Checks
/// that sizes and strides are non-negative and the view lies inside the
/// storage.
Result<TensorRecord> decodeTensorPickle(std::string_view dataPkl);

/// Copies the view `record` of `storage` (storageBytes() bytes) into `out`
/// in C order: out holds elementCount() * elementSize bytes (more than the
/// storage when a stride is 0). Swaps each element's bytes if `swapBytes`
/// (a big-endian item on a little-endian host).
Status copyToContiguous(const TensorRecord &record, const void *storage, uint64_t storageBytes,
                        void *out, bool swapBytes = false);

/// One opened torch.save item.
struct TorchSaveItem {
  std::string archiveName;
  std::vector<Entry> entries;
  std::string dataPkl;
  int64_t version = 0;
  bool bigEndian = false;

  /// The entry `<archive>/<name>`, e.g. "data/0"; null if absent.
  const Entry *findRecord(std::string_view name) const;
};

/// Opens an item as PyTorch's reader does: one top-level folder holding
/// every entry, data.pkl and version (or .data/version, 1..10) required,
/// byteorder "little" (default) or "big".
Result<TorchSaveItem> openTorchSaveItem(const ByteSource &source);

} // namespace zip
} // namespace fsdp

#endif // FSDP_FORMAT_ZIP_H
