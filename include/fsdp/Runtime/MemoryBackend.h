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
// (CudaBackend.h: device memory, copies on streams, events as completions,
// kernels for the cast and the test values).
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

  /// Makes host memory one this backend copies to and from at full speed
  /// (CUDA: page-locked, one registration per call): staging
  /// blocks and async-save snapshots. Nothing to do for host memory.
  virtual Status pinHostMemory(void *memory, uint64_t bytes) {
    (void)memory, (void)bytes;
    return Status::success();
  }
  virtual void unpinHostMemory(void *memory, uint64_t bytes) { (void)memory, (void)bytes; }
  /// Host bytes pinned now (what staging and snapshots hold), for reports.
  virtual uint64_t pinnedHostBytes() const { return 0; }

  /// Whether fillTestValues/checkTestValues run in this backend's memory
  /// (device kernels): --fill and --check then need no host copy.
  virtual bool hasTestValueKernels() const { return false; }
  /// Values.h's fillTestValues / checkTestValues on this backend's memory.
  virtual Status fillTestValues(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement,
                                uint64_t count, uint32_t seed, void *memory);
  virtual Status checkTestValues(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement,
                                 uint64_t count, uint32_t seed, const void *memory);
};

std::shared_ptr<MemoryBackend> createHostBackend();

/// Host blocks that device memory is staged through: allocated once (by a
/// checkpointer, for all its saves), pinned by the device's backend,
/// handed out in groups, and waited for when all are in use, which bounds
/// staging memory and holds back workers that run ahead (back-pressure).
class StagingPool {
public:
  /// Throws std::bad_alloc when the host has no memory for it; a failure to
  /// pin leaves the blocks unpinned (slower copies, same bytes).
  StagingPool(uint64_t blockBytes, size_t blocks, std::shared_ptr<MemoryBackend> pinner = nullptr);
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
  void releaseAll();
  uint64_t blockBytes_;
  std::shared_ptr<MemoryBackend> pinner_;
  std::vector<char *> blocks_, free_, pinned_;
  std::mutex mutex_;
  std::condition_variable freed_;
};

struct SimulatedDeviceOptions {
  /// Every copy waits this long on the device's thread before it runs.
  std::chrono::microseconds copyDelay{0};
};
/// The simulated device pins host memory by bookkeeping (pinnedHostBytes)
/// and runs the test-value functions on its own thread, as kernels would.
std::shared_ptr<MemoryBackend> createSimulatedDeviceBackend(SimulatedDeviceOptions options = {});

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_MEMORYBACKEND_H
