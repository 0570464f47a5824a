//===- Communicator.h - What the runtime needs from a process group -*- C++ -*-===//
//
// Saves and loads agree on success collectively; the committing rank gathers
// every rank's item checksums. This is all the communication a plan needs:
// the plan itself was computed ahead of time.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_COMMUNICATOR_H
#define FSDP_RUNTIME_COMMUNICATOR_H

#include "fsdp/Support/Result.h"

#include <cstdint>
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
};

/// A process alone: world size 1.
std::unique_ptr<Communicator> createSingleProcessCommunicator();

/// MPI_COMM_WORLD (initializing MPI if needed; finalized at exit). Null with
/// an error when the runtime was built without MPI.
Result<std::unique_ptr<Communicator>> createMpiCommunicator(int *argc, char ***argv);

/// True when this process was started by an MPI launcher (mpirun sets
/// OMPI_COMM_WORLD_SIZE / PMI_SIZE).
bool launchedByMpi();

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_COMMUNICATOR_H
