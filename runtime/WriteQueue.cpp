//===- WriteQueue.cpp - Direct writes kept in flight while workers fill ----===//
#include "WriteQueue.h"

#include <cerrno>
#include <cstdlib>
#include <sys/mman.h>

namespace fsdp {
namespace runtime {

Result<std::unique_ptr<WriteQueue>> WriteQueue::create(WritableFile &file, unsigned depth,
                                                       unsigned blocks, uint64_t blockBytes,
                                                       uint64_t blockAlignment) {
  if (!depth || !blocks || !blockBytes || blockBytes % blockAlignment)
    return makeError("write queue: depth, blocks and an aligned block size must be set",
                     ErrorKind::Internal);
  std::unique_ptr<WriteQueue> queue(new WriteQueue(file, blockBytes));
  for (unsigned i = 0; i < blocks; ++i) {
    void *block = std::aligned_alloc(blockAlignment, blockBytes);
    if (!block)
      return makeError("cannot allocate the direct-I/O blocks (" + std::to_string(blocks) +
                           " x " + std::to_string(blockBytes >> 20) + " MiB)",
                       ErrorKind::IO, ENOMEM);
    // A direct write of pages scattered in memory is cut into requests of
    // ~1 MiB; huge pages keep them at the device's maximum.
    ::madvise(block, blockBytes, MADV_HUGEPAGE);
    queue->owned_.emplace_back(static_cast<char *>(block), &std::free);
    queue->all_.push_back(static_cast<char *>(block));
  }
  queue->free_ = queue->all_;
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
