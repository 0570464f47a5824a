//===- fsdp-ckpt.cpp - Command line over the checkpoint runtime -----------===//
//
// One process per rank under mpirun (a process started without mpirun is
// world size 1); the MPI rank is the flat rank of the plan.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Plan/PlanFile.h"
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/Checkpointer.h"
#include "fsdp/Runtime/CudaBackend.h"
#include "fsdp/Runtime/Export.h"
#include "fsdp/Runtime/Inspect.h"
#include "fsdp/Runtime/JobRoot.h"
#include "fsdp/Runtime/Protocol.h"
#include "fsdp/Support/Printable.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sys/stat.h>
#include <unistd.h>

using namespace fsdp;
using namespace fsdp::runtime;

namespace {

/// POSIX storage, with a fault injected for the tests when asked.
Result<std::unique_ptr<Storage>> makeStorage(const std::string &fault, int64_t faultRank,
                                             int64_t rank) {
  std::unique_ptr<Storage> storage = createPosixStorage();
  if (fault.empty() || (faultRank >= 0 && faultRank != rank))
    return storage;
  Result<Fault> parsed = parseFault(fault);
  if (!parsed)
    return propagate(parsed, parsed.error());
  return createFaultInjectingStorage(std::move(storage), *parsed);
}

std::string gigabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GB", bytes / 1e9);
  return text;
}

ProgressCallback progressPrinter(const char *what, bool speaks) {
  if (!speaks)
    return {};
  return [what](const Progress &progress) {
    // Only long runs get progress lines.
    if (progress.seconds < 2.0 && progress.bytesTotal < (256u << 20))
      return true;
    std::fprintf(stderr, "%s: %s / %s, %.2f GB/s\n", what, gigabytes(progress.bytesDone).c_str(),
                 gigabytes(progress.bytesTotal).c_str(),
                 progress.seconds > 0 ? progress.bytesDone / progress.seconds / 1e9 : 0.0);
    return true;
  };
}

/// Every rank's statistics gathered on `reporter`, which prints "<what>:
/// <total> <preposition> N ranks in <slowest> s, <rate>" (and, for an async
/// save, "stall S s, total T s" of the slowest ranks) and writes
/// --stats-json; the status of writing the file.
Status reportStats(Checkpointer &checkpointer, const TransferStats &stats, int64_t reporter,
                   const std::string &op, const std::string &what, const char *preposition,
                   const std::string &statsPath, const char *suffix = "", bool printStall = false) {
  Result<std::vector<TransferStats>> all = gatherStats(checkpointer.comm(), stats, reporter);
  if (!all)
    return all.failure();
  if (checkpointer.rank() != reporter)
    return Status::success();
  uint64_t bytes = 0;
  double seconds = 0, stall = 0;
  for (const TransferStats &rank : *all) {
    bytes += rank.bytes;
    seconds = std::max(seconds, rank.seconds);
    stall = std::max(stall, rank.stallSeconds);
  }
  std::printf("%s: %s %s %lld ranks in %.3f s, %.2f GB/s%s\n", what.c_str(),
              gigabytes(static_cast<double>(bytes)).c_str(), preposition,
              static_cast<long long>(all->size()), seconds,
              seconds > 0 ? bytes / seconds / 1e9 : 0.0, suffix);
  if (printStall)
    std::printf("stall %.3f s, total %.3f s\n", stall, seconds);
  if (statsPath.empty())
    return Status::success();
  std::ofstream out(statsPath);
  out << statsJson(op, *all);
  out.close();
  if (!out)
    return makeError(statsPath + ": cannot write the statistics", ErrorKind::IO);
  return Status::success();
}

/// Writes `line` to stderr in one write(2): ranks under mpirun share the
/// stream, and pieces written separately interleave with other ranks'.
void writeErrorLine(const std::string &line) {
  for (size_t done = 0; done < line.size();) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    done += static_cast<size_t>(n);
  }
}

/// One line on stderr, escaped (a message may quote bytes from a file), and
/// the exit code of the error's kind.
int report(const char *command, const std::string &prefix, const Error &error) {
  writeErrorLine("fsdp-ckpt " + std::string(command) + ": " + prefix +
                 printable(error.message) + "\n");
  return errorKindExitCode(error.kind);
}

/// An error every rank agreed on: the deciding rank reports it, every rank
/// exits with its code.
int fail(Checkpointer *checkpointer, const char *command, const Error &error) {
  if (!checkpointer || checkpointer->rank() == checkpointer->root())
    return report(command, "", error);
  return errorKindExitCode(error.kind);
}

/// An error of this rank alone (before any collective): it reports it.
int failHere(int64_t rank, int64_t size, const char *command, const Error &error) {
  return report(command, size > 1 ? "rank " + std::to_string(rank) + ": " : "", error);
}

/// --threads, --staging-mb (two staging blocks per thread) and --write-depth.
SaveOptions saveOptions(unsigned threads, uint64_t stagingMb, bool bufferedIO,
                        unsigned writeDepth) {
  SaveOptions options;
  options.threads = threads;
  options.writeDepth = writeDepth;
  options.stagingBytes = stagingMb << 20;
  options.directIO = !bufferedIO;
  return options;
}

/// --device and --replica-plane: the memory backend, and how replicas
/// share a load's reads. A GPU that is not there is an error, never host
/// memory instead.
Status useDevice(Checkpointer &checkpointer, const std::string &device,
                 const std::string &replicaPlane) {
  int gpu = -1;
  if (device == "cuda") {
    Result<int> count = cudaDeviceCount();
    if (!count)
      return propagate(count, "--device cuda: " + count.error());
    gpu = localRankDevice(*count);
    Result<std::shared_ptr<MemoryBackend>> backend = createCudaBackend(gpu);
    if (!backend)
      return propagate(backend, "--device cuda: " + backend.error());
    checkpointer.useMemoryBackend(backend.take());
  } else if (device == "simulated") {
    checkpointer.useMemoryBackend(createSimulatedDeviceBackend());
  }
  bool nccl = replicaPlane == "nccl" || (replicaPlane == "auto" && gpu >= 0 && ncclBuilt());
  if (replicaPlane == "none")
    checkpointer.shareReplicaReads(false);
  else if (nccl && gpu < 0)
    return makeError("--replica-plane nccl needs --device cuda", ErrorKind::InvalidArgument);
  else if (nccl)
    checkpointer.useDataPlane(
        [gpu](std::unique_ptr<Communicator> group) {
          return createNcclDataPlane(std::move(group), gpu);
        },
        /*evenAlone=*/replicaPlane == "nccl");
  else if (replicaPlane == "communicator")
    checkpointer.useDataPlane(nullptr, /*evenAlone=*/true);
  return Status::success();
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
  int64_t seed = -1, faultRank = -1, scribbleSeed = -1;
  float step = 1.0f;
  bool overwrite = false, noSync = false, allowExtra = false, async = false;
  auto seedCheck = CLI::Range(int64_t(0), int64_t(2147483647));

  CLI::App *save = app.add_subcommand("save", "Fill every rank's buffers from SEED and save them");
  save->add_option("--plan", planPath, "Plan file (or directory of per-rank plans)")->required();
  save->add_option("--dir", dir, "Checkpoint directory to create")->required();
  save->add_option("--fill", seed, "Seed of the deterministic values (docs/TestValues.md)")
      ->required()
      ->check(seedCheck);
  save->add_option("--step", step, "Optimizer step count to store");
  bool modelOnly = false, noReserve = false;
  save->add_flag("--no-reserve", noReserve,
                 "Testing: do not reserve the data files' blocks before writing");
  save->add_flag("--model-only", modelOnly,
                 "Save the model's weights alone (no optimizer state: load it with --only model "
                 "or --exclude optimizer)");
  save->add_flag("--overwrite", overwrite, "Replace an existing checkpoint atomically");
  save->add_flag("--async", async,
                 "Return to training once every byte is copied to host memory, write in the "
                 "background, and print \"stall S s, total T s\"");
  unsigned repeat = 1;
  save->add_option("--repeat", repeat,
                   "Save N times in this process, each after the first over the last (a "
                   "training job's later saves: nothing left to reserve or warm up); one report "
                   "per save")
      ->check(CLI::Range(1u, 1000u));
  save->add_option("--scribble-after-return", scribbleSeed,
                   "Testing: with --async, fill the buffers from SEED as soon as the save "
                   "returns (the checkpoint must hold --fill's values)")
      ->check(seedCheck);
  std::string statsPath;
  const char *statsHelp = "Write every rank's statistics to FILE as JSON (one writer)";
  save->add_option("--stats-json", statsPath, statsHelp);
  save->add_option(
      "--inject-fault", fault,
      "Testing: OP:N:ERRNO|KILL|PAUSE, e.g. write:3:EIO, sync:2:KILL or write:1:PAUSE");
  save->add_option("--inject-fault-rank", faultRank, "Testing: the one rank to inject into");

  std::string hfDir;
  std::vector<std::string> keyMap;
  KeySelection keys;
  const char *hfHelp = "A Hugging Face model directory (model.safetensors, or the shards "
                       "model.safetensors.index.json names): its weights, optimizer state zeroed, "
                       "step 0";
  const char *keyMapHelp = "With --from-hf: OLD=NEW renames a file's tensors whose names start "
                           "with OLD (model.= drops a model. prefix); the first rule that "
                           "matches wins";
  CLI::App *load = app.add_subcommand("load", "Load a checkpoint into the plan's layout");
  load->add_option("--plan", planPath, "Plan file (or directory of per-rank plans)")->required();
  CLI::Option *loadDir = load->add_option("--dir", dir, "Checkpoint directory");
  CLI::Option *loadHf = load->add_option("--from-hf", hfDir, hfHelp)->excludes(loadDir);
  load->add_option("--key-map", keyMap, keyMapHelp)->needs(loadHf);
  load->add_option("--only", keys.only,
                   "Load only keys under this prefix (repeatable): model. loads the weights "
                   "alone")
      ->excludes(loadHf);
  load->add_option("--exclude", keys.exclude,
                   "Leave keys under this prefix as they are (repeatable): optimizer")
      ->excludes(loadHf);
  load->add_option("--check", seed,
                   "Exit 0 only if every loaded element equals SEED's value (with --from-hf: "
                   "the model's)")
      ->check(seedCheck);
  load->add_flag("--no-sync-model-weights", noSync, "Do not refresh model_weight from main_weight");
  load->add_option("--stats-json", statsPath, statsHelp);

  CLI::App *reshard = app.add_subcommand(
      "reshard", "Load any DCP checkpoint into the plan's layout and save it in ours");
  reshard->add_option("--plan", planPath, "Plan file (or directory of per-rank plans)")->required();
  CLI::Option *reshardFrom =
      reshard->add_option("--from", fromDir, "Source checkpoint (ours, PyTorch's, Megatron-FSDP's)");
  CLI::Option *reshardHf = reshard->add_option("--from-hf", hfDir, hfHelp)->excludes(reshardFrom);
  reshard->add_option("--key-map", keyMap, keyMapHelp)->needs(reshardHf);
  reshard->add_option("--to", dir, "Destination directory")->required();
  reshard->add_flag("--overwrite", overwrite, "Replace an existing destination atomically");
  reshard->add_option("--stats-json", statsPath, statsHelp);
  reshard->add_flag("--allow-extra", allowExtra,
                    "Accept source tensors the plan does not name that are too large or too "
                    "chunked to carry (they are dropped; smaller ones are carried)");
  std::vector<std::string> dropPrefixes;
  reshard->add_option("--drop", dropPrefixes,
                      "Leave the source's keys under this prefix out (repeatable; plain "
                      "prefixes): by default every item of the source the plan does not name "
                      "is carried over")
      ->excludes(reshardHf);

  unsigned threads = 0;
  uint64_t stagingMb = 0;
  const char *threadsHelp = "Worker threads per rank (default: the cores, at most 8)";
  const char *stagingHelp = "Host staging memory per rank in MiB for device buffers, two blocks "
                            "per thread (default: save 8 per thread, at most a 64th of memory; "
                            "load 64 per thread, at most a 128th of memory a thread)";
  bool bufferedIO = false;
  unsigned writeDepth = 0;
  std::string device = "cpu", replicaPlane = "auto";
  for (CLI::App *command : {save, load, reshard})
    command
        ->add_option("--device", device,
                     "Where the buffers live: cpu, cuda (the GPU local_rank % device_count) or "
                     "simulated (testing: device memory the host may not touch)")
        ->check(CLI::IsMember({"cpu", "cuda", "simulated"}));
  for (CLI::App *command : {load, reshard})
    command
        ->add_option("--replica-plane", replicaPlane,
                     "How replicas (HSDP) share a load's reads: auto (NCCL on cuda, else the "
                     "communicator), communicator, nccl (these two also for a group of one: a "
                     "check), or none (every rank reads all it loads)")
        ->check(CLI::IsMember({"auto", "communicator", "nccl", "none"}));
  load->add_flag("--buffered-io", bufferedIO,
                 "Read through the page cache (default: cold ranges of 16 MiB and more with "
                 "direct I/O)");
  reshard->add_flag("--buffered-io", bufferedIO,
                    "Read and write through the page cache (default: direct I/O where the file "
                    "system takes it)");
  save->add_flag("--buffered-io", bufferedIO,
                 "Write through the page cache (default: direct I/O where the file system "
                 "takes it)");
  for (CLI::App *command : {save, reshard}) {
    command
        ->add_option("--write-depth", writeDepth,
                     "Direct writes in flight per data file (default 8)")
        ->check(CLI::Range(1u, 256u));
  }
  for (CLI::App *command : {save, load, reshard}) {
    command->add_option("--threads", threads, threadsHelp)->check(CLI::Range(1u, 1024u));
    command->add_option("--staging-mb", stagingMb, stagingHelp)
        ->check(CLI::Range(uint64_t(1), uint64_t(1) << 20));
  }

  std::string verifyDir;
  CLI::App *verify = app.add_subcommand(
      "verify", "Check a checkpoint: every byte against its .fsdp-index (PyTorch's, without "
                "one: every zip record's CRC)");
  verify->add_option("dir", verifyDir, "Checkpoint directory")->required();

  std::string inspectDir;
  InspectOptions inspectOptions;
  CLI::App *inspect = app.add_subcommand(
      "inspect", "List the keys, shapes, dtypes, chunks and files of a DCP checkpoint");
  inspect->add_option("dir", inspectDir, "Checkpoint directory")->required();
  inspect->add_flag("--json", inspectOptions.json, "Print JSON");

  std::string exportDir, safetensorsOut, exportDType, maxShardSize = "5GB";
  bool exportOverwrite = false;
  CLI::App *exporter = app.add_subcommand(
      "export", "Write the model's whole tensors as Hugging Face safetensors (for inference)");
  exporter->add_option("dir", exportDir, "Checkpoint directory (ours, PyTorch's, Megatron-FSDP's)")
      ->required();
  exporter->add_option("--safetensors", safetensorsOut,
                       "Output directory: model.safetensors, or shards and "
                       "model.safetensors.index.json")
      ->required();
  exporter->add_option("--dtype", exportDType, "Cast floating tensors (default: as saved)")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  exporter->add_option("--max-shard-size", maxShardSize,
                       "Tensor bytes per file at most (5GB = 5e9, 2GiB = 2^30)");
  exporter->add_flag("--overwrite", exportOverwrite,
                     "Replace an existing output atomically (its other plain files are kept)");
  std::string exportHfConfig;
  exporter->add_option("--hf-config", exportHfConfig,
                       "A Hugging Face model directory (a hub snapshot too): copy its "
                       "config.json, generation_config.json and tokenizer files into the export");

  std::string jobRoot;
  CLI::App *lister = app.add_subcommand(
      "list", "List a job's step-<N> checkpoints (oldest first) and whether each is good");
  lister->add_option("root", jobRoot, "The job's checkpoint directory")->required();
  int64_t keep = 0;
  CLI::App *pruner = app.add_subcommand(
      "prune", "Remove a job's good checkpoints older than the K newest good ones");
  pruner->add_option("root", jobRoot, "The job's checkpoint directory")->required();
  pruner->add_option("--keep", keep, "How many of the newest good checkpoints stay")
      ->required()
      ->check(CLI::Range(int64_t(1), kMaxKeep));
  std::string pruneFault;
  pruner->add_option("--inject-fault", pruneFault,
                     "Testing: OP:N:ERRNO|KILL, e.g. rename:1:KILL (before the first removal)");

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
  // Where a load or reshard reads from: exactly one source.
  if ((load->parsed() && dir.empty() && hfDir.empty()) ||
      (reshard->parsed() && fromDir.empty() && hfDir.empty())) {
    std::cerr << "fsdp-ckpt " << (load->parsed() ? "load: --dir" : "reshard: --from")
              << " or --from-hf is required\n";
    return errorKindExitCode(ErrorKind::InvalidArgument);
  }
  HfLoadOptions hfOptions;
  for (const std::string &rule : keyMap) {
    size_t equals = rule.find('=');
    if (equals == std::string::npos || equals == 0) {
      std::cerr << "fsdp-ckpt: --key-map " << printable(rule)
                << ": expected OLD=NEW with a non-empty OLD\n";
      return errorKindExitCode(ErrorKind::InvalidArgument);
    }
    hfOptions.keyMap.prefixes.emplace_back(rule.substr(0, equals), rule.substr(equals + 1));
  }

  if (inspect->parsed()) {
    std::unique_ptr<Storage> storage = createPosixStorage();
    Status status = inspectCheckpoint(inspectDir, *storage, inspectOptions, std::cout);
    std::cout.flush();
    return status ? 0 : fail(nullptr, "inspect", status.failure());
  }
  if (exporter->parsed()) {
    ExportOptions options;
    options.overwrite = exportOverwrite;
    options.hfConfigDir = exportHfConfig;
    if (!exportDType.empty())
      options.dtype = exportDType == "bf16"  ? dcp::DType::BFloat16
                      : exportDType == "f16" ? dcp::DType::Float16
                                             : dcp::DType::Float32;
    Result<uint64_t> shardBytes = parseByteSize(maxShardSize);
    if (!shardBytes)
      return fail(nullptr, "export", propagate(shardBytes, "--max-shard-size: " + shardBytes.error()));
    options.maxShardBytes = *shardBytes;
    options.progress = progressPrinter("export", true);
    std::unique_ptr<Storage> storage = createPosixStorage();
    Result<ExportResult> exported =
        exportSafetensors(exportDir, safetensorsOut, *storage, options);
    if (!exported)
      return fail(nullptr, "export", exported.failure());
    std::printf("exported %s: %llu tensors, %s in %zu file%s to %s in %.3f s, %.2f GB/s (largest "
                "tensor %s)\n",
                printable(exportDir).c_str(), static_cast<unsigned long long>(exported->tensors),
                gigabytes(static_cast<double>(exported->bytes)).c_str(), exported->files.size(),
                exported->files.size() == 1 ? "" : "s", printable(safetensorsOut).c_str(),
                exported->seconds,
                exported->seconds > 0 ? exported->bytes / exported->seconds / 1e9 : 0.0,
                gigabytes(static_cast<double>(exported->largestTensorBytes)).c_str());
    if (!exported->configFiles.empty()) {
      std::string names;
      for (const std::string &name : exported->configFiles)
        names += (names.empty() ? "" : ", ") + name;
      std::printf("copied from %s: %s\n", printable(exportHfConfig).c_str(), names.c_str());
    }
    return 0;
  }
  if (lister->parsed() || pruner->parsed()) {
    Result<std::unique_ptr<Storage>> made = makeStorage(pruneFault, -1, 0);
    if (!made)
      return fail(nullptr, pruner->parsed() ? "prune" : "list", made.failure());
    std::unique_ptr<Storage> storage = made.take();
    if (pruner->parsed()) {
      Result<std::vector<std::string>> removed =
          pruneJobCheckpoints(jobRoot, keep, std::nullopt, *storage);
      if (!removed)
        return fail(nullptr, "prune", removed.failure());
      for (const std::string &path : *removed)
        std::cout << "removed " << printable(path) << "\n";
      std::cout << "pruned " << printable(jobRoot) << ": " << removed->size() << " removed\n";
      return 0;
    }
    Result<std::vector<JobCheckpoint>> listed = listJobCheckpoints(jobRoot, *storage);
    if (!listed)
      return fail(nullptr, "list", listed.failure());
    for (const JobCheckpoint &checkpoint : *listed)
      std::cout << "step " << checkpoint.step << "  " << printable(checkpoint.path) << "  "
                << (!checkpoint.good ? "damaged: " + printable(checkpoint.problem)
                    : checkpoint.full ? std::string("good")
                                      : std::string("good (model only)"))
                << "\n";
    auto show = [](const std::optional<JobCheckpoint> &found) {
      return found ? printable(found->path) : std::string("none");
    };
    std::optional<JobCheckpoint> latest = latestJobCheckpoint(*listed, false);
    std::cout << "latest: " << show(latest) << "\n";
    if (latest && !latest->full)
      std::cout << "latest with optimizer state: " << show(latestJobCheckpoint(*listed, true))
                << "\n";
    return 0;
  }
  if (verify->parsed()) {
    std::unique_ptr<Storage> storage = createPosixStorage();
    std::string problems;
    VerifyCoverage coverage = VerifyCoverage::RecordCrcs;
    Status status = verifyCheckpoint(verifyDir, *storage, problems, &coverage);
    // One line per problem, each escaped, then the verdict.
    for (size_t begin = 0, end; begin < problems.size(); begin = end + 1) {
      end = problems.find('\n', begin);
      if (end == std::string::npos)
        end = problems.size();
      std::cerr << printable(problems.substr(begin, end - begin)) << "\n";
    }
    if (!status)
      return fail(nullptr, "verify", status.failure());
    std::cout << "verified " << printable(verifyDir) << ": " << verifyVerdict(coverage) << "\n";
    return 0;
  }

  const char *command = save->parsed() ? "save" : load->parsed() ? "load" : "reshard";
  Result<std::unique_ptr<Communicator>> comm = createDefaultCommunicator(&argc, &argv);
  if (!comm)
    return fail(nullptr, command, comm.failure());
  int64_t rank = (*comm)->rank(), size = (*comm)->size();
  Result<std::unique_ptr<Storage>> storage = makeStorage(fault, faultRank, rank);
  if (!storage)
    return failHere(rank, size, command, storage.failure());
  Result<std::unique_ptr<Checkpointer>> opened =
      Checkpointer::open(planPath, comm.take(), storage.take());
  if (!opened)
    return failHere(rank, size, command, opened.failure());
  Checkpointer &checkpointer = **opened;
  if (Status status = useDevice(checkpointer, device, replicaPlane); !status)
    return failHere(rank, size, command, status.failure());
  // Staging for device buffers, reserved and pinned before any clock runs.
  if (Status status = checkpointer.reserveStaging(threads, stagingMb << 20); !status)
    return failHere(rank, size, command, status.failure());
  if (Status status = checkpointer.allocate(); !status)
    return failHere(rank, size, command, status.failure());
  // The blocks a save writes from, also before any clock runs, as a training
  // job reserves them at start-up (Checkpointer::reserveWriteBlocks).
  if ((save->parsed() || reshard->parsed()) && !bufferedIO)
    if (Status status = checkpointer.reserveWriteBlocks(threads, writeDepth); !status)
      return failHere(rank, size, command, status.failure());
  bool speaks = rank == checkpointer.root(); // the rank that reports for all

  if (save->parsed()) {
    // A training job reserves the async save's snapshot at start-up, so
    // that no save pays for it.
    if (async)
      if (Status status = checkpointer.reserveSnapshot(threads); !status)
        return failHere(rank, size, command, status.failure());
    if (Status status = checkpointer.fill(static_cast<uint32_t>(seed)); !status)
      return failHere(rank, size, command, status.failure());
    for (unsigned round = 0; round < repeat; ++round) {
      SaveOptions options = saveOptions(threads, stagingMb, bufferedIO, writeDepth);
      options.overwrite = overwrite || round > 0;
      options.step = step;
      if (modelOnly)
        options.keys.only = {"model"};
      options.reserveFiles = !noReserve;
      options.progress = progressPrinter("save", speaks);
      Result<TransferStats> stats = makeError("no save ran", ErrorKind::Internal);
      // The ranks start the save together, as the ranks of a training step
      // do: one still filling its buffers is not the save's time.
      if (Status status = checkpointer.comm().barrier(); !status)
        return failHere(rank, size, command, status.failure());
      if (async) {
        Result<std::shared_ptr<PendingSave>> started = checkpointer.saveAsync(dir, options);
        if (!started)
          return failHere(rank, size, command, started.failure());
        // Training goes on: the buffers change while the save writes.
        Status scribbled =
            scribbleSeed >= 0 ? checkpointer.fill(static_cast<uint32_t>(scribbleSeed)) : Status();
        stats = (*started)->wait();
        if (stats && !scribbled)
          return failHere(rank, size, command, scribbled.failure());
        // The next round saves --fill's values again.
        if (scribbleSeed >= 0 && round + 1 < repeat)
          if (Status refilled = checkpointer.fill(static_cast<uint32_t>(seed)); !refilled)
            return failHere(rank, size, command, refilled.failure());
      } else {
        stats = checkpointer.save(dir, options);
      }
      if (!stats)
        return fail(&checkpointer, command, stats.failure());
      if (Status status = reportStats(checkpointer, *stats, checkpointer.root(), "save",
                                      "saved " + dir, "from", statsPath, "", async);
          !status)
        return failHere(rank, size, command, status.failure());
    }
    return 0;
  }

  LoadOptions loadOptions;
  loadOptions.threads = threads;
  loadOptions.stagingBytes = (stagingMb << 20) / (2 * (threads ? threads : defaultThreads()));
  loadOptions.syncModelWeights = !noSync && !reshard->parsed();
  loadOptions.directReads = !bufferedIO;
  loadOptions.readTensorItems = false; // nothing here uses them
  loadOptions.keys = keys;
  loadOptions.progress = progressPrinter(load->parsed() ? "load" : "reshard", speaks);
  if (speaks)
    loadOptions.notice = [command](const std::string &text) {
      writeErrorLine("fsdp-ckpt " + std::string(command) + ": note: " + printable(text) + "\n");
    };
  bool fromHf = !hfDir.empty();
  std::string source = fromHf ? hfDir : load->parsed() ? dir : fromDir;
  Result<LoadResult> loaded = makeError("no load ran", ErrorKind::Internal);
  // The ranks start the load together, as they start a save (above).
  if (Status status = checkpointer.comm().barrier(); !status)
    return failHere(rank, size, command, status.failure());
  if (reshard->parsed() && !fromHf) {
    // Every item of the source comes along (Checkpointer::reshard).
    ReshardOptions options;
    options.load = loadOptions;
    options.save = saveOptions(threads, stagingMb, bufferedIO, writeDepth);
    options.save.overwrite = overwrite;
    options.save.progress = progressPrinter("reshard", speaks);
    options.drop = dropPrefixes;
    options.allowExtra = allowExtra;
    Result<ReshardResult> resharded = checkpointer.reshard(fromDir, dir, options);
    if (!resharded)
      return fail(&checkpointer, command, resharded.failure());
    if (Status status = reportStats(checkpointer, resharded->stats, checkpointer.root(),
                                    "reshard", "resharded " + source + " into " + dir, "for",
                                    statsPath);
        !status)
      return failHere(rank, size, command, status.failure());
    if (rank == checkpointer.root() &&
        (!resharded->carried.empty() || !resharded->dropped.empty()))
      std::cout << "carried " << resharded->carried.size()
                << " items the plan does not name, left out " << resharded->dropped.size()
                << (resharded->dropped.empty()
                        ? std::string()
                        : " (" + printable(resharded->dropped.front()) +
                              (resharded->dropped.size() > 1 ? ", ..." : "") + ")")
                << "\n";
    return 0;
  }
  if (fromHf) {
    hfOptions.threads = loadOptions.threads;
    hfOptions.stagingBytes = loadOptions.stagingBytes;
    hfOptions.syncModelWeights = loadOptions.syncModelWeights;
    hfOptions.progress = loadOptions.progress;
    hfOptions.notice = loadOptions.notice;
    loaded = checkpointer.loadHuggingFace(source, hfOptions);
  } else {
    loaded = checkpointer.load(source, loadOptions);
  }
  if (!loaded)
    return fail(&checkpointer, command, loaded.failure());

  if (load->parsed()) {
    // A Hugging Face model holds the weights alone (the optimizer state is zeroed).
    KeySelection checked = keys;
    if (fromHf)
      checked.only = {"model"};
    if (seed >= 0)
      if (Status status = checkpointer.check(static_cast<uint32_t>(seed), checked,
                                             loadOptions.syncModelWeights);
          !status)
        return fail(&checkpointer, command, propagate(status, "check failed: " + status.error()));
    // A load's statistics are rank 0's to report.
    std::string checkedText = seed < 0           ? ""
                              : checked.all()    ? ", every element checked"
                                                 : ", every element loaded checked";
    if (Status status = reportStats(checkpointer, loaded->stats, 0, "load", "loaded " + source,
                                    "into", statsPath, checkedText.c_str());
        !status)
      return failHere(rank, size, command, status.failure());
    return 0;
  }

  // reshard from a Hugging Face model: its weights (nothing else to carry).
  SaveOptions options = saveOptions(threads, stagingMb, bufferedIO, writeDepth);
  options.overwrite = overwrite;
  options.step = loaded->step.value_or(1.0f);
  options.progress = progressPrinter("reshard", speaks);
  Result<TransferStats> stats = checkpointer.save(dir, options);
  if (!stats)
    return fail(&checkpointer, command, stats.failure());
  // The whole reshard: the load's reads and the save's writes.
  TransferStats both = *stats;
  both.seconds += loaded->stats.seconds;
  both.stallSeconds += loaded->stats.stallSeconds;
  both.bytesReadStorage += loaded->stats.bytesReadStorage;
  both.readers = loaded->stats.readers;
  both.bytesReadInPlace = loaded->stats.bytesReadInPlace;
  if (Status status = reportStats(checkpointer, both, checkpointer.root(), "reshard",
                                  "resharded " + source + " into " + dir, "for", statsPath);
      !status)
    return failHere(rank, size, command, status.failure());
  return 0;
}

int main(int argc, char **argv) {
  // Whatever escapes (out of memory above all) still ends in one line.
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc &) {
    std::cerr << "fsdp-ckpt: out of memory\n";
  } catch (const std::exception &error) {
    writeErrorLine("fsdp-ckpt: internal error: " + printable(error.what()) + "\n");
  }
  return errorKindExitCode(ErrorKind::Internal);
}
