//===- Checkpointer.cpp - One rank's runtime, ready to save and load ------===//
#include "fsdp/Runtime/Checkpointer.h"
#include "fsdp/Runtime/Protocol.h"

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

Status Checkpointer::allocate() {
  Result<RankBuffers> allocated = RankBuffers::allocate(plan_, backend_);
  if (!allocated)
    return allocated.failure();
  bound_.clear();
  buffers_ = allocated.take();
  return Status::success();
}

Status Checkpointer::bind(int32_t group, plan::BufferRole role, void *data) {
  if (role < plan::BufferRole::MainWeight || role > plan::BufferRole::ExpAvgSq)
    return makeError("unknown buffer role " + std::to_string(static_cast<int>(role)),
                     ErrorKind::InvalidArgument);
  bound_[{group, role}] = data;
  buffers_.reset(); // rebuilt from the bindings on next use
  return Status::success();
}

Result<RankBuffers *> Checkpointer::buffers() {
  if (!buffers_) {
    Result<RankBuffers> wrapped = RankBuffers::wrap(plan_, bound_, backend_);
    if (!wrapped)
      return makeError(wrapped.error() + " (allocate the buffers or bind every one)",
                       ErrorKind::InvalidArgument);
    buffers_ = wrapped.take();
  }
  return &*buffers_;
}

Result<TransferStats> Checkpointer::save(const std::string &dir, SaveOptions options) {
  // One staging pool for all this checkpointer's saves of device buffers.
  if (!options.staging && backend_ && !backend_->hostAccessible()) {
    if (!staging_) {
      unsigned threads = options.threads ? options.threads : defaultThreads();
      uint64_t bytes = options.stagingBytes ? options.stagingBytes : defaultStagingBytes(threads);
      staging_ = std::make_unique<StagingPool>(bytes / (2 * threads), 2 * threads);
    }
    options.staging = staging_.get();
  }
  Result<RankBuffers *> held = buffers();
  // Every rank takes part in the save's collectives, even one without
  // buffers: its error then fails the save everywhere.
  if (!held) {
    if (Status agreed = agree(*comm_, held.failure(), root()); !agreed)
      return agreed.failure();
    return held.failure();
  }
  return saveCheckpoint(planFile_, plan_, **held, dir, *comm_, *storage_, options);
}

Result<LoadResult> Checkpointer::load(const std::string &dir, LoadOptions options) {
  options.root = root();
  Result<RankBuffers *> held = buffers();
  if (!held) {
    if (Status agreed = agree(*comm_, held.failure(), root()); !agreed)
      return agreed.failure();
    return held.failure();
  }
  return loadCheckpoint(plan_, **held, dir, *comm_, *storage_, options);
}

Status Checkpointer::fill(uint32_t seed) {
  Result<RankBuffers *> held = buffers();
  if (!held)
    return held.failure();
  return fillFromSeed(plan_, **held, seed);
}

Status Checkpointer::check(uint32_t seed) {
  Result<RankBuffers *> held = buffers();
  Status checked = held ? checkAgainstSeed(plan_, **held, seed) : Status(held.failure());
  return agree(*comm_, checked, root());
}

} // namespace runtime
} // namespace fsdp
