//===- mpi_subcomm.cpp - The runtime over a caller's MPI sub-communicator -===//
//
// Under mpirun -np 4: the world splits into two halves (as a trainer's data
// parallel groups would), each half wraps its own MPI communicator and
// saves, loads and checks a 2-rank plan in its own directory; the halves
// use different seeds, so a mix-up fails the check. Then each half splits
// again into groups of one, which load their half's checkpoint into a
// 1-rank plan. First, the runtime's collectives must not spin: every rank
// but the first waits half a second for it in a barrier, then in a
// broadcast, and may spend no more than a fifth of that on the CPU.
// usage: mpi_subcomm PLAN2 PLAN1 DIR
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/Checkpointer.h"
#include "fsdp/Runtime/MpiCommunicator.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

using namespace fsdp;
using namespace fsdp::runtime;

namespace {

int fail(int rank, const char *what, const std::string &error) {
  std::fprintf(stderr, "mpi_subcomm: rank %d: %s: %s\n", rank, what, error.c_str());
  return 1;
}

double threadCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

/// The CPU seconds this rank spent in a barrier and a broadcast for which
/// rank 0 comes half a second late each (0 on rank 0).
Result<double> cpuWhileWaiting(Communicator &comm) {
  if (comm.rank() == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  double start = threadCpuSeconds();
  if (Status status = comm.barrier(); !status)
    return status.failure();
  if (comm.rank() == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Result<std::string> sent = comm.broadcast(comm.rank() == 0 ? "late" : "", 0);
  if (!sent)
    return sent.failure();
  if (*sent != "late")
    return makeError("the broadcast delivered '" + *sent + "'");
  return comm.rank() == 0 ? 0.0 : threadCpuSeconds() - start;
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int world = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 4 || size != 4) {
    MPI_Finalize();
    return fail(world, "usage", "mpirun -np 4 mpi_subcomm PLAN2 PLAN1 DIR");
  }
  int half = world / 2;
  MPI_Comm halfComm;
  MPI_Comm_split(MPI_COMM_WORLD, half, world, &halfComm);
  std::string dir = std::string(argv[3]) + "/half" + std::to_string(half);
  uint32_t seed = 100 + half;
  int status = 0;
  {
    Result<std::unique_ptr<Communicator>> everyone = wrapMpiCommunicator(MPI_COMM_WORLD);
    if (!everyone)
      return fail(world, "wrap", everyone.error());
    Result<double> spent = cpuWhileWaiting(**everyone);
    if (!spent)
      return fail(world, "wait", spent.error());
    if (*spent > 0.2)
      return fail(world, "wait",
                  "spent " + std::to_string(*spent) +
                      " s of CPU waiting 1 s for rank 0: the collectives spin");
    std::printf("rank %d: waited for a late rank without spinning\n", world);
  }
  {
    Result<std::unique_ptr<Communicator>> comm = wrapMpiCommunicator(halfComm);
    if (!comm)
      return fail(world, "wrap", comm.error());
    // One communicator for the save, a split of it (groups of one) later.
    Result<std::unique_ptr<Communicator>> single = (*comm)->split((*comm)->rank(), 0);
    if (!single)
      return fail(world, "split", single.error());
    Result<std::unique_ptr<Checkpointer>> saver = Checkpointer::open(argv[1], comm.take());
    if (!saver)
      return fail(world, "open", saver.error());
    Status done = (*saver)->allocate();
    if (done)
      done = (*saver)->fill(seed);
    // MPI_Init gave MPI_THREAD_SINGLE: an async save is refused at once,
    // nothing started, and the synchronous one goes on.
    if (done) {
      Result<std::shared_ptr<PendingSave>> async = (*saver)->saveAsync(dir);
      if (async || async.kind() != ErrorKind::InvalidArgument ||
          async.error().find("MPI_THREAD_MULTIPLE") == std::string::npos)
        done = makeError("an async save over a single-threaded MPI was not refused: " +
                         (async ? std::string("it started") : async.error()));
    }
    if (done) {
      Result<TransferStats> saved = (*saver)->save(dir);
      done = saved ? Status::success() : Status(saved.failure());
    }
    if (done) {
      Result<std::unique_ptr<Checkpointer>> loader = Checkpointer::open(argv[2], single.take());
      done = loader ? (*loader)->allocate() : Status(loader.failure());
      if (done) {
        Result<LoadResult> loaded = (*loader)->load(dir);
        done = loaded ? (*loader)->check(seed) : Status(loaded.failure());
      }
    }
    if (!done)
      status = fail(world, "save and reload", done.error());
    else
      std::printf("rank %d: half %d saved on 2 ranks and reloaded on 1, every element checked\n",
                  world, half);
  }
  MPI_Comm_free(&halfComm);
  MPI_Finalize();
  return status;
}
