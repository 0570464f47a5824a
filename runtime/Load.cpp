//===- Load.cpp - Load any DCP checkpoint into a plan's layout ------------===//
#include "Loader.h"
#include "ModelWeightRefresh.h"
#include "Parallel.h"
#include "RuntimeSupport.h"
#include "fsdp/Layout/Overlap.h"
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/DataPlane.h"
#include "fsdp/Runtime/Protocol.h"
#include "fsdp/Support/Printable.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <tuple>
#include <unistd.h>
#include <unordered_map>

namespace fsdp {
namespace runtime {

namespace {

/// The fewest pieces a cold load reads at once (see loadCheckpoint).
constexpr unsigned kColdReadStreams = 4;

/// Each of a worker's two staging blocks for device pieces:
/// LoadOptions::stagingBytes, else kDeviceBandBytes, at most a 256th of the
/// machine's memory.
uint64_t deviceBandBytes(const LoadOptions &options) {
  if (options.stagingBytes)
    return options.stagingBytes;
  uint64_t memory = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                    static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return std::max<uint64_t>(uint64_t(1) << 20, std::min(kDeviceBandBytes, memory / 256));
}

uint64_t pieceBytes(const plan::ReadItem &read) {
  if (read.source != plan::ItemSource::Buffer || read.buffer.elements < 0)
    return 0;
  return static_cast<uint64_t>(read.buffer.elements) * dcp::dtypeInfo(read.dtype).elementSize;
}

/// Per position of `order`: the member of a group of `members` that reads
/// it. Contiguous runs, each about an equal share of the piece bytes.
std::vector<int64_t> shareReads(const plan::RankPlan &plan, const std::vector<size_t> &order,
                                int64_t members) {
  uint64_t total = 0;
  for (size_t index : order)
    total += pieceBytes(plan.reads[index]);
  std::vector<int64_t> owners;
  uint64_t before = 0;
  for (size_t index : order) {
    uint64_t bytes = pieceBytes(plan.reads[index]);
    // The member whose share holds this piece's middle byte.
    unsigned __int128 middle = before + bytes / 2;
    owners.push_back(total ? std::min<int64_t>(members - 1, static_cast<int64_t>(
                                                                middle * members / total))
                           : 0);
    before += bytes;
  }
  return owners;
}

/// The broadcasts that give every member the pieces the others read, in
/// the same order on every member (by buffer and offset, never by
/// address): adjacent ranges of one buffer with one reader merged.
Result<std::vector<ReplicaDataPlane::Transfer>>
replicaTransfers(const plan::RankPlan &plan, const RankBuffers &buffers,
                 const std::vector<size_t> &order, const std::vector<int64_t> &owners) {
  struct Range {
    int32_t group;
    plan::BufferRole role;
    uint64_t offset, bytes;
    int64_t root;
    char *data;
  };
  std::vector<Range> ranges;
  for (size_t position = 0; position < order.size(); ++position) {
    const plan::ReadItem &read = plan.reads[order[position]];
    uint64_t bytes = pieceBytes(read);
    if (!bytes)
      continue;
    Result<BufferView> view = buffers.get(read.buffer.group, read.buffer.role);
    if (!view)
      return view.failure();
    uint64_t offset =
        static_cast<uint64_t>(read.buffer.localOffset) * dcp::dtypeInfo(read.dtype).elementSize;
    if (offset + bytes > view->bytes)
      return makeError(read.key + ": the plan's piece does not fit its buffer",
                       ErrorKind::InvalidArgument);
    ranges.push_back({read.buffer.group, read.buffer.role, offset, bytes, owners[position],
                      static_cast<char *>(view->data) + offset});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range &a, const Range &b) {
    return std::tie(a.group, a.role, a.offset) < std::tie(b.group, b.role, b.offset);
  });
  std::vector<ReplicaDataPlane::Transfer> merged;
  const Range *last = nullptr;
  for (const Range &range : ranges) {
    if (last && last->group == range.group && last->role == range.role &&
        merged.back().root == range.root && last->offset + last->bytes == range.offset)
      merged.back().bytes += range.bytes;
    else
      merged.push_back({range.data, range.bytes, range.root});
    last = &range;
  }
  return merged;
}

/// True when prefix `prefix` holds `key`: the key itself, or one below it.
bool holds(const std::string &prefix, const std::string &key) {
  if (key.compare(0, prefix.size(), prefix) != 0)
    return false;
  return key.size() == prefix.size() || prefix.empty() || prefix.back() == '.' ||
         key[prefix.size()] == '.';
}

} // namespace

bool KeySelection::selects(const std::string &key) const {
  auto held = [&](const std::string &prefix) { return holds(prefix, key); };
  return (only.empty() || std::any_of(only.begin(), only.end(), held)) &&
         std::none_of(exclude.begin(), exclude.end(), held);
}

Status KeySelection::checkPrefixes() const {
  for (const auto *list : {&only, &exclude})
    for (const std::string &prefix : *list) {
      const char *what = list == &only ? "only" : "exclude";
      if (prefix.empty())
        return makeError(std::string("an empty ") + what +
                             " prefix (an unset variable?): it would hold every key",
                         ErrorKind::InvalidArgument);
      if (prefix.find_first_of("*?[") != std::string::npos)
        return makeError(std::string(what) + " prefix '" + printable(prefix) +
                             "' has a glob character: prefixes are plain key prefixes "
                             "('model' holds model.*)",
                         ErrorKind::InvalidArgument);
    }
  return Status::success();
}

Status KeySelection::checkAgainst(const std::vector<std::string> &keys) const {
  if (Status status = checkPrefixes(); !status)
    return status;
  // What the checkpoint does hold, for the message: its keys' first names.
  auto has = [&]() {
    std::map<std::string, size_t> tops;
    for (const std::string &key : keys)
      ++tops[key.substr(0, key.find('.'))];
    std::string text;
    for (const auto &[top, count] : tops) {
      if (text.size() > 160) {
        text += ", ...";
        break;
      }
      text += (text.empty() ? "" : ", ") + printable(top) + " (" + std::to_string(count) +
              (count == 1 ? " key)" : " keys)");
    }
    return "the checkpoint holds keys under " + (text.empty() ? std::string("nothing") : text);
  };
  for (const std::string &prefix : only)
    if (std::none_of(keys.begin(), keys.end(),
                     [&](const std::string &key) { return holds(prefix, key); }))
      return makeError("only prefix '" + printable(prefix) + "' holds no key: " + has(),
                       ErrorKind::InvalidArgument);
  if (std::none_of(keys.begin(), keys.end(), [&](const std::string &key) { return selects(key); }))
    return makeError("the selection leaves no key to load (every key is excluded): " + has(),
                     ErrorKind::InvalidArgument);
  return Status::success();
}

Result<LoadResult> loadCheckpoint(const plan::RankPlan &plan, RankBuffers &buffers,
                                  const std::string &dir, Communicator &comm, Storage &storage,
                                  const LoadOptions &options) {
  if (!options.keys.all()) {
    // A selection that holds nothing fails on every rank (a checkpoint that
    // does not open is reported by the load below).
    Status selection = options.keys.checkPrefixes();
    if (selection) {
      ReaderOptions keysOnly;
      keysOnly.useChunkIndex = true;
      if (Result<std::unique_ptr<CheckpointReader>> reader =
              CheckpointReader::open(dir, storage, keysOnly)) {
        std::vector<std::string> keys = (*reader)->tensorKeys();
        for (std::string &key : (*reader)->bytesKeys())
          keys.push_back(std::move(key));
        selection = options.keys.checkAgainst(keys);
      }
    }
    if (Status agreed = agree(comm, selection, options.root); !agreed)
      return propagate(agreed,
                       "load from " + printable(trimSlashes(dir)) + ": " + agreed.error());
    // The plan's reads of the keys selected, the same buffers.
    plan::RankPlan selected;
    selected.rank = plan.rank;
    selected.coords = plan.coords;
    selected.buffers = plan.buffers;
    for (const plan::ReadItem &read : plan.reads)
      if (options.keys.selects(read.key))
        selected.reads.push_back(read);
    LoadOptions all = options;
    all.keys = {};
    Result<LoadResult> loaded = loadCheckpoint(selected, buffers, dir, comm, storage, all);
    if (!loaded)
      return loaded;
    auto keepSelected = [&](auto &items) {
      for (auto at = items.begin(); at != items.end();)
        at = options.keys.selects(at->first) ? std::next(at) : items.erase(at);
    };
    keepSelected(loaded->bytesItems);
    keepSelected(loaded->tensorItems);
    return loaded;
  }
  auto start = std::chrono::steady_clock::now();
  LoadResult result;
  ReaderOptions readerOptions;
  readerOptions.verifyItems = options.verifyChecksums;
  readerOptions.directReads = options.directReads;
  // Our checkpoints' chunk index: no rank parses `.metadata` (near 1 GB at
  // scale) or `.fsdp-index`; each reads the index pages its pieces need.
  readerOptions.useChunkIndex = true;
  DirIdentity identity = identityOf(storage, dir);
  Result<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::open(dir, storage, readerOptions);
  Status status = reader ? Status::success() : Status(reader.failure());
  if (reader && !(*reader)->hasChecksums() && options.verifyChecksums && options.notice)
    options.notice(printable(trimSlashes(dir)) +
                   " has no integrity index (not written by fsdp-mlir): checking the zip CRC "
                   "of every item read");
  std::optional<Loader> loader;
  std::vector<size_t> order;   // the reads, in file order
  std::vector<int64_t> owners; // per position of order: the member reading it
  int64_t member = options.replicas ? options.replicas->group().rank() : 0;
  if (status)
    loader.emplace(**reader);
  // The small tensors the plan does not save (live tensor items, say): the
  // committing rank, which holds every key of the plan, lists them, and
  // once every rank has loaded its pieces, hands the list to all.
  std::string listed;
  unsigned readers = 0;
  std::optional<ModelWeightRefresh> refresh;
  try {
    // Pieces are independent (each fills its own part of a buffer): worker
    // threads take them one by one; the first step found in plan order wins.
    unsigned threads = options.threads ? options.threads : defaultThreads();
    std::vector<std::optional<float>> steps(plan.reads.size());
    // Workers take pieces in the order their first saved bytes lie in the
    // files, so each file is read front to back.
    if (status)
      status = loader->plan(plan.reads);
    if (status)
      order = loader->fileOrder();
    // A cold load keeps at least kColdReadStreams pieces in flight: each
    // worker has one piece's direct reads queued, and this project's disks
    // serve more streams faster (bench/checkpoint.py: 0.85 of fio's best
    // with 2 streams per rank, 0.96 with 4). The workers mostly wait on the
    // disk then, so they cost no more CPU than `threads` would.
    bool cold = status && loader->readsCold();
    if (cold)
      threads = std::max(threads, kColdReadStreams);
    readers = threads;
    // In a replica group each member reads its own contiguous run of that
    // order, about an equal share of the bytes.
    if (options.replicas)
      owners = shareReads(plan, order, options.replicas->group().size());
    uint64_t total = 0;
    for (size_t position = 0; position < order.size(); ++position)
      if (owners.empty() || owners[position] == member) {
        total += pieceBytes(plan.reads[order[position]]);
        // Opening an item reads its zip records: on a cold load each such
        // read would wait behind the queued data reads (50-300 ms measured
        // between a worker's items), so they are all asked for now.
        if (cold)
          loader->prefetchRecords(order[position]);
      }
    // Buffers the host may not touch are staged through two pinned blocks
    // per worker, no larger than the bytes read need: pinning costs time
    // (0.3 s for 512 MiB on an H200's host, measured by bench/gpu/run).
    std::unique_ptr<StagingPool> pool;
    if (status && !buffers.backend().hostAccessible()) {
      uint64_t share = (total + 2 * threads - 1) / (2 * threads);
      pool = std::make_unique<StagingPool>(
          std::max<uint64_t>(1, std::min(deviceBandBytes(options), share)), 2 * threads,
          buffers.sharedBackend());
      loader->setBandBytes(pool->blockBytes());
    }
    std::vector<std::unique_ptr<BandStaging>> staging;
    for (unsigned worker = 0; worker < threads; ++worker)
      staging.push_back(std::make_unique<BandStaging>(pool.get()));
    ProgressReporter progress(options.progress, total);
    if (status && options.syncModelWeights)
      refresh.emplace(plan, buffers);
    if (status)
      status = forEachItem(order.size(), threads, [&](size_t position, unsigned worker) {
        size_t index = order[position];
        const plan::ReadItem &read = plan.reads[index];
        if (read.source == plan::ItemSource::Buffer) {
          if (!owners.empty() && owners[position] != member)
            return Status::success(); // another member of the replica group reads it
          // A main weight's bytes are cast into its model weight as they land.
          CheckpointReader::Landed landed;
          if (refresh && read.buffer.role == plan::BufferRole::MainWeight &&
              refresh->castsAsLanded(read.buffer.group))
            landed = {[&](const char *at, uint64_t bytes) {
                        refresh->landed(read.buffer.group, at, bytes);
                      },
                      [&](char *to, const char *from, size_t bytes) {
                        refresh->copyLanded(read.buffer.group, to, from, bytes);
                      }};
          if (Status piece = loader->loadPiece(read, index, buffers, *staging[worker],
                                               landed.landed ? &landed : nullptr);
              !piece)
            return piece;
        } else if (read.source == plan::ItemSource::Step) {
          Result<float> step = loader->loadStep(read, index);
          if (!step)
            return Status(step.failure());
          steps[index] = *step;
        }
        return progress.reached(loader->bytesRead());
      });
    // No copy in may still read the staging once the load goes on.
    for (std::unique_ptr<BandStaging> &worker : staging)
      if (Status finished = worker->finish(); !finished && status)
        status = finished;
    for (const plan::ReadItem &read : plan.reads)
      result.stats.items +=
          read.source == plan::ItemSource::Buffer || read.source == plan::ItemSource::Step;
    for (const std::optional<float> &step : steps)
      if (step && !result.step)
        result.step = step;
    if (status) {
      Result<std::map<std::string, std::string>> bytes = loader->bytesItems();
      if (!bytes)
        status = bytes.failure();
      else
        result.bytesItems = bytes.take();
    }
    if (status && options.readTensorItems && comm.rank() == options.root) {
      Result<const std::vector<std::string> *> planned =
          options.plannedKeys ? options.plannedKeys()
                              : Result<const std::vector<std::string> *>(nullptr);
      if (!planned)
        status = propagate(planned, "the plan's keys: " + planned.error());
      else
        listed = encodeStrings(
            loader->unplannedTensors(plan.reads, *planned));
    }
  } catch (const std::bad_alloc &) {
    status = makeError("out of memory while reading " + printable(trimSlashes(dir)), ErrorKind::IO,
                       ENOMEM);
  }
  status = explainIfReplaced(storage, dir, identity, std::move(status));
  // Every member passes through the exchange (after agreeing within the
  // group, so that none waits on a member that failed).
  uint64_t fromPeers = 0;
  if (options.replicas) {
    Status groupStatus = agree(options.replicas->group(), status, 0);
    if (!groupStatus) {
      if (status)
        status = groupStatus;
    } else {
      Result<std::vector<ReplicaDataPlane::Transfer>> transfers =
          replicaTransfers(plan, buffers, order, owners);
      Status exchanged = transfers ? options.replicas->broadcast(*transfers, buffers.backend())
                                   : Status(transfers.failure());
      if (!exchanged)
        status = propagate(exchanged, "sharing the reads of a replica group (" +
                                          std::string(options.replicas->name()) +
                                          "): " + exchanged.error());
      for (size_t position = 0; transfers && position < order.size(); ++position)
        if (owners[position] != member)
          fromPeers += pieceBytes(plan.reads[order[position]]);
    }
  }
  // What did not land in this rank's reads (a replica peer's pieces, say).
  if (status && refresh)
    status = refresh->finish(options.threads ? options.threads : defaultThreads());
  if (Status agreed = agree(comm, status, options.root); !agreed)
    return propagate(agreed,
                     "load from " + printable(trimSlashes(dir)) + " failed: " + agreed.error());
  // Every rank got here: the committing rank's list of tensor items to all,
  // each reads them, and all agree again.
  if (options.readTensorItems) {
    Result<std::string> received = comm.broadcast(listed, options.root);
    Status read = received ? Status::success() : Status(received.failure());
    try {
      Result<std::vector<std::string>> keys =
          received ? decodeStrings(*received) : Result<std::vector<std::string>>(received.failure());
      Result<std::map<std::string, LiveItem>> tensors =
          keys ? loader->tensorItems(*keys, LoadResult::kMaxForeignTensorItemBytes)
               : Result<std::map<std::string, LiveItem>>(keys.failure());
      if (!tensors)
        read = tensors.failure();
      else
        result.tensorItems = tensors.take();
    } catch (const std::bad_alloc &) {
      read = makeError("out of memory while reading " + printable(trimSlashes(dir)), ErrorKind::IO,
                       ENOMEM);
    }
    if (Status agreed = agree(comm, read, options.root); !agreed)
      return propagate(agreed,
                       "load from " + printable(trimSlashes(dir)) + " failed: " + agreed.error());
  }
  uint64_t bytesRead = loader ? loader->bytesRead() : 0;
  result.stats.bytes = bytesRead + fromPeers;
  result.stats.bytesFromPeers = fromPeers;
  result.stats.readers = readers;
  result.stats.bytesReadStorage = reader ? (*reader)->bytesRead() : 0;
  result.stats.bytesReadInPlace = reader ? (*reader)->bytesReadInPlace() : 0;
  result.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.stats.stallSeconds = result.stats.seconds;
  return result;
}

} // namespace runtime
} // namespace fsdp
