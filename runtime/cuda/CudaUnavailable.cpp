//===- CudaUnavailable.cpp - The CUDA and NCCL calls in a build without ---===//
#include "fsdp/Runtime/CudaBackend.h"
#include "fsdp/Runtime/DataPlane.h"

namespace fsdp {
namespace runtime {

namespace {
Error notBuilt(const char *what) {
  return makeError(std::string(what) + ": this build of fsdp-mlir has no CUDA support",
                   ErrorKind::InvalidArgument);
}
} // namespace

bool cudaBuilt() { return false; }
Result<int> cudaDeviceCount() { return notBuilt("CUDA"); }
Result<std::shared_ptr<MemoryBackend>> createCudaBackend(int) { return notBuilt("CUDA"); }
std::string cudaDeviceDescription(int) { return "no CUDA in this build"; }
Result<std::unique_ptr<ReplicaDataPlane>> createNcclDataPlane(std::unique_ptr<Communicator>, int) {
  return notBuilt("NCCL");
}

} // namespace runtime
} // namespace fsdp
