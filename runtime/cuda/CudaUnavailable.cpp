//===- CudaUnavailable.cpp - The CUDA and NCCL calls in a build without ---===//
//
// Built without CUDA: every CUDA and NCCL call fails with one line naming
// it. Built with CUDA but without NCCL (FSDP_HAVE_CUDA defined): the NCCL
// data plane's stand-in alone.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/CudaBackend.h"
#include "fsdp/Runtime/DataPlane.h"

namespace fsdp {
namespace runtime {

namespace {
#ifndef FSDP_HAVE_CUDA
Error notBuilt(const char *what) {
  return makeError(std::string(what) +
                       ": this build of fsdp-mlir has no CUDA support (configure with the CUDA "
                       "toolkit present and -DFSDP_ENABLE_CUDA=ON)",
                   ErrorKind::InvalidArgument);
}
#endif
} // namespace

#ifndef FSDP_HAVE_CUDA
bool cudaBuilt() { return false; }
Result<int> cudaDeviceCount() { return notBuilt("CUDA"); }
Result<std::shared_ptr<MemoryBackend>> createCudaBackend(int) { return notBuilt("CUDA"); }
std::string cudaDeviceDescription(int) { return "no CUDA in this build"; }
Result<std::unique_ptr<ReplicaDataPlane>> createNcclDataPlane(std::unique_ptr<Communicator>, int) {
  return notBuilt("NCCL");
}
#else
Result<std::unique_ptr<ReplicaDataPlane>> createNcclDataPlane(std::unique_ptr<Communicator>, int) {
  return makeError("NCCL: this build of fsdp-mlir has CUDA but no NCCL (configure with nccl.h "
                   "and libnccl in the CUDA toolkit, NCCL_ROOT or pip's nvidia-nccl-cu13)",
                   ErrorKind::InvalidArgument);
}
#endif

} // namespace runtime
} // namespace fsdp
