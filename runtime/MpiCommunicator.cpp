//===- MpiCommunicator.cpp - MPI communicators ----------------------------===//
#include "fsdp/Runtime/Communicator.h"

#ifdef FSDP_HAVE_MPI
#include "fsdp/Runtime/MpiCommunicator.h"
#endif

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <thread>

namespace fsdp {
namespace runtime {

#ifdef FSDP_HAVE_MPI
namespace {

Status mpiCheck(int code, const char *what) {
  if (code == MPI_SUCCESS)
    return Status::success();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return makeError(std::string(what) + " failed: " + std::string(text, length));
}

/// Waits for a collective started with `request` without spinning: MPI's
/// blocking calls poll at full speed, so a rank waiting for a slower one
/// (still writing its file, say), or an async save's background thread
/// waiting beside training, would take a core from the work it waits for.
/// Tests back off from 10 us to 1 ms: a save or a load runs a handful of
/// these, so the latency added is at most a few milliseconds. Bulk data
/// (broadcastInPlace) keeps MPI's own waiting, which drives its transfers.
Status waitWithoutSpinning(MPI_Request &request, const char *what) {
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    int done = 0;
    if (Status s = mpiCheck(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what); !s)
      return s;
    if (done)
      return Status::success();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

/// Starts a collective by `start(request)` and waits for it without spinning.
template <typename Start> Status collective(const char *what, Start start) {
  MPI_Request request = MPI_REQUEST_NULL;
  if (Status s = mpiCheck(start(&request), what); !s)
    return s;
  return waitWithoutSpinning(request, what);
}

/// True when MPI was initialized here (and is the runtime's alone).
bool initializedByRuntime = false;

class MpiCommunicator : public Communicator {
public:
  /// Over `comm`; frees it when destroyed if `owned` (made by split).
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm_, &rank);
    MPI_Comm_size(comm_, &size);
    rank_ = rank;
    size_ = size;
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized)
      MPI_Comm_free(&comm_);
  }
  Result<std::unique_ptr<Communicator>> split(int64_t color, int64_t key) override {
    if (color < 0 || color > INT32_MAX || key < INT32_MIN || key > INT32_MAX)
      return makeError("MPI_Comm_split: color and key must fit an int (color >= 0)",
                       ErrorKind::InvalidArgument);
    MPI_Comm child;
    if (Status s =
            mpiCheck(MPI_Comm_split(comm_, static_cast<int>(color), static_cast<int>(key), &child),
                     "MPI_Comm_split");
        !s)
      return s.failure();
    MPI_Comm_set_errhandler(child, MPI_ERRORS_RETURN);
    return std::unique_ptr<Communicator>(new MpiCommunicator(child, /*owned=*/true));
  }
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  bool usableFromAnotherThread() const override {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    // SERIALIZED suffices when the runtime initialized MPI: nothing else in
    // the process calls it, and the checkpointer never runs two collectives
    // at once. A caller's MPI may be in use on the caller's thread.
    return provided == MPI_THREAD_MULTIPLE ||
           (provided == MPI_THREAD_SERIALIZED && initializedByRuntime);
  }
  Status barrier() override {
    return collective("MPI_Ibarrier", [&](MPI_Request *r) { return MPI_Ibarrier(comm_, r); });
  }

  Result<std::vector<std::string>> gather(const std::string &bytes, int64_t root) override {
    // Sizes first (as 64-bit counts), then the bytes in chunks that fit int.
    long long mine = static_cast<long long>(bytes.size());
    std::vector<long long> sizes(rank_ == root ? size_ : 0);
    if (Status s = collective("MPI_Igather",
                              [&](MPI_Request *r) {
                                return MPI_Igather(&mine, 1, MPI_LONG_LONG, sizes.data(), 1,
                                                   MPI_LONG_LONG, static_cast<int>(root), comm_, r);
                              });
        !s)
      return s.failure();
    std::vector<int> counts, displs;
    std::string all;
    if (rank_ == root) {
      long long total = 0;
      for (long long size : sizes) {
        counts.push_back(static_cast<int>(size));
        displs.push_back(static_cast<int>(total));
        total += size;
      }
      if (total > (1ll << 31) - 1)
        return makeError("gather of " + std::to_string(total) + " bytes exceeds MPI's int counts");
      all.resize(static_cast<size_t>(total));
    }
    if (Status s = collective("MPI_Igatherv",
                              [&](MPI_Request *r) {
                                return MPI_Igatherv(bytes.data(), static_cast<int>(mine), MPI_BYTE,
                                                    all.data(), counts.data(), displs.data(),
                                                    MPI_BYTE, static_cast<int>(root), comm_, r);
                              });
        !s)
      return s.failure();
    std::vector<std::string> out;
    if (rank_ == root)
      for (int64_t r = 0; r < size_; ++r)
        out.push_back(all.substr(displs[r], counts[r]));
    return out;
  }

  Result<std::string> broadcast(const std::string &bytes, int64_t root) override {
    long long length = static_cast<long long>(bytes.size());
    if (Status s = collective("MPI_Ibcast",
                              [&](MPI_Request *r) {
                                return MPI_Ibcast(&length, 1, MPI_LONG_LONG, static_cast<int>(root),
                                                  comm_, r);
                              });
        !s)
      return s.failure();
    std::string out = rank_ == root ? bytes : std::string(static_cast<size_t>(length), '\0');
    if (Status s = collective("MPI_Ibcast",
                              [&](MPI_Request *r) {
                                return MPI_Ibcast(out.data(), static_cast<int>(length), MPI_BYTE,
                                                  static_cast<int>(root), comm_, r);
                              });
        !s)
      return s.failure();
    return out;
  }

  Status broadcastInPlace(void *data, uint64_t size, int64_t root) override {
    // MPI counts are ints: pieces of at most 1 GiB.
    constexpr uint64_t kPiece = uint64_t(1) << 30;
    for (uint64_t at = 0; at < size; at += kPiece)
      if (Status s = mpiCheck(MPI_Bcast(static_cast<char *>(data) + at,
                                        static_cast<int>(std::min(kPiece, size - at)), MPI_BYTE,
                                        static_cast<int>(root), comm_),
                              "MPI_Bcast");
          !s)
        return s;
    return Status::success();
  }

private:
  MPI_Comm comm_;
  bool owned_;
  int64_t rank_ = 0, size_ = 1;
};

void finalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized)
    MPI_Finalize();
}

} // namespace

Result<std::unique_ptr<Communicator>> createMpiCommunicator(int *argc, char ***argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // An async save's collectives run on its background thread, one at a
    // time. (SERIALIZED, not MULTIPLE: Open MPI 4.1 in MULTIPLE mode now
    // and then ends a process "improperly" after MPI_Finalize.)
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      return makeError("MPI_Init_thread failed");
    initializedByRuntime = true;
    std::atexit(finalizeAtExit);
  }
  // Errors come back as codes we turn into messages, not aborts.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(MPI_COMM_WORLD, /*owned=*/false));
}

Result<std::unique_ptr<Communicator>> wrapMpiCommunicator(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || comm == MPI_COMM_NULL)
    return makeError("wrapMpiCommunicator: MPI is not initialized or the communicator is null",
                     ErrorKind::InvalidArgument);
  // The caller's handler stays; a duplicate carries ours (and keeps our
  // messages off the caller's tags).
  MPI_Comm own;
  if (Status s = mpiCheck(MPI_Comm_dup(comm, &own), "MPI_Comm_dup"); !s)
    return s.failure();
  MPI_Comm_set_errhandler(own, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(own, /*owned=*/true));
}
#else
Result<std::unique_ptr<Communicator>> createMpiCommunicator(int *, char ***) {
  return makeError("this build of the runtime has no MPI support");
}
#endif

} // namespace runtime
} // namespace fsdp
