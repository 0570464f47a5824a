//===- Buffers.h - A rank's packed buffers ---------------------*- C++ -*-===//
//
// The local shard of every (group, role) buffer a plan names: allocated by
// the runtime (zeroed, 4 KiB aligned: optimizer state starts at zero and
// gradients exist in main_grads dtype, as the seed's _init_optimizer_state
// arranges) or given by the caller. model_weight aliases main_weight when
// the plan says so.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_BUFFERS_H
#define FSDP_RUNTIME_BUFFERS_H

#include "fsdp/Plan/CheckpointPlan.h"

#include <map>
#include <memory>

namespace fsdp {
namespace runtime {

struct BufferView {
  void *data = nullptr;
  uint64_t bytes = 0;
  dcp::DType dtype = dcp::DType::Float32;
  int64_t elements = 0;
};

class RankBuffers {
public:
  /// Allocates every buffer of `plan`, zeroed.
  static Result<RankBuffers> allocate(const plan::RankPlan &plan);
  /// Uses caller-owned memory; every (group, role) of the plan must be given
  /// with at least elements x element size bytes (aliases may be omitted).
  static Result<RankBuffers> wrap(const plan::RankPlan &plan,
                                  const std::map<std::pair<int32_t, plan::BufferRole>, void *> &memory);

  /// The buffer, or an error naming it when the plan has none.
  Result<BufferView> get(int32_t group, plan::BufferRole role) const;
  const std::vector<plan::LocalBuffer> &layout() const { return layout_; }
  uint64_t totalBytes() const;

private:
  struct Owned {
    void operator()(void *p) const { std::free(p); }
  };
  std::vector<plan::LocalBuffer> layout_;
  std::map<std::pair<int32_t, plan::BufferRole>, BufferView> views_;
  std::vector<std::unique_ptr<void, Owned>> owned_;
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_BUFFERS_H
