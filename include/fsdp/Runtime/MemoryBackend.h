//===- MemoryBackend.h - Where a rank's buffers live ------------*- C++ -*-===//
//
// Every buffer belongs to a memory backend that allocates it, zeroes it,
// copies it out to host staging and in from it (asynchronously: a future to
// wait on) and casts main to model weights. The executor touches buffer
// memory only through its backend unless the backend says the host may
// (host memory): a device pointer is never read or written by the host.
//
// Backends: host memory; a simulated device for the tests (its memory is
// mapped without any access for the host, so a stray host access faults at
// once; copies run on its own thread after a configurable delay); CUDA
// (planned).
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_MEMORYBACKEND_H
#define FSDP_RUNTIME_MEMORYBACKEND_H

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Support/Result.h"

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

namespace fsdp {
namespace runtime {

enum class MemoryKind : uint8_t { Host, PinnedHost, Device };
const char *memoryKindName(MemoryKind kind);

class MemoryBackend {
public:
  virtual ~MemoryBackend() = default;
  virtual MemoryKind kind() const = 0;
  /// True when the host may read and write this memory directly.
  virtual bool hostAccessible() const = 0;
  /// `bytes` of this backend's memory, zeroed.
  virtual Result<void *> allocate(uint64_t bytes) = 0;
  virtual void release(void *memory) = 0;
  /// Host memory at `destination` gets `bytes` from `source` (this
  /// backend's memory); the future says when it is done.
  virtual std::future<Status> copyOut(const void *source, void *destination, uint64_t bytes) = 0;
  /// This backend's memory at `destination` gets `bytes` of host `source`.
  virtual std::future<Status> copyIn(const void *source, void *destination, uint64_t bytes) = 0;
  /// `bytes` of this backend's memory at `memory` set to zero.
  virtual Status zero(void *memory, uint64_t bytes) = 0;
  /// `elements` of `from` at `source` cast to `to` at `destination`, both
  /// this backend's memory (rounding to nearest even).
  virtual Status cast(dcp::DType from, const void *source, dcp::DType to, void *destination,
                      uint64_t elements) = 0;
};

std::shared_ptr<MemoryBackend> createHostBackend();

/// Host blocks that device memory is staged through: allocated once (by a
/// checkpointer, for all its saves), handed out in groups, and waited for
/// when all are in use, which bounds staging memory and holds back workers
/// that run ahead (back-pressure).
class StagingPool {
public:
  StagingPool(uint64_t blockBytes, size_t blocks);
  ~StagingPool();
  StagingPool(const StagingPool &) = delete;
  StagingPool &operator=(const StagingPool &) = delete;

  uint64_t blockBytes() const { return blockBytes_; }
  size_t blocks() const { return blocks_.size(); }
  /// `count` blocks at once (never some of them: no two takers can each
  /// hold part of what the other waits for), waiting until they are free.
  std::vector<char *> acquire(size_t count);
  void release(const std::vector<char *> &blocks);

private:
  uint64_t blockBytes_;
  std::vector<char *> blocks_, free_;
  std::mutex mutex_;
  std::condition_variable freed_;
};

struct SimulatedDeviceOptions {
  /// Every copy waits this long on the device's thread before it runs.
  std::chrono::microseconds copyDelay{0};
};
std::shared_ptr<MemoryBackend> createSimulatedDeviceBackend(SimulatedDeviceOptions options = {});

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_MEMORYBACKEND_H
