//===- JobRoot.h - A job's step-<N> checkpoints ------------------*- C++ -*-===//
//
// A job keeps its checkpoints as `<root>/step-<N>`. A save stages beside its
// target and appears whole at its commit, so a `step-<N>` directory is a
// commit; whether it is still good is checked by opening its `.metadata`
// against its integrity index. Retention removes committed good checkpoints
// older than the k newest good ones, renaming each away
// (`.step-<N>.deleting`) before removing it, so a crash leaves nothing that
// looks like a checkpoint. The one rule for `fsdp-ckpt list` / `prune` and
// Python's CheckpointManager.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_JOBROOT_H
#define FSDP_RUNTIME_JOBROOT_H

#include "fsdp/Runtime/Storage.h"
#include "fsdp/Support/Result.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {
namespace runtime {

struct JobCheckpoint {
  int64_t step = 0;
  std::string path;
  bool good = false;
  std::string problem; // why not, when not good
};

/// The `step-<N>` checkpoints under `root`, oldest first, each checked.
Result<std::vector<JobCheckpoint>> listJobCheckpoints(const std::string &root, Storage &storage);

/// Removes the committed good checkpoints older than the `keep` newest good
/// ones (never `writing`, never a damaged or staging one), and what an
/// earlier removal left; the removed paths.
Result<std::vector<std::string>> pruneJobCheckpoints(const std::string &root, int64_t keep,
                                                     std::optional<int64_t> writing,
                                                     Storage &storage);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_JOBROOT_H
