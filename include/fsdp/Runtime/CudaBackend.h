//===- CudaBackend.h - Buffers in a CUDA device's memory --------*- C++ -*-===//
//
// Device memory of one GPU: allocations zeroed on the device, copies out
// to and in from host memory on a few streams (an event per copy is its
// completion: the future waits on it), host staging page-locked in pieces
// of at most 1 GiB, and kernels for the model_weight cast (f32 to bf16/f16,
// round to nearest even, the host cast's bits) and the test values
// (Values.h), so --fill and --check need no host copy of the buffers.
//
// Declared in every build: without CUDA (FSDP_ENABLE_CUDA off, or no CUDA
// toolkit at configure time) the calls fail with one line naming CUDA.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_CUDABACKEND_H
#define FSDP_RUNTIME_CUDABACKEND_H

#include "fsdp/Runtime/MemoryBackend.h"

#include <string>

namespace fsdp {
namespace runtime {

/// Whether this build has the CUDA backend.
bool cudaBuilt();

/// The number of GPUs the process sees (an error without CUDA, a driver or
/// a GPU: what `--device cuda` reports).
Result<int> cudaDeviceCount();

/// The GPU a rank uses when started several to a node: its local rank
/// (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK, else LOCAL_RANK as torchrun
/// sets it, else 0) modulo the number of GPUs.
int localRankDevice(int deviceCount);

/// A backend for GPU `device`; the device is made current on the calling
/// thread and on every thread the backend runs work on.
Result<std::shared_ptr<MemoryBackend>> createCudaBackend(int device);

/// A line for people: the device's name, memory and PCI bus.
std::string cudaDeviceDescription(int device);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_CUDABACKEND_H
