//===- ModelWeightRefresh.h - Model weights cast as a load lands --*- C++ -*-===//
//
// Internal to the runtime. A load ends by casting every main weight into its
// model weight (refreshModelWeights). Done as a pass of its own, that cast
// reads the main weights back from memory after the load has pushed them out
// of cache: measured here, it added half as much again to a copy and an
// xxh3 of the same bytes. Cast block by block as the load's reads land
// (each block still in cache after its copy and its check), it costs half
// that; cast in the copy itself (a block copied out of the page cache or
// out of staging), where the copy waits on memory anyway, a fifth of that.
// This class does the landed and copied parts and, at the end, casts what
// did not land through them (pieces a replica peer sent, ranges cut
// mid-element).
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
  /// Copies `bytes` bytes from `from` to `to`, in group `group`'s main
  /// weight, and casts the whole elements among them in the same pass: what
  /// landed does, without reading them back. Safe as landed is.
  void copyLanded(int32_t group, char *to, const char *from, uint64_t bytes);
  /// Casts every element that did not land, on `threads` workers.
  Status finish(unsigned threads);

private:
  struct Group {
    ModelWeightCast cast;
    bool castsAsLanded;
    std::vector<std::pair<uint64_t, uint64_t>> landed; // [first, end) elements; guarded by mutex_
  };
  Group *find(int32_t group);
  /// The whole elements [first, end) of `group`'s main weight among `bytes`
  /// bytes at `at`, or nullptr where none are (or they lie outside it, or
  /// the group is not cast as it lands).
  Group *wholeElements(int32_t group, const char *at, uint64_t bytes, uint64_t &first,
                       uint64_t &end);
  /// Records [first, end) of `group` as cast.
  void record(Group &group, uint64_t first, uint64_t end);

  RankBuffers &buffers_;
  Status found_; // the groups' buffers looked up; finish() reports a failure
  std::vector<Group> groups_;
  std::mutex mutex_;
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_MODELWEIGHTREFRESH_H
