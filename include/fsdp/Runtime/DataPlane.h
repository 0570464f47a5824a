//===- DataPlane.h - Bulk bytes between the members of a replica group -*- C++ -*-===//
//
// Ranks whose plans read exactly the same pieces into the same buffer
// ranges (the replicas of an HSDP mesh, any mesh with replicate axes) form
// a replica group. A load then reads each saved byte from storage once per
// group: the members split the reads and broadcast what each read to the
// others over a data plane. The control plane (Communicator) agrees and
// exchanges small strings; a data plane moves the loaded bytes:
//   - over the group's Communicator (MPI_Bcast on host memory; device
//     memory staged through the host): CPU ranks, and the tests;
//   - over NCCL on device memory (built with CUDA and NCCL), bootstrapped
//     through the group's Communicator (the unique id broadcast).
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_DATAPLANE_H
#define FSDP_RUNTIME_DATAPLANE_H

#include "fsdp/Plan/CheckpointPlan.h"
#include "fsdp/Runtime/Communicator.h"
#include "fsdp/Runtime/MemoryBackend.h"

#include <functional>
#include <memory>
#include <vector>

namespace fsdp {
namespace runtime {

class ReplicaDataPlane {
public:
  virtual ~ReplicaDataPlane() = default;
  /// The replica group (its control plane): rank() and size() are the
  /// member's place in it.
  virtual Communicator &group() = 0;
  /// "communicator" or "nccl", for reports.
  virtual const char *name() const = 0;

  struct Transfer {
    void *data = nullptr; // memory of the buffers' backend
    uint64_t bytes = 0;
    int64_t root = 0; // the member whose bytes every other member gets
  };
  /// Runs every transfer; collective over the group, with the same list
  /// (sizes and roots) on every member. `backend` owns the memory.
  virtual Status broadcast(const std::vector<Transfer> &transfers, MemoryBackend &backend) = 0;
};

/// A 128-bit digest of what `plan` loads: its buffer reads (key, chunk box,
/// dtype, buffer range). Ranks with equal digests load the same bytes.
std::string replicaDigest(const plan::RankPlan &plan);

/// Collective over `comm`: the group of ranks whose replicaDigest equals
/// this rank's, ranked as in `comm` (`root` gathers the digests and hands
/// out the groups). Null on every rank when no two ranks load the same
/// bytes, unless `evenAlone` (then each rank is a group of one).
Result<std::unique_ptr<Communicator>> splitReplicaGroup(const plan::RankPlan &plan,
                                                        Communicator &comm, int64_t root,
                                                        bool evenAlone = false);

/// The data plane over the group's own communicator.
std::unique_ptr<ReplicaDataPlane> createCommunicatorDataPlane(std::unique_ptr<Communicator> group,
                                                              uint64_t stagingBytes = 64 << 20);

/// Whether this build has the NCCL data plane.
bool ncclBuilt();

/// NCCL over the GPU `device` (the backend's). Without NCCL in the build,
/// an error naming it.
Result<std::unique_ptr<ReplicaDataPlane>> createNcclDataPlane(std::unique_ptr<Communicator> group,
                                                              int device);

/// What a checkpointer uses to make a data plane from a replica group.
using DataPlaneFactory =
    std::function<Result<std::unique_ptr<ReplicaDataPlane>>(std::unique_ptr<Communicator>)>;

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_DATAPLANE_H
