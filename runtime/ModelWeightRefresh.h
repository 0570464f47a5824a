//===- ModelWeightRefresh.h - Model weights cast as a load lands --*- C++ -*-===//
//
// Internal to the runtime. A load ends by casting every main weight into its
// model weight (refreshModelWeights). Done as a pass of its own, that cast
// reads the main weights back from memory after the load has pushed them out
// of cache: measured here, it added half as much again to a copy and an
// xxh3 of the same bytes. Cast block by block as the load's reads land
// (each 1 MiB block still in cache after its copy and its check), it costs
// half that. This class does the landed part and, at the end, casts what did
// not land through it (pieces a replica peer sent, ranges cut mid-element).
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_MODELWEIGHTREFRESH_H
#define FSDP_RUNTIME_MODELWEIGHTREFRESH_H

#include "fsdp/Runtime/Buffers.h"
#include "fsdp/Support/Result.h"

#include <mutex>
#include <utility>
#include <vector>

namespace fsdp {
namespace runtime {

/// A group whose model_weight is a buffer of its own, with its main weight.
struct ModelWeightCast {
  int32_t group;
  BufferView main, model;
  uint64_t elements; // the fewer of the two buffers'
};

class ModelWeightRefresh {
public:
  /// Every group of `plan` with a model_weight of its own. Groups whose
  /// buffers the host cannot touch, or whose dtypes do not cast, are cast
  /// only by finish(), where any error is reported.
  ModelWeightRefresh(const plan::RankPlan &plan, RankBuffers &buffers);

  /// True when bytes landing in group `group`'s main weight are cast as
  /// they land.
  bool castsAsLanded(int32_t group);
  /// `bytes` bytes of group `group`'s main weight at `at` hold their final
  /// values: the whole elements among them are cast now. Safe from many
  /// threads at once (each on its own bytes).
  void landed(int32_t group, const char *at, uint64_t bytes);
  /// Casts every element that did not land, on `threads` workers.
  Status finish(unsigned threads);

private:
  struct Group {
    ModelWeightCast cast;
    bool castsAsLanded;
    std::vector<std::pair<uint64_t, uint64_t>> landed; // [first, end) elements; guarded by mutex_
  };
  Group *find(int32_t group);

  RankBuffers &buffers_;
  Status found_; // the groups' buffers looked up; finish() reports a failure
  std::vector<Group> groups_;
  std::mutex mutex_;
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_MODELWEIGHTREFRESH_H
