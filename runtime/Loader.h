//===- Loader.h - Pieces of tensors out of a checkpoint -----------*- C++ -*-===//
//
// Internal to the runtime: what a load does for one piece (a box of one
// tensor into a buffer range), through the one reader: the saved chunks it
// needs found first (through the chunk index when there is one), then each
// read (and checked) straight into the piece where it lands contiguously,
// overlapping saved chunks compared where they overlap, and the box's
// coverage checked. Load uses it for a plan's pieces, export for whole
// tensors.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_LOADER_H
#define FSDP_RUNTIME_LOADER_H

#include "RuntimeSupport.h"
#include "fsdp/Layout/Overlap.h"
#include "fsdp/Runtime/Buffers.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/LiveItem.h"
#include "fsdp/Support/Printable.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

namespace fsdp {
namespace runtime {

inline Error incompatible(std::string message) {
  return makeError(std::move(message), ErrorKind::Incompatible);
}

/// The buffer a piece of the plan's reads lands in, checked: its dtype is
/// the piece's and the piece lies inside it.
inline Result<BufferView> pieceBuffer(const plan::ReadItem &read, const RankBuffers &buffers) {
  Result<BufferView> view = buffers.get(read.buffer.group, read.buffer.role);
  if (!view)
    return propagate(view, read.key + ": " + view.error());
  uint64_t elementSize = dcp::dtypeInfo(read.dtype).elementSize;
  if (view->dtype != read.dtype || read.buffer.localOffset < 0 || read.buffer.elements < 0 ||
      static_cast<uint64_t>(read.buffer.localOffset + read.buffer.elements) * elementSize >
          view->bytes)
    return makeError(read.key + ": the plan's piece does not fit its buffer",
                     ErrorKind::InvalidArgument);
  return view;
}

/// Each of a worker's two pinned staging blocks for a device piece. Streamed
/// chunks are read in the reader's own direct-I/O blocks whatever this is;
/// smaller blocks pin less and stay nearer the cache. On an H200's host, in
/// four interleaved rounds of cold loads, 4 MiB blocks took 3.37-3.44 s,
/// 8 MiB 3.42-3.65 and 32 MiB 3.54-3.73 (bench/gpu/run). Bands (chunks that
/// are not row ranges) are read through the cache at this size: direct
/// reads start at 16 MiB.
constexpr uint64_t kDeviceBandBytes = uint64_t(4) << 20;

/// One worker's host staging for pieces in memory the host may not touch: a
/// band is read into one block while the band before it is still being
/// copied in from the other. The blocks come from a pool pinned by the
/// device's backend (the copies then run without the host); without a pool,
/// or for a band larger than its blocks, from memory of its own, each copy
/// waited for at once.
class BandStaging {
public:
  explicit BandStaging(StagingPool *pool = nullptr) : pool_(pool) {}
  ~BandStaging() { (void)finish(); }
  BandStaging(const BandStaging &) = delete;
  BandStaging &operator=(const BandStaging &) = delete;

  /// Host memory for the next band of `bytes`, once the copy out of it
  /// issued two bands ago is done (that copy's failure is returned, named
  /// as `copying` was told).
  Result<char *> take(uint64_t bytes) {
    pooled_ = pool_ && bytes <= pool_->blockBytes();
    if (!pooled_) {
      if (Status status = finish(); !status)
        return status.failure();
      own_.resize(bytes);
      return own_.data();
    }
    if (blocks_.empty())
      blocks_ = pool_->acquire(2);
    if (Status status = wait(next_); !status)
      return status.failure();
    return blocks_[next_];
  }
  /// The copy out of the memory `take` returned last; `what` names it in
  /// its failure.
  Status copying(std::future<Status> copy, std::string what) {
    pending_[next_] = {std::move(copy), std::move(what)};
    if (!pooled_)
      return wait(next_);
    next_ ^= 1;
    return Status::success();
  }
  /// Waits for every copy issued (none reads the blocks after this) and
  /// gives the blocks back; the first failure.
  Status finish() {
    Status first;
    for (unsigned slot = 0; slot < 2; ++slot)
      if (Status status = wait(slot); !status && first)
        first = status;
    if (!blocks_.empty())
      pool_->release(blocks_);
    blocks_.clear();
    next_ = 0;
    return first;
  }

private:
  struct Pending {
    std::future<Status> copy;
    std::string what;
  };
  Status wait(unsigned slot) {
    Pending &pending = pending_[slot];
    if (!pending.copy.valid())
      return Status::success();
    Status status = pending.copy.get();
    if (status)
      return status;
    return propagate(status, pending.what + ": " + status.error());
  }

  StagingPool *pool_;
  std::vector<char *> blocks_; // two, from the pool, while held
  Pending pending_[2];
  unsigned next_ = 0;
  bool pooled_ = false;
  std::string own_;
};

/// A saved chunk that overlaps the piece being loaded.
struct Overlap {
  const SavedChunk *chunk;
  layout::Box source;  // the saved chunk
  layout::Box overlap; // its part inside the piece
  int64_t rowBegin() const { return overlap.offsets.empty() ? 0 : overlap.offsets[0]; }
  int64_t rowEnd() const {
    return overlap.offsets.empty() ? 1 : overlap.offsets[0] + overlap.sizes[0];
  }
};

/// Reads this rank's pieces out of a checkpoint through the one reader.
class Loader {
public:
  explicit Loader(CheckpointReader &reader) : reader_(reader) {}
  /// The most host staging one band of a device piece takes (the size of a
  /// staging block): set before device pieces are loaded.
  void setBandBytes(uint64_t bandBytes) { bandBytes_ = bandBytes; }

  /// Finds the saved chunks every read needs (through the chunk index when
  /// the checkpoint has one), before any data is read.
  Status plan(const std::vector<plan::ReadItem> &reads) {
    Result<std::vector<std::vector<SavedChunk>>> planned = reader_.planReads(reads);
    if (!planned)
      return planned.failure();
    planned_ = planned.take();
    return Status::success();
  }

  /// The indices of the reads sorted by where the first saved chunk each one
  /// needs lies (file, offset); reads without one keep their place at the end.
  std::vector<size_t> fileOrder() const {
    std::vector<std::tuple<std::string, uint64_t, size_t>> keyed;
    for (size_t index = 0; index < planned_.size(); ++index) {
      std::tuple<std::string, uint64_t, size_t> key{std::string(1, '\xff'), 0, index};
      if (!planned_[index].empty())
        key = {planned_[index].front().file, planned_[index].front().itemOffset, index};
      keyed.push_back(std::move(key));
    }
    std::sort(keyed.begin(), keyed.end());
    std::vector<size_t> order;
    for (const auto &entry : keyed)
      order.push_back(std::get<2>(entry));
    return order;
  }

  /// True when one of the three largest saved chunks the reads need is cold
  /// (ByteSource::cold): the load then waits on the disk.
  bool readsCold() {
    std::vector<const SavedChunk *> chunks;
    for (const std::vector<SavedChunk> &needed : planned_)
      for (const SavedChunk &chunk : needed)
        chunks.push_back(&chunk);
    size_t probes = std::min<size_t>(chunks.size(), 3);
    std::partial_sort(chunks.begin(), chunks.begin() + probes, chunks.end(),
                      [](const SavedChunk *a, const SavedChunk *b) {
                        return a->itemLength > b->itemLength;
                      });
    for (size_t probe = 0; probe < probes; ++probe)
      if (reader_.cold(*chunks[probe]))
        return true;
    return false;
  }

  /// Starts reading the zip records of every saved chunk read `index` needs
  /// (CheckpointReader::prefetchRecords).
  void prefetchRecords(size_t index) {
    for (const SavedChunk &chunk : planned_[index])
      reader_.prefetchRecords(chunk);
  }

  /// Piece `index` of the plan's reads; `staging` is the calling worker's
  /// host staging (its copies may still run when this returns: its finish()
  /// waits for them). `landed`, when given, hears of the piece's bytes as
  /// they land in a buffer the host can touch.
  Status loadPiece(const plan::ReadItem &read, size_t index, RankBuffers &buffers,
                   BandStaging &staging, const CheckpointReader::Landed *landed = nullptr) {
    const std::string &dir = reader_.dir();
    std::optional<KeyInfo> saved = reader_.keyInfo(read.key);
    if (!saved)
      return missingKey(read.key);
    if (saved->isBytes)
      return incompatible(read.key + ": " + printable(dir) +
                          " holds a bytes item, the plan expects a tensor");
    if (saved->shape != read.globalShape)
      return incompatible(read.key + ": shape mismatch: " + printable(dir) + " has " +
                          dimsText(saved->shape) + ", the plan expects " +
                          dimsText(read.globalShape));
    if (saved->dtype != read.dtype)
      return incompatible(read.key + ": dtype mismatch: " + printable(dir) + " has " +
                          dcp::dtypeInfo(saved->dtype).name + ", the plan expects " +
                          dcp::dtypeInfo(read.dtype).name);
    const std::vector<SavedChunk> &chunks = planned_[index];
    Result<BufferView> view = pieceBuffer(read, buffers);
    if (!view)
      return view.failure();
    uint64_t elementSize = dcp::dtypeInfo(read.dtype).elementSize;
    uint64_t pieceOffset = static_cast<uint64_t>(read.buffer.localOffset) * elementSize;
    uint64_t pieceBytes = static_cast<uint64_t>(read.buffer.elements) * elementSize;
    layout::Box target{read.chunkOffsets, read.chunkSizes};
    if (view->backend->hostAccessible()) {
      if (Status status = loadBox(read.key, chunks, target, elementSize,
                                  static_cast<char *>(view->data) + pieceOffset, landed);
          !status)
        return status;
    } else {
      // Memory the host may not touch (a device). Row-range chunks stream
      // through the staging, each read and checked once.
      bool streamed = false;
      if (Status status = streamChunks(read.key, chunks, target, elementSize, *view, pieceOffset,
                                       staging, streamed);
          !status)
        return status;
      if (streamed) {
        bytesRead_ += pieceBytes;
        return Status::success();
      }
      // Otherwise the piece in bands of whole rows, each assembled in host
      // staging and copied in while the next is read.
      uint64_t rowBytes = elementSize;
      for (size_t d = 1; d < target.sizes.size(); ++d)
        rowBytes *= static_cast<uint64_t>(target.sizes[d]);
      int64_t rows = target.sizes.empty() ? 1 : target.sizes[0];
      int64_t bandRows =
          std::max<int64_t>(1, static_cast<int64_t>(bandBytes_ / std::max<uint64_t>(rowBytes, 1)));
      for (int64_t row = 0; row < rows; row += bandRows) {
        layout::Box band = target;
        if (!band.sizes.empty()) {
          band.offsets[0] += row;
          band.sizes[0] = std::min(bandRows, rows - row);
        }
        uint64_t bandBytes = band.sizes.empty() ? rowBytes : rowBytes * band.sizes[0];
        Result<char *> host = staging.take(bandBytes);
        if (!host)
          return host.failure();
        if (Status status = loadBox(read.key, chunks, band, elementSize, *host); !status)
          return status;
        uint64_t at = pieceOffset + static_cast<uint64_t>(row) * rowBytes;
        if (at > view->bytes || bandBytes > view->bytes - at)
          return makeError(read.key + ": a band past the end of its buffer", ErrorKind::Internal);
        if (Status status = staging.copying(
                view->backend->copyIn(*host, static_cast<char *>(view->data) + at, bandBytes),
                read.key);
            !status)
          return status;
      }
    }
    bytesRead_ += pieceBytes;
    return Status::success();
  }

  /// When the part of every saved chunk overlapping `target` is one
  /// contiguous run in its storage and in the piece, apart from the others
  /// (row-range chunks and pieces, as Megatron-FSDP's are), streams each run
  /// block by block into `staging` and from there into the device piece at
  /// `pieceOffset` of `view`, and sets `streamed`. Each chunk is read once
  /// (CheckpointReader::streamStorage). In bands, a chunk was read twice:
  /// its check read it whole, then each band read its own range again
  /// (0.55 x the read ceiling on an H200's disk, measured by bench/gpu/run).
  Status streamChunks(const std::string &key, const std::vector<SavedChunk> &chunks,
                      const layout::Box &target, uint64_t elementSize, const BufferView &view,
                      uint64_t pieceOffset, BandStaging &staging, bool &streamed) {
    streamed = false;
    struct Run {
      TensorItem *item;
      uint64_t source;      // byte offset in the item's storage
      uint64_t destination; // byte offset in the buffer
      uint64_t bytes;
    };
    std::vector<Run> streams;
    int64_t covered = 0;
    std::vector<layout::CopyRun> runs;
    for (const SavedChunk &chunk : chunks) {
      layout::Box source{chunk.offsets, chunk.sizes};
      if (!layout::intersect(source, target))
        continue;
      runs.clear();
      layout::overlapRuns(source, target, runs);
      if (runs.size() != 1)
        return Status::success();
      Result<TensorItem *> item = reader_.tensorItem(key, chunk);
      if (!item)
        return item.failure();
      if (!(*item)->contiguous)
        return Status::success();
      const layout::CopyRun &run = runs[0];
      uint64_t sourceElement =
          (*item)->record.storageOffset + static_cast<uint64_t>(run.srcElementOffset);
      streams.push_back({*item, sourceElement * elementSize,
                         pieceOffset + static_cast<uint64_t>(run.dstElementOffset) * elementSize,
                         static_cast<uint64_t>(run.count) * elementSize});
      covered += run.count;
    }
    std::sort(streams.begin(), streams.end(),
              [](const Run &a, const Run &b) { return a.destination < b.destination; });
    for (size_t i = 1; i < streams.size(); ++i)
      if (streams[i - 1].destination + streams[i - 1].bytes > streams[i].destination)
        return Status::success(); // chunks overlapping each other: compared in bands
    if (streams.empty() || covered != layout::boxElements(target))
      return Status::success(); // not covered: the band path words the error
    streamed = true;
    for (const Run &run : streams) {
      char *block = nullptr;
      uint64_t blockStart = 0, blockBytes = 0, filled = 0;
      Status status = reader_.streamStorage(
          *run.item, run.source, run.bytes,
          [&](uint64_t at, const char *bytes, size_t size) -> Status {
            if (at != blockStart + filled || at + size > run.bytes)
              return makeError(key + ": a streamed read out of order", ErrorKind::Internal);
            while (size) {
              if (!block) {
                blockStart = at;
                // No band set (no pool): the rest of the run at once.
                blockBytes = bandBytes_ ? std::min(bandBytes_, run.bytes - at) : run.bytes - at;
                filled = 0;
                Result<char *> taken = staging.take(blockBytes);
                if (!taken)
                  return taken.failure();
                block = *taken;
              }
              uint64_t take = std::min<uint64_t>(size, blockBytes - filled);
              std::memcpy(block + filled, bytes, take);
              filled += take, bytes += take, size -= take, at += take;
              if (filled == blockBytes) {
                char *device = static_cast<char *>(view.data) + run.destination + blockStart;
                Status copied =
                    staging.copying(view.backend->copyIn(block, device, blockBytes), key);
                block = nullptr;
                blockStart += blockBytes, filled = 0;
                if (!copied)
                  return copied;
              }
            }
            return Status::success();
          });
      if (!status)
        return status;
    }
    return Status::success();
  }

  /// The saved chunks of `key` overlapping `target` (a box of the tensor;
  /// `chunks` holds every saved chunk that may) into host memory at `base`,
  /// laid out as the box: every element covered, chunks that overlap each
  /// other agreeing; `landed` as for loadPiece.
  Status loadBox(const std::string &key, const std::vector<SavedChunk> &chunks,
                 const layout::Box &target, uint64_t elementSize, char *base,
                 const CheckpointReader::Landed *landed = nullptr) {
    const std::string &dir = reader_.dir();
    std::vector<Overlap> overlaps;
    for (const SavedChunk &chunk : chunks) {
      layout::Box source{chunk.offsets, chunk.sizes};
      if (std::optional<layout::Box> overlap = layout::intersect(source, target))
        overlaps.push_back({&chunk, source, *overlap});
    }
    // In row order, so that saved chunks overlapping each other are found
    // among neighbours: their common elements must agree.
    std::sort(overlaps.begin(), overlaps.end(),
              [](const Overlap &a, const Overlap &b) { return a.rowBegin() < b.rowBegin(); });
    std::vector<const Overlap *> active;
    std::vector<layout::Box> covered;
    for (const Overlap &overlap : overlaps) {
      Result<TensorItem *> item = reader_.tensorItem(key, *overlap.chunk);
      if (!item)
        return item.failure();
      active.erase(std::remove_if(active.begin(), active.end(),
                                  [&](const Overlap *earlier) {
                                    return earlier->rowEnd() <= overlap.rowBegin();
                                  }),
                   active.end());
      for (const Overlap *earlier : active)
        if (std::optional<layout::Box> both = layout::intersect(earlier->overlap, overlap.overlap))
          if (Status status =
                  compareOverlap(**item, overlap, *earlier, *both, target, elementSize, base, key);
              !status)
            return status;
      if (Status status = copyOverlap(**item, overlap.source, target, elementSize, base, landed);
          !status)
        return propagate(status, key + ": " + status.error());
      active.push_back(&overlap);
      covered.push_back(overlap.overlap);
    }
    if (!layout::covers(covered, target))
      return incompatible(
          key + ": no saved chunk in " + printable(dir) + " covers part of rows [" +
          std::to_string(target.offsets.empty() ? 0 : target.offsets[0]) + ", " +
          std::to_string(target.offsets.empty() ? 0 : target.offsets[0] + target.sizes[0]) +
          "): the checkpoint does not tile the tensor");
    return Status::success();
  }

  Result<float> loadStep(const plan::ReadItem &read, size_t index) {
    std::optional<KeyInfo> saved = reader_.keyInfo(read.key);
    if (!saved)
      return missingKey(read.key);
    if (saved->isBytes || !saved->shape.empty() || saved->chunkCount != 1 ||
        planned_[index].size() != 1 || saved->dtype != dcp::DType::Float32)
      return incompatible(read.key + ": expected a 0-d float32 tensor in " +
                          printable(reader_.dir()));
    Result<TensorItem *> item = reader_.tensorItem(read.key, planned_[index][0]);
    if (!item)
      return item.failure();
    std::string storage((*item)->record.storageBytes(), '\0');
    if (Status status = reader_.readStorage(**item, storage.data()); !status)
      return propagate(status, read.key + ": " + status.error());
    float step = 0;
    std::memcpy(&step, storage.data() + (*item)->record.storageOffset * sizeof(float),
                sizeof(step));
    return step;
  }

  /// Every bytes item's raw archive, checked: what a reshard carries over.
  Result<std::map<std::string, std::string>> bytesItems() {
    std::map<std::string, std::string> out;
    for (const std::string &key : reader_.bytesKeys()) {
      Result<std::string> bytes = reader_.bytesItem(key);
      if (!bytes)
        return bytes.failure();
      out[key] = bytes.take();
    }
    return out;
  }

  /// What the committing rank lists for LoadResult::tensorItems: every
  /// tensor of the checkpoint that neither `planned` (sorted; null: none)
  /// nor this rank's `reads` (pieces and steps) name, saved as one chunk of
  /// at most kMaxLiveItemBytes (the most a live item holds).
  std::vector<std::string> unplannedTensors(const std::vector<plan::ReadItem> &reads,
                                            const std::vector<std::string> *planned) const {
    const uint64_t maxBytes = kMaxLiveItemBytes;
    std::unordered_set<std::string> read;
    for (const plan::ReadItem &item : reads)
      if (item.source == plan::ItemSource::Buffer || item.source == plan::ItemSource::Step)
        read.insert(item.key);
    std::vector<std::string> out;
    for (std::string &key : reader_.tensorKeys()) {
      if (read.count(key) || (planned && std::binary_search(planned->begin(), planned->end(), key)))
        continue;
      std::optional<KeyInfo> info = reader_.keyInfo(key);
      if (info && !info->isBytes && info->chunkCount == 1 && tensorBytes(*info) <= maxBytes)
        out.push_back(std::move(key));
    }
    return out;
  }

  /// The tensors `keys` (unplannedTensors' list) where each is saved as one
  /// chunk covering it: dtype, shape and C-order data, checked as every
  /// item is. Live items (ours, in kLiveFileName) come back whatever their
  /// size, others (a PyTorch job's) when at most `maxForeignBytes`: every
  /// rank reads them all. Others are skipped.
  Result<std::map<std::string, LiveItem>> tensorItems(const std::vector<std::string> &keys,
                                                      uint64_t maxForeignBytes) {
    std::map<std::string, LiveItem> out;
    for (const std::string &key : keys) {
      std::optional<KeyInfo> info = reader_.keyInfo(key);
      if (!info || info->isBytes || info->chunkCount != 1)
        continue;
      uint64_t bytes = tensorBytes(*info);
      if (bytes > kMaxLiveItemBytes)
        continue;
      Result<std::vector<SavedChunk>> chunks = reader_.chunksOf(key);
      if (!chunks)
        return chunks.failure();
      if (chunks->size() != 1)
        continue;
      const SavedChunk &chunk = chunks->front();
      uint64_t maxBytes = chunk.file == kLiveFileName ? kMaxLiveItemBytes : maxForeignBytes;
      if (bytes > maxBytes)
        continue;
      if (chunk.sizes != info->shape || chunk.offsets.size() != info->shape.size() ||
          std::any_of(chunk.offsets.begin(), chunk.offsets.end(),
                      [](int64_t offset) { return offset != 0; }))
        continue;
      Result<TensorItem *> opened = reader_.tensorItem(key, chunk);
      if (!opened)
        return opened.failure();
      TensorItem &item = **opened;
      if (item.record.storageBytes() > maxBytes)
        continue; // a small view of a large storage: not read
      LiveItem live;
      live.key = key;
      live.isTensor = true;
      live.dtype = info->dtype;
      live.shape = info->shape;
      live.data.assign(bytes, '\0');
      if (item.contiguous && item.record.storageOffset == 0 &&
          item.record.storageElements == item.record.elementCount()) {
        if (Status status = reader_.readStorage(item, live.data.data()); !status)
          return propagate(status, key + ": " + status.error());
      } else {
        std::string storage(item.record.storageBytes(), '\0');
        if (Status status = reader_.readStorage(item, storage.data()); !status)
          return propagate(status, key + ": " + status.error());
        if (Status status = zip::copyToContiguous(item.record, storage.data(), storage.size(),
                                                  live.data.data());
            !status)
          return propagate(status, key + ": " + status.error());
      }
      bytesRead_ += bytes;
      out.emplace(key, std::move(live));
    }
    return out;
  }

  uint64_t bytesRead() const { return bytesRead_; }

private:
  /// A key the plan reads that the checkpoint lacks; optimizer state may be
  /// missing from a checkpoint of the model alone.
  Error missingKey(const std::string &key) const {
    return incompatible(key + ": missing in " + reader_.pathOf(".metadata") +
                        (key.rfind("optimizer.", 0) == 0
                             ? " (a checkpoint of the model alone? exclude \"optimizer\" to "
                               "load its weights)"
                             : ""));
  }

  /// Saved chunks that overlap must hold the same values where they do:
  /// reads `overlap`'s values in `both` and compares them with what
  /// `earlier` already put in the piece.
  Status compareOverlap(TensorItem &item, const Overlap &overlap, const Overlap &earlier,
                        const layout::Box &both, const layout::Box &target, uint64_t elementSize,
                        const char *base, const std::string &key) {
    uint64_t elements = 1;
    for (int64_t size : both.sizes)
      elements *= static_cast<uint64_t>(size);
    std::string scratch(elements * elementSize, '\0');
    if (Status status = copyOverlap(item, overlap.source, both, elementSize, scratch.data());
        !status)
      return propagate(status, key + ": " + status.error());
    std::vector<layout::CopyRun> runs;
    layout::overlapRuns(both, target, runs);
    for (const layout::CopyRun &run : runs)
      if (std::memcmp(scratch.data() + run.srcElementOffset * elementSize,
                      base + run.dstElementOffset * elementSize, run.count * elementSize) != 0)
        return makeError(key + ": the saved chunks at " + dimsText(earlier.chunk->offsets) +
                             " and " + dimsText(overlap.chunk->offsets) + " in " +
                             printable(reader_.dir()) + " overlap and hold different values there",
                         ErrorKind::Corrupt);
    return Status::success();
  }

  /// Copies source ∩ target into the target box at `base`; `landed` hears
  /// of the bytes copied.
  Status copyOverlap(TensorItem &item, const layout::Box &source, const layout::Box &target,
                     uint64_t elementSize, char *base,
                     const CheckpointReader::Landed *landed = nullptr) {
    std::vector<layout::CopyRun> runs;
    layout::overlapRuns(source, target, runs);
    auto tell = [&] {
      if (landed)
        for (const layout::CopyRun &run : runs)
          (*landed)(base + run.dstElementOffset * elementSize, run.count * elementSize);
    };
    // The whole saved chunk lands contiguously in the piece (a load into the
    // layout it was saved from): one read straight into the buffer, checked
    // there.
    if (item.contiguous && item.record.storageOffset == 0 && runs.size() == 1 &&
        runs[0].srcElementOffset == 0 &&
        static_cast<uint64_t>(runs[0].count) == item.record.storageElements)
      return reader_.readStorage(item, base + runs[0].dstElementOffset * elementSize, landed);
    // A row-range chunk partly needed and not checked yet: the whole item
    // passes by for its check, and its run is copied out on the way (read
    // once, memory bounded whatever the item's size).
    if (item.contiguous && runs.size() == 1 && reader_.needsCheck(item)) {
      char *into = base + runs[0].dstElementOffset * elementSize;
      Status status = reader_.streamStorage(
          item, (item.record.storageOffset + runs[0].srcElementOffset) * elementSize,
          runs[0].count * elementSize, [&](uint64_t at, const char *bytes, size_t size) {
            std::memcpy(into + at, bytes, size);
            return Status::success();
          });
      if (status)
        tell();
      return status;
    }
    // A large item only partly needed in several runs is checked block by
    // block first (its bytes not kept), then only the needed ranges are
    // read. A small one is read whole, once.
    if (item.contiguous && reader_.needsCheck(item) && item.record.storageBytes() > kWholeItemBytes)
      if (Status status = reader_.checkItem(item); !status)
        return status;
    if (item.contiguous && !reader_.needsCheck(item)) {
      // Row-range chunks: exactly one run, one contiguous read.
      for (const layout::CopyRun &run : runs)
        if (Status status = reader_.readStorageRange(
                item, (item.record.storageOffset + run.srcElementOffset) * elementSize,
                run.count * elementSize, base + run.dstElementOffset * elementSize);
            !status)
          return status;
      tell();
      return Status::success();
    }
    // Read (and check) the storage once; serve the runs from memory, in C
    // order (PyTorch may save strided views).
    std::string storage(item.record.storageBytes(), '\0');
    if (Status status = reader_.readStorage(item, storage.data()); !status)
      return status;
    std::string dense;
    const char *elements = storage.data() + item.record.storageOffset * elementSize;
    if (!item.contiguous) {
      dense.assign(item.record.elementCount() * elementSize, '\0');
      if (Status status =
              zip::copyToContiguous(item.record, storage.data(), storage.size(), dense.data());
          !status)
        return status;
      elements = dense.data();
    }
    for (const layout::CopyRun &run : runs)
      std::memcpy(base + run.dstElementOffset * elementSize,
                  elements + run.srcElementOffset * elementSize, run.count * elementSize);
    tell();
    return Status::success();
  }

  /// A tensor's bytes (UINT64_MAX when that overflows).
  static uint64_t tensorBytes(const KeyInfo &info) {
    uint64_t bytes = dcp::dtypeInfo(info.dtype).elementSize;
    for (int64_t dim : info.shape)
      if (dim < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes))
        return UINT64_MAX;
    return bytes;
  }

  /// Items up to this size are read whole when only part of them is needed.
  static constexpr uint64_t kWholeItemBytes = 64 << 20;

  CheckpointReader &reader_;
  std::vector<std::vector<SavedChunk>> planned_; // per read: the saved chunks it needs
  uint64_t bandBytes_ = 0;             // the most host staging one band of a device piece takes
  std::atomic<uint64_t> bytesRead_{0}; // pieces loaded, by every worker
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_LOADER_H
