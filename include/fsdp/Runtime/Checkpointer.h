//===- Checkpointer.h - One rank's runtime, ready to save and load -*- C++ -*-===//
//
// What every driver (fsdp-ckpt, the C API, generated code, the Python
// bindings) needs, done once: open the plan (a file, or a directory of
// per-rank files) for the communicator's rank, check its world size, hold
// the buffers (allocated here or bound to the caller's memory), and save,
// load, fill and check with the plan's committing rank deciding for all.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_CHECKPOINTER_H
#define FSDP_RUNTIME_CHECKPOINTER_H

#include "fsdp/Runtime/Checkpoint.h"

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace fsdp {
namespace runtime {

class Checkpointer {
public:
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
  /// unless told otherwise).
  void useMemoryBackend(std::shared_ptr<MemoryBackend> backend) { backend_ = std::move(backend); }

  /// Runtime-owned buffers for every (group, role), zeroed.
  Status allocate();
  /// Caller-owned memory for one buffer (at least elements x element size
  /// bytes). Bound buffers replace allocated ones; every buffer must then
  /// be bound before use.
  Status bind(int32_t group, plan::BufferRole role, void *data);
  /// The buffers, built from the bindings on first use.
  Result<RankBuffers *> buffers();

  Result<TransferStats> save(const std::string &dir, SaveOptions options = {});
  Result<LoadResult> load(const std::string &dir, LoadOptions options = {});
  /// The deterministic test values (docs/TestValues.md).
  Status fill(uint32_t seed);
  /// Every rank checks its pieces; one rank's mismatch fails every rank.
  Status check(uint32_t seed);

private:
  Checkpointer(plan::PlanFile planFile, std::unique_ptr<Communicator> comm,
               std::unique_ptr<Storage> storage)
      : planFile_(std::move(planFile)), comm_(std::move(comm)), storage_(std::move(storage)) {}

  plan::PlanFile planFile_;
  plan::RankPlan plan_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Storage> storage_;
  std::shared_ptr<MemoryBackend> backend_;
  std::unique_ptr<StagingPool> staging_; // made by the first save that needs it
  std::map<std::pair<int32_t, plan::BufferRole>, void *> bound_;
  std::optional<RankBuffers> buffers_;
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_CHECKPOINTER_H
