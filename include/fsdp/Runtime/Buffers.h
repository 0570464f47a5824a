//===- Buffers.h - A rank's packed buffers ---------------------*- C++ -*-===//
//
// The local shard of every (group, role) buffer a plan names: allocated by
// the runtime (zeroed, 4 KiB aligned: optimizer state starts at zero and
// gradients exist in main_grads dtype, as Megatron-FSDP's optimizer priming
// arranges) or given by the caller, in the memory of one backend (host or
// device: MemoryBackend.h). model_weight aliases main_weight when the plan
// says so.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_BUFFERS_H
#define FSDP_RUNTIME_BUFFERS_H

#include "fsdp/Plan/CheckpointPlan.h"
#include "fsdp/Runtime/MemoryBackend.h"

#include <functional>

#include <map>
#include <memory>

namespace fsdp {
namespace runtime {

struct BufferView {
  void *data = nullptr; // the backend's memory: device memory is not the host's
  uint64_t bytes = 0;
  dcp::DType dtype = dcp::DType::Float32;
  int64_t elements = 0;
  MemoryBackend *backend = nullptr;

  /// `count` bytes from byte `offset` into host memory at `host`, waited for.
  Status copyOut(uint64_t offset, uint64_t count, void *host) const;
  /// `count` bytes of host memory at `host` into byte `offset`, waited for.
  Status copyIn(uint64_t offset, uint64_t count, const void *host) const;
};

class RankBuffers {
public:
  /// Allocates every buffer of `plan` from `backend` (host when null), zeroed.
  static Result<RankBuffers> allocate(const plan::RankPlan &plan,
                                      std::shared_ptr<MemoryBackend> backend = nullptr);
  /// Uses caller-owned memory of `backend` (host when null); every (group,
  /// role) of the plan must be given with at least elements x element size
  /// bytes (aliases may be omitted).
  static Result<RankBuffers>
  wrap(const plan::RankPlan &plan,
       const std::map<std::pair<int32_t, plan::BufferRole>, void *> &memory,
       std::shared_ptr<MemoryBackend> backend = nullptr);

  /// The buffer, or an error naming it when the plan has none.
  Result<BufferView> get(int32_t group, plan::BufferRole role) const;
  const std::vector<plan::LocalBuffer> &layout() const { return layout_; }
  MemoryBackend &backend() const { return *backend_; }
  const std::shared_ptr<MemoryBackend> &sharedBackend() const { return backend_; }

private:
  std::shared_ptr<MemoryBackend> backend_;
  std::vector<plan::LocalBuffer> layout_;
  std::map<std::pair<int32_t, plan::BufferRole>, BufferView> views_;
  std::vector<std::unique_ptr<void, std::function<void(void *)>>> owned_;
};

/// model_weight = main_weight cast to its dtype, for every group whose
/// model_weight is a buffer of its own (after a load or a fill), or for
/// group `onlyGroup` alone when it is not negative. The one place that
/// casts model weights: loads, fills and the Python attach all come here.
/// Host buffers are cast by `threads` workers in pieces.
Status refreshModelWeights(const plan::RankPlan &plan, RankBuffers &buffers,
                           int32_t onlyGroup = -1, unsigned threads = 1);
/// Checks that every model_weight of its own holds its main weight cast, as
/// refreshModelWeights leaves it; the error names the group and the first
/// element that differs.
Status checkModelWeights(const plan::RankPlan &plan, const RankBuffers &buffers);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_BUFFERS_H
