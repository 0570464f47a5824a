//===- Checkpoint.h - Execute save and load plans --------------*- C++ -*-===//
//
// save: the committing rank first claims the target (an flock on
// `<target>.fsdp-lock`, held through the commit; a second save fails at once
// with a busy error) and prepares a staging directory beside the target,
// marked uncommitted; all ranks agree before anyone writes. Every rank then
// writes its planned items into it (zip headers as planned, data straight
// from its buffers, CRC32 and xxh3 computed while the bytes stream), fsyncs,
// and all ranks agree on success; only then the committing rank writes its
// live items (the caller's, LiveItem.h: `__live_0.distcp`, fsync), the
// integrity index and `.metadata` (tmp, fsync, rename), removes the marker
// and renames the staging directory into place (atomically exchanging it
// with an existing checkpoint when asked to overwrite). Any failure: nothing
// committed, the error (with its kind) reported on every rank, the staging
// directory removed.
//
// load: opens the checkpoint through CheckpointReader (ours or PyTorch's),
// and for every piece of this rank's layout reads the bytes of each
// overlapping saved chunk (one contiguous range per row-range overlap),
// checking each item the first time it is read (its xxh3 in `.fsdp-index`,
// or its zip CRC when there is no index) and that saved chunks overlapping
// each other agree, then refreshes model_weight from main_weight. Every
// bytes item, and every small whole tensor the plan does not read, comes
// back in LoadResult (checked). Errors name the file and key.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_CHECKPOINT_H
#define FSDP_RUNTIME_CHECKPOINT_H

#include "fsdp/Plan/PlanFile.h"
#include "fsdp/Runtime/Buffers.h"
#include "fsdp/Runtime/Communicator.h"
#include "fsdp/Runtime/LiveItem.h"
#include "fsdp/Runtime/MemoryBackend.h"
#include "fsdp/Runtime/Storage.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unistd.h>

namespace fsdp {
namespace runtime {

class ReplicaDataPlane;
class WriteBlocks; // a save's direct-I/O blocks (runtime/WriteQueue.h)

struct Progress {
  uint64_t bytesDone = 0;
  uint64_t bytesTotal = 0;
  double seconds = 0;
};
/// Told how far a save, load or export has come; returning false cancels it
/// (it then fails as a save that never committed, a load that did not finish).
using ProgressCallback = std::function<bool(const Progress &)>;

struct TransferStats {
  uint64_t bytes = 0; // this rank's item bytes written or read
  uint64_t items = 0;
  double seconds = 0; // this rank's wall time for the whole operation
  /// Until the buffers may change again (a synchronous save: all of it).
  double stallSeconds = 0;
  /// What this rank read from and wrote to storage, every file included
  /// (`.metadata`, the index, whole items read to check them).
  uint64_t bytesReadStorage = 0;
  uint64_t bytesWrittenStorage = 0;
  /// What reached this rank from other ranks instead of storage.
  uint64_t bytesFromPeers = 0;
  /// The threads a load read on (0 for other operations): the threads
  /// asked for, or more for a cold load (Load.cpp, kColdReadStreams).
  uint64_t readers = 0;
  /// Of a load's bytes read, those its direct reads landed straight in the
  /// buffers, neither staged nor copied: a cold load into host buffers in
  /// the layout the checkpoint was saved from reads nearly all so.
  uint64_t bytesReadInPlace = 0;
};

/// `{"op": OP, "ranks": [{"rank", "seconds", "stall_seconds",
/// "bytes_read_storage", "bytes_written_storage", "bytes_from_peers"} and,
/// for a load, "readers" and "bytes_read_in_place", ...]}`
/// for every rank's statistics, in rank order: what --stats-json writes.
std::string statsJson(const std::string &op, const std::vector<TransferStats> &ranks);

/// The worker threads a rank uses when not told: FSDP_THREADS if set (1 to
/// 1024), else the machine's cores, at most 8 (a node's ranks share them).
inline unsigned defaultThreads() {
  if (const char *text = std::getenv("FSDP_THREADS")) {
    char *end = nullptr;
    unsigned long threads = std::strtoul(text, &end, 10);
    if (*text && !*end && threads >= 1 && threads <= 1024)
      return static_cast<unsigned>(threads);
  }
  return std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
}

/// Host staging for `threads` workers when not told: 8 MiB each, at most a
/// 64th of the machine's memory (at least 64 KiB each).
inline uint64_t defaultStagingBytes(unsigned threads) {
  uint64_t memory = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                    static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t wanted = uint64_t(threads) << 23;
  return std::max<uint64_t>(uint64_t(threads) << 16, std::min(wanted, memory / 64));
}

/// Which keys a load reads (or a check checks): those under one of `only`
/// (every key when empty) and under none of `exclude`. A prefix holds the
/// key it names and every key below it: "optimizer" and "optimizer." both
/// hold optimizer.state.w.exp_avg; "model.w" holds model.w alone.
/// Prefixes are plain: no glob ("model.*" is refused with a hint), none
/// empty. A load with a selection fails (kind InvalidArgument) when an
/// `only` prefix holds no key of the checkpoint, or when the selection
/// leaves no key at all (an `exclude` of everything): a typo never loads
/// nothing and succeeds.
struct KeySelection {
  std::vector<std::string> only, exclude;
  bool selects(const std::string &key) const;
  bool all() const { return only.empty() && exclude.empty(); }
  /// Every prefix is non-empty and plain.
  Status checkPrefixes() const;
  /// checkPrefixes, then the selection against the checkpoint's keys.
  Status checkAgainst(const std::vector<std::string> &keys) const;
};

struct SaveOptions {
  bool overwrite = false;
  /// Worker threads writing items (0: the machine's cores, at most 8).
  unsigned threads = 0;
  /// Write the data files with direct I/O (O_DIRECT) where the file system
  /// takes it: each item assembled in aligned blocks, so the
  /// page cache is bypassed (measured 1.15-2.4x faster writes and far less
  /// CPU than buffered writes on this project's machines). Off: pwritev
  /// through the page cache.
  bool directIO = true;
  /// Direct writes kept in flight per data file, by I/O threads, while the
  /// workers fill the next blocks (0: 8). The device, not the worker count,
  /// then sets the pace.
  unsigned writeDepth = 0;
  /// Reserve each data file's blocks before writing (fallocate, the size
  /// unchanged), so that concurrent writes at planned offsets leave few
  /// extents. Off: for measurements.
  bool reserveFiles = true;
  /// Host staging for buffers the host may not touch: every worker stages
  /// through two blocks of this pool (bounded, reused: a Checkpointer keeps
  /// one for all its saves). Null: a pool for this save of `stagingBytes`
  /// (0: defaultStagingBytes).
  StagingPool *staging = nullptr;
  uint64_t stagingBytes = 0;
  /// Where a direct-I/O save's blocks (a worker's and a write in flight's,
  /// 8 MiB each) are kept for the next save, which then finds them faulted
  /// in: those there are used when there are enough, else new ones are made
  /// and left there (a Checkpointer keeps one set for all its saves). Null:
  /// the save makes its own and frees them.
  std::unique_ptr<WriteBlocks> *keptWriteBlocks = nullptr;
  /// The optimizer step count stored in every `optimizer.state.<fqn>.step`.
  float step = 1.0f;
  /// Bytes items to write instead of the plan's payloads (reshard carries
  /// the source checkpoint's hyper-parameters over), by key.
  std::map<std::string, std::string> bytesItems;
  /// Items the caller supplies at this save (LiveItem.h): the committing
  /// rank's are written, into `__live_0.distcp`, and added to `.metadata`;
  /// every other rank's are ignored. A live key the plan also saves fails
  /// the save (invalid argument), as do items checkLiveItems refuses.
  std::vector<LiveItem> liveItems;
  /// The keys saved: the others are left out of the checkpoint, and the
  /// items kept move up in their files to close the gaps (a model-only
  /// save: only "model", about a third of the bytes with Adam).
  KeySelection keys;
  /// Drop the plan's bytes items (its `optimizer.param_groups.0.*`) from
  /// `.metadata`: the live items replace them (every param group as it is
  /// now). The planned items are still written and checksummed, but no
  /// longer referenced.
  bool liveReplacesPlannedBytes = false;
  ProgressCallback progress;
  std::string writer = "fsdp-mlir runtime";
  /// What becomes of the checkpoint an overwrite replaced, once the new one
  /// is committed and durable. Null: removed before the save returns. Set
  /// (a Checkpointer sets it): handed the path the old tree now has and the
  /// target's claim, to remove the tree in the background and then release
  /// the claim. Removing gigabytes takes seconds where the file system
  /// discards freed blocks (ext4 mounted with `discard`), and nothing of the
  /// user's waits on it.
  std::function<void(std::string replaced, std::unique_ptr<Claim> claim)> removeReplaced;
};

struct LoadOptions {
  /// Refresh model_weight from main_weight by a cast after the load.
  bool syncModelWeights = true;
  /// Worker threads loading pieces (0: the machine's cores, at most 8).
  unsigned threads = 0;
  /// Host staging for buffers the host may not touch: each worker streams
  /// a device piece through two pinned blocks of this size, one filled
  /// while the other's copy in runs (0: 4 MiB, at most a 256th of the
  /// machine's memory).
  uint64_t stagingBytes = 0;
  /// Cold ranges of 16 MiB and more are read with direct I/O; off: through
  /// the page cache, with readahead.
  bool directReads = true;
  bool verifyChecksums = true;
  ProgressCallback progress;
  /// Told once what a user should know (a checkpoint without an index).
  std::function<void(const std::string &)> notice;
  /// Read the checkpoint's small tensors the plan does not save into
  /// LoadResult::tensorItems (off: skipped, as the tools do). The
  /// committing rank lists them for all (one broadcast).
  bool readTensorItems = true;
  /// Every key the plan saves, sorted: called on the committing rank only,
  /// whose list for tensorItems leaves them out (Checkpointer::load sets it
  /// from the plan). None: only the committing rank's own reads count as
  /// planned.
  std::function<Result<const std::vector<std::string> *>()> plannedKeys;
  /// The rank that decides for all (the plan's committing rank).
  int64_t root = 0;
  /// The keys read: others are left as they are in the buffers, and left
  /// out of LoadResult's bytes and tensor items (loading the weights into
  /// a fresh optimizer: exclude "optimizer").
  KeySelection keys;
  /// This rank's replica group (DataPlane.h): when set, the members split
  /// the reads and broadcast what each read, so every saved byte is read
  /// from storage once per group. Checkpointer::load sets it.
  ReplicaDataPlane *replicas = nullptr;
};

struct LoadResult {
  TransferStats stats;
  /// The step count found in the checkpoint (of the first step item read).
  std::optional<float> step;
  /// The checkpoint's bytes items (hyper-parameters), by key: what a
  /// reshard carries over.
  std::map<std::string, std::string> bytesItems;
  /// Every tensor of the checkpoint that the plan does not save
  /// (LoadOptions::plannedKeys), when saved as one chunk covering it, read
  /// and checked: its dtype, shape and raw C-order data. Live tensor items
  /// (what a save wrote beside the plan: at most kMaxLiveItemBytes each)
  /// come back whatever their size; another writer's (a PyTorch job's
  /// buffers, say) only up to kMaxForeignTensorItemBytes, since every rank
  /// reads them. Larger or chunked ones are skipped.
  std::map<std::string, LiveItem> tensorItems;
  static constexpr uint64_t kMaxForeignTensorItemBytes = uint64_t(64) << 20;
};

Result<TransferStats> saveCheckpoint(const plan::PlanFile &planFile, const plan::RankPlan &plan,
                                     const RankBuffers &buffers, const std::string &dir,
                                     Communicator &comm, Storage &storage,
                                     const SaveOptions &options = {});

Result<LoadResult> loadCheckpoint(const plan::RankPlan &plan, RankBuffers &buffers,
                                  const std::string &dir, Communicator &comm, Storage &storage,
                                  const LoadOptions &options = {});

/// Fills every piece of this rank's main weights and optimizer state with
/// the deterministic values of docs/TestValues.md (then model_weight by a cast).
Status fillFromSeed(const plan::RankPlan &plan, RankBuffers &buffers, uint32_t seed);
/// Checks every piece of the keys selected against those values; the error
/// names key, chunk and element of the first mismatch.
Status checkAgainstSeed(const plan::RankPlan &plan, const RankBuffers &buffers, uint32_t seed,
                        const KeySelection &keys = {});

/// Checks every byte of a checkpoint of ours against its integrity index
/// (items, alignment padding, `.metadata`, the index itself) and that every
/// file `.metadata` names exists; for a PyTorch checkpoint (no index), checks
/// the zip CRCs of every item. Also every tensor item's header against
/// `.metadata`, and that each tensor's chunks tile it without overlap. One
/// line per problem in `report`; fails when any problem was found.
/// `coverage`, when given, hears what the byte checks covered.
enum class VerifyCoverage {
  EveryByte,  // against `.fsdp-index`: items, padding, trailing bytes
  RecordCrcs, // no `.fsdp-index`: each zip record's CRC; bytes between records unchecked
};
Status verifyCheckpoint(const std::string &dir, Storage &storage, std::string &report,
                        VerifyCoverage *coverage = nullptr);
/// The verdict of a verify that passed, saying what it covered.
const char *verifyVerdict(VerifyCoverage coverage);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_CHECKPOINT_H
