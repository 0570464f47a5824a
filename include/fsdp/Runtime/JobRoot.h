//===- JobRoot.h - A job's step-<N> checkpoints ------------------*- C++ -*-===//
//
// A job keeps its checkpoints as `<root>/step-<N>` (0 <= N < 10^18). A save
// stages beside its target and appears whole at its commit, so a `step-<N>`
// directory is a commit. It is good when a load of it would succeed, checked
// without reading its items (CheckpointReader::checkLoadable): `.metadata`
// agrees with both indexes, the chunk index is whole, every data file is
// there with its bytes. Retention removes good checkpoints older than the k
// newest good ones (so it never leaves fewer than k, and never the newest
// good one whatever is newer), renaming each away (`.step-<N>.deleting`)
// before removing it, so a crash leaves nothing that looks like a
// checkpoint; it holds `<root>/.fsdp-retention.lock` throughout, so two
// prunes of one root (two jobs, two managers) take turns. In a job, one rank
// (the decider) looks and decides and every rank gets its answer. The one
// rule for `fsdp-ckpt list` / `prune` and Python's CheckpointManager.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_JOBROOT_H
#define FSDP_RUNTIME_JOBROOT_H

#include "fsdp/Runtime/Communicator.h"
#include "fsdp/Runtime/Storage.h"
#include "fsdp/Support/Result.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {
namespace runtime {

/// Steps are below this (18 digits).
constexpr int64_t kMaxStep = 999999999999999999;
/// Retention keeps at most this many.
constexpr int64_t kMaxKeep = 1000000;
/// The lock a prune holds, inside the root.
constexpr const char *kRetentionLockName = ".fsdp-retention.lock";

struct JobCheckpoint {
  int64_t step = 0;
  std::string path;
  bool good = false;
  bool full = false;   // good, with optimizer state (not model-only)
  std::string problem; // why not, when not good
};

/// The `step-<N>` checkpoints under `root`, oldest first, each checked.
Result<std::vector<JobCheckpoint>> listJobCheckpoints(const std::string &root, Storage &storage);

/// The newest good checkpoint (`full`: with optimizer state), if any.
std::optional<JobCheckpoint> latestJobCheckpoint(const std::vector<JobCheckpoint> &listed,
                                                 bool full);

/// Removes the committed good checkpoints older than the `keep` newest good
/// ones (never `writing`, never a damaged or staging one), and what an
/// earlier removal left; the removed paths. Waits up to `lockWait` for
/// another prune of the root to finish (then fails, kind Busy).
Result<std::vector<std::string>>
pruneJobCheckpoints(const std::string &root, int64_t keep, std::optional<int64_t> writing,
                    Storage &storage, std::chrono::milliseconds lockWait = std::chrono::minutes(10));

/// Collective: the decider creates `root` when missing and every rank checks
/// it names the same directory as the decider's (a job has one root).
Status agreeJobRoot(const std::string &root, Communicator &comm, Storage &storage,
                    int64_t decider);
/// Collective: the decider's latestJobCheckpoint's path (or none) on every
/// rank; its error on every rank when listing fails.
Result<std::optional<std::string>> agreeLatestJobCheckpoint(const std::string &root, bool full,
                                                            Communicator &comm, Storage &storage,
                                                            int64_t decider);
/// Collective: pruneJobCheckpoints on the decider; its outcome on every rank.
Result<std::vector<std::string>> agreePruneJobCheckpoints(const std::string &root, int64_t keep,
                                                          std::optional<int64_t> writing,
                                                          Communicator &comm, Storage &storage,
                                                          int64_t decider);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_JOBROOT_H
