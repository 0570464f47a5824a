//===- JobRoot.cpp - A job's step-<N> checkpoints -------------------------===//
#include "fsdp/Runtime/JobRoot.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Support/Printable.h"

#include <algorithm>

namespace fsdp {
namespace runtime {

namespace {

constexpr const char *kDeleting = ".deleting";

/// N of a `step-<N>` name (at most 18 digits, no sign), or nothing.
std::optional<int64_t> stepOf(const std::string &name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 5 + 18)
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
    if (found->kind != PathStatus::Kind::Directory)
      continue;
    JobCheckpoint checkpoint{*step, path, false, ""};
    // Opening the reader checks .metadata against the integrity index.
    Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(path, storage);
    checkpoint.good = static_cast<bool>(reader);
    if (!reader)
      checkpoint.problem = reader.error();
    out.push_back(std::move(checkpoint));
  }
  std::sort(out.begin(), out.end(),
            [](const JobCheckpoint &a, const JobCheckpoint &b) { return a.step < b.step; });
  return out;
}

Result<std::vector<std::string>> pruneJobCheckpoints(const std::string &root, int64_t keep,
                                                     std::optional<int64_t> writing,
                                                     Storage &storage) {
  if (keep < 1)
    return makeError("keep must be at least 1 (the newest good checkpoint is never removed)",
                     ErrorKind::InvalidArgument);
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
  std::vector<std::string> removed;
  if (good.size() <= static_cast<size_t>(keep))
    return removed;
  for (size_t i = 0; i + static_cast<size_t>(keep) < good.size(); ++i) {
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

} // namespace runtime
} // namespace fsdp
