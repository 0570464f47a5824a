//===- MpiCommunicator.cpp - MPI_COMM_WORLD as a Communicator -------------===//
#include "fsdp/Runtime/Communicator.h"

#ifdef FSDP_HAVE_MPI
// The C API only: the deprecated C++ bindings need their own library.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include <cstdlib>

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

class MpiCommunicator : public Communicator {
public:
  MpiCommunicator() {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rank_ = rank;
    size_ = size;
  }
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  Status barrier() override { return mpiCheck(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  Result<std::vector<std::string>> gather(const std::string &bytes, int64_t root) override {
    // Sizes first (as 64-bit counts), then the bytes in chunks that fit int.
    long long mine = static_cast<long long>(bytes.size());
    std::vector<long long> sizes(rank_ == root ? size_ : 0);
    if (Status s = mpiCheck(MPI_Gather(&mine, 1, MPI_LONG_LONG, sizes.data(), 1, MPI_LONG_LONG,
                                       static_cast<int>(root), MPI_COMM_WORLD),
                            "MPI_Gather");
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
    if (Status s = mpiCheck(MPI_Gatherv(bytes.data(), static_cast<int>(mine), MPI_BYTE,
                                        all.data(), counts.data(), displs.data(), MPI_BYTE,
                                        static_cast<int>(root), MPI_COMM_WORLD),
                            "MPI_Gatherv");
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
    if (Status s = mpiCheck(MPI_Bcast(&length, 1, MPI_LONG_LONG, static_cast<int>(root),
                                      MPI_COMM_WORLD),
                            "MPI_Bcast");
        !s)
      return s.failure();
    std::string out = rank_ == root ? bytes : std::string(static_cast<size_t>(length), '\0');
    if (Status s = mpiCheck(MPI_Bcast(out.data(), static_cast<int>(length), MPI_BYTE,
                                      static_cast<int>(root), MPI_COMM_WORLD),
                            "MPI_Bcast");
        !s)
      return s.failure();
    return out;
  }

private:
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
    if (MPI_Init(argc, argv) != MPI_SUCCESS)
      return makeError("MPI_Init failed");
    std::atexit(finalizeAtExit);
  }
  // Errors come back as codes we turn into messages, not aborts.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator());
}
#else
Result<std::unique_ptr<Communicator>> createMpiCommunicator(int *, char ***) {
  return makeError("this build of the runtime has no MPI support");
}
#endif

} // namespace runtime
} // namespace fsdp
