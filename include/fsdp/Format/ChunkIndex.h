//===- ChunkIndex.h - A compact, seekable index of a checkpoint's chunks -*- C++ -*-===//
//
// At scale the DCP `.metadata` pickle is the bottleneck of a load: a
// 405B-parameter model saved from 16,384 ranks has about 6 million chunks,
// a `.metadata` near 1 GB, and every rank of a resharding load would parse
// all of it to find the few chunks it needs. Our checkpoints add a side
// file, `.fsdp-chunks`, that PyTorch never opens: the same keys and chunks
// as fixed-size binary records sorted by (key, chunk offsets), so a rank
// binary-searches for the chunks that overlap its pieces and reads only the
// pages that hold them.
//
// Layout (all integers little-endian; docs/CheckpointFormat.md):
//   header      128 bytes: magic "FSDPCHK1", version, flags, record size,
//               records per block, counts, section offsets, the length and
//               xxh3 of `.metadata`, and the xxh3 of the directory (every
//               byte before the records but this field)
//   key table   72 bytes per key, sorted by key bytes: name (pool offset,
//               length), dtype, ndim, bytes-item flag, global shape, the
//               key's record range [begin, end) and the largest dim-0 size of
//               its chunks (so a row-range query can binary-search)
//   file table  16 bytes per data file: name (pool offset, length)
//   string pool key and file names
//   block table per block of records: its xxh3 and the dim-0 offset of its
//               first record (its fence)
//   records     96 bytes per chunk (or bytes item), sorted by (key, offsets):
//               offsets[4], sizes[4], file index, item offset, item length,
//               the item's xxh3 (the digest `.fsdp-index` holds; 0 when the
//               index was built without checksums)
// The directory (header to block table) is read and checked whole at open;
// the records are read and checked block by block (170 records, 16,320
// bytes) the first time a query touches them. A query finds its block by
// the fences, so it reads one block or two: a rank's memory and reads grow
// with the chunks it asks about, not with the checkpoint. Everything is
// treated as hostile: counts, offsets and names are checked against the
// file's real size before use, the fences' order at open, and each record
// against its key's shape, its neighbours' order and its block's fences
// when its block is first read.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_FORMAT_CHUNKINDEX_H
#define FSDP_FORMAT_CHUNKINDEX_H

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Format/Zip.h"
#include "fsdp/Support/Result.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {
namespace chunkindex {

constexpr const char *kChunkIndexFileName = ".fsdp-chunks";
constexpr uint32_t kVersion = 1;
/// Tensors of more dimensions get no chunk index (readers use `.metadata`).
constexpr unsigned kMaxDims = 4;
constexpr uint32_t kRecordSize = 96;
// Small blocks: a query reads one or two, so a rank reads ~16 KiB per piece.
constexpr uint32_t kRecordsPerBlock = 170; // 16,320 bytes

/// One key of the checkpoint.
struct KeyInfo {
  std::string name;
  bool isBytes = false;
  dcp::DType dtype = dcp::DType::Float32; // tensors only
  dcp::Dims shape;                        // tensors only
  uint64_t chunkCount = 0;                // records of the key (1 for a bytes item)
};

/// One saved chunk of a tensor (or a bytes item: no offsets or sizes) and
/// where its item lies.
struct Chunk {
  dcp::Dims offsets;
  dcp::Dims sizes;
  uint32_t file = 0; // index into the file table
  uint64_t itemOffset = 0;
  uint64_t itemLength = 0;
  uint64_t xxh3 = 0; // valid when the index has checksums
};

/// Builds the index of `metadata` (validated). `checksums` gives each item's
/// xxh3, matched by (file, offset, length): every item must have one; null
/// builds an index without checksums (a benchmark's, from `.metadata`
/// alone). Fails with kind Incompatible when a tensor has more than
/// kMaxDims dimensions (no index can be written), InvalidArgument when a
/// checksum is missing.
Result<std::string> build(const dcp::Metadata &metadata,
                          const std::vector<integrity::ItemChecksum> *checksums,
                          uint64_t metadataLength, uint64_t metadataXxh3);

/// Builds an index from keys and chunks given one at a time, in the index's
/// order: keys by name bytes, each key's chunks by offsets (a bytes item or
/// 0-d tensor: one chunk without offsets). It holds only the records (96
/// bytes a chunk), so a planner need not build a dcp::Metadata of millions
/// of chunks; build() feeds one too, so both give the same bytes. Errors
/// are build()'s; after one the builder is spent.
class Builder {
public:
  /// `files`: the data files' names, sorted and unique; chunks name them by
  /// position.
  static Result<Builder> create(std::vector<std::string> files);
  Builder(Builder &&) noexcept;
  Builder &operator=(Builder &&) noexcept;
  ~Builder();

  void reserve(uint64_t keys, uint64_t records);
  /// Starts the next key (`shape` and `dtype` ignored for a bytes item).
  Status addKey(const std::string &name, bool isBytes, dcp::DType dtype, const dcp::Dims &shape);
  /// A chunk of the current key.
  Status addChunk(const dcp::Dims &offsets, const dcp::Dims &sizes, uint32_t file,
                  uint64_t itemOffset, uint64_t itemLength, uint64_t xxh3 = 0);
  /// The index; `checksums` says whether the chunks carried their xxh3.
  Result<std::string> finish(bool checksums, uint64_t metadataLength, uint64_t metadataXxh3);

private:
  struct State;
  Builder();
  Status closeKey();
  std::unique_ptr<State> state_;
};

/// Recomputes the block hashes and the directory's hash of `bytes` from
/// what its header says, where that geometry fits the bytes (else leaves
/// them for a reader to refuse): a hostile writer's tool, so that a test's
/// or a fuzzer's edit stays the only fault a reader can find.
void resignForTesting(std::string &bytes);

/// Fills the checksums into an index built without them (the plan's): each
/// record's xxh3 is that of the gathered item at the same (file, offset),
/// the checksums flag is set and the block and directory hashes redone, so
/// the bytes are build()'s with `items`. The index must be of the
/// `.metadata` of this length and xxh3. Returns false, the index then
/// unusable, when a bytes item's length differs from its record's (a
/// payload that changed size: `.metadata` must be patched and the index
/// rebuilt). Fails (kind Internal) when an item is missing, naming the key,
/// or a tensor item's length differs.
Result<bool> fillChecksums(std::string &index, const std::vector<integrity::ItemChecksum> &items,
                           uint64_t metadataLength, uint64_t metadataXxh3);

/// An opened index. Queries may run from several threads at once.
class ChunkIndex {
public:
  /// Reads and checks the header and directory; the records are read on
  /// demand. `name` is used in messages.
  static Result<std::unique_ptr<ChunkIndex>> open(std::unique_ptr<zip::ByteSource> source,
                                                  std::string name);
  /// An index held whole in memory (built in-process: `trusted` skips the
  /// block checks, which cannot fail on bytes `build` just made).
  static Result<std::unique_ptr<ChunkIndex>> fromBytes(std::string bytes, std::string name,
                                                       bool trusted = false);
  ~ChunkIndex();

  bool hasChecksums() const { return hasChecksums_; }
  uint64_t metadataLength() const { return metadataLength_; }
  uint64_t metadataXxh3() const { return metadataXxh3_; }
  uint64_t keyCount() const { return keys_.size(); }
  uint64_t recordCount() const { return recordCount_; }
  uint64_t fileCount() const { return files_.size(); }
  const std::string &fileName(uint32_t file) const { return files_[file]; }

  /// The key's position in the key table (sorted by name), if present.
  std::optional<uint64_t> find(std::string_view key) const;
  KeyInfo key(uint64_t position) const;

  /// The chunks of the key at `position` that overlap the box [offsets,
  /// offsets + sizes), in (offsets) order; every chunk of a 0-d tensor or
  /// bytes item. A box of another rank than the key's overlaps nothing.
  /// Fails (kind Corrupt) when a record block it reads is damaged.
  Result<std::vector<Chunk>> overlapping(uint64_t position, const dcp::Dims &offsets,
                                         const dcp::Dims &sizes) const;
  /// Every chunk of the key, in (offsets) order.
  Result<std::vector<Chunk>> chunks(uint64_t position) const;

  /// Bytes read from the source so far (the directory and record blocks).
  uint64_t bytesRead() const { return bytesRead_; }
  /// Record blocks read so far (each at most once).
  uint64_t blocksRead() const { return blocksRead_; }

private:
  struct Key {
    uint64_t nameOffset = 0; // into pool_
    uint32_t nameLength = 0;
    uint8_t dtype = 0, ndim = 0;
    bool isBytes = false;
    int64_t shape[kMaxDims] = {};
    uint64_t begin = 0, end = 0;
    int64_t maxDim0 = 0;
  };
  ChunkIndex() = default;
  static Result<std::unique_ptr<ChunkIndex>> openImpl(std::unique_ptr<zip::ByteSource> source,
                                                      std::string name, std::string whole,
                                                      bool trusted);
  Error corrupt(const std::string &what) const;
  std::string_view keyName(const Key &key) const {
    return std::string_view(pool_).substr(key.nameOffset, key.nameLength);
  }
  /// The checked bytes of record `index` (kRecordSize of them).
  Result<const char *> record(uint64_t index) const;
  /// Block `block`, read and checked on first use.
  Result<const char *> block(uint64_t block) const;
  /// Reads block `block` and checks its hash and its records; under
  /// loadMutex_.
  Result<const char *> loadBlock(uint64_t block) const;
  Status checkBlock(uint64_t block, const char *bytes) const;
  /// The key that owns record `index`.
  const Key &keyOf(uint64_t index) const;
  Chunk decode(const Key &key, const char *bytes) const;

  std::string name_;
  std::unique_ptr<zip::ByteSource> source_;
  std::string whole_; // the file, when held in memory
  bool trusted_ = false;
  bool hasChecksums_ = false;
  uint64_t metadataLength_ = 0, metadataXxh3_ = 0;
  uint64_t recordCount_ = 0, recordOffset_ = 0;
  std::vector<Key> keys_;
  std::vector<std::string> files_;
  std::string pool_;
  std::vector<uint64_t> blockHashes_;
  std::vector<int64_t> fences_; // per block: its first record's dim-0 offset
  // ready_[b]: block b, checked; published once (under loadMutex_), then
  // read without a lock. owned_ only under loadMutex_.
  std::unique_ptr<std::atomic<const char *>[]> ready_;
  mutable std::vector<std::unique_ptr<char[]>> owned_;
  mutable std::mutex loadMutex_;
  mutable std::atomic<uint64_t> bytesRead_{0}, blocksRead_{0};
};

} // namespace chunkindex
} // namespace fsdp

#endif // FSDP_FORMAT_CHUNKINDEX_H
