//===- MultiRankTest.cpp - Save, load, reshard and verify in one process --===//
//
// N ranks as N threads over a thread-group communicator: the protocol
// between ranks (agree, decide at the committing rank, one rank's error on
// every rank), split into sub-groups, the callback communicator, and whole
// saves, loads and reshards between world sizes, with one rank failing.
// No mpirun. (ThreadSanitizer runs these: scripts/tsan.sh.)
//
//===----------------------------------------------------------------------===//

#include "ForwardingStorage.h"
#include "MultiRank.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/FileSource.h"
#include "fsdp/Runtime/Protocol.h"

#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <mutex>
#include <sys/stat.h>
#include <unistd.h>

using namespace fsdp;
using namespace fsdp::runtime;
using namespace fsdp::multirank;
using fsdp::testmodels::workedExample;

namespace {

TEST(Protocol, OneRanksErrorReachesEveryRank) {
  PerRank<Status> statuses(4);
  onRanks(4, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Status local =
        rank == 2 ? Status(makeError("bad bytes", ErrorKind::Corrupt)) : Status::success();
    statuses.values[rank] = agree(*comm, local, /*root=*/3);
  });
  expectAllFailWith(statuses.values, "rank 2: bad bytes", ErrorKind::Corrupt);
}

TEST(Protocol, TheRootDecidesOverEveryPayload) {
  PerRank<Status> statuses(3);
  std::vector<std::string> seen;
  onRanks(3, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    statuses.values[rank] =
        agreeThenDecide(*comm, Status::success(), "payload " + std::to_string(rank), /*root=*/1,
                        [&](const std::vector<std::string> &payloads) -> Status {
                          seen = payloads; // only the root runs this
                          return makeError("the root says no", ErrorKind::Busy);
                        });
  });
  EXPECT_EQ(seen, (std::vector<std::string>{"payload 0", "payload 1", "payload 2"}));
  expectAllFailWith(statuses.values, "the root says no", ErrorKind::Busy);
}

TEST(Protocol, StatisticsGatherOnTheRoot) {
  PerRank<size_t> counts(3);
  onRanks(3, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    TransferStats stats;
    stats.bytes = 100 * static_cast<uint64_t>(rank + 1);
    Result<std::vector<TransferStats>> all = gatherStats(*comm, stats, 0);
    ASSERT_TRUE(all) << all.error();
    counts.values[rank] = all->size();
    if (rank == 0)
      EXPECT_EQ((*all)[2].bytes, 300u);
  });
  EXPECT_EQ(counts.values, (std::vector<size_t>{3, 0, 0}));
}

TEST(Communicators, SplitIntoReplicaGroups) {
  // A 2 x 2 HSDP mesh: ranks with the same shard index form a replica group.
  PerRank<std::string> received(4);
  PerRank<int64_t> childRanks(4);
  onRanks(4, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Communicator>> replicas = comm->split(rank % 2, -rank);
    ASSERT_TRUE(replicas) << replicas.error();
    ASSERT_EQ((*replicas)->size(), 2);
    childRanks.values[rank] = (*replicas)->rank();
    // The highest world rank is rank 0 of its group (key -rank).
    Result<std::string> value = (*replicas)->broadcast("from " + std::to_string(rank), 0);
    ASSERT_TRUE(value) << value.error();
    received.values[rank] = *value;
  });
  EXPECT_EQ(childRanks.values, (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(received.values, (std::vector<std::string>{"from 2", "from 3", "from 2", "from 3"}));
}

TEST(Communicators, CallbacksCarryVariableSizesOverFixedSizeCollectives) {
  PerRank<std::vector<std::string>> gathered(3);
  PerRank<std::string> broadcast(3);
  onRanks(3, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    // Fixed-size callbacks as torch.distributed offers them, here over the
    // thread group itself.
    Communicator *base = comm.get();
    CommunicatorCallbacks callbacks;
    callbacks.rank = rank;
    callbacks.size = 3;
    callbacks.gather = [base](const void *data, size_t size, void *out, int64_t root) -> Status {
      Result<std::vector<std::string>> all =
          base->gather(std::string(static_cast<const char *>(data), size), root);
      if (!all)
        return all.failure();
      for (size_t r = 0; r < all->size(); ++r)
        std::memcpy(static_cast<char *>(out) + r * size, (*all)[r].data(), size);
      return Status::success();
    };
    callbacks.broadcast = [base](void *data, size_t size, int64_t root) -> Status {
      Result<std::string> value =
          base->broadcast(std::string(static_cast<const char *>(data), size), root);
      if (!value)
        return value.failure();
      std::memcpy(data, value->data(), size);
      return Status::success();
    };
    callbacks.barrier = [base] { return base->barrier(); };
    Result<std::unique_ptr<Communicator>> wrapped = createCallbackCommunicator(callbacks);
    ASSERT_TRUE(wrapped) << wrapped.error();
    Result<std::vector<std::string>> all =
        (*wrapped)->gather(std::string(static_cast<size_t>(rank) * 5, 'a' + rank), 2);
    ASSERT_TRUE(all) << all.error();
    gathered.values[rank] = *all;
    Result<std::string> value = (*wrapped)->broadcast(rank == 1 ? "the root's words" : "", 1);
    ASSERT_TRUE(value) << value.error();
    broadcast.values[rank] = *value;
    // No split callback: split is refused, on every rank alike.
    EXPECT_FALSE((*wrapped)->split(0, 0));
  });
  EXPECT_EQ(gathered.values[2], (std::vector<std::string>{"", "bbbbb", "cccccccccc"}));
  EXPECT_TRUE(gathered.values[0].empty());
  for (const std::string &value : broadcast.values)
    EXPECT_EQ(value, "the root's words");
}

TEST(MultiRank, SaveVerifyAndReshardBetweenWorldSizes) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile four = planFor(workedExample({4}));
  expectAllOk(saveOnRanks(four, work + "/four", 11));
  std::unique_ptr<Storage> storage = createPosixStorage();
  std::string problems;
  Status verified = verifyCheckpoint(work + "/four", *storage, problems);
  EXPECT_TRUE(verified) << verified.error() << "\n" << problems;
  EXPECT_FALSE(storage->exists(work + "/four.fsdp-lock"));

  // Into 1, 2 and 3 ranks, and a 2 x 2 HSDP mesh: every element checked.
  for (int64_t size : {1, 2, 3})
    expectAllOk(loadOnRanks(planFor(workedExample({size})), work + "/four", 11));
  expectAllOk(loadOnRanks(
      planFor(workedExample({2, 2}, {layout::Placement::Replicate, layout::Placement::Shard})),
      work + "/four", 11));
  // A reshard: load on 3 ranks, save from them, load that on 2.
  expectAllOk(reshardOnRanks(planFor(workedExample({3})), work + "/four", work + "/three"));
  expectAllOk(loadOnRanks(planFor(workedExample({2})), work + "/three", 11));
  // Another seed is found out on every rank.
  for (const Status &status : loadOnRanks(planFor(workedExample({2})), work + "/three", 12))
    EXPECT_FALSE(status);
  (void)storage->removeTree(work);
}

/// Every file of checkpoint `dir` dropped from the page cache (true) or
/// read through it (false).
void setCache(const std::string &dir, bool drop) {
  for (const std::string &name : {"__0_0.distcp", "__1_0.distcp", ".metadata", ".fsdp-chunks"}) {
    int fd = ::open((dir + "/" + name).c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << name;
    if (drop) {
      ::fsync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    } else {
      char block[1 << 16];
      while (::read(fd, block, sizeof(block)) > 0) {
      }
    }
    ::close(fd);
  }
}

TEST(MultiRank, ColdLoadsReadOnMoreStreamsThanThreadsWarmOnesOnTheThreadsAsked) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile two = planFor(workedExample({2}));
  expectAllOk(saveOnRanks(two, work + "/ckpt", 5));
  setCache(work + "/ckpt", true);
  {
    auto probe = FileSource::open(work + "/ckpt/__0_0.distcp");
    ASSERT_TRUE(probe) << probe.error();
    if (!(*probe)->cold(0, (*probe)->size()))
      GTEST_SKIP() << "this file system keeps evicted files in its cache";
  }
  for (bool cold : {true, false}) {
    setCache(work + "/ckpt", cold);
    PerRank<Status> loaded(2);
    PerRank<uint64_t> readers(2);
    onRanks(2, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
      Result<std::unique_ptr<Checkpointer>> opened =
          openAndAllocate(two, std::move(comm), nullptr, {});
      Status status = opened ? Status::success() : Status(opened.failure());
      if (status) {
        LoadOptions options;
        options.threads = 1;
        Result<LoadResult> load = (*opened)->load(work + "/ckpt", options);
        status = load ? (*opened)->check(5) : Status(load.failure());
        if (load)
          readers.values[rank] = load->stats.readers;
      }
      loaded.values[rank] = status;
    });
    expectAllOk(loaded.values);
    for (uint64_t count : readers.values)
      EXPECT_EQ(count, cold ? 4u : 1u) << (cold ? "cold" : "warm");
  }
  (void)createPosixStorage()->removeTree(work);
}

TEST(MultiRank, OneRankFailingFailsEveryRankAndCommitsNothing) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile four = planFor(workedExample({4}));
  // Rank 1's first write fails with EIO.
  std::vector<Status> statuses =
      saveOnRanks(four, work + "/ckpt", 5, [](int64_t rank) -> std::unique_ptr<Storage> {
        if (rank != 1)
          return createPosixStorage();
        Fault fault;
        fault.op = Fault::Op::Write;
        fault.nth = 1;
        fault.error = EIO;
        return createFaultInjectingStorage(createPosixStorage(), fault);
      });
  expectAllFailWith(statuses, "nothing committed: rank 1: ", ErrorKind::IO);
  expectAllFailWith(statuses, "Input/output error", ErrorKind::IO);
  std::unique_ptr<Storage> storage = createPosixStorage();
  EXPECT_FALSE(storage->exists(work + "/ckpt"));
  EXPECT_FALSE(storage->exists(work + "/ckpt.fsdp-staging"));
  EXPECT_FALSE(storage->exists(work + "/ckpt.fsdp-lock"));

  // A load where one rank has no buffers: every rank learns it.
  expectAllOk(saveOnRanks(four, work + "/good", 5));
  plan::PlanFile two = planFor(workedExample({2}));
  PerRank<Status> loads(2);
  onRanks(2, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened = Checkpointer::open(two, std::move(comm));
    ASSERT_TRUE(opened) << opened.error();
    if (rank == 0)
      ASSERT_TRUE((*opened)->allocate());
    Result<LoadResult> loaded = (*opened)->load(work + "/good");
    loads.values[rank] = loaded ? Status::success() : Status(loaded.failure());
  });
  expectAllFailWith(loads.values, "rank 1: ", ErrorKind::InvalidArgument);
  (void)storage->removeTree(work);
}

TEST(SimulatedDevice, SaveLoadAndReshardThroughCopiesOnly) {
  // Device memory the host cannot touch: every byte goes through the
  // backend's copies (a stray host access would fault).
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile four = planFor(workedExample({4}));
  expectAllOk(saveOnRanks(four, work + "/device", 21, {}, slowDevice));
  std::unique_ptr<Storage> storage = createPosixStorage();
  std::string problems;
  Status verified = verifyCheckpoint(work + "/device", *storage, problems);
  EXPECT_TRUE(verified) << verified.error() << "\n" << problems;
  // Device to host and host to device give the same checkpoint's values.
  expectAllOk(loadOnRanks(planFor(workedExample({2})), work + "/device", 21));
  expectAllOk(saveOnRanks(four, work + "/host", 21));
  expectAllOk(loadOnRanks(planFor(workedExample({3})), work + "/host", 21, slowDevice));
  // HSDP on devices, and a reshard from devices to devices.
  expectAllOk(loadOnRanks(
      planFor(workedExample({2, 2}, {layout::Placement::Replicate, layout::Placement::Shard})),
      work + "/device", 21, slowDevice));
  expectAllOk(reshardOnRanks(planFor(workedExample({3})), work + "/device", work + "/resharded",
                             slowDevice));
  expectAllOk(loadOnRanks(planFor(workedExample({1})), work + "/resharded", 21));
  // The data files are the same whichever memory they were saved from.
  for (const char *file : {"__0_0.distcp", "__3_0.distcp"}) {
    Result<std::unique_ptr<zip::ByteSource>> a = storage->openRead(work + "/device/" + file);
    Result<std::unique_ptr<zip::ByteSource>> b = storage->openRead(work + "/host/" + file);
    ASSERT_TRUE(a && b) << file;
    std::string bytesA((*a)->size(), '\0'), bytesB((*b)->size(), '\0');
    ASSERT_TRUE((*a)->read(0, bytesA.data(), bytesA.size()));
    ASSERT_TRUE((*b)->read(0, bytesB.data(), bytesB.size()));
    EXPECT_EQ(bytesA, bytesB) << file;
  }
  (void)storage->removeTree(work);
}

/// A 300x1000 tensor (1.2 MB) and a 7-element one, sharded over `ranks`.
plan::ModelLayout bigAndSmall(int64_t ranks) {
  plan::ModelLayout model = workedExample({ranks});
  model.groups[0] = fsdp::testmodels::makeGroup("", {{"big"}, {"small"}}, {{300, 1000}, {7}},
                                                {ranks}, {layout::Placement::Shard});
  model.optimizerParams = {"big", "small"};
  return model;
}

/// One 4352x4096 weight (71 MB), no optimizer, sharded over `ranks`.
plan::PlanFile hugeWeight(int64_t ranks) {
  plan::ModelLayout model = workedExample({ranks});
  model.optimizer.present = false;
  model.optimizerParams.clear();
  model.groups[0] = fsdp::testmodels::makeGroup("", {{"huge"}}, {{4352, 4096}}, {ranks},
                                                {layout::Placement::Shard});
  return planFor(model);
}

/// One file's pages evicted from the page cache (written back first).
void evict(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << path;
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

/// True when `path`, just evicted, reads as cold (some file systems keep
/// evicted files in their cache).
bool evictsToCold(const std::string &path) {
  auto probe = FileSource::open(path);
  return probe && (*probe)->missingShare(0, (*probe)->size()) >= 0.9;
}

/// One rank's save of hugeWeight into `work`/ckpt, its data file evicted:
/// the file's path, or "" where evicting leaves it cached.
std::string coldHugeCheckpoint(const std::string &work, uint32_t seed) {
  expectAllOk(saveOnRanks(hugeWeight(1), work + "/ckpt", seed));
  std::string data = work + "/ckpt/__0_0.distcp";
  evict(data);
  return evictsToCold(data) ? data : "";
}

TEST(MultiRank, AChunkOverSixtyFourMiBCutByAReshardIsReadOnce) {
  // One rank saves a 71 MB weight (no optimizer); two ranks load half of
  // it each. Its check reads it whole, and the half it needs is copied out
  // on the way: a rank reads the item once. (It was checked, then its half
  // read again: 1.5 times the item.)
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  auto huge = hugeWeight;
  expectAllOk(saveOnRanks(huge(1), work + "/ckpt", 51));
  std::vector<TransferStats> stats;
  expectAllOk(loadOnRanks(huge(2), work + "/ckpt", 51, {}, {}, &stats));
  const uint64_t itemBytes = uint64_t(4352) * 4096 * 4;
  ASSERT_EQ(stats.size(), 2u);
  for (const TransferStats &rank : stats) {
    EXPECT_GE(rank.bytesReadStorage, itemBytes);
    EXPECT_LT(rank.bytesReadStorage, itemBytes + itemBytes / 8);
  }
  // A byte changed in the half rank 0 does not copy: rank 1 copied it, and
  // both ranks' checks of the whole item find it, host or device.
  {
    std::fstream file(work + "/ckpt/__0_0.distcp", std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file.good());
    file.seekg(0, std::ios::end);
    std::streamoff at = static_cast<std::streamoff>(file.tellg()) * 3 / 4;
    file.seekg(at);
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    file.seekp(at);
    file.write(&byte, 1);
  }
  expectAllFailWith(loadOnRanks(huge(2), work + "/ckpt", 51), "checksum mismatch",
                    ErrorKind::Corrupt);
  expectAllFailWith(loadOnRanks(huge(2), work + "/ckpt", 51, slowDevice), "checksum mismatch",
                    ErrorKind::Corrupt);
  (void)createPosixStorage()->removeTree(work);
}

/// Every direct write of one data file: (offset, bytes), in the order made.
struct DirectWrites {
  std::mutex mutex;
  std::vector<std::pair<uint64_t, uint64_t>> writes;
};

/// A file opened for direct I/O that records each write and passes it on.
class RecordingFile : public WritableFile {
public:
  RecordingFile(std::unique_ptr<WritableFile> base, std::shared_ptr<DirectWrites> writes)
      : base_(std::move(base)), writes_(std::move(writes)) {}
  Status writeAt(uint64_t offset, const std::vector<ByteSpan> &spans) override {
    uint64_t bytes = 0;
    for (const ByteSpan &span : spans)
      bytes += span.size;
    {
      std::lock_guard<std::mutex> lock(writes_->mutex);
      writes_->writes.emplace_back(offset, bytes);
    }
    return base_->writeAt(offset, spans);
  }
  Status sync() override { return base_->sync(); }
  Status close() override { return base_->close(); }
  const std::string &path() const override { return base_->path(); }
  uint64_t directAlignment() const override { return base_->directAlignment(); }
  Status truncate(uint64_t size) override { return base_->truncate(size); }
  Status reserve(uint64_t size) override { return base_->reserve(size); }

private:
  std::unique_ptr<WritableFile> base_;
  std::shared_ptr<DirectWrites> writes_;
};

class RecordingStorage : public ForwardingStorage {
public:
  explicit RecordingStorage(std::shared_ptr<DirectWrites> writes) : writes_(std::move(writes)) {}
  Result<std::unique_ptr<WritableFile>> createDirect(const std::string &path) override {
    Result<std::unique_ptr<WritableFile>> file = base_->createDirect(path);
    if (!file || !(*file)->directAlignment())
      return file;
    return std::unique_ptr<WritableFile>(new RecordingFile(file.take(), writes_));
  }

private:
  std::shared_ptr<DirectWrites> writes_;
};

TEST(MultiRank, ADirectSaveFillsWholeBlocksAcrossItems) {
  // Items of 4 MB, 8 MB and a few bytes, with two Adam moments each: a
  // worker's block runs on from one item into the next, so a 1-thread save
  // writes the file in whole 8 MiB blocks but the last (it wrote a short
  // block at the end of every item), and a 2-thread one in fewer writes
  // than items. Either way the checkpoint loads with every value.
  plan::ModelLayout model = workedExample({1});
  model.groups[0] = fsdp::testmodels::makeGroup("", {{"a"}, {"b"}, {"c"}, {"d"}},
                                                {{1000, 1000}, {7}, {2000, 1000}, {13}}, {1},
                                                {layout::Placement::Shard});
  model.optimizerParams = {"a", "b", "c", "d"};
  plan::PlanFile plan = planFor(model);
  Result<plan::RankPlan> rank0 = plan.rank(0);
  ASSERT_TRUE(rank0) << rank0.error();
  const size_t items = rank0->writes.size();
  for (unsigned threads : {1u, 2u}) {
    std::string work = tempDir();
    ASSERT_FALSE(work.empty());
    auto writes = std::make_shared<DirectWrites>();
    onRanks(1, [&](int64_t, std::unique_ptr<Communicator> comm) {
      Result<std::unique_ptr<Checkpointer>> opened = openAndAllocate(
          plan, std::move(comm), std::make_unique<RecordingStorage>(writes), {});
      ASSERT_TRUE(opened) << opened.error();
      ASSERT_TRUE((*opened)->fill(81));
      SaveOptions options;
      options.threads = threads;
      Result<TransferStats> saved = (*opened)->save(work + "/ckpt", options);
      ASSERT_TRUE(saved) << saved.error();
    });
    if (writes->writes.empty()) {
      (void)createPosixStorage()->removeTree(work);
      GTEST_SKIP() << "this file system takes no direct writes";
    }
    expectAllOk(loadOnRanks(plan, work + "/ckpt", 81));
    struct stat file {};
    ASSERT_EQ(::stat((work + "/ckpt/__0_0.distcp").c_str(), &file), 0);
    const uint64_t block = uint64_t(8) << 20, size = static_cast<uint64_t>(file.st_size);
    ASSERT_GT(size, 4 * block);
    uint64_t written = 0;
    for (const auto &write : writes->writes)
      written += write.second;
    EXPECT_GE(written, size);
    EXPECT_LT(written, size + 4096 * threads) << "bytes written twice";
    if (threads == 1) {
      EXPECT_EQ(writes->writes.size(), (size + block - 1) / block);
      for (size_t i = 0; i + 1 < writes->writes.size(); ++i)
        EXPECT_EQ(writes->writes[i].second, block) << "write " << i;
    } else {
      EXPECT_LT(writes->writes.size(), items);
    }
    (void)createPosixStorage()->removeTree(work);
  }
}

TEST(MultiRank, ALoadCastsTheMainWeightItCopiesWarmOrCold) {
  // A 71 MB main weight cast into its bf16 model weight as it is copied:
  // out of the page cache (warm), in place but for its edge pages (cold),
  // or in a load of half of it per rank; model weights checked each time.
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  expectAllOk(saveOnRanks(hugeWeight(1), work + "/ckpt", 59));
  std::string data = work + "/ckpt/__0_0.distcp";
  for (int64_t ranks : {1, 2})
    for (bool warm : {true, false}) {
      SCOPED_TRACE((warm ? "warm, " : "cold, ") + std::to_string(ranks) + " ranks");
      evict(data);
      if (warm) {
        std::ifstream file(data, std::ios::binary);
        std::vector<char> block(1 << 20);
        while (file.read(block.data(), static_cast<std::streamsize>(block.size())))
          ;
      }
      expectAllOk(loadOnRanks(hugeWeight(ranks), work + "/ckpt", 59));
    }
  (void)createPosixStorage()->removeTree(work);
}

TEST(MultiRank, LoadsWithoutDirectReadsReadColdFilesThroughTheCache) {
  // A cold 71 MB item: read direct by default (the page cache stays
  // without it), through the cache with LoadOptions::directReads off (then
  // it is cached); the values are right both ways, on host and device.
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  std::string data = coldHugeCheckpoint(work, 53);
  if (data.empty())
    GTEST_SKIP() << "this file system keeps evicted files in its cache";
  auto missing = [&] {
    int fd = ::open(data.c_str(), O_RDONLY);
    EXPECT_GE(fd, 0);
    ::fsync(fd);
    ::close(fd);
    auto probe = FileSource::open(data);
    return probe ? (*probe)->missingShare(0, (*probe)->size()) : -1.0;
  };
  for (const BackendOf &backendOf : {BackendOf{}, BackendOf(slowDevice)}) {
    for (bool direct : {true, false}) {
      evict(data);
      LoadOptions options;
      options.directReads = direct;
      expectAllOk(loadOnRanks(hugeWeight(1), work + "/ckpt", 53, backendOf, options));
      if (direct)
        EXPECT_GT(missing(), 0.5) << "read through the cache though direct reads were on";
      else
        EXPECT_LT(missing(), 0.1) << "not read through the cache";
    }
  }
  (void)createPosixStorage()->removeTree(work);
}

TEST(MultiRank, AColdLoadInTheSavedLayoutReadsStraightIntoTheBuffers) {
  // Our saves start each piece's data where the piece starts in a page of
  // its buffer, so a cold load in the same layout lands the item's whole
  // pages in the buffer itself (no staging, no copy); not into device
  // buffers (staged in host memory), nor with direct reads off.
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  std::string data = coldHugeCheckpoint(work, 57);
  if (data.empty())
    GTEST_SKIP() << "this file system keeps evicted files in its cache";
  const uint64_t itemBytes = uint64_t(4352) * 4096 * 4;
  int direct = ::open(data.c_str(), O_RDONLY | O_DIRECT);
  if (direct < 0)
    GTEST_SKIP() << "this file system has no direct I/O";
  ::close(direct);
  struct Case {
    const char *name;
    BackendOf backendOf;
    bool direct;
    bool inPlace;
  };
  for (const Case &run : {Case{"host", BackendOf{}, true, true},
                          Case{"host, direct reads off", BackendOf{}, false, false},
                          Case{"device", BackendOf(slowDevice), true, false}}) {
    evict(data);
    LoadOptions options;
    options.directReads = run.direct;
    std::vector<TransferStats> stats;
    expectAllOk(loadOnRanks(hugeWeight(1), work + "/ckpt", 57, run.backendOf, options, &stats));
    ASSERT_EQ(stats.size(), 1u);
    if (run.inPlace) {
      // All but the partial first and last pages.
      EXPECT_GE(stats[0].bytesReadInPlace, itemBytes - 8192) << run.name;
      EXPECT_LE(stats[0].bytesReadInPlace, itemBytes) << run.name;
    } else {
      EXPECT_EQ(stats[0].bytesReadInPlace, 0u) << run.name;
    }
  }
  (void)createPosixStorage()->removeTree(work);
}

TEST(CheckpointReader, PrefetchesAnItemsZipRecordsAndNotItsData) {
  // A cold load asks for every item's first and last pages up front: opening
  // the item reads them, and would otherwise wait behind the data reads.
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  std::string data = coldHugeCheckpoint(work, 59);
  if (data.empty())
    GTEST_SKIP() << "this file system keeps evicted files in its cache";
  auto probe = FileSource::open(data);
  ASSERT_TRUE(probe);
  std::unique_ptr<Storage> storage = createPosixStorage();
  Result<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::open(work + "/ckpt", *storage);
  ASSERT_TRUE(reader) << reader.error();
  Result<std::vector<SavedChunk>> chunks = (*reader)->chunksOf("model.huge");
  ASSERT_TRUE(chunks && chunks->size() == 1u);
  const SavedChunk &chunk = chunks->front();
  (*reader)->prefetchRecords(chunk);
  uint64_t first = chunk.itemOffset, last = chunk.itemOffset + chunk.itemLength - 4096;
  // The reads run in the background: wait for them (a few ms on a disk).
  for (int tries = 0; tries < 200 && ((*probe)->missingShare(first, 8192) > 0 ||
                                      (*probe)->missingShare(last, 4096) > 0);
       ++tries)
    ::usleep(10000);
  EXPECT_EQ((*probe)->missingShare(first, 8192), 0.0);
  EXPECT_EQ((*probe)->missingShare(last, 4096), 0.0);
  EXPECT_GT((*probe)->missingShare(first + (1 << 20), chunk.itemLength - (2 << 20)), 0.99);
  (void)storage->removeTree(work);
}

TEST(CheckpointReader, StreamsARangeCheckingTheWholeItemOnce) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  expectAllOk(saveOnRanks(planFor(bigAndSmall(1)), work + "/ckpt", 61));
  std::unique_ptr<Storage> storage = createPosixStorage();
  Result<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::open(work + "/ckpt", *storage);
  ASSERT_TRUE(reader) << reader.error();
  const std::string key = "model.big";
  Result<std::vector<SavedChunk>> chunks = (*reader)->chunksOf(key);
  ASSERT_TRUE(chunks && chunks->size() == 1u);
  Result<TensorItem *> item = (*reader)->tensorItem(key, chunks->front());
  ASSERT_TRUE(item) << item.error();
  uint64_t storageBytes = (*item)->record.storageBytes();
  ASSERT_EQ(storageBytes, uint64_t(300 * 1000 * 4));
  std::string whole(storageBytes, '\0');
  ASSERT_TRUE((*item)->file->read((*item)->dataOffset, whole.data(), storageBytes));
  auto stream = [&](uint64_t offset, uint64_t count, std::string &out) {
    out.clear();
    return (*reader)->streamStorage(**item, offset, count,
                                    [&](uint64_t at, const char *bytes, size_t size) {
                                      EXPECT_EQ(at, out.size()); // in order, from the offset
                                      out.append(bytes, size);
                                      return Status::success();
                                    });
  };
  // The first time the whole item is read (and checked); the range alone
  // goes on. After that, only the range is read.
  std::string got;
  uint64_t before = (*reader)->bytesRead();
  ASSERT_TRUE(stream(400000, 500000, got));
  EXPECT_EQ(got, whole.substr(400000, 500000));
  EXPECT_GE((*reader)->bytesRead() - before, storageBytes);
  before = (*reader)->bytesRead();
  ASSERT_TRUE(stream(1000, 3000, got));
  EXPECT_EQ(got, whole.substr(1000, 3000));
  EXPECT_EQ((*reader)->bytesRead() - before, 3000u);
  // A range past the item's storage is refused before anything is read.
  Status outside = stream(storageBytes - 10, 11, got);
  ASSERT_FALSE(outside);
  EXPECT_EQ(outside.kind(), ErrorKind::Corrupt);
  EXPECT_NE(outside.error().find("read outside the item"), std::string::npos) << outside.error();
  EXPECT_TRUE(got.empty());
  (void)storage->removeTree(work);
}

TEST(SimulatedDevice, LargeItemsThroughSmallStagingBlocks) {
  // 1.2 MB tensors staged through 16 KiB blocks (a 64 KiB pool for 2
  // workers): every block copied out, checksummed and written in turn.
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile two = planFor(bigAndSmall(2));
  PerRank<Status> saved(2);
  onRanks(2, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(two, std::move(comm), nullptr, slowDevice);
    Status status = opened ? (*opened)->fill(31) : Status(opened.failure());
    SaveOptions options;
    options.threads = 2;
    options.stagingBytes = 64 << 10;
    // Twice through one checkpointer: its staging pool serves both saves.
    for (const char *dir : {"/first", "/second"}) {
      if (!status)
        break;
      Result<TransferStats> stats = (*opened)->save(work + dir, options);
      status = stats ? Status::success() : Status(stats.failure());
    }
    saved.values[rank] = status;
  });
  expectAllOk(saved.values);
  plan::PlanFile one = planFor(bigAndSmall(1));
  expectAllOk(loadOnRanks(one, work + "/first", 31));
  expectAllOk(loadOnRanks(one, work + "/second", 31));
  // Back onto devices of 3 ranks, in bands of 16 rows (two 64 KiB blocks a
  // worker, one read into while the other's copy runs): 300 rows saved as
  // 2 chunks land across band boundaries.
  LoadOptions options;
  options.stagingBytes = 64 << 10;
  expectAllOk(loadOnRanks(planFor(bigAndSmall(3)), work + "/second", 31, slowDevice, options));
  (void)createPosixStorage()->removeTree(work);
}

TEST(SimulatedDevice, LoadsReadEachSavedByteOnceThroughSmallStaging) {
  // 1.2 MB chunks into device pieces through 64 KiB blocks: each row-range
  // chunk streams through the staging, read and checked once, as a host
  // load reads it (in bands it was read twice: its check, then each band's
  // range), whole or cut by a reshard.
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile two = planFor(bigAndSmall(2));
  expectAllOk(saveOnRanks(two, work + "/ckpt", 41));
  LoadOptions options;
  options.stagingBytes = 64 << 10;
  options.threads = 2;
  auto bytesRead = [&](const plan::PlanFile &plan, const BackendOf &backendOf) {
    std::vector<TransferStats> stats;
    expectAllOk(loadOnRanks(plan, work + "/ckpt", 41, backendOf, options, &stats));
    uint64_t total = 0;
    for (const TransferStats &rank : stats)
      total += rank.bytesReadStorage;
    return total;
  };
  uint64_t host = bytesRead(two, {});
  uint64_t device = bytesRead(two, slowDevice);
  EXPECT_GT(host, uint64_t(2 * 1200000)); // main weight and two optimizer states at least
  EXPECT_EQ(device, host);
  // Into 3 ranks, the 2 saved chunks are cut: each rank reads the chunks it
  // needs part of, once (their check reads them whole), device or host.
  plan::PlanFile three = planFor(bigAndSmall(3));
  uint64_t hostResharded = bytesRead(three, {});
  EXPECT_EQ(bytesRead(three, slowDevice), hostResharded);
  EXPECT_LT(hostResharded, host * 2);
  (void)createPosixStorage()->removeTree(work);
}

} // namespace
