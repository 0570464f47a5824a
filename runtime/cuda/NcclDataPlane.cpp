//===- NcclDataPlane.cpp - A replica group's bytes over NCCL --------------===//
//
// Bootstrapped through the group's Communicator: member 0 makes the unique
// id and broadcasts it, every member joins the NCCL communicator on its
// GPU. A broadcast of device memory is one NCCL group of in-place
// ncclBroadcast calls on the plane's own stream, waited for (with NCCL's
// asynchronous errors polled, so that a failed peer is an error, not a
// hang). Host memory goes over the Communicator instead.
//
// libnccl.so.2 is loaded when the first data plane is made (dlopen: the
// loader's path, then the library found at configure time), so binaries
// start, and use the CUDA backend, on machines without NCCL.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/CudaBackend.h"
#include "fsdp/Runtime/DataPlane.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <dlfcn.h>
#include <mutex>
#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>

#ifndef FSDP_NCCL_LIBRARY_PATH
#define FSDP_NCCL_LIBRARY_PATH ""
#endif

namespace fsdp {
namespace runtime {

namespace {

/// The NCCL calls this plane makes, from libnccl.so.2 loaded at run time.
struct Nccl {
  decltype(&::ncclGetErrorString) getErrorString = nullptr;
  decltype(&::ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&::ncclCommInitRank) commInitRank = nullptr;
  decltype(&::ncclCommDestroy) commDestroy = nullptr;
  decltype(&::ncclCommAbort) commAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) commGetAsyncError = nullptr;
  decltype(&::ncclGroupStart) groupStart = nullptr;
  decltype(&::ncclGroupEnd) groupEnd = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  std::string error; // why it is not loaded
};

const Nccl &nccl() {
  static Nccl loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    void *library = nullptr;
    std::string tried;
    for (const char *name : {"libnccl.so.2", FSDP_NCCL_LIBRARY_PATH}) {
      if (!*name)
        continue;
      library = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (library)
        break;
      const char *why = ::dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (why ? why : name);
    }
    if (!library) {
      loaded.error = "NCCL: cannot load libnccl.so.2 (" + tried + ")";
      return;
    }
    bool all = true;
    auto find = [&](auto &function, const char *symbol) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(
          ::dlsym(library, symbol));
      if (!function && all) {
        all = false;
        loaded.error = std::string("NCCL: libnccl.so.2 has no ") + symbol;
      }
    };
    find(loaded.getErrorString, "ncclGetErrorString");
    find(loaded.getUniqueId, "ncclGetUniqueId");
    find(loaded.commInitRank, "ncclCommInitRank");
    find(loaded.commDestroy, "ncclCommDestroy");
    find(loaded.commAbort, "ncclCommAbort");
    find(loaded.commGetAsyncError, "ncclCommGetAsyncError");
    find(loaded.groupStart, "ncclGroupStart");
    find(loaded.groupEnd, "ncclGroupEnd");
    find(loaded.broadcast, "ncclBroadcast");
    if (!all)
      loaded.getErrorString = nullptr; // marks the whole table unusable
  });
  return loaded;
}

Error ncclFailure(ncclResult_t code, const std::string &what, int device) {
  return makeError("NCCL " + what + " on device " + std::to_string(device) + ": " +
                       nccl().getErrorString(code),
                   code == ncclInvalidArgument || code == ncclInvalidUsage
                       ? ErrorKind::InvalidArgument
                       : ErrorKind::Internal);
}

Error cudaFailureHere(cudaError_t code, const std::string &what, int device) {
  (void)cudaGetLastError();
  return makeError("CUDA " + what + " on device " + std::to_string(device) + ": " +
                       cudaGetErrorString(code) + " (" + cudaGetErrorName(code) + ")",
                   code == cudaErrorMemoryAllocation ? ErrorKind::IO : ErrorKind::Internal);
}

class NcclDataPlane : public ReplicaDataPlane {
public:
  NcclDataPlane(std::unique_ptr<Communicator> group, int device, ncclComm_t comm,
                cudaStream_t stream)
      : group_(std::move(group)), device_(device), comm_(comm), stream_(stream) {}
  ~NcclDataPlane() override {
    if (cudaSetDevice(device_) != cudaSuccess)
      return;
    if (comm_)
      (void)nccl().commDestroy(comm_);
    if (stream_)
      (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  Communicator &group() override { return *group_; }
  const char *name() const override { return "nccl"; }

  Status broadcast(const std::vector<Transfer> &transfers, MemoryBackend &backend) override {
    if (backend.kind() != MemoryKind::Device) {
      for (const Transfer &transfer : transfers)
        if (Status status = group_->broadcastInPlace(transfer.data, transfer.bytes, transfer.root);
            !status)
          return status;
      return Status::success();
    }
    if (!comm_)
      return makeError("NCCL: the communicator was aborted after an earlier failure",
                       ErrorKind::Internal);
    cudaError_t cuda = cudaSetDevice(device_);
    if (cuda != cudaSuccess)
      return cudaFailureHere(cuda, "cudaSetDevice", device_);
    ncclResult_t code = nccl().groupStart();
    if (code != ncclSuccess)
      return ncclFailure(code, "ncclGroupStart", device_);
    Status issued;
    for (const Transfer &transfer : transfers) {
      if (!transfer.bytes)
        continue;
      if (transfer.root < 0 || transfer.root >= group_->size()) {
        issued = makeError("NCCL broadcast: root " + std::to_string(transfer.root) +
                               " is not a member of a group of " + std::to_string(group_->size()),
                           ErrorKind::InvalidArgument);
        break;
      }
      // In place: the root's buffer is both send and receive buffer.
      code = nccl().broadcast(transfer.data, transfer.data, static_cast<size_t>(transfer.bytes),
                           ncclUint8, static_cast<int>(transfer.root), comm_, stream_);
      if (code != ncclSuccess) {
        issued = ncclFailure(code,
                             "ncclBroadcast of " + std::to_string(transfer.bytes) +
                                 " bytes from member " + std::to_string(transfer.root),
                             device_);
        break;
      }
    }
    code = nccl().groupEnd();
    if (!issued)
      return issued;
    if (code != ncclSuccess)
      return ncclFailure(code, "ncclGroupEnd (a group of broadcasts)", device_);
    return wait("broadcast");
  }

  /// Waits for the stream, polling NCCL's asynchronous errors: a failed
  /// peer aborts the communicator and is an error, not a hang.
  Status wait(const char *what) {
    auto pause = std::chrono::microseconds(20);
    while (true) {
      cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess)
        return Status::success();
      if (state != cudaErrorNotReady)
        return cudaFailureHere(state, std::string("NCCL ") + what + " (the stream)", device_);
      ncclResult_t async = ncclSuccess;
      ncclResult_t code = nccl().commGetAsyncError(comm_, &async);
      if (code == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
        (void)nccl().commAbort(comm_);
        comm_ = nullptr;
        return ncclFailure(async, std::string(what) + " (asynchronous error; communicator aborted)",
                           device_);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

private:
  std::unique_ptr<Communicator> group_;
  int device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
};

} // namespace

Result<std::unique_ptr<ReplicaDataPlane>> createNcclDataPlane(std::unique_ptr<Communicator> group,
                                                              int device) {
  if (!group)
    return makeError("NCCL: no replica group", ErrorKind::InvalidArgument);
  int64_t rank = group->rank(), size = group->size();
  // The members agree first that each has NCCL (a member without it would
  // leave the others waiting in ncclCommInitRank), then member 0 makes the
  // id and every member gets it: an empty id when anything failed.
  const Nccl &library = nccl();
  bool usable = library.getErrorString != nullptr;
  Result<std::vector<std::string>> ready = group->gather(usable ? "1" : "0", 0);
  if (!ready)
    return makeError("NCCL: agreeing on NCCL: " + ready.error(), ready.kind());
  std::string id;
  Error made;
  bool failed = false;
  if (rank == 0) {
    int64_t without = -1;
    for (size_t member = 0; member < ready->size(); ++member)
      if ((*ready)[member] != "1" && without < 0)
        without = static_cast<int64_t>(member);
    cudaError_t cuda = cudaSuccess;
    ncclResult_t code = ncclSuccess;
    ncclUniqueId unique;
    if (without < 0 && (cuda = cudaSetDevice(device)) == cudaSuccess)
      code = library.getUniqueId(&unique);
    failed = true;
    if (without > 0)
      made = makeError("NCCL: member " + std::to_string(without) +
                           " of the replica group cannot load NCCL",
                       ErrorKind::InvalidArgument);
    else if (without == 0)
      made = makeError(library.error, ErrorKind::InvalidArgument);
    else if (cuda != cudaSuccess)
      made = cudaFailureHere(cuda, "cudaSetDevice", device);
    else if (code != ncclSuccess)
      made = ncclFailure(code, "ncclGetUniqueId", device);
    else {
      failed = false;
      id.assign(unique.internal, sizeof unique.internal);
    }
  }
  Result<std::string> shared = group->broadcast(id, 0);
  if (!shared)
    return makeError("NCCL: sharing the unique id: " + shared.error(), shared.kind());
  if (failed)
    return made;
  if (!usable)
    return makeError(library.error, ErrorKind::InvalidArgument);
  if (shared->size() != sizeof(ncclUniqueId))
    return makeError("NCCL: member 0 of the replica group could not create the NCCL unique id "
                     "(or a member cannot load NCCL)",
                     ErrorKind::Internal);
  ncclUniqueId unique;
  std::memcpy(unique.internal, shared->data(), sizeof unique.internal);

  cudaError_t cuda = cudaSetDevice(device);
  if (cuda != cudaSuccess)
    return cudaFailureHere(cuda, "cudaSetDevice", device);
  cudaStream_t stream = nullptr;
  cuda = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (cuda != cudaSuccess)
    return cudaFailureHere(cuda, "cudaStreamCreateWithFlags", device);
  ncclComm_t comm = nullptr;
  ncclResult_t code =
      nccl().commInitRank(&comm, static_cast<int>(size), unique, static_cast<int>(rank));
  if (code != ncclSuccess) {
    (void)cudaStreamDestroy(stream);
    return ncclFailure(code,
                       "ncclCommInitRank (member " + std::to_string(rank) + " of " +
                           std::to_string(size) + ")",
                       device);
  }
  return std::unique_ptr<ReplicaDataPlane>(
      new NcclDataPlane(std::move(group), device, comm, stream));
}

} // namespace runtime
} // namespace fsdp
