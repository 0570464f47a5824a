//===- Communicator.h - What the runtime needs from a process group -*- C++ -*-===//
//
// Saves and loads agree on success collectively; the committing rank gathers
// every rank's item checksums. This is all the communication a plan needs:
// the plan itself was computed ahead of time. The protocol built on these
// calls lives in Protocol.h.
//
// Implementations: one process alone; MPI (MPI_COMM_WORLD, or a caller's
// communicator: MpiCommunicator.h); callbacks (fixed-size gather, broadcast
// and barrier, what bindings over torch.distributed provide); and a group
// of threads in one process (tests, and one process driving several ranks).
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_COMMUNICATOR_H
#define FSDP_RUNTIME_COMMUNICATOR_H

#include "fsdp/Support/Result.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {
namespace runtime {

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  virtual Status barrier() = 0;
  /// Every rank's `bytes`, in rank order, on `root`; empty elsewhere.
  virtual Result<std::vector<std::string>> gather(const std::string &bytes, int64_t root) = 0;
  /// `bytes` of `root` on every rank.
  virtual Result<std::string> broadcast(const std::string &bytes, int64_t root) = 0;
  /// `size` bytes of host memory at `data` of `root` into `data` on every
  /// rank (the same size everywhere): bulk bytes without copies where the
  /// implementation can (MPI, callbacks); by default through broadcast().
  virtual Status broadcastInPlace(void *data, uint64_t size, int64_t root);
  /// Collective: the ranks passing the same `color` form a new group,
  /// ranked by (`key`, rank). E.g. the replica groups of an HSDP mesh.
  virtual Result<std::unique_ptr<Communicator>> split(int64_t color, int64_t key) = 0;
  /// Whether split can work (callbacks may not provide it).
  virtual bool canSplit() const { return true; }
  /// Whether another thread may run this communicator's collectives while
  /// the caller's thread goes on (an async save's background): a caller's
  /// MPI needs MPI_THREAD_MULTIPLE for that.
  virtual bool usableFromAnotherThread() const { return true; }
};

/// A process alone: world size 1.
std::unique_ptr<Communicator> createSingleProcessCommunicator();

/// What a caller's process group provides; every call is collective over
/// the group, and returns success or an error (with its kind).
struct CommunicatorCallbacks {
  int64_t rank = 0;
  int64_t size = 1;
  /// Every rank's `size` bytes at `data`, in rank order, into `out` on
  /// `root` (size x group size bytes); `out` is unused elsewhere.
  std::function<Status(const void *data, size_t size, void *out, int64_t root)> gather;
  /// `size` bytes at `data` of `root` into `data` on every rank.
  std::function<Status(void *data, size_t size, int64_t root)> broadcast;
  std::function<Status()> barrier;
  /// Optional: the callbacks of the sub-group of `color` (see
  /// Communicator::split). Without it, split fails.
  std::function<Result<CommunicatorCallbacks>(int64_t color, int64_t key)> split;
};

/// A communicator over callbacks. Variable-sized gathers and broadcasts are
/// built from the fixed-size ones (sizes first, then the bytes padded to the
/// largest).
Result<std::unique_ptr<Communicator>> createCallbackCommunicator(CommunicatorCallbacks callbacks);

/// `size` ranks in one process, one communicator each, to be driven from
/// one thread per rank (collectives block until every rank has called).
/// split works within the group.
std::vector<std::unique_ptr<Communicator>> createThreadGroup(int64_t size);

/// MPI_COMM_WORLD (initializing MPI if needed; finalized at exit). Null with
/// an error when the runtime was built without MPI.
Result<std::unique_ptr<Communicator>> createMpiCommunicator(int *argc, char ***argv);

/// True when this process was started by an MPI launcher (mpirun sets
/// OMPI_COMM_WORLD_SIZE / PMI_SIZE).
bool launchedByMpi();

/// What a process uses when nobody hands it a group: MPI_COMM_WORLD under
/// an MPI launcher, a world of one otherwise.
Result<std::unique_ptr<Communicator>> createDefaultCommunicator(int *argc, char ***argv);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_COMMUNICATOR_H
