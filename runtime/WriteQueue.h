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
// The blocks themselves (WriteBlocks) outlive a queue: a Checkpointer keeps
// one set for all its saves, so only the first faults them in. The kernel
// zeroes fresh huge pages at their first touch, compacting memory first
// where it is fragmented: a save that made its own 72 MiB spent 0.1-0.24 s
// of a core per rank on it here, and its first blocks took 26 ms each to
// fill (8 writes in flight after 0.2 s).
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

/// A save's direct-I/O blocks: 8 MiB (measured: large requests pay, 1 MiB
/// ones do not), 2 MiB aligned for huge pages.
constexpr uint64_t kWriteBlockBytes = uint64_t(8) << 20;
constexpr uint64_t kWriteBlockAlignment = uint64_t(2) << 20;
/// Direct writes in flight per file when not told.
constexpr unsigned kDefaultWriteDepth = 8;

/// Aligned blocks for direct writes, on huge pages where the kernel gives
/// them. A queue hands them out first to last, and takes a returned block
/// again first, so a save touches no more of them than it needs at once.
class WriteBlocks {
public:
  static Result<std::unique_ptr<WriteBlocks>> create(unsigned count, uint64_t blockBytes,
                                                     uint64_t alignment);
  /// What a save of `threads` workers with `depth` writes in flight uses
  /// (0: kDefaultWriteDepth): a block per worker and per write in flight,
  /// of kWriteBlockBytes. Those in `kept` when there are enough, else new
  /// ones, left in `kept` for the next save.
  static Result<const WriteBlocks *> forSave(std::unique_ptr<WriteBlocks> &kept,
                                             unsigned threads, unsigned depth);
  static unsigned countForSave(unsigned threads, unsigned depth) {
    return threads + (depth ? depth : kDefaultWriteDepth);
  }
  /// Faults the first `count` blocks in now (at most all of them).
  void touch(uint64_t count) const;
  const std::vector<char *> &blocks() const { return blocks_; }
  uint64_t blockBytes() const { return blockBytes_; }

private:
  explicit WriteBlocks(uint64_t blockBytes) : blockBytes_(blockBytes) {}
  uint64_t blockBytes_;
  std::vector<char *> blocks_;
  std::vector<std::unique_ptr<char, void (*)(void *)>> owned_;
};

class WriteQueue {
public:
  /// Writes the blocks of `blocks` (which must outlive the queue) to `file`
  /// with `depth` I/O threads.
  static Result<std::unique_ptr<WriteQueue>> create(WritableFile &file, unsigned depth,
                                                    const WriteBlocks &blocks);
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
  WriteQueue(WritableFile &file, const WriteBlocks &blocks)
      : file_(file), blockBytes_(blocks.blockBytes()), all_(blocks.blocks()) {}
  void run();

  WritableFile &file_;
  uint64_t blockBytes_;
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
