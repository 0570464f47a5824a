//===- WriteQueue.cpp - Direct writes kept in flight while workers fill ----===//
#include "WriteQueue.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>

namespace fsdp {
namespace runtime {

Result<std::unique_ptr<WriteBlocks>> WriteBlocks::create(unsigned count, uint64_t blockBytes,
                                                         uint64_t alignment) {
  if (!count || !blockBytes || blockBytes % alignment)
    return makeError("write blocks: a count and an aligned block size must be set",
                     ErrorKind::Internal);
  std::unique_ptr<WriteBlocks> made(new WriteBlocks(blockBytes));
  for (unsigned i = 0; i < count; ++i) {
    void *block = std::aligned_alloc(alignment, blockBytes);
    if (!block)
      return makeError("cannot allocate the direct-I/O blocks (" + std::to_string(count) +
                           " x " + std::to_string(blockBytes >> 20) + " MiB)",
                       ErrorKind::IO, ENOMEM);
    made->owned_.emplace_back(static_cast<char *>(block), &std::free);
    // A direct write of pages scattered in memory is cut into requests of
    // ~1 MiB; huge pages keep them at the device's maximum.
    ::madvise(block, blockBytes, MADV_HUGEPAGE);
    made->blocks_.push_back(static_cast<char *>(block));
  }
  return made;
}

void WriteBlocks::touch(uint64_t count) const {
  for (uint64_t i = 0; i < std::min<uint64_t>(count, blocks_.size()); ++i)
    std::memset(blocks_[i], 0, blockBytes_);
}

Result<const WriteBlocks *> WriteBlocks::forSave(std::unique_ptr<WriteBlocks> &kept,
                                                 unsigned threads, unsigned depth) {
  unsigned count = countForSave(threads, depth);
  if (kept && kept->blocks().size() >= count && kept->blockBytes() == kWriteBlockBytes)
    return kept.get();
  kept.reset(); // freed before the larger set is made
  Result<std::unique_ptr<WriteBlocks>> made =
      create(count, kWriteBlockBytes, kWriteBlockAlignment);
  if (!made)
    return made.failure();
  kept = made.take();
  return kept.get();
}

Result<std::unique_ptr<WriteQueue>> WriteQueue::create(WritableFile &file, unsigned depth,
                                                       const WriteBlocks &blocks) {
  if (!depth)
    return makeError("write queue: the depth must be set", ErrorKind::Internal);
  std::unique_ptr<WriteQueue> queue(new WriteQueue(file, blocks));
  // Handed out from the back: the first block first.
  queue->free_.assign(queue->all_.rbegin(), queue->all_.rend());
  for (unsigned i = 0; i < depth; ++i)
    queue->threads_.emplace_back([raw = queue.get()] { raw->run(); });
  return queue;
}

WriteQueue::~WriteQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (std::thread &thread : threads_)
    thread.join(); // each finishes the write it holds; queued ones are dropped
}

Result<char *> WriteQueue::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !failure_ || !free_.empty(); });
  if (!failure_)
    return failure_.failure();
  char *block = free_.back();
  free_.pop_back();
  return block;
}

void WriteQueue::submit(char *block, uint64_t offset, uint64_t size, const std::string &what) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back({block, offset, size, what});
  }
  changed_.notify_all();
}

void WriteQueue::release(char *block) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(block);
  }
  changed_.notify_all();
}

Status WriteQueue::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return pending_.empty() && writing_ == 0; });
  return failure_;
}

void WriteQueue::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (stopping_)
      return;
    Write write = std::move(pending_.front());
    pending_.pop_front();
    // After a failure the rest are not written: the save has failed.
    Status status;
    if (failure_) {
      ++writing_;
      lock.unlock();
      status = file_.writeAt(write.offset, {{write.block, write.size}});
      lock.lock();
      --writing_;
    }
    if (!status && failure_)
      failure_ = propagate(status, status.error() + " (item " + write.what + ")");
    free_.push_back(write.block);
    changed_.notify_all();
  }
}

} // namespace runtime
} // namespace fsdp
