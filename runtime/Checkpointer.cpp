//===- Checkpointer.cpp - One rank's runtime, ready to save and load ------===//
#include "fsdp/Runtime/Checkpointer.h"
#include "SaveSnapshot.h"
#include "WriteQueue.h"
#include "fsdp/Format/ChunkIndex.h"
#include "fsdp/Runtime/Protocol.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <sys/stat.h>

namespace fsdp {
namespace runtime {

Result<std::unique_ptr<Checkpointer>> Checkpointer::open(const std::string &planPath,
                                                         std::unique_ptr<Communicator> comm,
                                                         std::unique_ptr<Storage> storage) {
  if (!comm)
    return makeError("no communicator", ErrorKind::InvalidArgument);
  // A directory of per-rank plans (--plan-split-dir) holds one per rank.
  std::string path = planPath;
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode))
    path += "/" + plan::planFileName(comm->rank());
  Result<plan::PlanFile> file = plan::PlanFile::open(path);
  if (!file)
    return file.failure();
  return open(file.take(), std::move(comm), std::move(storage));
}

Result<std::unique_ptr<Checkpointer>> Checkpointer::open(plan::PlanFile file,
                                                         std::unique_ptr<Communicator> comm,
                                                         std::unique_ptr<Storage> storage) {
  if (!comm)
    return makeError("no communicator", ErrorKind::InvalidArgument);
  if (!storage)
    storage = createPosixStorage();
  if (file.worldSize() != comm->size())
    return makeError(file.name() + ": the plan is for " + std::to_string(file.worldSize()) +
                         " ranks but " + std::to_string(comm->size()) +
                         " are running (start one process per rank with mpirun -np " +
                         std::to_string(file.worldSize()) + ")",
                     ErrorKind::InvalidArgument);
  std::unique_ptr<Checkpointer> checkpointer(
      new Checkpointer(std::move(file), std::move(comm), std::move(storage)));
  Result<plan::RankPlan> rankPlan = checkpointer->planFile_.rank(checkpointer->rank());
  if (!rankPlan)
    return rankPlan.failure();
  checkpointer->plan_ = rankPlan.take();
  return checkpointer;
}

PendingSave::~PendingSave() { (void)wait(); }

Result<TransferStats> PendingSave::wait() {
  std::call_once(joined_, [this] {
    if (thread_.joinable())
      thread_.join();
  });
  return *outcome_;
}

Checkpointer::Checkpointer(plan::PlanFile planFile, std::unique_ptr<Communicator> comm,
                           std::unique_ptr<Storage> storage)
    : planFile_(std::move(planFile)), comm_(std::move(comm)), storage_(std::move(storage)) {}

Checkpointer::~Checkpointer() {
  waitForPendingSave();
  waitForReplacedRemoval();
}

void Checkpointer::waitForReplacedRemoval() {
  if (removal_.joinable())
    removal_.join();
}

void Checkpointer::removeReplacedInBackground(SaveOptions &options) {
  if (options.removeReplaced)
    return;
  options.removeReplaced = [this](std::string replaced, std::unique_ptr<Claim> claim) {
    waitForReplacedRemoval();
    removal_ = std::thread(
        [this, replaced = std::move(replaced), claim = std::move(claim)]() mutable {
          // A failure leaves a tree at the staging path, which the next save
          // removes before it stages (and fails on, clearly, if it cannot).
          (void)storage_->removeTree(replaced);
          claim.reset();
        });
  };
}

void Checkpointer::waitForPendingSave() {
  if (pending_)
    (void)pending_->wait();
  pending_.reset();
}

void Checkpointer::useMemoryBackend(std::shared_ptr<MemoryBackend> backend) {
  backend_ = std::move(backend);
  staging_.reset(); // pinned for the old backend
}

Status Checkpointer::reserveStaging(unsigned threads, uint64_t bytes) {
  if (!backend_ || backend_->hostAccessible())
    return Status::success();
  threads = threads ? threads : defaultThreads();
  bytes = bytes ? bytes : defaultStagingBytes(threads);
  if (staging_ && stagingThreads_ == threads && stagingBytes_ == bytes)
    return Status::success();
  staging_.reset();
  try {
    staging_ = std::make_unique<StagingPool>(bytes / (2 * threads), 2 * threads, backend_);
  } catch (const std::bad_alloc &) {
    return makeError("cannot allocate " + std::to_string(bytes) + " bytes of host staging",
                     ErrorKind::IO, ENOMEM);
  }
  stagingThreads_ = threads;
  stagingBytes_ = bytes;
  return Status::success();
}

Status Checkpointer::ensureStaging() {
  if (staging_ || !backend_ || backend_->hostAccessible())
    return Status::success();
  return reserveStaging();
}

void Checkpointer::useDataPlane(DataPlaneFactory factory, bool evenAlone) {
  dataPlaneFactory_ = std::move(factory);
  dataPlaneAlone_ = evenAlone;
  replicas_.reset();
  replicasDecided_ = false;
}

Status Checkpointer::allocate() {
  if (Status status = ensureStaging(); !status)
    return status;
  Result<RankBuffers> allocated = RankBuffers::allocate(plan_, backend_);
  if (!allocated)
    return allocated.failure();
  bound_.clear();
  buffers_ = allocated.take();
  return Status::success();
}

Status Checkpointer::bind(int32_t group, plan::BufferRole role, void *data) {
  if (role > plan::kLastBufferRole)
    return makeError("unknown buffer role " + std::to_string(static_cast<int>(role)),
                     ErrorKind::InvalidArgument);
  bound_[{group, role}] = data;
  buffers_.reset(); // rebuilt from the bindings on next use
  return Status::success();
}

Result<RankBuffers *> Checkpointer::buffers() {
  if (!buffers_) {
    if (Status status = ensureStaging(); !status)
      return status.failure();
    Result<RankBuffers> wrapped = RankBuffers::wrap(plan_, bound_, backend_);
    if (!wrapped)
      return makeError(wrapped.error() + " (allocate the buffers or bind every one)",
                       ErrorKind::InvalidArgument);
    buffers_ = wrapped.take();
  }
  return &*buffers_;
}

Result<TransferStats> Checkpointer::save(const std::string &dir, SaveOptions options) {
  waitForPendingSave();
  waitForReplacedRemoval();
  removeReplacedInBackground(options);
  // One staging pool for all this checkpointer's saves of device buffers.
  Result<RankBuffers *> held = buffers();
  if (held && !options.staging && staging_)
    options.staging = staging_.get();
  if (!options.keptWriteBlocks)
    options.keptWriteBlocks = &writeBlocks_;
  // Every rank takes part in the save's collectives, even one without
  // buffers: its error then fails the save everywhere.
  if (!held) {
    if (Status agreed = agree(*comm_, held.failure(), root()); !agreed)
      return agreed.failure();
    return held.failure();
  }
  return saveCheckpoint(planFile_, plan_, **held, dir, *comm_, *storage_, options);
}

Status Checkpointer::reserveSnapshot(unsigned threads) {
  return reserveSnapshot(threads ? threads : defaultThreads(), /*hugePages=*/true);
}

Status Checkpointer::reserveSnapshot(unsigned threads, bool hugePages) {
  if (snapshot_)
    return Status::success();
  // Pinned by a device's backend: the capture is then one device-to-host
  // copy at full speed.
  std::shared_ptr<MemoryBackend> pinner =
      backend_ && !backend_->hostAccessible() ? backend_ : nullptr;
  Result<std::unique_ptr<SaveSnapshot>> reserved =
      SaveSnapshot::reserve(plan_, threads, hugePages, pinner);
  if (!reserved)
    return reserved.failure();
  snapshot_ = reserved.take();
  return Status::success();
}

Status Checkpointer::reserveWriteBlocks(unsigned threads, unsigned writeDepth) {
  waitForPendingSave(); // its save writes from them
  Result<const WriteBlocks *> reserved =
      WriteBlocks::forSave(writeBlocks_, threads ? threads : defaultThreads(), writeDepth);
  if (!reserved)
    return reserved.failure();
  // Touched now, as many as this rank's bytes fill (a small file with many
  // workers needs few: the others are faulted in only if a save uses them).
  uint64_t bytes = 0;
  for (const plan::WriteItem &item : plan_.writes)
    bytes += item.itemLength;
  (*reserved)->touch((bytes + (*reserved)->blockBytes() - 1) / (*reserved)->blockBytes());
  return Status::success();
}

Result<std::shared_ptr<PendingSave>> Checkpointer::saveAsync(const std::string &dir,
                                                             SaveOptions options) {
  auto start = std::chrono::steady_clock::now();
  if (!comm_->usableFromAnotherThread())
    return makeError("an async save runs collectives on a background thread: initialize MPI "
                     "with MPI_Init_thread(MPI_THREAD_MULTIPLE), or save synchronously",
                     ErrorKind::InvalidArgument);
  waitForPendingSave(); // a second save waits for the first
  // This rank's snapshot. A failure here is still taken through the save's
  // first collective in the background, so that every rank fails with it.
  Status captured;
  Result<RankBuffers *> held = buffers();
  if (!held)
    captured = held.failure();
  unsigned threads = options.threads ? options.threads : defaultThreads();
  // Made in the caller's stall: small pages, faulted in several times faster than
  // huge ones where the machine has not backed the memory yet.
  if (captured)
    captured = reserveSnapshot(threads, /*hugePages=*/false);
  if (captured) {
    captured = snapshot_->capture(**held, threads);
  }
  double stall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::shared_ptr<PendingSave> pending(new PendingSave());
  pending->stallSeconds_ = stall;
  options.staging = nullptr; // the snapshot is host memory
  if (!options.keptWriteBlocks)
    options.keptWriteBlocks = &writeBlocks_;
  removeReplacedInBackground(options);
  PendingSave *job = pending.get();
  job->thread_ = std::thread([this, job, captured, dir, options = std::move(options), start] {
    Result<TransferStats> outcome = makeError("the async save did not run", ErrorKind::Internal);
    // The last save's removal, waited for here rather than in the caller's stall.
    waitForReplacedRemoval();
    try {
      if (!captured) {
        Status agreed = agree(*comm_, captured, root());
        outcome =
            propagate(agreed, "save to " + dir + " failed, nothing written: " + agreed.error());
      } else {
        outcome =
            saveCheckpoint(planFile_, plan_, snapshot_->buffers(), dir, *comm_, *storage_, options);
      }
    } catch (const std::bad_alloc &) {
      outcome = makeError("save to " + dir + ": out of memory", ErrorKind::IO, ENOMEM);
    }
    if (outcome) {
      outcome->stallSeconds = job->stallSeconds_;
      outcome->seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    job->outcome_ = std::move(outcome);
    job->done_ = true;
  });
  pending_ = pending;
  return pending;
}

Status Checkpointer::findReplicas() {
  // A caller's process group that cannot split (callbacks without it)
  // loads without sharing.
  if (!shareReads_ || replicasDecided_ || !comm_->canSplit())
    return Status::success();
  Result<std::unique_ptr<Communicator>> group =
      splitReplicaGroup(plan_, *comm_, root(), dataPlaneAlone_);
  if (!group)
    return group.failure();
  if (*group && ((*group)->size() > 1 || dataPlaneAlone_)) {
    Result<std::unique_ptr<ReplicaDataPlane>> plane =
        dataPlaneFactory_ ? dataPlaneFactory_(group.take())
                          : Result<std::unique_ptr<ReplicaDataPlane>>(
                                createCommunicatorDataPlane(group.take()));
    // Every rank learns whether every data plane came up.
    Status made = plane ? Status::success() : Status(plane.failure());
    if (Status agreed = agree(*comm_, made, root()); !agreed)
      return propagate(agreed, "the replica data plane: " + agreed.error());
    replicas_ = plane.take();
  }
  replicasDecided_ = true;
  return Status::success();
}

Result<LoadResult> Checkpointer::load(const std::string &dir, LoadOptions options) {
  waitForPendingSave();
  options.root = root();
  // The replica group, looked for once (collective, so before anything
  // that may fail on one rank alone); loads then share its reads.
  if (Status status = findReplicas(); !status)
    return status.failure();
  Result<RankBuffers *> held = buffers();
  if (!held) {
    if (Status agreed = agree(*comm_, held.failure(), root()); !agreed)
      return agreed.failure();
    return held.failure();
  }
  options.replicas = shareReads_ ? replicas_.get() : nullptr;
  if (!options.plannedKeys)
    options.plannedKeys = [this] { return plannedKeys(); };
  return loadCheckpoint(plan_, **held, dir, *comm_, *storage_, options);
}

Result<LoadResult> Checkpointer::loadHuggingFace(const std::string &dir, HfLoadOptions options) {
  waitForPendingSave();
  options.root = root();
  Result<RankBuffers *> held = buffers();
  if (!held) {
    if (Status agreed = agree(*comm_, held.failure(), root()); !agreed)
      return agreed.failure();
    return held.failure();
  }
  if (!options.plannedKeys)
    options.plannedKeys = [this] { return plannedKeys(); };
  return runtime::loadHuggingFace(plan_, **held, dir, *comm_, *storage_, options);
}

Result<const std::vector<std::string> *> Checkpointer::plannedKeys() {
  if (plannedKeys_)
    return &*plannedKeys_;
  std::vector<std::string> keys;
  Result<std::string> index = planFile_.chunkIndexBytes();
  if (!index)
    return index.failure();
  if (!index->empty()) {
    // The plan's chunk index names every key, in a table read at open.
    Result<std::unique_ptr<chunkindex::ChunkIndex>> opened =
        chunkindex::ChunkIndex::fromBytes(index.take(), planFile_.name(), /*trusted=*/true);
    if (!opened)
      return opened.failure();
    for (uint64_t position = 0; position < (*opened)->keyCount(); ++position)
      keys.push_back((*opened)->key(position).name);
  } else {
    Result<std::string> bytes = planFile_.metadataBytes();
    if (!bytes)
      return bytes.failure();
    Result<dcp::Metadata> metadata = dcp::parseMetadata(*bytes);
    if (!metadata)
      return propagate(metadata, planFile_.name() + ": " + metadata.error());
    for (const auto &[key, saved] : metadata->stateDictMetadata)
      keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  plannedKeys_ = std::move(keys);
  return &*plannedKeys_;
}

Status Checkpointer::fill(uint32_t seed) {
  Result<RankBuffers *> held = buffers();
  if (!held)
    return held.failure();
  return fillFromSeed(plan_, **held, seed);
}

Status Checkpointer::refreshModelWeights(int32_t group) {
  if (group >= 0 && std::none_of(plan_.buffers.begin(), plan_.buffers.end(),
                                 [&](const plan::LocalBuffer &buffer) {
                                   return buffer.group == group &&
                                          buffer.role == plan::BufferRole::ModelWeight &&
                                          !buffer.aliasesMainWeight;
                                 }))
    return makeError("group " + std::to_string(group) +
                     " has no model_weight of its own on this rank to refresh",
                     ErrorKind::InvalidArgument);
  Result<RankBuffers *> held = buffers();
  if (!held)
    return held.failure();
  return runtime::refreshModelWeights(plan_, **held, group);
}

Status Checkpointer::check(uint32_t seed, const KeySelection &keys, bool modelWeights) {
  waitForPendingSave();
  Result<RankBuffers *> held = buffers();
  Status checked = held ? checkAgainstSeed(plan_, **held, seed, keys) : Status(held.failure());
  if (checked && modelWeights)
    checked = checkModelWeights(plan_, **held);
  return agree(*comm_, checked, root());
}

} // namespace runtime
} // namespace fsdp
