//===- CheckpointReader.h - The one reader of a checkpoint directory -*- C++ -*-===//
//
// Load, verify, inspect and the tools read a checkpoint directory only
// through this class, and only through Storage. It treats every file as
// hostile:
//  - a staging directory (a save that never committed) is refused, by its
//    name once links and `.` are resolved, and by the marker a save leaves
//    in it until the commit;
//  - only regular files are opened (a FIFO is refused, never waited on), and
//    no link leads out of the directory; every file name from `.metadata` or
//    the index is a plain name inside the directory;
//  - sizes are checked against the file's real size before anything is
//    allocated, offsets with overflow-safe arithmetic; the `.metadata`
//    conversion has a budget, so memo-shared values cannot expand it;
//  - every item is checked the first time its bytes are read: against the
//    integrity index (xxh3 of the whole item) in our checkpoints, against
//    the zip CRC of its data record in PyTorch's; each use of an opened
//    tensor item re-checks its dtype, shape and byte count against the key
//    that uses it.
// Keys and chunks come from one of two sources behind the same queries
// (keyInfo, chunksOverlapping, bytesKeys): our compact chunk index
// `.fsdp-chunks` (ReaderOptions::useChunkIndex, what a load asks for: then
// neither `.metadata` nor `.fsdp-index` is read, and only the index pages a
// query touches are), or the parsed `.metadata` (PyTorch's checkpoints, and
// verify and inspect, which read everything).
// Opened, it may be used from several threads at once (a load's workers).
// Errors carry their kind (not found, corrupt, incompatible, I/O) and name
// the file and key; bytes from files are escaped where they are printed.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_CHECKPOINTREADER_H
#define FSDP_RUNTIME_CHECKPOINTREADER_H

#include "fsdp/Format/ChunkIndex.h"
#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Format/FileName.h"
#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Format/Zip.h"
#include "fsdp/Layout/Overlap.h"
#include "fsdp/Plan/CheckpointPlan.h"
#include "fsdp/Runtime/Storage.h"

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace fsdp {
namespace runtime {

/// The file a save leaves in its staging directory until it commits.
constexpr const char *kUncommittedMarker = ".fsdp-uncommitted";

/// One saved tensor item (a torch.save zip), opened once.
struct TensorItem {
  std::string fileName; // relative to the checkpoint directory
  std::string path;     // directory/fileName, for messages
  const zip::ByteSource *file = nullptr;
  uint64_t itemOffset = 0, itemLength = 0;
  uint64_t dataOffset = 0; // absolute offset of the storage's first byte
  uint32_t dataCrc = 0;    // the zip CRC of the storage record
  zip::TensorRecord record;
  bool contiguous = true; // C order
  /// The xxh3 of the whole item (from the integrity or the chunk index), or
  /// none (PyTorch's checkpoints: then the zip CRC).
  std::optional<uint64_t> xxh3;
  std::string label; // the item's name in the index ("model.w@[4, 0]"), for messages
  std::atomic<bool> verified{false}; // set by whichever thread checked it
};

struct ReaderOptions {
  /// Check items when they are first read (against the index or the zip
  /// CRCs). Off only for measurements.
  bool verifyItems = true;
  /// Answer key and chunk queries from `.fsdp-chunks` when the checkpoint
  /// has one, reading neither `.metadata` nor `.fsdp-index` (a load's
  /// choice); metadata(), find() and storageOf() then know nothing. A chunk
  /// index that is damaged fails the open (kind corrupt).
  bool useChunkIndex = false;
  /// Read cold ranges of data files with direct I/O (16 MiB and more); off:
  /// everything through the page cache.
  bool directReads = true;
};

/// A key as a load needs it: bytes item or tensor, dtype, global shape.
using KeyInfo = chunkindex::KeyInfo;

/// One saved chunk (or bytes item) and where its item lies.
struct SavedChunk {
  dcp::Dims offsets, sizes;
  std::string file;
  uint64_t itemOffset = 0, itemLength = 0;
  /// The item's xxh3 when the chunk index holds it (else looked up in
  /// `.fsdp-index`, or none).
  std::optional<uint64_t> xxh3;
};

class CheckpointReader {
public:
  /// Opens a committed checkpoint: resolves and checks the directory, reads
  /// `.metadata` (ours or PyTorch's) and, when present, the integrity index,
  /// checking `.metadata` against it.
  static Result<std::unique_ptr<CheckpointReader>> open(const std::string &dir, Storage &storage,
                                                        const ReaderOptions &options = {});

  const std::string &dir() const { return dir_; }
  /// True when keys and chunks come from the chunk index (`.metadata` and
  /// `.fsdp-index` unread).
  bool usesChunkIndex() const { return fromChunkIndex_; }
  /// True when items are checked against xxh3 digests (our checkpoints),
  /// false when against zip CRCs (PyTorch's).
  bool hasChecksums() const { return fromChunkIndex_ || hasIndex_; }

  /// The key, or nullopt when the checkpoint lacks it.
  std::optional<KeyInfo> keyInfo(const std::string &key) const;
  /// The saved chunks of tensor `key` that overlap the box [offsets, offsets
  /// + sizes) of it, in offsets order (every chunk of a 0-d tensor); none for
  /// a missing key or a box of another rank. Fails when the chunk index is
  /// damaged where the query reads it.
  Result<std::vector<SavedChunk>>
  chunksOverlapping(const std::string &key, const dcp::Dims &offsets, const dcp::Dims &sizes) const;
  /// Every bytes item's key, sorted.
  std::vector<std::string> bytesKeys() const;
  /// Every tensor's key, sorted.
  std::vector<std::string> tensorKeys() const;
  /// Every saved chunk of tensor `key`, in offsets order (none for a missing
  /// key or a bytes item).
  Result<std::vector<SavedChunk>> chunksOf(const std::string &key) const;
  /// For each read of a rank's plan, the saved chunks it needs: those that
  /// overlap its piece (a tensor piece) or the step's one chunk; none where
  /// the checkpoint lacks the key or holds it with another shape (the load
  /// reports those). What a load does before reading any data, alone.
  Result<std::vector<std::vector<SavedChunk>>>
  planReads(const std::vector<plan::ReadItem> &reads) const;

  /// The parsed `.metadata` and integrity index (empty and null when the
  /// chunk index is used).
  const dcp::Metadata &metadata() const { return metadata_; }
  /// The integrity index (our checkpoints have one), or null.
  const integrity::IntegrityIndex *index() const { return hasIndex_ ? &index_ : nullptr; }
  const dcp::StorageMetadata *find(const std::string &key) const;
  /// The storage of a tensor chunk (offsets) or of a bytes item (nullopt).
  const dcp::StorageInfo *storageOf(const std::string &key,
                                    const std::optional<dcp::Dims> &offsets) const;

  /// True when reading `chunk`'s item would wait on the device (its file's
  /// page cache lacks some of it); false for a file that does not open (the
  /// read reports that).
  bool cold(const SavedChunk &chunk);
  /// Starts reading, in the background, the pages of `chunk`'s item that
  /// opening it reads (its zip records: the first and last pages), so that
  /// they do not wait behind the data reads a cold load keeps queued.
  void prefetchRecords(const SavedChunk &chunk);

  /// The item of `chunk` of tensor `key`, opened (once) and checked against
  /// what the checkpoint says of that key: dtype, chunk shape, storage size.
  Result<TensorItem *> tensorItem(const std::string &key, const SavedChunk &chunk);
  /// The same for a chunk of the parsed `.metadata`.
  Result<TensorItem *> tensorItem(const std::string &key, const dcp::ChunkMetadata &chunk);
  /// True while an item's bytes are still to be checked: reads of parts of
  /// it must go through readStorage first.
  bool needsCheck(const TensorItem &item) const { return options_.verifyItems && !item.verified; }
  /// Told of bytes of a destination that hold what they will keep (read,
  /// and checked as far as the check has got): where they are, how many.
  /// `copy`, where set, copies the blocks a read copies into the
  /// destination and does for them in the same pass what `landed` does for
  /// the others (a load's cast of a main weight: one pass over each block
  /// where there were two).
  struct Landed {
    std::function<void(const char *at, uint64_t bytes)> landed;
    zip::ByteSource::BlockCopy copy;
    void operator()(const char *at, uint64_t bytes) const { landed(at, bytes); }
  };
  /// The item's whole storage into `destination` (storageBytes() bytes),
  /// checking the item the first time; `landed`, when given, hears of each
  /// block as it lands, while it is still in cache.
  Status readStorage(TensorItem &item, char *destination, const Landed *landed = nullptr);
  /// Bytes [offset, offset + count) of the item's storage handed to `sink`
  /// block by block, in order (positions from `offset`). The first time, the
  /// whole item is read and checked on the way (a mismatch fails after the
  /// last block), so a range is read once, not for its check and again for
  /// its bytes; after that, the range alone is read.
  Status streamStorage(TensorItem &item, uint64_t offset, uint64_t count,
                       const zip::ByteSource::BlockConsumer &sink);
  /// Checks the item without keeping its bytes (one block of memory),
  /// unless it is checked already.
  Status checkItem(TensorItem &item);
  /// `count` bytes of the storage from byte `offset`, unchecked: only for an
  /// item already checked (or when checks are off).
  Status readStorageRange(const TensorItem &item, uint64_t offset, uint64_t count,
                          char *destination);

  /// A bytes item's whole torch.save archive, checked.
  Result<std::string> bytesItem(const std::string &key);
  /// The Python repr of a bytes item's value (never executed; bounded).
  Result<std::string> bytesItemRepr(const std::string &key);

  /// Checks every byte (our checkpoints: items, padding, trailing bytes
  /// against the index; PyTorch's: every zip CRC) and every tensor item's
  /// header against `.metadata`, streaming files in blocks, and that the
  /// chunk index, when there is one, is exactly the one `.metadata` and the
  /// integrity index make. One line per problem in `report`; fails when
  /// there was any. Needs a reader opened without useChunkIndex.
  Status verifyAll(std::string &report);

  /// Whether a load of this checkpoint would find what it reads, checked
  /// without reading its items: `.metadata` agrees with `.fsdp-index` and
  /// `.fsdp-chunks` (length and checksum), the chunk index is whole (every
  /// record block against its checksum), and every data file named exists
  /// with at least the bytes its items end at. The job root's rule for a
  /// good checkpoint (JobRoot.h). Fails (kind Corrupt or NotFound) naming
  /// the first problem.
  Status checkLoadable();
  /// True when some key is optimizer state (`optimizer.`): false for a
  /// model-only checkpoint.
  bool hasOptimizerState() const;

  /// directory/name, for messages (name escaped).
  std::string pathOf(const std::string &name) const;

  /// Bytes read from storage so far (`.metadata`, the indexes, items).
  uint64_t bytesRead() const { return bytesRead_ + (chunks_ ? chunks_->bytesRead() : 0); }
  /// Of those, what direct reads landed straight in the caller's memory.
  uint64_t bytesReadInPlace() const;

private:
  /// chunksOverlapping (`target` set) and chunksOf (null) in one.
  Result<std::vector<SavedChunk>> savedChunks(const std::string &key,
                                              const layout::Box *target) const;
  /// bytesKeys (true) and tensorKeys (false) in one.
  std::vector<std::string> keysOfKind(bool bytes) const;
  CheckpointReader(std::string dir, Storage &storage, const ReaderOptions &options)
      : dir_(std::move(dir)), storage_(storage), options_(options) {}
  Status readMetadataAndIndex();
  /// Reads and parses `.fsdp-index` (which must exist), adding what it read
  /// to `bytes`.
  Result<integrity::IntegrityIndex> readIntegrityIndex(uint64_t &bytes) const;
  /// Opens `.fsdp-chunks`; false in `used` when there is none to use.
  Status openChunkIndex(bool &used);
  Result<const zip::ByteSource *> file(const std::string &name);
  /// Checks [offset, offset + length) lies in `file`; names the key.
  Status checkBounds(const std::string &key, const std::string &name, uint64_t offset,
                     uint64_t length, uint64_t fileSize) const;
  /// Reads the whole item block by block and checks it, marking it
  /// checked; its storage lands at `destination` when that is set, and
  /// `landed` hears of each block there.
  Status readAndCheck(TensorItem &item, char *destination, const Landed *landed,
                      const zip::ByteSource::BlockConsumer *sink = nullptr);
  Status checkItemAgainstKey(const TensorItem &item, const std::string &key,
                             const dcp::Dims &sizes) const;
  /// Where bytes item `key` lies.
  Result<SavedChunk> bytesLocation(const std::string &key) const;
  Status verifyIndexed(std::string &report, size_t &problems);
  /// The chunk index against the one `.metadata` and the index make.
  Status verifyChunkIndex(std::string &report, size_t &problems);
  Status verifyCrcs(std::string &report, size_t &problems);

  std::string dir_;
  Storage &storage_;
  ReaderOptions options_;
  dcp::Metadata metadata_;
  uint64_t metadataSize_ = 0, metadataXxh3_ = 0; // of the `.metadata` read
  integrity::IntegrityIndex index_;
  bool hasIndex_ = false;
  std::unique_ptr<chunkindex::ChunkIndex> chunks_; // when fromChunkIndex_
  bool fromChunkIndex_ = false;
  std::unordered_map<std::string, size_t> keys_;
  std::map<std::pair<std::string, dcp::Dims>, const dcp::StorageInfo *> tensorStorage_;
  std::map<std::string, const dcp::StorageInfo *> bytesStorage_;
  std::map<std::pair<std::string, uint64_t>, const integrity::ItemChecksum *> checksums_;
  std::map<std::string, std::unique_ptr<zip::ByteSource>> files_;
  std::map<std::pair<std::string, uint64_t>, std::unique_ptr<TensorItem>> items_;
  std::atomic<uint64_t> bytesRead_{0};
  // Loads read items from several threads: the caches are guarded (files_
  // by filesMutex_, items_ by itemsMutex_, taken in that nesting order:
  // items, then files).
  mutable std::mutex filesMutex_;
  std::mutex itemsMutex_;
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_CHECKPOINTREADER_H
