//===- Checkpointer.h - One rank's runtime, ready to save and load -*- C++ -*-===//
//
// What every driver (fsdp-ckpt, the C API, generated code, the Python
// bindings) needs, done once: open the plan (a file, or a directory of
// per-rank files) for the communicator's rank, check its world size, hold
// the buffers (allocated here or bound to the caller's memory), and save,
// load, fill and check with the plan's committing rank deciding for all.
//
// An async save (saveAsync) returns once every byte it saves has been
// copied into a host snapshot the checkpointer owns: from then on the
// caller may change its buffers. The writes, fsync and commit run on a
// background thread over the checkpointer's communicator; wait() gives
// their outcome. Every other collective call (save, saveAsync, load, check)
// first waits for a save still running, so a second save waits for the
// first; a save from elsewhere to the same target still fails busy.
//
// The checkpoint an overwrite replaces is removed on a thread of its own
// once the new one is committed (SaveOptions::removeReplaced): the save
// returns without waiting for it, the next save waits for it first, and
// until it is gone the target stays claimed (a save from elsewhere fails
// busy).
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_CHECKPOINTER_H
#define FSDP_RUNTIME_CHECKPOINTER_H

#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/DataPlane.h"
#include "fsdp/Runtime/HfImport.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace fsdp {
namespace runtime {

class SaveSnapshot;

/// A reshard: a load of any DCP checkpoint into the plan's layout, then a
/// save in ours that carries the source's job state along.
struct ReshardOptions {
  /// The load's options (its keys and readTensorItems are the reshard's).
  LoadOptions load;
  /// The save's options (its step, bytesItems and liveItems are the
  /// reshard's).
  SaveOptions save;
  /// Prefixes of source keys to leave out (plain, non-empty).
  std::vector<std::string> drop;
  /// A source tensor under `model.` or `optimizer.state.` that the plan
  /// does not name (another model's), or any other that cannot be carried
  /// (saved in chunks, or a foreign one over
  /// LoadResult::kMaxForeignTensorItemBytes), is an error (incompatible)
  /// unless this is set: then it is left out.
  bool allowExtra = false;
};

struct ReshardResult {
  /// The load's and the save's together.
  TransferStats stats;
  /// The source's keys the plan does not name that the new checkpoint
  /// holds (as live items), and those left out (--drop, --allow-extra);
  /// the committing rank's (empty elsewhere).
  std::vector<std::string> carried, dropped;
};

/// A save running in the background (Checkpointer::saveAsync).
class PendingSave {
public:
  ~PendingSave();
  PendingSave(const PendingSave &) = delete;
  PendingSave &operator=(const PendingSave &) = delete;

  /// Waits for the writes, fsync and commit; the same outcome on every call.
  /// Its stallSeconds is how long saveAsync held the caller.
  Result<TransferStats> wait();
  /// True once the outcome is known (wait() will not block).
  bool done() const { return done_.load(); }
  /// How long saveAsync held the caller (waiting for an earlier save, then
  /// copying into the snapshot).
  double stallSeconds() const { return stallSeconds_; }

private:
  friend class Checkpointer;
  PendingSave() = default;
  std::thread thread_;
  std::once_flag joined_;
  std::optional<Result<TransferStats>> outcome_;
  std::atomic<bool> done_{false};
  double stallSeconds_ = 0;
};

class Checkpointer {
public:
  /// Waits for a save still running in the background, and for the
  /// removal of a replaced checkpoint.
  ~Checkpointer();

  /// Opens `planPath` for `comm`'s rank over `storage` (POSIX when null).
  /// Fails (invalid argument) when the plan is for another world size.
  static Result<std::unique_ptr<Checkpointer>> open(const std::string &planPath,
                                                    std::unique_ptr<Communicator> comm,
                                                    std::unique_ptr<Storage> storage = nullptr);
  /// The same for a plan already in memory (an embedded one).
  static Result<std::unique_ptr<Checkpointer>> open(plan::PlanFile planFile,
                                                    std::unique_ptr<Communicator> comm,
                                                    std::unique_ptr<Storage> storage = nullptr);

  Communicator &comm() { return *comm_; }
  Storage &storage() { return *storage_; }
  const plan::PlanFile &planFile() const { return planFile_; }
  const plan::RankPlan &plan() const { return plan_; }
  int64_t rank() const { return comm_->rank(); }
  int64_t worldSize() const { return comm_->size(); }
  /// The rank that decides for all: the plan's committing rank.
  int64_t root() const { return planFile_.commitRank(); }

  /// Where allocate and bind put the buffers from now on (host memory
  /// unless told otherwise). For memory the host may not touch (a GPU),
  /// the staging pool is reserved and pinned by the first allocate, bind
  /// or reserveStaging, so no save pays for it.
  void useMemoryBackend(std::shared_ptr<MemoryBackend> backend);
  MemoryBackend *memoryBackend() const { return backend_.get(); }
  /// Reserves (and pins) the staging pool for device buffers now: `bytes`
  /// in all (0: defaultStagingBytes), two blocks per thread. Replaces a
  /// pool of another size.
  Status reserveStaging(unsigned threads = 0, uint64_t bytes = 0);

  /// How loads share reads within a replica group (DataPlane.h): the
  /// group's communicator by default; `factory` makes another (NCCL). With
  /// `evenAlone`, a group of one gets a data plane too (a check of it on
  /// one GPU). Takes effect at the next load.
  void useDataPlane(DataPlaneFactory factory, bool evenAlone = false);
  /// Off: every rank reads all its pieces from storage itself.
  void shareReplicaReads(bool share) { shareReads_ = share; }

  /// Runtime-owned buffers for every (group, role), zeroed.
  Status allocate();
  /// Caller-owned memory for one buffer (at least elements x element size
  /// bytes). Bound buffers replace allocated ones; every buffer must then
  /// be bound before use.
  Status bind(int32_t group, plan::BufferRole role, void *data);
  /// The buffers, built from the bindings on first use.
  Result<RankBuffers *> buffers();

  Result<TransferStats> save(const std::string &dir, SaveOptions options = {});
  /// Starts a save and returns once every byte it saves is copied into the
  /// snapshot (host memory of this rank's saved bytes, reserved by the
  /// first async save or by reserveSnapshot, and reused); the rest runs in
  /// the background. Errors, this rank's or another's, come from wait().
  /// Fails at once (nothing started) only when the communicator may not be
  /// used from another thread (a caller's MPI without MPI_THREAD_MULTIPLE).
  Result<std::shared_ptr<PendingSave>> saveAsync(const std::string &dir, SaveOptions options = {});
  /// Reserves the async save's snapshot now and faults it in on `threads`
  /// threads (0: defaultThreads), so that the first async save does not pay
  /// for it; in huge pages where the system grants them, which the captures
  /// copy into faster (the first async save, reserving it in its stall,
  /// takes small pages, faulted in faster).
  Status reserveSnapshot(unsigned threads = 0);
  /// Reserves the blocks a direct-I/O save of `threads` workers (0:
  /// defaultThreads) with `writeDepth` writes in flight (0: 8) writes from,
  /// one per worker and per write in flight, 8 MiB each, and faults in as
  /// many as this rank's bytes fill, so that no save pays for them. Every
  /// save keeps its blocks for the next (72 MiB at 1 thread, 128 MiB at 8);
  /// a save with more threads or a deeper queue replaces them.
  Status reserveWriteBlocks(unsigned threads = 0, unsigned writeDepth = 0);
  /// Waits for a save still running in the background (none: returns at
  /// once); its outcome stays with its PendingSave.
  void waitForPendingSave();
  /// Waits for the removal of the checkpoint the last save replaced (none:
  /// returns at once). Every save waits for it first.
  void waitForReplacedRemoval();
  Result<LoadResult> load(const std::string &dir, LoadOptions options = {});
  /// Loads `source` (ours, PyTorch's, Megatron-FSDP's) and saves it into
  /// `target` in the plan's layout, every item of the source kept: its
  /// bytes items the plan also has replace the plan's, and every other
  /// bytes item and every tensor the plan does not name (optimizer param
  /// groups past the first, `initial_lr`, an LR scheduler's and a train
  /// loop's state, RNG states) is written as a live item with its
  /// planner_data path, unless `drop` names it (Reshard.cpp).
  Result<ReshardResult> reshard(const std::string &source, const std::string &target,
                                ReshardOptions options);
  /// Loads a Hugging Face model directory (HfImport.h): main weights from
  /// its safetensors, optimizer state zeroed, step 0.
  Result<LoadResult> loadHuggingFace(const std::string &dir, HfLoadOptions options = {});
  /// Every key the plan saves, sorted (from the plan's global part, read
  /// once): what a load leaves out of LoadResult::tensorItems.
  Result<const std::vector<std::string> *> plannedKeys();
  /// The deterministic test values (docs/TestValues.md).
  Status fill(uint32_t seed);
  /// Every rank checks its pieces (of the keys selected), and with
  /// `modelWeights` that every model_weight of its own is its main weight
  /// cast (checkModelWeights); one rank's mismatch fails every rank.
  Status check(uint32_t seed, const KeySelection &keys = {}, bool modelWeights = false);
  /// model_weight = main_weight cast to model_weight's dtype, as a load
  /// with syncModelWeights does: in every group with a model_weight of its
  /// own, or in `group` alone (not negative). This rank only; not
  /// collective. An unknown group, or one without such a model_weight, is
  /// an error.
  Status refreshModelWeights(int32_t group = -1);

private:
  Checkpointer(plan::PlanFile planFile, std::unique_ptr<Communicator> comm,
               std::unique_ptr<Storage> storage);

  plan::PlanFile planFile_;
  plan::RankPlan plan_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Storage> storage_;
  std::shared_ptr<MemoryBackend> backend_;
  Status ensureStaging();
  Status findReplicas();
  /// Sets options.removeReplaced (unless the caller did) to removal_.
  void removeReplacedInBackground(SaveOptions &options);
  std::unique_ptr<StagingPool> staging_;   // for device buffers; see reserveStaging
  uint64_t stagingBytes_ = 0;              // what staging_ was reserved with
  unsigned stagingThreads_ = 0;
  DataPlaneFactory dataPlaneFactory_;
  bool dataPlaneAlone_ = false, shareReads_ = true;
  bool replicasDecided_ = false;           // the replica group was looked for
  std::unique_ptr<ReplicaDataPlane> replicas_;
  Status reserveSnapshot(unsigned threads, bool hugePages);
  std::unique_ptr<SaveSnapshot> snapshot_; // made by the first async save
  // Written from by every save, made by the first; used by one save at a
  // time (each waits for the one before).
  std::unique_ptr<WriteBlocks> writeBlocks_;
  std::shared_ptr<PendingSave> pending_;
  // Removes what the last save replaced. Touched only by the thread that
  // runs a save, after the previous save was joined.
  std::thread removal_;
  std::map<std::pair<int32_t, plan::BufferRole>, void *> bound_;
  std::optional<RankBuffers> buffers_;
  std::optional<std::vector<std::string>> plannedKeys_;
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_CHECKPOINTER_H
