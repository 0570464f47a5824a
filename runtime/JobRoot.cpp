//===- JobRoot.cpp - A job's step-<N> checkpoints -------------------------===//
#include "fsdp/Runtime/JobRoot.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/Protocol.h"
#include "fsdp/Support/Printable.h"

#include <algorithm>
#include <thread>
#include <unistd.h>

namespace fsdp {
namespace runtime {

namespace {

constexpr const char *kDeleting = ".deleting";

/// N of a `step-<N>` name (at most 18 digits, no sign, no leading zero:
/// the name a save of step N makes), or nothing.
std::optional<int64_t> stepOf(const std::string &name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 5 + 18 ||
      (name[5] == '0' && name.size() > 6))
    return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9')
      return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

bool endsWith(const std::string &text, const std::string &suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The root's retention lock, waited for up to `wait`.
Result<std::unique_ptr<Claim>> claimRetention(const std::string &root, Storage &storage,
                                              std::chrono::milliseconds wait) {
  std::string path = root + "/" + kRetentionLockName;
  char host[256] = "";
  ::gethostname(host, sizeof(host) - 1);
  std::string holder = "a prune by pid " + std::to_string(::getpid()) + " on " + host;
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (auto pause = std::chrono::milliseconds(5);; pause = std::min(pause * 2, decltype(pause)(200))) {
    Result<std::unique_ptr<Claim>> claimed = storage.claim(path, holder);
    if (claimed || claimed.kind() != ErrorKind::Busy)
      return claimed;
    if (std::chrono::steady_clock::now() >= deadline)
      return makeError(printable(path) + ": another prune of this job root held it for " +
                           std::to_string(wait.count() / 1000) + " s: " +
                           printable(claimed.error()),
                       ErrorKind::Busy);
    std::this_thread::sleep_for(pause);
  }
}

} // namespace

Result<std::vector<JobCheckpoint>> listJobCheckpoints(const std::string &root, Storage &storage) {
  Result<std::vector<std::string>> names = storage.listDir(root);
  if (!names)
    return names.failure();
  std::vector<JobCheckpoint> out;
  for (const std::string &name : *names) {
    std::optional<int64_t> step = stepOf(name);
    if (!step)
      continue;
    std::string path = root + "/" + name;
    Result<PathStatus> found = storage.status(path);
    if (!found)
      return found.failure();
    // (Missing: removed by another job's prune since the listing.)
    if (found->kind != PathStatus::Kind::Directory)
      continue;
    JobCheckpoint checkpoint{*step, path, false, false, ""};
    // What a load reads first: the chunk index (ours) or `.metadata`.
    ReaderOptions options;
    options.useChunkIndex = true;
    Result<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::open(path, storage, options);
    Status loadable = reader ? (*reader)->checkLoadable() : Status(reader.failure());
    checkpoint.good = static_cast<bool>(loadable);
    if (loadable)
      checkpoint.full = (*reader)->hasOptimizerState();
    else
      checkpoint.problem = loadable.error();
    out.push_back(std::move(checkpoint));
  }
  std::sort(out.begin(), out.end(),
            [](const JobCheckpoint &a, const JobCheckpoint &b) { return a.step < b.step; });
  return out;
}

std::optional<JobCheckpoint> latestJobCheckpoint(const std::vector<JobCheckpoint> &listed,
                                                 bool full) {
  for (auto at = listed.rbegin(); at != listed.rend(); ++at)
    if (at->good && (!full || at->full))
      return *at;
  return std::nullopt;
}

Result<std::vector<std::string>> pruneJobCheckpoints(const std::string &root, int64_t keep,
                                                     std::optional<int64_t> writing,
                                                     Storage &storage,
                                                     std::chrono::milliseconds lockWait) {
  if (keep < 1 || keep > kMaxKeep)
    return makeError("keep must be from 1 to " + std::to_string(kMaxKeep) + ", not " +
                         std::to_string(keep) + " (the newest good checkpoint is never removed)",
                     ErrorKind::InvalidArgument);
  // One prune of a root at a time: another job's (or manager's) would rename
  // away what this one is about to, or remove its leftovers under it.
  Result<std::unique_ptr<Claim>> lock = claimRetention(root, storage, lockWait);
  if (!lock)
    return lock.failure();
  // What a removal killed midway left behind.
  Result<std::vector<std::string>> names = storage.listDir(root);
  if (!names)
    return names.failure();
  for (const std::string &name : *names)
    if (name.rfind(".step-", 0) == 0 && endsWith(name, kDeleting))
      if (Status status = storage.removeTree(root + "/" + name); !status)
        return status.failure();
  Result<std::vector<JobCheckpoint>> listed = listJobCheckpoints(root, storage);
  if (!listed)
    return listed.failure();
  std::vector<const JobCheckpoint *> good;
  for (const JobCheckpoint &checkpoint : *listed)
    if (checkpoint.good && checkpoint.step != writing)
      good.push_back(&checkpoint);
  // The newest checkpoint with optimizer state stays besides the `keep`
  // newest good ones when those are all model-only: the job resumes from it.
  const JobCheckpoint *newestFull = nullptr;
  for (const JobCheckpoint *checkpoint : good)
    if (checkpoint->full)
      newestFull = checkpoint;
  std::vector<std::string> removed;
  for (size_t i = 0; i + static_cast<size_t>(keep) < good.size(); ++i) {
    if (good[i] == newestFull)
      continue;
    const JobCheckpoint &old = *good[i];
    std::string away = root + "/.step-" + std::to_string(old.step) + kDeleting;
    if (Status status = storage.removeTree(away); !status)
      return status.failure();
    if (Status status = storage.rename(old.path, away); !status)
      return status.failure();
    if (Status status = storage.syncDir(root); !status)
      return status.failure();
    if (Status status = storage.removeTree(away); !status)
      return status.failure();
    removed.push_back(old.path);
  }
  return removed;
}

Status agreeJobRoot(const std::string &root, Communicator &comm, Storage &storage,
                    int64_t decider) {
  auto resolve = [&]() -> Result<std::string> {
    if (!storage.exists(root))
      if (Status made = storage.makeDir(root); !made && !storage.exists(root))
        return made.failure(); // (another process may have made it meanwhile)
    return storage.realPath(root);
  };
  Result<std::string> decided = decideOnRoot(comm, decider, resolve);
  if (!decided)
    return propagate(decided, "job root " + printable(root) + ": " + decided.error());
  // Every rank sees the decider's directory under its own name for it.
  Status mine = Status::success();
  if (comm.rank() != decider) {
    Result<std::string> real = storage.realPath(root);
    if (!real || *real != *decided)
      mine = makeError("job root " + printable(root) + " is not rank " + std::to_string(decider) +
                           "'s (" + printable(*decided) +
                           "): every rank of a job must name one directory",
                       ErrorKind::InvalidArgument);
  }
  return agree(comm, mine, decider);
}

Result<std::optional<std::string>> agreeLatestJobCheckpoint(const std::string &root, bool full,
                                                            Communicator &comm, Storage &storage,
                                                            int64_t decider) {
  Result<std::string> decided = decideOnRoot(comm, decider, [&]() -> Result<std::string> {
    Result<std::vector<JobCheckpoint>> listed = listJobCheckpoints(root, storage);
    if (!listed)
      return listed.failure();
    std::optional<JobCheckpoint> latest = latestJobCheckpoint(*listed, full);
    return latest ? "P" + latest->path : std::string("N");
  });
  if (!decided)
    return decided.failure();
  if (decided->empty() || (*decided)[0] == 'N')
    return std::optional<std::string>();
  return std::optional<std::string>(decided->substr(1));
}

Result<std::vector<std::string>> agreePruneJobCheckpoints(const std::string &root, int64_t keep,
                                                          std::optional<int64_t> writing,
                                                          Communicator &comm, Storage &storage,
                                                          int64_t decider) {
  Result<std::string> decided = decideOnRoot(comm, decider, [&]() -> Result<std::string> {
    Result<std::vector<std::string>> removed = pruneJobCheckpoints(root, keep, writing, storage);
    if (!removed)
      return removed.failure();
    return encodeStrings(*removed);
  });
  if (!decided)
    return decided.failure();
  return decodeStrings(*decided);
}

} // namespace runtime
} // namespace fsdp

