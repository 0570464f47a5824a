//===- Reshard.cpp - Any DCP checkpoint into the plan's layout, state kept -===//
//
// A reshard is a load and a save, but the source may hold what the plan
// does not know: a job's further param groups, `initial_lr`, its LR
// scheduler, data loader, RNG and train-loop state (DCP saves every leaf of
// the state dict). Leaving those behind makes a checkpoint no job can resume
// from, so the committing rank carries each of them into the new checkpoint
// as a live item (LiveItem.h), with the planner_data path the source gave it.
// Tensors under `model.` and `optimizer.state.` are the plan's to name: one
// it does not is an error (another model), or left out with --allow-extra.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/Checkpointer.h"
#include "fsdp/Runtime/Protocol.h"
#include "fsdp/Support/Printable.h"

#include <algorithm>
#include <map>

namespace fsdp {
namespace runtime {

namespace {

struct Carried {
  std::vector<LiveItem> live;
  std::vector<std::string> carried, dropped;
};

/// What the save writes besides the plan's own items, decided from the
/// source's `.metadata` (its keys and planner_data paths) and what the load
/// read: every bytes item and every unplanned tensor it could read.
Result<Carried> carry(const std::string &source, Storage &storage, LoadResult &loaded,
                      const std::vector<std::string> &planned, const KeySelection &drop,
                      bool allowExtra) {
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(source, storage);
  if (!reader)
    return reader.failure();
  const dcp::Metadata &metadata = (*reader)->metadata();
  std::map<std::string, std::vector<dcp::PathPart>> paths;
  if (metadata.plannerData)
    for (const auto &[key, path] : *metadata.plannerData)
      paths[key] = path;
  auto isPlanned = [&](const std::string &key) {
    return std::binary_search(planned.begin(), planned.end(), key);
  };
  Carried out;
  for (const auto &[key, saved] : metadata.stateDictMetadata) {
    bool kept = drop.selects(key);
    if (saved.isBytes) {
      auto bytes = loaded.bytesItems.find(key);
      if (bytes == loaded.bytesItems.end())
        return makeError(printable(key) + ": a bytes item of " + printable(source) +
                             " that the load did not read",
                         ErrorKind::Internal);
      if (!kept) {
        out.dropped.push_back(key);
      } else if (!isPlanned(key)) { // a planned one replaces the plan's payload
        LiveItem item;
        item.key = key;
        item.data = std::move(bytes->second);
        item.path = paths[key];
        out.live.push_back(std::move(item));
        out.carried.push_back(key);
      }
      continue;
    }
    if (isPlanned(key))
      continue;
    if (!kept) {
      out.dropped.push_back(key);
      continue;
    }
    // The model's and the optimizer's tensors are the plan's to name: one
    // it does not is another model's, not job state to carry.
    if (key.rfind("model.", 0) == 0 || key.rfind("optimizer.state.", 0) == 0) {
      if (!allowExtra)
        return makeError(printable(source) + " holds tensor '" + printable(key) +
                             "', which the plan does not name (pass --allow-extra to drop it)",
                         ErrorKind::Incompatible);
      out.dropped.push_back(key);
      continue;
    }
    auto tensor = loaded.tensorItems.find(key);
    if (tensor == loaded.tensorItems.end()) {
      if (!allowExtra)
        return makeError(printable(source) + " holds tensor '" + printable(key) +
                             "', which the plan does not name and which is too large (or too "
                             "chunked) to carry as a live item (pass --allow-extra or --drop " +
                             printable(key) + " to leave it out)",
                         ErrorKind::Incompatible);
      out.dropped.push_back(key);
      continue;
    }
    LiveItem item = std::move(tensor->second);
    item.path = paths[key];
    out.live.push_back(std::move(item));
    out.carried.push_back(key);
  }
  if (Status status = checkLiveItems(out.live); !status)
    return propagate(status, "carrying the items of " + printable(source) +
                                 " the plan does not name: " + status.error());
  return out;
}

} // namespace

Result<ReshardResult> Checkpointer::reshard(const std::string &source, const std::string &target,
                                            ReshardOptions options) {
  KeySelection drop;
  drop.exclude = options.drop;
  Status dropped = drop.checkPrefixes();
  if (Status agreed = agree(*comm_, dropped, root()); !agreed)
    return propagate(agreed, "reshard: --drop: " + agreed.error());
  options.load.keys = {};
  options.load.readTensorItems = true;
  Result<LoadResult> loaded = load(source, options.load);
  if (!loaded)
    return loaded.failure();
  // The source's hyper-parameters replace the plan's payloads on whichever
  // rank the plan gives each bytes item to (Save ignores keys it does not
  // write), so every rank keeps its own copy of them.
  std::map<std::string, std::string> replacements;
  for (const auto &[key, bytes] : loaded->bytesItems)
    if (drop.selects(key))
      replacements.emplace(key, bytes);
  // The committing rank, which writes the live items, decides what they are.
  Carried carried;
  Status decided = Status::success();
  if (rank() == root()) {
    Result<const std::vector<std::string> *> planned = plannedKeys();
    Result<Carried> made =
        planned ? carry(source, *storage_, *loaded, **planned, drop, options.allowExtra)
                : Result<Carried>(planned.failure());
    if (made)
      carried = made.take();
    else
      decided = made.failure();
  }
  if (Status agreed = agree(*comm_, decided, root()); !agreed)
    return agreed.failure();
  SaveOptions save = std::move(options.save);
  save.step = loaded->step.value_or(1.0f);
  save.bytesItems = std::move(replacements);
  save.liveItems = std::move(carried.live);
  Result<TransferStats> saved = this->save(target, std::move(save));
  if (!saved)
    return saved.failure();
  ReshardResult result;
  result.stats = *saved;
  result.stats.seconds += loaded->stats.seconds;
  result.stats.stallSeconds += loaded->stats.stallSeconds;
  result.stats.bytesReadStorage += loaded->stats.bytesReadStorage;
  result.stats.readers = loaded->stats.readers;
  result.stats.bytesReadInPlace = loaded->stats.bytesReadInPlace;
  result.carried = std::move(carried.carried);
  result.dropped = std::move(carried.dropped);
  return result;
}

} // namespace runtime
} // namespace fsdp
