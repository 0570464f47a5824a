//===- MultiRank.h - N ranks as N threads, for the runtime's tests -*- C++ -*-===//
//
// Thread-group ranks driving Checkpointers: open, allocate, save, load and
// check on every rank, and what every rank's status must be.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_UNITTESTS_RUNTIME_MULTIRANK_H
#define FSDP_UNITTESTS_RUNTIME_MULTIRANK_H

#include "../TestModels.h"
#include "fsdp/Plan/PlanFile.h"
#include "fsdp/Runtime/Checkpointer.h"
#include "fsdp/Runtime/MemoryBackend.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <thread>
#include <unistd.h>

namespace fsdp {
namespace multirank {

using namespace fsdp::runtime;

/// Runs `body(rank, comm)` on one thread per rank of a new thread group.
template <typename Body> void onRanks(int64_t size, Body body) {
  std::vector<std::unique_ptr<Communicator>> comms = createThreadGroup(size);
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < size; ++rank)
    threads.emplace_back([&, rank] { body(rank, std::move(comms[rank])); });
  for (std::thread &thread : threads)
    thread.join();
}

/// Results of every rank, filled from their threads.
template <typename T> struct PerRank {
  explicit PerRank(int64_t size) : values(static_cast<size_t>(size)) {}
  std::vector<T> values;
};

inline std::string tempDir() {
  const char *base = std::getenv("TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/fsdp-multirank-XXXXXX";
  return ::mkdtemp(pattern.data()) ? pattern : "";
}

inline plan::PlanFile planFor(const plan::ModelLayout &model) {
  Result<std::string> bytes = plan::buildPlanFile(model);
  EXPECT_TRUE(bytes) << bytes.error();
  Result<plan::PlanFile> file = plan::PlanFile::fromBytes(bytes.take(), "plan");
  EXPECT_TRUE(file) << file.error();
  return file.take();
}

/// Where each rank's buffers live (host memory when null).
using BackendOf = std::function<std::shared_ptr<MemoryBackend>()>;

/// A simulated device per rank whose copies each wait 100 us.
inline std::shared_ptr<MemoryBackend> slowDevice() {
  SimulatedDeviceOptions options;
  options.copyDelay = std::chrono::microseconds(100);
  return createSimulatedDeviceBackend(options);
}

/// Opens `plan` for the rank of `comm` and allocates its buffers.
inline Result<std::unique_ptr<Checkpointer>> openAndAllocate(const plan::PlanFile &plan,
                                                             std::unique_ptr<Communicator> comm,
                                                             std::unique_ptr<Storage> storage,
                                                             const BackendOf &backendOf) {
  Result<std::unique_ptr<Checkpointer>> opened =
      Checkpointer::open(plan, std::move(comm), std::move(storage));
  if (!opened)
    return opened;
  if (backendOf)
    (*opened)->useMemoryBackend(backendOf());
  if (Status status = (*opened)->allocate(); !status)
    return status.failure();
  return opened;
}

/// Every rank of `plan` saves SEED's values into `dir`; each rank's status.
inline std::vector<Status>
saveOnRanks(const plan::PlanFile &plan, const std::string &dir, uint32_t seed,
            std::function<std::unique_ptr<Storage>(int64_t)> storageOf = {},
            const BackendOf &backendOf = {}) {
  PerRank<Status> statuses(plan.worldSize());
  onRanks(plan.worldSize(), [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(plan, std::move(comm), storageOf ? storageOf(rank) : nullptr, backendOf);
    Status status = opened ? Status::success() : Status(opened.failure());
    if (status)
      status = (*opened)->fill(seed);
    if (status) {
      Result<TransferStats> saved = (*opened)->save(dir);
      status = saved ? Status::success() : Status(saved.failure());
    }
    statuses.values[rank] = status;
  });
  return statuses.values;
}

/// Every rank of `plan` loads `dir` and checks SEED's values.
/// Every rank of `plan` loads `dir` with `options` and checks the values
/// and model weights; `stats`, when given, gets each rank's figures.
inline std::vector<Status> loadOnRanks(const plan::PlanFile &plan, const std::string &dir,
                                       uint32_t seed, const BackendOf &backendOf = {},
                                       const LoadOptions &options = {},
                                       std::vector<TransferStats> *stats = nullptr) {
  PerRank<Status> statuses(plan.worldSize());
  PerRank<TransferStats> figures(plan.worldSize());
  onRanks(plan.worldSize(), [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(plan, std::move(comm), nullptr, backendOf);
    Status status = opened ? Status::success() : Status(opened.failure());
    if (status) {
      Result<LoadResult> loaded = (*opened)->load(dir, options);
      if (loaded)
        figures.values[rank] = loaded->stats;
      // The values loaded, and the model weights refreshed from them.
      status = loaded ? (*opened)->check(seed, {}, true) : Status(loaded.failure());
    }
    statuses.values[rank] = status;
  });
  if (stats)
    *stats = figures.values;
  return statuses.values;
}

/// Every rank of `plan` loads `from` and saves it into `to` (a reshard).
inline std::vector<Status> reshardOnRanks(const plan::PlanFile &plan, const std::string &from,
                                          const std::string &to, const BackendOf &backendOf = {}) {
  PerRank<Status> statuses(plan.worldSize());
  onRanks(plan.worldSize(), [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(plan, std::move(comm), nullptr, backendOf);
    Status status = opened ? Status::success() : Status(opened.failure());
    if (status) {
      Result<LoadResult> loaded = (*opened)->load(from);
      status = loaded ? Status::success() : Status(loaded.failure());
    }
    if (status) {
      Result<TransferStats> saved = (*opened)->save(to);
      status = saved ? Status::success() : Status(saved.failure());
    }
    statuses.values[rank] = status;
  });
  return statuses.values;
}

/// Every rank failed with the same error of `kind`, whose message holds
/// `text`.
inline void expectAllFailWith(const std::vector<Status> &statuses, const std::string &text,
                              ErrorKind kind) {
  for (size_t rank = 0; rank < statuses.size(); ++rank) {
    ASSERT_FALSE(statuses[rank]) << "rank " << rank;
    EXPECT_EQ(statuses[rank].kind(), kind) << statuses[rank].error();
    EXPECT_NE(statuses[rank].error().find(text), std::string::npos) << statuses[rank].error();
  }
}

inline void expectAllOk(const std::vector<Status> &statuses) {
  for (size_t rank = 0; rank < statuses.size(); ++rank)
    EXPECT_TRUE(statuses[rank]) << "rank " << rank << ": " << statuses[rank].error();
}

} // namespace multirank
} // namespace fsdp

#endif // FSDP_UNITTESTS_RUNTIME_MULTIRANK_H
