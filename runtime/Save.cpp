//===- Save.cpp - Execute a save plan -------------------------------------===//
#include "LiveItems.h"
#include "Parallel.h"
#include "RuntimeSupport.h"
#include "WriteQueue.h"
#include "fsdp/Format/ChunkIndex.h"
#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Format/Zip.h"
#include "fsdp/Runtime/Cast.h"
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/Protocol.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <sys/mman.h>
#include <tuple>
#include <unistd.h>

namespace fsdp {
namespace runtime {

namespace {

/// Host data goes into a direct block in pieces of this size, each CRCed
/// and hashed while it is still in the core's L2.
constexpr uint64_t kCachedPieceBytes = uint64_t(256) << 10;
/// A worker's run of consecutive items: at most this many bytes (less when
/// a rank's file is small, so every worker gets several runs).
constexpr uint64_t kWriteRunBytes = uint64_t(64) << 20;

/// Streams one item: header, data, trailer, with CRC32 of the data and xxh3
/// of the whole item computed block by block while the data is hot.
struct ItemWriter {
  ItemLayoutCache &layouts;
  WritableFile &file;
  std::vector<integrity::ItemChecksum> &checksums;
  uint64_t bytes = 0;
  /// Where buffers the host may not touch are staged: two blocks per item,
  /// one copied out while the other is checksummed and written.
  StagingPool *staging = nullptr;
  /// For a file opened for direct I/O: the aligned blocks every item is
  /// assembled in, written while the next ones are filled.
  WriteQueue *directQueue = nullptr;
  /// The end of the last byte this writer wrote (direct writes round up).
  uint64_t end = 0;
  /// Direct I/O: the block being filled, kept open from one item to the
  /// next when the next starts where it ends (a worker's items follow each
  /// other in the file): small items and items' tails then share blocks, and
  /// the device sees full 8 MiB writes instead of a short one per item.
  char *openBlock = nullptr;
  /// Where `openBlock` goes in the file, and how much of it is filled.
  uint64_t openAt = 0, openUsed = 0;
  /// The item the open block starts in (named if its write fails).
  std::string openKey;

  ~ItemWriter() {
    if (openBlock) // a failed save: the block goes back unwritten
      directQueue->release(openBlock);
  }

  /// Writes the open block, its tail zeroed to the file's alignment (an
  /// empty one goes back to the pool).
  void submitOpenBlock() {
    if (!openBlock)
      return;
    if (!openUsed) {
      directQueue->release(openBlock);
      openBlock = nullptr;
      return;
    }
    uint64_t alignment = file.directAlignment();
    uint64_t size = (openUsed + alignment - 1) / alignment * alignment;
    std::memset(openBlock + openUsed, 0, size - openUsed);
    directQueue->submit(openBlock, openAt, size, openKey);
    openBlock = nullptr;
    openUsed = 0;
  }

  /// `size` bytes of an item's data from byte `at` into host memory.
  using Fill = std::function<Status(uint64_t at, uint64_t size, char *to)>;

  /// Direct I/O: header, data (CRC32 and xxh3 computed as it is copied in),
  /// trailer and zeros to the alignment, in aligned blocks written whenever
  /// they are full. Items start aligned (the plan aligns every item to 4
  /// KiB), so the zeros fall in the gap before the next item; an item that
  /// starts at the end of the open block goes on filling it. With
  /// `hostData` (the item's data in host memory), each 256 KiB piece is
  /// copied in with streaming stores and CRCed and hashed from its source,
  /// which the copy left in the core's cache; otherwise `fill` (a device
  /// copy, a fixed cost per call) runs once per block, then each piece is
  /// CRCed and hashed from the block.
  Status writeDirect(const plan::WriteItem &item, const zip::ItemLayout *layout,
                     const std::string *payload, const Fill &fill, const char *hostData) {
    uint64_t alignment = file.directAlignment();
    uint64_t directBlockBytes = directQueue->blockBytes();
    if (item.itemOffset % alignment || directBlockBytes % alignment)
      return makeError(item.key + ": item at " + std::to_string(item.itemOffset) +
                           " is not aligned for direct I/O",
                       ErrorKind::Internal);
    if (openBlock) {
      uint64_t filled = (openUsed + alignment - 1) / alignment * alignment;
      if (openAt + filled == item.itemOffset && filled < directBlockBytes) {
        std::memset(openBlock + openUsed, 0, filled - openUsed);
        openUsed = filled;
      } else {
        submitOpenBlock();
      }
    }
    if (!openBlock) {
      Result<char *> acquired = directQueue->acquire();
      if (!acquired)
        return acquired.failure();
      openBlock = *acquired;
      openAt = item.itemOffset;
      openUsed = 0;
      openKey = item.key;
    }
    // The full block written, the next one acquired where it ends.
    auto flush = [&]() -> Status {
      uint64_t next = openAt + openUsed;
      submitOpenBlock();
      Result<char *> acquired = directQueue->acquire();
      if (!acquired)
        return acquired.failure();
      openBlock = *acquired;
      openAt = next;
      openKey = item.key;
      return Status::success();
    };
    // Copies `size` bytes in by `copy(offset, count, to)`, writing full blocks.
    auto append = [&](uint64_t size, const auto &copy) -> Status {
      for (uint64_t done = 0; done < size;) {
        uint64_t count = std::min(size - done, directBlockBytes - openUsed);
        if (Status status = copy(done, count, openBlock + openUsed); !status)
          return status;
        openUsed += count;
        done += count;
        if (openUsed == directBlockBytes)
          if (Status status = flush(); !status)
            return status;
      }
      return Status::success();
    };
    auto bytesOf = [](const std::string &bytes) {
      return [&bytes](uint64_t offset, uint64_t count, char *to) {
        std::memcpy(to, bytes.data() + offset, count);
        return Status::success();
      };
    };
    if (payload) { // a bytes item: the archive as it is
      if (Status status = append(payload->size(), bytesOf(*payload)); !status)
        return status;
      end = std::max(end, item.itemOffset + payload->size());
      checksums.push_back({itemChecksumKey(item.key, item.chunkOffsets, false),
                           baseName(file.path()), item.itemOffset, payload->size(),
                           integrity::xxh3(payload->data(), payload->size())});
      bytes += payload->size();
      return Status::success();
    }
    integrity::StreamingXxh3 hash;
    uint32_t crc = 0;
    hash.update(layout->header.data(), layout->header.size());
    if (Status status = append(layout->header.size(), bytesOf(layout->header)); !status)
      return status;
    // CRC and hash each piece while it is still in the core's cache: a
    // whole block (8 MiB) copied first was read back twice from memory.
    auto data = [&](uint64_t offset, uint64_t count, char *to) -> Status {
      if (!hostData)
        if (Status status = fill(offset, count, to); !status)
          return propagate(status, item.key + ": " + status.error());
      for (uint64_t done = 0; done < count; done += kCachedPieceBytes) {
        uint64_t size = std::min(kCachedPieceBytes, count - done);
        const char *piece = to + done;
        if (hostData) {
          // The block is not read again but by the disk: streaming stores
          // spare reading each of its lines in first.
          piece = hostData + offset + done;
          copyBypassingCache(to + done, piece, size);
        }
        crc = zip::crc32(piece, size, crc);
        hash.update(piece, size);
      }
      return Status::success();
    };
    if (Status status = append(layout->dataSize, data); !status)
      return status;
    zip::ItemLayout filled = *layout; // the trailer carries this item's CRC
    filled.setDataCrc(crc);
    hash.update(filled.trailer.data(), filled.trailer.size());
    if (Status status = append(filled.trailer.size(), bytesOf(filled.trailer)); !status)
      return status;
    end = std::max(end, item.itemOffset + layout->totalSize);
    return recordChecksum(item, hash.digest());
  }

  /// An item from a buffer: straight from its memory when the host may
  /// touch it, else through the staging blocks.
  Status writeTensor(const plan::WriteItem &item, const BufferView &view, uint64_t offset) {
    if (directQueue && !view.backend->hostAccessible()) {
      Result<const zip::ItemLayout *> layout = checkedLayout(item);
      if (!layout)
        return layout.failure();
      // Each piece copied out straight into the aligned block.
      const char *source = static_cast<const char *>(view.data) + offset;
      // One device copy per block: each copy has a fixed cost.
      return writeDirect(
          item, *layout, nullptr,
          [&](uint64_t at, uint64_t size, char *to) {
            return view.backend->copyOut(source + at, to, size).get();
          },
          nullptr);
    }
    if (view.backend->hostAccessible())
      return writeTensor(item, static_cast<const char *>(view.data) + offset);
    Result<const zip::ItemLayout *> layout = checkedLayout(item);
    if (!layout)
      return layout.failure();
    uint64_t dataSize = (*layout)->dataSize;
    std::vector<char *> blocks = staging->acquire(2);
    struct Release {
      StagingPool &pool;
      std::vector<char *> &blocks;
      ~Release() { pool.release(blocks); }
    } release{*staging, blocks};
    uint64_t stagingBlock = staging->blockBytes();
    integrity::StreamingXxh3 hash;
    hash.update((*layout)->header.data(), (*layout)->header.size());
    if (Status status =
            file.writeAt(item.itemOffset, {{(*layout)->header.data(), (*layout)->header.size()}});
        !status)
      return propagate(status, status.error() + " (item " + item.key + ")");
    uint32_t crc = 0;
    auto copyOut = [&](uint64_t at, char *block) {
      return view.backend->copyOut(static_cast<const char *>(view.data) + offset + at, block,
                                   std::min(stagingBlock, dataSize - at));
    };
    std::future<Status> pending = dataSize ? copyOut(0, blocks[0]) : std::future<Status>();
    for (uint64_t at = 0, index = 0; at < dataSize; at += stagingBlock, index ^= 1) {
      uint64_t size = std::min(stagingBlock, dataSize - at);
      if (Status status = pending.get(); !status)
        return propagate(status, item.key + ": " + status.error());
      if (at + size < dataSize)
        pending = copyOut(at + size, blocks[index ^ 1]);
      const char *block = blocks[index];
      crc = zip::crc32(block, size, crc);
      hash.update(block, size);
      if (Status status = file.writeAt(item.dataOffset + at, {{block, size}}); !status) {
        if (pending.valid())
          (void)pending.get(); // the copy in flight writes into our staging
        return propagate(status, status.error() + " (item " + item.key + ")");
      }
    }
    zip::ItemLayout filled = **layout; // the trailer carries this item's CRC
    filled.setDataCrc(crc);
    hash.update(filled.trailer.data(), filled.trailer.size());
    if (Status status = file.writeAt(item.dataOffset + dataSize,
                                     {{filled.trailer.data(), filled.trailer.size()}});
        !status)
      return propagate(status, status.error() + " (item " + item.key + ")");
    return recordChecksum(item, hash.digest());
  }

  /// The planned layout of a tensor item, checked against this runtime's
  /// for data starting where the plan puts it in its page (plans from before
  /// plan::pieceDataPageOffset put it at the next multiple of 64: the same).
  Result<const zip::ItemLayout *> checkedLayout(const plan::WriteItem &item) {
    Result<const zip::ItemLayout *> cached =
        layouts.get(item.dtype, item.chunkSizes, item.dataOffset % zip::kDataPage);
    if (!cached)
      return propagate(cached, item.key + ": " + cached.error());
    const zip::ItemLayout &layout = **cached;
    if (layout.totalSize != item.itemLength ||
        item.itemOffset + layout.dataOffset != item.dataOffset ||
        layout.dataSize != item.dataLength)
      return makeError(item.key + ": the plan's item layout does not match this runtime's "
                                  "(re-emit the plan with this build)");
    return cached;
  }

  Status recordChecksum(const plan::WriteItem &item, uint64_t digest) {
    checksums.push_back(
        {itemChecksumKey(item.key, item.chunkOffsets, item.source != plan::ItemSource::Bytes),
         baseName(file.path()), item.itemOffset, item.itemLength, digest});
    bytes += item.itemLength;
    return Status::success();
  }

  /// An item from host memory, written with one pwritev.
  Status writeTensor(const plan::WriteItem &item, const void *data) {
    Result<const zip::ItemLayout *> cached = checkedLayout(item);
    if (!cached)
      return cached.failure();
    const zip::ItemLayout &layout = **cached;
    const char *bytesIn = static_cast<const char *>(data);
    if (directQueue)
      return writeDirect(item, &layout, nullptr, {}, bytesIn);
    integrity::StreamingXxh3 hash;
    hash.update(layout.header.data(), layout.header.size());
    uint32_t crc = 0;
    constexpr uint64_t kBlock = 1 << 20;
    for (uint64_t at = 0; at < layout.dataSize; at += kBlock) {
      uint64_t size = std::min(kBlock, layout.dataSize - at);
      crc = zip::crc32(bytesIn + at, size, crc);
      hash.update(bytesIn + at, size);
    }
    zip::ItemLayout filled = layout; // the trailer carries this item's CRC
    filled.setDataCrc(crc);
    hash.update(filled.trailer.data(), filled.trailer.size());
    if (Status status =
            file.writeAt(item.itemOffset, {{filled.header.data(), filled.header.size()},
                                           {data, layout.dataSize},
                                           {filled.trailer.data(), filled.trailer.size()}});
        !status)
      return propagate(status, status.error() + " (item " + item.key + ")");
    return recordChecksum(item, hash.digest());
  }

  Status writeBytes(const plan::WriteItem &item, const std::string &payload) {
    if (directQueue)
      return writeDirect(item, nullptr, &payload, {}, nullptr);
    if (Status status = file.writeAt(item.itemOffset, {{payload.data(), payload.size()}}); !status)
      return propagate(status, status.error() + " (item " + item.key + ")");
    checksums.push_back({itemChecksumKey(item.key, item.chunkOffsets, false), baseName(file.path()),
                         item.itemOffset, payload.size(),
                         integrity::xxh3(payload.data(), payload.size())});
    bytes += payload.size();
    return Status::success();
  }
};

/// Item offsets keep their residue modulo this when a selection moves them
/// up: what direct I/O needs of a file offset on every file system here.
constexpr uint64_t kItemAlignment = 4096;

/// `plan` with only the writes of the keys selected, each moved to the
/// first offset past the previous one that keeps its planned offset's
/// residue modulo kItemAlignment (the gaps the others leave are closed).
plan::RankPlan selectWrites(const plan::RankPlan &plan, const KeySelection &keys) {
  plan::RankPlan selected;
  selected.rank = plan.rank;
  selected.coords = plan.coords;
  selected.buffers = plan.buffers;
  selected.files = plan.files;
  for (const plan::WriteItem &write : plan.writes)
    if (keys.selects(write.key))
      selected.writes.push_back(write);
  std::sort(selected.writes.begin(), selected.writes.end(),
            [](const plan::WriteItem &a, const plan::WriteItem &b) {
              return a.itemOffset < b.itemOffset;
            });
  uint64_t end = 0;
  for (plan::WriteItem &write : selected.writes) {
    uint64_t residue = write.itemOffset % kItemAlignment;
    uint64_t at = end - end % kItemAlignment + residue;
    if (at < end)
      at += kItemAlignment;
    write.dataOffset = write.dataOffset - write.itemOffset + at;
    write.itemOffset = at;
    end = at + write.itemLength;
  }
  return selected;
}

/// After a selection moved the items: every storage entry of `metadata`
/// at the offset and length its item was written at.
Status pointAtWrittenItems(dcp::Metadata &metadata,
                           const std::vector<integrity::ItemChecksum> &items) {
  std::map<std::pair<std::string, std::string>, const integrity::ItemChecksum *> written;
  for (const integrity::ItemChecksum &item : items)
    written[{item.file, item.key}] = &item;
  for (auto &[index, info] : metadata.storageData) {
    auto found = written.find(
        {info.relativePath,
         itemChecksumKey(index.fqn, index.offset.value_or(dcp::Dims{}), index.offset.has_value())});
    if (found == written.end())
      return makeError(index.fqn + ": selected but not written", ErrorKind::Internal);
    info.offset = found->second->offset;
    info.length = found->second->length;
  }
  return Status::success();
}

/// This rank's part of the save: its data file in the staging directory.
Status writeRankFile(const plan::RankPlan &plan, const RankBuffers &buffers,
                     const std::string &staging, Storage &storage, const SaveOptions &options,
                     std::vector<integrity::ItemChecksum> &checksums, TransferStats &stats) {
  if (plan.writes.empty())
    return Status::success();
  if (plan.files.size() != 1)
    return makeError("rank " + std::to_string(plan.rank) + ": the plan names " +
                     std::to_string(plan.files.size()) + " data files; this runtime writes one");
  std::string path = staging + "/" + plan.files[0].name;
  Result<std::unique_ptr<WritableFile>> file =
      options.directIO ? storage.createDirect(path) : storage.create(path);
  if (!file)
    return file.failure();
  // The file's blocks reserved up front: workers write items at their
  // offsets in any order, which would otherwise fragment the file.
  if (options.reserveFiles) {
    uint64_t end = 0;
    for (const plan::WriteItem &item : plan.writes)
      end = std::max(end, item.itemOffset + item.itemLength);
    if (Status status = (*file)->reserve(end); !status)
      return status;
  }
  // One writer per worker thread: its own layout cache, staging blocks and
  // checksums; items land at their planned offsets in any order.
  unsigned threads = options.threads ? options.threads : defaultThreads();
  std::vector<ItemLayoutCache> layouts(threads);
  std::vector<std::vector<integrity::ItemChecksum>> found(threads);
  // Staging only when the buffers live where the host may not go.
  StagingPool *pool = options.staging;
  std::unique_ptr<StagingPool> ownPool;
  if (!pool && !buffers.backend().hostAccessible()) {
    uint64_t bytes = options.stagingBytes ? options.stagingBytes : defaultStagingBytes(threads);
    ownPool = std::make_unique<StagingPool>(bytes / (2 * threads), 2 * threads);
    pool = ownPool.get();
  }
  // Direct I/O: aligned blocks for every worker to fill and more in
  // flight, so the device sees a deep queue whatever the worker count.
  // The blocks are kept for the next save where the caller keeps them (a
  // Checkpointer does), and outlive the queue either way.
  uint64_t alignment = (*file)->directAlignment();
  std::unique_ptr<WriteBlocks> ownBlocks;
  std::unique_ptr<WriteQueue> queue;
  if (alignment) {
    Result<const WriteBlocks *> blocks = WriteBlocks::forSave(
        options.keptWriteBlocks ? *options.keptWriteBlocks : ownBlocks, threads,
        options.writeDepth);
    if (!blocks)
      return blocks.failure();
    unsigned depth = options.writeDepth ? options.writeDepth : kDefaultWriteDepth;
    Result<std::unique_ptr<WriteQueue>> created = WriteQueue::create(**file, depth, **blocks);
    if (!created)
      return created.failure();
    queue = created.take();
  }
  // Device buffers are copied out straight into these blocks: pinned, the
  // copies run at the link's speed (unpinned blocks still work, slower).
  struct Unpin {
    MemoryBackend *backend = nullptr;
    std::vector<char *> blocks;
    ~Unpin() {
      for (char *block : blocks)
        backend->unpinHostMemory(block, kWriteBlockBytes);
    }
  } unpin;
  if (queue && !buffers.backend().hostAccessible()) {
    unpin.backend = &buffers.backend();
    for (char *block : queue->blocks())
      if (buffers.backend().pinHostMemory(block, kWriteBlockBytes))
        unpin.blocks.push_back(block);
  }
  std::vector<std::unique_ptr<ItemWriter>> writers;
  for (unsigned worker = 0; worker < threads; ++worker) {
    writers.push_back(std::unique_ptr<ItemWriter>(
        new ItemWriter{layouts[worker], **file, found[worker], 0, pool}));
    writers.back()->directQueue = queue.get();
  }
  uint64_t total = 0;
  for (const plan::WriteItem &item : plan.writes)
    total += item.itemLength;
  std::atomic<uint64_t> written{0};
  ProgressReporter progress(options.progress, total);
  auto writeItem = [&](size_t index, unsigned worker) -> Status {
    const plan::WriteItem &item = plan.writes[index];
    ItemWriter &writer = *writers[worker];
    Status status;
    switch (item.source) {
    case plan::ItemSource::Buffer: {
      Result<BufferView> view = buffers.get(item.buffer.group, item.buffer.role);
      if (!view)
        return Status(propagate(view, item.key + ": " + view.error()));
      uint64_t elementSize = dcp::dtypeInfo(view->dtype).elementSize;
      if (view->dtype != item.dtype)
        return Status(makeError(item.key + ": buffer holds " + dcp::dtypeInfo(view->dtype).name +
                                " but the plan saves " + dcp::dtypeInfo(item.dtype).name));
      if (item.buffer.localOffset < 0 || item.buffer.elements < 0 ||
          static_cast<uint64_t>(item.buffer.localOffset + item.buffer.elements) * elementSize >
              view->bytes)
        return Status(makeError(item.key + ": the plan reads past the end of its buffer"));
      status = writer.writeTensor(item, *view, item.buffer.localOffset * elementSize);
      break;
    }
    case plan::ItemSource::Step:
      status = writer.writeTensor(item, &options.step);
      break;
    case plan::ItemSource::Bytes: {
      auto replaced = options.bytesItems.find(item.key);
      status = writer.writeBytes(item, replaced != options.bytesItems.end() ? replaced->second
                                                                            : item.payload);
      break;
    }
    }
    if (!status)
      return status;
    return progress.reached(written += item.itemLength);
  };
  // Workers take runs of items that follow each other in the plan (and the
  // file), so that a direct writer's blocks run on from one item to the next;
  // runs are small enough for every worker to get several.
  uint64_t runBytes = std::max<uint64_t>(
      1, std::min<uint64_t>(kWriteRunBytes, total / (uint64_t(threads) * 4)));
  std::vector<std::pair<size_t, size_t>> runs; // [first, last) items
  for (size_t first = 0, index = 0; index < plan.writes.size(); first = index) {
    uint64_t bytes = 0;
    while (index < plan.writes.size() && bytes < runBytes)
      bytes += plan.writes[index++].itemLength;
    runs.emplace_back(first, index);
  }
  Status wrote = forEachItem(runs.size(), threads, [&](size_t run, unsigned worker) {
    for (size_t index = runs[run].first; index < runs[run].second; ++index)
      if (Status status = writeItem(index, worker); !status)
        return status;
    return Status::success();
  });
  if (!wrote)
    return wrote;
  // Each worker's last block, still open after its last item.
  for (std::unique_ptr<ItemWriter> &writer : writers)
    writer->submitOpenBlock();
  if (queue)
    if (Status status = queue->drain(); !status)
      return status;
  for (std::vector<integrity::ItemChecksum> &part : found)
    checksums.insert(checksums.end(), part.begin(), part.end());
  // The index lists items in file order, whatever order they were written in.
  std::sort(checksums.begin(), checksums.end(), [](const auto &a, const auto &b) {
    return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
  });
  // Direct writes end on a whole block: the file ends where its last item does.
  if (alignment) {
    uint64_t end = 0;
    for (const std::unique_ptr<ItemWriter> &writer : writers)
      end = std::max(end, writer->end);
    if (Status status = (*file)->truncate(end); !status)
      return status;
  }
  if (Status status = (*file)->sync(); !status)
    return status;
  if (Status status = (*file)->close(); !status)
    return status;
  stats.bytes = written;
  stats.bytesWrittenStorage += written;
  stats.items = plan.writes.size();
  return Status::success();
}

/// Bytes items whose payload changed size (carried over from another
/// checkpoint) move their end; `.metadata` must say so. True when any did.
bool patchBytesLengths(dcp::Metadata &metadata,
                       const std::vector<integrity::ItemChecksum> &items) {
  bool changed = false;
  for (auto &[index, info] : metadata.storageData) {
    if (index.offset)
      continue;
    for (const integrity::ItemChecksum &item : items)
      if (item.key == index.fqn && item.file == info.relativePath && item.offset == info.offset &&
          item.length != info.length) {
        info.length = item.length;
        changed = true;
      }
  }
  return changed;
}

/// The committing rank's part: the live items, the integrity index, the
/// chunk index, `.metadata`, then the rename.
Status commit(const plan::PlanFile &planFile, const std::string &staging, const std::string &target,
              Storage &storage, const SaveOptions &options,
              std::vector<integrity::ItemChecksum> items, TransferStats &stats,
              bool &keptReplaced) {
  Result<std::string> metadata = planFile.metadataBytes();
  if (!metadata)
    return metadata.failure();
  integrity::IntegrityIndex index;
  index.planId = planFile.planId();
  index.writer = options.writer;
  index.metadataLength = metadata->size();
  index.metadataXxh3 = integrity::xxh3(metadata->data(), metadata->size());
  // The chunk index, so that a load reads neither `.metadata` nor this
  // index; covered by the integrity index as one item spanning its file.
  // None when a tensor has more dimensions than it holds: loads then read
  // `.metadata`, as for PyTorch's checkpoints. The plan's, with the
  // checksums filled in, when it has one, no bytes item changed size and
  // `.metadata` is the plan's: parsing `.metadata` takes ~25 GB at 6M chunks.
  bool live = !options.liveItems.empty() || options.liveReplacesPlannedBytes;
  bool selected = !options.keys.all();
  Result<std::string> chunks = planFile.chunkIndexBytes();
  if (!chunks)
    return chunks.failure();
  bool fromPlan = false;
  if (!chunks->empty() && !live && !selected) {
    Result<bool> filled =
        chunkindex::fillChecksums(*chunks, items, index.metadataLength, index.metadataXxh3);
    if (!filled)
      return propagate(filled, "the chunk index: " + filled.error());
    fromPlan = *filled;
  }
  if (!fromPlan) {
    // An older plan, a bytes item that changed size, or live items: from
    // the parsed `.metadata`, patched, with the live items added.
    Result<dcp::Metadata> parsed = dcp::parseMetadata(*metadata);
    if (!parsed)
      return propagate(parsed, "the plan's .metadata: " + parsed.error());
    bool changed = patchBytesLengths(*parsed, items);
    if (selected) {
      dropKeys(*parsed, [&](const std::string &key, const dcp::StorageMetadata &) {
        return !options.keys.selects(key);
      });
      if (Status status = pointAtWrittenItems(*parsed, items); !status)
        return status;
      changed = true;
    }
    if (live) {
      if (options.liveReplacesPlannedBytes)
        dropBytesItems(*parsed);
      if (Status status = checkLiveKeysAreNew(*parsed, options.liveItems); !status)
        return status;
      if (!options.liveItems.empty()) {
        std::vector<integrity::ItemChecksum> written;
        uint64_t liveBytes = 0;
        if (Status status =
                writeLiveFile(storage, staging, options.liveItems, written, liveBytes);
            !status)
          return status;
        addLiveItems(*parsed, options.liveItems, written);
        stats.bytes += liveBytes;
        stats.bytesWrittenStorage += liveBytes;
        stats.items += options.liveItems.size();
        items.insert(items.end(), written.begin(), written.end());
      }
      changed = true;
    }
    if (changed) {
      metadata = dcp::serializeMetadata(*parsed);
      if (!metadata)
        return propagate(metadata, "the .metadata with the live items: " + metadata.error());
    }
    index.metadataLength = metadata->size();
    index.metadataXxh3 = integrity::xxh3(metadata->data(), metadata->size());
    chunks = chunkindex::build(*parsed, &items, index.metadataLength, index.metadataXxh3);
    if (!chunks && chunks.kind() != ErrorKind::Incompatible)
      return propagate(chunks, "the chunk index: " + chunks.error());
  }
  index.items = items;
  if (chunks)
    index.items.push_back({chunkindex::kChunkIndexFileName, chunkindex::kChunkIndexFileName, 0,
                           chunks->size(), integrity::xxh3(chunks->data(), chunks->size())});
  std::string indexBytes = integrity::serializeIndex(index);
  if (Status status = writeFileDurably(storage, staging, integrity::kIndexFileName, indexBytes);
      !status)
    return status;
  if (chunks)
    if (Status status =
            writeFileDurably(storage, staging, chunkindex::kChunkIndexFileName, *chunks);
        !status)
      return status;
  // `.metadata` last: its appearance is DCP's commit point. The marker goes
  // just before the rename; until then the directory's name marks it.
  stats.bytesWrittenStorage +=
      indexBytes.size() + (chunks ? chunks->size() : 0) + metadata->size();
  if (Status status = writeFileDurably(storage, staging, ".metadata", *metadata); !status)
    return status;
  if (Status status = storage.removeTree(staging + "/" + kUncommittedMarker); !status)
    return status;
  if (Status status = storage.syncDir(staging); !status)
    return status;
  return commitStaged(storage, staging, target, ReplaceTarget::Checkpoint, options.overwrite,
                      options.removeReplaced ? &keptReplaced : nullptr);
}

} // namespace

Result<TransferStats> saveCheckpoint(const plan::PlanFile &planFile, const plan::RankPlan &plan,
                                     const RankBuffers &buffers, const std::string &dir,
                                     Communicator &comm, Storage &storage,
                                     const SaveOptions &options) {
  auto start = std::chrono::steady_clock::now();
  const int64_t root = planFile.commitRank();
  std::string target = trimSlashes(dir);
  std::string staging = stagingDirFor(target);
  if (comm.size() != planFile.worldSize())
    return makeError("the plan is for " + std::to_string(planFile.worldSize()) + " ranks but " +
                         std::to_string(comm.size()) + " are running",
                     ErrorKind::InvalidArgument);

  // 1. The committing rank claims the target before anyone writes, and holds
  //    the claim through the commit: a second save of the same target fails
  //    at once with "busy". Then it checks the target and prepares the
  //    staging directory (removing one a crashed save left behind), marked
  //    uncommitted so that no reader takes it for a checkpoint.
  std::unique_ptr<Claim> claim;
  Status prepared;
  if (comm.rank() == root) {
    // Its live items (every other rank's are ignored) are checked first.
    prepared = target.empty() ? makeError("the checkpoint directory is an empty path",
                                          ErrorKind::InvalidArgument)
                              : checkLiveItems(options.liveItems);
    Result<std::unique_ptr<Claim>> claimed =
        prepared ? storage.claim(lockPathFor(target), claimHolder())
                 : Result<std::unique_ptr<Claim>>(prepared.failure());
    if (!claimed)
      prepared = claimed.failure();
    else
      claim = claimed.take();
    if (prepared) {
      // Checked now, so that nothing is written for a target that cannot be
      // replaced, and again at the commit.
      Result<ExistingTarget> found =
          checkReplaceable(storage, target, ReplaceTarget::Checkpoint, options.overwrite);
      if (!found)
        prepared = found.failure();
    }
    if (prepared)
      prepared = storage.removeTree(staging);
    if (prepared)
      prepared = storage.makeDir(staging);
    if (prepared) {
      // Not synced: after a crash the directory's name marks it just as well.
      Result<std::unique_ptr<WritableFile>> marker =
          storage.create(staging + "/" + kUncommittedMarker);
      prepared = marker ? (*marker)->close() : Status(marker.failure());
    }
  }
  if (Status agreed = agree(comm, prepared, root); !agreed) {
    if (comm.rank() == root && prepared) // another rank failed: undo what this one made
      (void)storage.removeTree(staging);
    return propagate(agreed, "save to " + target + " failed, nothing written: " + agreed.error());
  }

  // 2. Every rank writes and fsyncs its items.
  TransferStats stats;
  std::vector<integrity::ItemChecksum> checksums;
  std::optional<plan::RankPlan> selected;
  if (!options.keys.all())
    selected = selectWrites(plan, options.keys);
  Status wrote = writeRankFile(selected ? *selected : plan, buffers, staging, storage, options,
                               checksums, stats);

  // 3. All agree; the committing rank gathers the checksums and commits.
  integrity::IntegrityIndex mine;
  mine.items = std::move(checksums);
  bool keptReplaced = false; // the replaced checkpoint waits at the staging path
  auto commitAll = [&](const std::vector<std::string> &payloads) -> Status {
    std::vector<integrity::ItemChecksum> all;
    for (size_t r = 0; r < payloads.size(); ++r) {
      Result<integrity::IntegrityIndex> part = integrity::parseIndex(payloads[r]);
      if (!part)
        return makeError("rank " + std::to_string(r) + " sent corrupt checksums: " + part.error());
      all.insert(all.end(), part->items.begin(), part->items.end());
    }
    return commit(planFile, staging, target, storage, options, std::move(all), stats,
                  keptReplaced);
  };
  Status committed = agreeThenDecide(comm, wrote, integrity::serializeIndex(mine), root, commitAll);
  if (comm.rank() == root) {
    if (!committed)
      (void)storage.removeTree(staging); // nothing committed; the target is untouched
    else if (keptReplaced)
      options.removeReplaced(staging, std::move(claim)); // released once it is gone
    claim.reset();                                       // the next save may start
  }
  if (!committed)
    return propagate(committed,
                     "save to " + target + " failed, nothing committed: " + committed.error());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.stallSeconds = stats.seconds; // the buffers were in use throughout
  return stats;
}

} // namespace runtime
} // namespace fsdp
