//===- WriteQueue.h - Direct writes kept in flight while workers fill --*- C++ -*-===//
//
// A direct-I/O save is bound by how many writes the device sees at once,
// not by how many workers copy and hash: with one synchronous write per
// worker, 2 workers keep 2 requests in flight and wait on each while
// nothing is copied. The queue owns a pool of aligned blocks and a few I/O
// threads: a worker fills a block, submits it and takes the next free one
// while earlier blocks are on their way. Blocks are written in any order
// (each has its own offset); a failed write stops the queue, and every
// later acquire and the drain report it.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_WRITEQUEUE_H
#define FSDP_RUNTIME_WRITEQUEUE_H

#include "fsdp/Runtime/Storage.h"
#include "fsdp/Support/Result.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fsdp {
namespace runtime {

class WriteQueue {
public:
  /// `blocks` blocks of `blockBytes` (aligned to `blockAlignment`, on huge
  /// pages where the kernel gives them), written to `file` by `depth` I/O
  /// threads.
  static Result<std::unique_ptr<WriteQueue>> create(WritableFile &file, unsigned depth,
                                                    unsigned blocks, uint64_t blockBytes,
                                                    uint64_t blockAlignment);
  ~WriteQueue();
  WriteQueue(const WriteQueue &) = delete;
  WriteQueue &operator=(const WriteQueue &) = delete;

  uint64_t blockBytes() const { return blockBytes_; }
  /// Every block of the pool (what a device backend pins).
  const std::vector<char *> &blocks() const { return all_; }

  /// A free block, waiting while all are filled or in flight; the first
  /// write error once one has failed.
  Result<char *> acquire();
  /// Writes `size` bytes of `block` at `offset`; the block returns to the
  /// pool once written. `what` names the item in the error of a failure.
  void submit(char *block, uint64_t offset, uint64_t size, const std::string &what);
  /// Gives back a block that was acquired but not submitted.
  void release(char *block);
  /// Waits until every submitted write is done; the first that failed.
  Status drain();

private:
  struct Write {
    char *block;
    uint64_t offset, size;
    std::string what;
  };
  WriteQueue(WritableFile &file, uint64_t blockBytes) : file_(file), blockBytes_(blockBytes) {}
  void run();

  WritableFile &file_;
  uint64_t blockBytes_;
  std::vector<std::unique_ptr<char, void (*)(void *)>> owned_;
  std::vector<char *> all_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<char *> free_;  // guarded by mutex_
  std::deque<Write> pending_; // guarded by mutex_
  unsigned writing_ = 0;      // guarded by mutex_
  bool stopping_ = false;     // guarded by mutex_
  Status failure_;            // the first failed write; guarded by mutex_
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_WRITEQUEUE_H
