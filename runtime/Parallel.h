//===- Parallel.h - Items on worker threads ---------------------*- C++ -*-===//
//
// The executor's stages run item by item on a few worker threads: items are
// independent (each has its own planned bytes in its file, or its own piece
// of a buffer), so workers take the next item until none is left or one
// fails. The error reported is the failing item with the lowest index, so a
// run's message does not depend on thread timing.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_PARALLEL_H
#define FSDP_RUNTIME_PARALLEL_H

#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Support/Result.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace fsdp {
namespace runtime {

/// Tells `progress` how far workers have come, at most once per 256 MiB
/// (and when all is done), from whichever thread gets there.
class ProgressReporter {
public:
  ProgressReporter(ProgressCallback progress, uint64_t total)
      : progress_(std::move(progress)), total_(total), start_(std::chrono::steady_clock::now()) {}
  /// Fails once the callback has asked to cancel: the worker stops there.
  Status reached(uint64_t done) {
    if (cancelled_)
      return cancelledError();
    if (!progress_ || (done - reported_.load() <= (256u << 20) && done != total_))
      return Status::success();
    std::lock_guard<std::mutex> lock(mutex_);
    // The end once, not once per worker that gets there.
    if (done == total_ && finished_)
      return Status::success();
    finished_ = done == total_;
    reported_ = done;
    if (!cancelled_ && !progress_({done, total_, seconds()}))
      cancelled_ = true;
    return cancelled_ ? cancelledError() : Status::success();
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

private:
  static Status cancelledError() { return makeError("cancelled by the progress callback"); }
  ProgressCallback progress_;
  std::atomic<bool> cancelled_{false};
  uint64_t total_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> reported_{0};
  bool finished_ = false; // the end was reported (guarded by mutex_)
  std::mutex mutex_;
};

/// Runs `body(index, worker)` for every index in [0, count) on `threads`
/// workers (worker 0 is the calling thread).
template <typename Body> Status forEachItem(size_t count, unsigned threads, Body body) {
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(count ? count : 1)));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  size_t failedIndex = count;
  Status firstError;
  auto work = [&](unsigned worker) {
    while (!failed.load(std::memory_order_relaxed)) {
      size_t index = next.fetch_add(1);
      if (index >= count)
        return;
      Status status;
      try {
        status = body(index, worker);
      } catch (const std::bad_alloc &) {
        status = makeError("out of memory", ErrorKind::IO, ENOMEM);
      }
      if (!status) {
        std::lock_guard<std::mutex> lock(mutex);
        if (index < failedIndex) {
          failedIndex = index;
          firstError = status;
        }
        failed = true;
      }
    }
  };
  std::vector<std::thread> workers;
  for (unsigned worker = 1; worker < threads; ++worker)
    workers.emplace_back(work, worker);
  work(0);
  for (std::thread &worker : workers)
    worker.join();
  return firstError;
}

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_PARALLEL_H
