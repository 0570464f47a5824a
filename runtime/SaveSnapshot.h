//===- SaveSnapshot.h - A host copy of what a save writes ------*- C++ -*-===//
//
// An async save copies every buffer range this rank's plan saves into host
// memory it owns, then writes from that copy in the background while the
// caller goes on changing its buffers. The memory is reserved once (for all
// of a checkpointer's async saves) and faulted in when reserved, on several
// threads, so no capture pays for page faults: in huge pages when reserved
// ahead of time (copies into them are faster), in small pages when the
// first save reserves it in its stall (faulting them in is faster). The copy
// runs on several threads (host buffers) or as the backend's copies (device
// buffers), all issued before any is waited for.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_SAVESNAPSHOT_H
#define FSDP_RUNTIME_SAVESNAPSHOT_H

#include "fsdp/Runtime/Buffers.h"

#include <memory>

namespace fsdp {
namespace runtime {

class SaveSnapshot {
public:
  /// Host memory for every buffer that `plan` saves from (not the others),
  /// faulted in on `threads` threads, in huge pages if `hugePages` (and the
  /// system grants them); pinned by `pinner` when given (a device's backend;
  /// unpinned memory if it cannot).
  static Result<std::unique_ptr<SaveSnapshot>>
  reserve(const plan::RankPlan &plan, unsigned threads, bool hugePages,
          std::shared_ptr<MemoryBackend> pinner = nullptr);
  ~SaveSnapshot();
  SaveSnapshot(const SaveSnapshot &) = delete;
  SaveSnapshot &operator=(const SaveSnapshot &) = delete;

  /// Copies every saved range of `buffers` (the plan's write items) into
  /// the snapshot on `threads` threads; returns when every byte is copied.
  Status capture(const RankBuffers &buffers, unsigned threads);
  /// Host views of the copy, for the save to write from.
  const RankBuffers &buffers() const { return buffers_; }
  /// The snapshot's size, and the bytes one capture copies.
  uint64_t reservedBytes() const { return reserved_; }
  uint64_t capturedBytes() const;

private:
  SaveSnapshot() = default;
  struct Range {
    int32_t group;
    plan::BufferRole role;
    uint64_t offset, bytes; // in the buffer and in its copy alike
  };
  std::vector<Range> ranges_; // the write items' ranges, adjacent ones merged
  std::shared_ptr<MemoryBackend> host_, pinner_;
  Status populate(unsigned threads);
  void *memory_ = nullptr; // reserved_ bytes, aligned in mapping_
  uint64_t reserved_ = 0;
  void *mapping_ = nullptr;
  uint64_t mappingBytes_ = 0;
  RankBuffers buffers_;
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_SAVESNAPSHOT_H
