//===- fsdp-ckpt.cpp - Command line over the checkpoint runtime -----------===//
//
// One process per rank under mpirun (a process started without mpirun is
// world size 1); the MPI rank is the flat rank of the plan.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Plan/PlanFile.h"
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/Inspect.h"
#include "fsdp/Support/Printable.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <sys/stat.h>

using namespace fsdp;
using namespace fsdp::runtime;

namespace {

struct Context {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Storage> storage;
};

Result<Context> makeContext(int *argc, char ***argv, const std::string &fault,
                            int64_t faultRank) {
  Context context;
  if (launchedByMpi()) {
    Result<std::unique_ptr<Communicator>> comm = createMpiCommunicator(argc, argv);
    if (!comm)
      return comm.failure();
    context.comm = comm.take();
  } else {
    context.comm = createSingleProcessCommunicator();
  }
  context.storage = createPosixStorage();
  if (!fault.empty() && (faultRank < 0 || faultRank == context.comm->rank())) {
    Result<Fault> parsed = parseFault(fault);
    if (!parsed)
      return parsed.failure();
    context.storage = createFaultInjectingStorage(std::move(context.storage), *parsed);
  }
  return context;
}

/// A plan file, or a directory of per-rank plan files (--plan-split-dir).
Result<plan::PlanFile> openPlan(const std::string &path, int64_t rank) {
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode))
    return plan::PlanFile::open(path + "/" + plan::planFileName(rank));
  return plan::PlanFile::open(path);
}

Result<plan::RankPlan> rankPlanFor(const plan::PlanFile &file, Communicator &comm) {
  if (file.worldSize() != comm.size())
    return makeError(file.name() + ": the plan is for " + std::to_string(file.worldSize()) +
                     " ranks but " + std::to_string(comm.size()) +
                         " are running (start one process per rank with mpirun -np " +
                         std::to_string(file.worldSize()) + ")",
                     ErrorKind::InvalidArgument);
  return file.rank(comm.rank());
}

std::string gigabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GB", bytes / 1e9);
  return text;
}

std::function<void(const Progress &)> progressPrinter(const char *what, Communicator &comm) {
  if (comm.rank() != 0)
    return {};
  return [what](const Progress &progress) {
    // Only long runs get progress lines.
    if (progress.seconds < 2.0 && progress.bytesTotal < (256u << 20))
      return;
    std::fprintf(stderr, "%s: rank 0 %s / %s, %.2f GB/s\n", what,
                 gigabytes(progress.bytesDone).c_str(), gigabytes(progress.bytesTotal).c_str(),
                 progress.seconds > 0 ? progress.bytesDone / progress.seconds / 1e9 : 0.0);
  };
}

/// Total bytes over all ranks and the slowest rank's time, on rank 0.
std::pair<uint64_t, double> aggregate(Communicator &comm, const TransferStats &stats) {
  char line[64];
  std::snprintf(line, sizeof(line), "%llu %.9f", static_cast<unsigned long long>(stats.bytes),
                stats.seconds);
  Result<std::vector<std::string>> all = comm.gather(line, 0);
  uint64_t bytes = 0;
  double seconds = 0;
  if (all)
    for (const std::string &entry : *all) {
      unsigned long long b = 0;
      double s = 0;
      if (std::sscanf(entry.c_str(), "%llu %lf", &b, &s) == 2) {
        bytes += b;
        seconds = std::max(seconds, s);
      }
    }
  return {bytes, seconds};
}

/// The source's tensor keys that the plan's metadata does not name.
Status checkNoExtraTensors(const plan::PlanFile &planFile, const std::string &source,
                           Storage &storage) {
  Result<std::string> planned = planFile.metadataBytes();
  if (!planned)
    return planned.failure();
  Result<dcp::Metadata> plannedMetadata = dcp::parseMetadata(*planned);
  if (!plannedMetadata)
    return propagate(plannedMetadata, planFile.name() + ": " + plannedMetadata.error());
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(source, storage);
  if (!reader)
    return reader.failure();
  for (const auto &[key, storageMetadata] : (*reader)->metadata().stateDictMetadata)
    if (!storageMetadata.isBytes && !plannedMetadata->find(key))
      return makeError(source + " holds tensor '" + key +
                           "', which the plan does not name (pass --allow-extra to drop it)",
                       ErrorKind::Incompatible);
  return Status::success();
}

/// Rank 0's status on every rank.
Status agreeOnRoot(Communicator &comm, const Status &rootStatus) {
  Result<std::string> decided =
      comm.broadcast(rootStatus ? "" : std::string(1, char('0' + int(rootStatus.kind()))) +
                                           rootStatus.error(),
                     0);
  if (!decided)
    return decided.failure();
  if (decided->empty())
    return Status::success();
  return makeError(decided->substr(1), static_cast<ErrorKind>((*decided)[0] - '0'));
}

/// One line on stderr, escaped (a message may quote bytes from a file), and
/// the exit code of the error's kind.
int report(const char *command, const std::string &prefix, const Error &error) {
  std::cerr << "fsdp-ckpt " << command << ": " << prefix << printable(error.message) << "\n";
  return errorKindExitCode(error.kind);
}

/// An error every rank agreed on: rank 0 reports it.
int fail(Communicator *comm, const char *command, const Error &error) {
  if (!comm || comm->rank() == 0)
    return report(command, "", error);
  return errorKindExitCode(error.kind);
}

/// An error of this rank alone (before any collective): it reports it.
int failHere(Communicator &comm, const char *command, const Error &error) {
  return report(command,
                comm.size() > 1 ? "rank " + std::to_string(comm.rank()) + ": " : "", error);
}

constexpr const char *kExitCodes =
    "Exit status: 0 success; 1 failed (a --check mismatch, or any other failure);\n"
    "2 invalid argument; 3 not found; 4 corrupt (checksum, truncated, malformed);\n"
    "5 incompatible (key, shape, dtype, region not covered); 6 I/O error;\n"
    "7 busy (another save holds the target).";

} // namespace

int run(int argc, char **argv) {
  CLI::App app{"fsdp-ckpt: save, load, reshard, verify and inspect DCP checkpoints.\n"
               "Run one process per rank under mpirun; without mpirun the world is one rank."};
  app.require_subcommand(1);

  std::string planPath, dir, fromDir, fault;
  int64_t seed = -1, faultRank = -1;
  float step = 1.0f;
  bool overwrite = false, noSync = false, allowExtra = false;
  auto seedCheck = CLI::Range(int64_t(0), int64_t(2147483647));

  CLI::App *save = app.add_subcommand("save", "Fill every rank's buffers from SEED and save them");
  save->add_option("--plan", planPath, "Plan file (or directory of per-rank plans)")->required();
  save->add_option("--dir", dir, "Checkpoint directory to create")->required();
  save->add_option("--fill", seed, "Seed of the deterministic values (DESIGN.md §4.1)")
      ->required()->check(seedCheck);
  save->add_option("--step", step, "Optimizer step count to store");
  save->add_flag("--overwrite", overwrite, "Replace an existing checkpoint atomically");
  save->add_option("--inject-fault", fault,
                   "Testing: OP:N:ERRNO|KILL|PAUSE, e.g. write:3:EIO, sync:2:KILL or write:1:PAUSE");
  save->add_option("--inject-fault-rank", faultRank, "Testing: the one rank to inject into");

  CLI::App *load = app.add_subcommand("load", "Load a checkpoint into the plan's layout");
  load->add_option("--plan", planPath, "Plan file (or directory of per-rank plans)")->required();
  load->add_option("--dir", dir, "Checkpoint directory")->required();
  load->add_option("--check", seed, "Exit 0 only if every loaded element equals SEED's value")
      ->check(seedCheck);
  load->add_flag("--no-sync-model-weights", noSync, "Do not refresh model_weight from main_weight");

  CLI::App *reshard = app.add_subcommand(
      "reshard", "Load any DCP checkpoint into the plan's layout and save it in ours");
  reshard->add_option("--plan", planPath, "Plan file (or directory of per-rank plans)")->required();
  reshard->add_option("--from", fromDir, "Source checkpoint (ours, PyTorch's, Megatron-FSDP's)")
      ->required();
  reshard->add_option("--to", dir, "Destination directory")->required();
  reshard->add_flag("--overwrite", overwrite, "Replace an existing destination atomically");
  reshard->add_flag("--allow-extra", allowExtra,
                    "Accept source tensors the plan does not name (they are dropped)");

  std::string verifyDir;
  CLI::App *verify = app.add_subcommand("verify", "Check every byte of a checkpoint");
  verify->add_option("dir", verifyDir, "Checkpoint directory")->required();

  std::string inspectDir;
  InspectOptions inspectOptions;
  CLI::App *inspect = app.add_subcommand(
      "inspect", "List the keys, shapes, dtypes, chunks and files of a DCP checkpoint");
  inspect->add_option("dir", inspectDir, "Checkpoint directory")->required();
  inspect->add_flag("--json", inspectOptions.json, "Print JSON");

  app.footer(kExitCodes);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp &help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp &help) {
    return app.exit(help);
  } catch (const CLI::ParseError &error) {
    app.exit(error); // prints the problem and the usage hint
    return errorKindExitCode(ErrorKind::InvalidArgument);
  }

  if (inspect->parsed()) {
    std::unique_ptr<Storage> storage = createPosixStorage();
    Status status = inspectCheckpoint(inspectDir, *storage, inspectOptions, std::cout);
    std::cout.flush();
    return status ? 0 : fail(nullptr, "inspect", status.failure());
  }
  if (verify->parsed()) {
    std::unique_ptr<Storage> storage = createPosixStorage();
    std::string problems;
    Status status = verifyCheckpoint(verifyDir, *storage, problems);
    // One line per problem, each escaped, then the verdict.
    for (size_t begin = 0, end; begin < problems.size(); begin = end + 1) {
      end = problems.find('\n', begin);
      if (end == std::string::npos)
        end = problems.size();
      std::cerr << printable(problems.substr(begin, end - begin)) << "\n";
    }
    if (!status)
      return fail(nullptr, "verify", status.failure());
    std::cout << "verified " << printable(verifyDir) << ": every byte is covered and matches\n";
    return 0;
  }

  const char *command = save->parsed() ? "save" : load->parsed() ? "load" : "reshard";
  Result<Context> context = makeContext(&argc, &argv, fault, faultRank);
  if (!context)
    return fail(nullptr, command, context.failure());
  Communicator &comm = *context->comm;
  Storage &storage = *context->storage;
  Result<plan::PlanFile> planFile = openPlan(planPath, comm.rank());
  if (!planFile)
    return failHere(comm, command, planFile.failure());
  Result<plan::RankPlan> rankPlan = rankPlanFor(*planFile, comm);
  if (!rankPlan)
    return failHere(comm, command, rankPlan.failure());
  Result<RankBuffers> buffers = RankBuffers::allocate(*rankPlan);
  if (!buffers)
    return failHere(comm, command, buffers.failure());

  if (save->parsed()) {
    if (Status status = fillFromSeed(*rankPlan, *buffers, static_cast<uint32_t>(seed)); !status)
      return failHere(comm, command, status.failure());
    SaveOptions options;
    options.overwrite = overwrite;
    options.step = step;
    options.progress = progressPrinter("save", comm);
    Result<TransferStats> stats = saveCheckpoint(*planFile, *rankPlan, *buffers, dir, comm, storage,
                                                 options);
    if (!stats)
      return fail(&comm, command, stats.failure());
    auto [bytes, seconds] = aggregate(comm, *stats);
    if (comm.rank() == 0)
      std::printf("saved %s: %s from %lld ranks in %.3f s, %.2f GB/s\n", dir.c_str(),
                  gigabytes(bytes).c_str(), static_cast<long long>(comm.size()), seconds,
                  seconds > 0 ? bytes / seconds / 1e9 : 0.0);
    return 0;
  }

  LoadOptions loadOptions;
  loadOptions.syncModelWeights = !noSync && !reshard->parsed();
  loadOptions.progress = progressPrinter(load->parsed() ? "load" : "reshard", comm);
  if (comm.rank() == 0)
    loadOptions.notice = [command](const std::string &text) {
      std::cerr << "fsdp-ckpt " << command << ": note: " << printable(text) << "\n";
    };
  Result<LoadResult> loaded = loadCheckpoint(*rankPlan, *buffers, load->parsed() ? dir : fromDir,
                                             comm, storage, loadOptions);
  if (!loaded)
    return fail(&comm, command, loaded.failure());

  if (load->parsed()) {
    Status checked = seed >= 0 ? checkAgainstSeed(*rankPlan, *buffers, static_cast<uint32_t>(seed))
                               : Status::success();
    auto [bytes, seconds] = aggregate(comm, loaded->stats);
    // Every rank's verdict: one rank's mismatch fails the load everywhere.
    Result<std::vector<std::string>> verdicts = comm.gather(checked ? "" : checked.error(), 0);
    std::string firstError;
    if (verdicts)
      for (size_t r = 0; r < verdicts->size() && firstError.empty(); ++r)
        if (!(*verdicts)[r].empty())
          firstError = "rank " + std::to_string(r) + ": " + (*verdicts)[r];
    Result<std::string> decided = comm.broadcast(firstError, 0);
    if (!decided)
      return fail(&comm, command, decided.failure());
    if (!decided->empty())
      return fail(&comm, command, makeError("check failed: " + *decided));
    if (comm.rank() == 0)
      std::printf("loaded %s: %s into %lld ranks in %.3f s, %.2f GB/s%s\n", dir.c_str(),
                  gigabytes(bytes).c_str(), static_cast<long long>(comm.size()), seconds,
                  seconds > 0 ? bytes / seconds / 1e9 : 0.0,
                  seed >= 0 ? ", every element checked" : "");
    return 0;
  }

  // reshard: the source's hyper-parameters and step come along.
  SaveOptions options;
  options.overwrite = overwrite;
  options.step = loaded->step.value_or(1.0f);
  options.bytesItems = loaded->bytesItems;
  options.progress = progressPrinter("reshard", comm);
  // Every source tensor must be one the plan names, unless told otherwise.
  Status extras = Status::success();
  if (!allowExtra && comm.rank() == 0)
    extras = checkNoExtraTensors(*planFile, fromDir, storage);
  if (Status agreed = agreeOnRoot(comm, extras); !agreed)
    return fail(&comm, command, agreed.failure());
  Result<TransferStats> stats =
      saveCheckpoint(*planFile, *rankPlan, *buffers, dir, comm, storage, options);
  if (!stats)
    return fail(&comm, command, stats.failure());
  if (comm.rank() == 0)
    std::printf("resharded %s into %s for %lld ranks\n", fromDir.c_str(), dir.c_str(),
                static_cast<long long>(comm.size()));
  return 0;
}

int main(int argc, char **argv) {
  // Whatever escapes (out of memory above all) still ends in one line.
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc &) {
    std::cerr << "fsdp-ckpt: out of memory\n";
  } catch (const std::exception &error) {
    std::cerr << "fsdp-ckpt: internal error: " << printable(error.what()) << "\n";
  }
  return errorKindExitCode(ErrorKind::Internal);
}
