//===- AsyncSaveTest.cpp - Saves that return once the bytes are copied ----===//
//
// Checkpointer::saveAsync on thread-group ranks: the caller overwrites its
// buffers as soon as the save returns and the checkpoint still holds the
// values it had then (host buffers and simulated device buffers); a second
// save waits for the first, and saves reuse the snapshot and the direct-I/O
// blocks (kept in a caller's slot too); every error, any rank's, comes out
// of wait() on every rank. An overwrite returns before the checkpoint it
// replaced is removed, and the next save waits for that removal.
// (ThreadSanitizer runs these: scripts/tsan.sh.)
//
//===----------------------------------------------------------------------===//

#include "fsdp/Runtime/Cast.h"
#include "../../runtime/CastKernels.h"
#include "../../runtime/SaveSnapshot.h"
#include "../../runtime/WriteQueue.h"
#include "ForwardingStorage.h"
#include "MultiRank.h"

#include <condition_variable>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <sys/mman.h>
#include <unistd.h>

using namespace fsdp;
using namespace fsdp::runtime;
using namespace fsdp::multirank;
using fsdp::testmodels::makeGroup;
using fsdp::testmodels::workedExample;

namespace {

/// A model with items of about 1 MB per rank, so a save takes a while.
plan::ModelLayout largerModel(int64_t ranks) {
  plan::ModelLayout model = workedExample({ranks});
  model.groups[0] = makeGroup("", {{"big"}, {"small"}}, {{300, 1000}, {7}}, {ranks},
                              {layout::Placement::Shard});
  model.optimizerParams = {"big", "small"};
  return model;
}

Status statusOf(const Result<TransferStats> &result) {
  return result ? Status::success() : Status(result.failure());
}

/// Every rank: fill SEED, start an async save, overwrite its buffers with
/// SEED + 1 at once, wait. The checkpoint must hold SEED's values.
void overwriteAfterReturn(const BackendOf &backendOf) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile two = planFor(largerModel(2));
  PerRank<Status> saved(2);
  PerRank<double> stalls(2), totals(2);
  onRanks(2, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(two, std::move(comm), nullptr, backendOf);
    ASSERT_TRUE(opened) << opened.error();
    Checkpointer &checkpointer = **opened;
    ASSERT_TRUE(checkpointer.fill(41));
    Result<std::shared_ptr<PendingSave>> pending = checkpointer.saveAsync(work + "/ckpt");
    ASSERT_TRUE(pending) << pending.error();
    Status status = checkpointer.fill(42); // training goes on
    Result<TransferStats> stats = (*pending)->wait();
    if (status)
      status = statusOf(stats);
    if (stats) {
      stalls.values[rank] = stats->stallSeconds;
      totals.values[rank] = stats->seconds;
      EXPECT_EQ(stats->stallSeconds, (*pending)->stallSeconds());
    }
    EXPECT_TRUE((*pending)->done());
    // The same outcome again, and the buffers keep the new values.
    EXPECT_EQ(statusOf((*pending)->wait()).error(), status.error());
    if (status)
      status = checkpointer.check(42);
    saved.values[rank] = status;
  });
  expectAllOk(saved.values);
  for (int64_t rank = 0; rank < 2; ++rank)
    EXPECT_LE(stalls.values[rank], totals.values[rank]);
  expectAllOk(loadOnRanks(two, work + "/ckpt", 41));
  expectAllOk(loadOnRanks(planFor(largerModel(3)), work + "/ckpt", 41));
  std::string problems;
  std::unique_ptr<Storage> storage = createPosixStorage();
  Status verified = verifyCheckpoint(work + "/ckpt", *storage, problems);
  EXPECT_TRUE(verified) << verified.error() << "\n" << problems;
  (void)storage->removeTree(work);
}

TEST(AsyncSave, BuffersOverwrittenAfterReturnKeepTheSavedValues) { overwriteAfterReturn({}); }

// The snapshot's copy streams whole cache lines of an aligned destination,
// four 4 KiB runs at a time, and copies the head and tail plainly: every byte
// lands, none outside the range, in every build of it this CPU runs.
TEST(AsyncSave, TheSnapshotCopyIsExactAtEveryAlignmentAndLength) {
  constexpr size_t kGuard = 128;
  std::vector<std::pair<std::string, void (*)(void *, const void *, uint64_t)>> copies = {
      {"copyBypassingCache", copyBypassingCache}};
  for (const FloatCastKernels &kernel : runnableFloatCastKernels())
    copies.push_back({kernel.isa, kernel.copyStreaming});
  for (const auto &[name, copy] : copies)
    for (size_t length : {0, 1, 15, 63, 64, 65, 127, 200, 4096 + 17, 16384, 16384 + 64 + 5,
                          3 * 16384 + 4096 + 17, (1 << 20) + 3})
      for (size_t sourceShift : {0, 1, 7})
        for (size_t destinationShift : {0, 1, 16, 63}) {
          std::vector<unsigned char> source(length + sourceShift);
          for (size_t i = 0; i < source.size(); ++i)
            source[i] = static_cast<unsigned char>(i * 131 + 7 + i / 4096);
          std::vector<unsigned char> destination(kGuard + length + kGuard, 0xAB);
          // A 64-byte aligned start, then the shift.
          unsigned char *base = destination.data() +
                                (64 - reinterpret_cast<uintptr_t>(destination.data()) % 64) % 64;
          ASSERT_LE(base + destinationShift + length, destination.data() + destination.size());
          copy(base + destinationShift, source.data() + sourceShift, length);
          for (unsigned char *at = destination.data();
               at < destination.data() + destination.size(); ++at) {
            size_t index = static_cast<size_t>(at - (base + destinationShift));
            bool inside = at >= base + destinationShift && index < length;
            ASSERT_EQ(*at, inside ? source[sourceShift + index] : 0xAB)
                << name << ": length " << length << ", source +" << sourceShift
                << ", destination +" << destinationShift << ", byte "
                << (at - destination.data());
          }
        }
}

/// How many of the pages under `view` are in memory.
uint64_t residentPages(const BufferView &view) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t start = reinterpret_cast<uintptr_t>(view.data) / page * page;
  uint64_t length = reinterpret_cast<uintptr_t>(view.data) + view.bytes - start;
  std::vector<unsigned char> resident((length + page - 1) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void *>(start), length, resident.data()), 0);
  uint64_t count = 0;
  for (unsigned char flags : resident)
    count += flags & 1;
  return count;
}

// A snapshot is faulted in when reserved (on the threads given), so that no
// capture pays for page faults, and its capture copies every saved byte.
TEST(AsyncSave, TheSnapshotIsFaultedInWhenReservedAndHoldsEverySavedByte) {
  plan::PlanFile one = planFor(largerModel(1));
  Result<plan::RankPlan> rankPlan = one.rank(0);
  ASSERT_TRUE(rankPlan) << rankPlan.error();
  Result<RankBuffers> source = RankBuffers::allocate(*rankPlan);
  ASSERT_TRUE(source) << source.error();
  for (const plan::LocalBuffer &buffer : source->layout()) {
    Result<BufferView> view = source->get(buffer.group, buffer.role);
    ASSERT_TRUE(view) << view.error();
    for (uint64_t i = 0; i < view->bytes; ++i)
      static_cast<unsigned char *>(view->data)[i] = static_cast<unsigned char>(i * 13 + 5);
  }
  for (auto [threads, hugePages] : {std::pair{1u, false}, std::pair{3u, true}}) {
    Result<std::unique_ptr<SaveSnapshot>> snapshot =
        SaveSnapshot::reserve(*rankPlan, threads, hugePages);
    ASSERT_TRUE(snapshot) << snapshot.error();
    ASSERT_GT((*snapshot)->capturedBytes(), uint64_t(1) << 20);
    const std::vector<plan::LocalBuffer> &saved = (*snapshot)->buffers().layout();
    ASSERT_FALSE(saved.empty());
    for (const plan::LocalBuffer &buffer : saved) {
      BufferView view = *(*snapshot)->buffers().get(buffer.group, buffer.role);
      EXPECT_EQ(residentPages(view), (view.bytes + 4095) / 4096)
          << "group " << buffer.group << " " << plan::bufferRoleName(buffer.role);
    }
    ASSERT_TRUE((*snapshot)->capture(*source, threads));
    for (const plan::WriteItem &item : rankPlan->writes) {
      if (item.source != plan::ItemSource::Buffer)
        continue;
      BufferView from = *source->get(item.buffer.group, item.buffer.role);
      BufferView to = *(*snapshot)->buffers().get(item.buffer.group, item.buffer.role);
      uint64_t elementSize = dcp::dtypeInfo(item.dtype).elementSize;
      uint64_t offset = static_cast<uint64_t>(item.buffer.localOffset) * elementSize;
      EXPECT_EQ(std::memcmp(static_cast<char *>(from.data) + offset,
                            static_cast<char *>(to.data) + offset,
                            static_cast<uint64_t>(item.buffer.elements) * elementSize),
                0)
          << item.key;
    }
  }
}

// A snapshot larger than the machine can map (here 384 TiB of weights and
// moments, over a process's whole address space whatever the overcommit
// policy) fails with one error line, not an abort.
TEST(AsyncSave, ASnapshotTooLargeToMapIsAnError) {
  plan::ModelLayout model = workedExample({1});
  model.groups[0] = makeGroup("", {{"huge"}}, {{int64_t(1) << 23, int64_t(1) << 22}}, {1},
                              {layout::Placement::Shard});
  model.optimizerParams = {"huge"};
  Result<plan::RankPlan> rankPlan = planFor(model).rank(0);
  ASSERT_TRUE(rankPlan) << rankPlan.error();
  Result<std::unique_ptr<SaveSnapshot>> snapshot = SaveSnapshot::reserve(*rankPlan, 2, false);
  ASSERT_FALSE(snapshot);
  EXPECT_NE(snapshot.error().find("the async save's snapshot: cannot map"), std::string::npos)
      << snapshot.error();
}

TEST(AsyncSave, DeviceBuffersOverwrittenAfterReturnKeepTheSavedValues) {
  overwriteAfterReturn(slowDevice);
}

TEST(AsyncSave, ASecondSaveWaitsForTheFirstAndReusesTheSnapshotAndBlocks) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile two = planFor(largerModel(2));
  PerRank<Status> saved(2);
  onRanks(2, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(two, std::move(comm), nullptr, {});
    ASSERT_TRUE(opened) << opened.error();
    Checkpointer &checkpointer = **opened;
    ASSERT_TRUE(checkpointer.reserveSnapshot());
    // The direct-I/O blocks every save below writes from, reserved up front.
    ASSERT_TRUE(checkpointer.reserveWriteBlocks(2));
    ASSERT_TRUE(checkpointer.fill(51));
    SaveOptions options;
    options.threads = 2;
    Result<std::shared_ptr<PendingSave>> first = checkpointer.saveAsync(work + "/a", options);
    ASSERT_TRUE(first) << first.error();
    ASSERT_TRUE(checkpointer.fill(52));
    Result<std::shared_ptr<PendingSave>> second = checkpointer.saveAsync(work + "/b", options);
    ASSERT_TRUE(second) << second.error();
    // The second started only after the first had ended.
    EXPECT_TRUE((*first)->done());
    Status status = statusOf((*first)->wait());
    if (status)
      status = statusOf((*second)->wait());
    // A synchronous save after an async one waits for it too.
    if (status) {
      Result<std::shared_ptr<PendingSave>> third = checkpointer.saveAsync(work + "/c");
      status = third ? statusOf(checkpointer.save(work + "/d")) : Status(third.failure());
      if (status)
        status = statusOf((*third)->wait());
    }
    // More workers than the blocks were reserved for: a larger set replaces them.
    if (status)
      status = checkpointer.fill(53);
    if (status) {
      SaveOptions wider;
      wider.threads = 4;
      status = statusOf(checkpointer.save(work + "/e", wider));
    }
    saved.values[rank] = status;
  });
  expectAllOk(saved.values);
  expectAllOk(loadOnRanks(two, work + "/a", 51));
  for (const char *dir : {"/b", "/c", "/d"})
    expectAllOk(loadOnRanks(two, work + dir, 52));
  expectAllOk(loadOnRanks(two, work + "/e", 53));
  (void)createPosixStorage()->removeTree(work);
}

// A caller's slot for the direct-I/O blocks (what a Checkpointer passes for
// its own): the first save makes them there, the next writes from the same
// ones, and both checkpoints load back.
TEST(SaveBlocks, ASaveMakesItsBlocksInTheCallersSlotAndTheNextReusesThem) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  // Where the file system refuses direct I/O a save makes no blocks at all.
  int probe = ::open((work + "/probe").c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (probe < 0) {
    (void)createPosixStorage()->removeTree(work);
    GTEST_SKIP() << "the temporary directory's file system refuses direct I/O";
  }
  ::close(probe);
  plan::PlanFile two = planFor(largerModel(2));
  PerRank<Status> saved(2);
  onRanks(2, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(two, std::move(comm), nullptr, {});
    ASSERT_TRUE(opened) << opened.error();
    Checkpointer &checkpointer = **opened;
    std::unique_ptr<WriteBlocks> kept;
    SaveOptions options;
    options.threads = 2;
    options.keptWriteBlocks = &kept;
    Status status = checkpointer.fill(61);
    if (status)
      status = statusOf(checkpointer.save(work + "/x", options));
    ASSERT_TRUE(kept) << "the save left no blocks in the caller's slot";
    const WriteBlocks *made = kept.get();
    EXPECT_EQ(made->blocks().size(), WriteBlocks::countForSave(2, 0));
    std::vector<char *> blocks = made->blocks();
    if (status)
      status = checkpointer.fill(62);
    if (status)
      status = statusOf(checkpointer.save(work + "/y", options));
    EXPECT_EQ(kept.get(), made);
    EXPECT_EQ(kept->blocks(), blocks);
    saved.values[rank] = status;
  });
  expectAllOk(saved.values);
  expectAllOk(loadOnRanks(two, work + "/x", 61));
  expectAllOk(loadOnRanks(two, work + "/y", 62));
  (void)createPosixStorage()->removeTree(work);
}

/// Where the test holds the removal of a replaced checkpoint, and lets it go.
struct RemovalGate {
  std::mutex mutex;
  std::condition_variable changed;
  bool entered = false, open = false, timedOut = false;
};

/// POSIX storage whose removal of a checkpoint (a tree holding a
/// `.metadata`: what an overwrite replaced) waits for the gate to open.
class GatedRemovalStorage : public ForwardingStorage {
public:
  explicit GatedRemovalStorage(std::shared_ptr<RemovalGate> gate) : gate_(std::move(gate)) {}
  Status removeTree(const std::string &path) override {
    if (base_->exists(path + "/.metadata")) {
      std::unique_lock<std::mutex> lock(gate_->mutex);
      gate_->entered = true;
      gate_->changed.notify_all();
      // Bounded, so that a removal the save waits for fails the test rather than hanging it.
      if (!gate_->changed.wait_for(lock, std::chrono::seconds(10), [&] { return gate_->open; }))
        gate_->timedOut = true;
    }
    return base_->removeTree(path);
  }

private:
  std::shared_ptr<RemovalGate> gate_;
};

TEST(ReplacedRemoval, AnOverwriteReturnsBeforeItAndTheNextSaveWaitsForIt) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile two = planFor(largerModel(2));
  std::string target = work + "/ckpt", staging = target + ".fsdp-staging";
  expectAllOk(saveOnRanks(two, target, 71));
  auto gate = std::make_shared<RemovalGate>();
  PerRank<Status> saved(2);
  onRanks(2, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened = openAndAllocate(
        two, std::move(comm), std::make_unique<GatedRemovalStorage>(gate), {});
    ASSERT_TRUE(opened) << opened.error();
    Checkpointer &checkpointer = **opened;
    bool root = rank == checkpointer.root();
    SaveOptions overwrite;
    overwrite.overwrite = true;
    Status status = checkpointer.fill(72);
    if (status)
      status = statusOf(checkpointer.save(target, overwrite));
    if (root) {
      // The save returned with the replaced checkpoint still at the gate.
      std::unique_lock<std::mutex> lock(gate->mutex);
      EXPECT_TRUE(gate->changed.wait_for(lock, std::chrono::seconds(60),
                                         [&] { return gate->entered; }));
      EXPECT_FALSE(gate->open);
      lock.unlock();
      EXPECT_TRUE(createPosixStorage()->exists(staging + "/.metadata"));
      // A save from elsewhere meanwhile fails busy: the target is still claimed.
      expectAllFailWith(saveOnRanks(planFor(workedExample({1})), target, 74),
                        "busy: another save holds this target", ErrorKind::Busy);
    }
    // The new checkpoint is in place: a load reads it.
    if (status)
      status = checkpointer.fill(73);
    if (status)
      status = checkpointer.load(target) ? checkpointer.check(72)
                                         : makeError("the load failed", ErrorKind::Internal);
    // The next save waits for the removal (else its claim would fail busy).
    std::thread opener;
    if (root)
      opener = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        std::lock_guard<std::mutex> lock(gate->mutex);
        gate->open = true;
        gate->changed.notify_all();
      });
    if (status)
      status = checkpointer.fill(75);
    if (status)
      status = statusOf(checkpointer.save(target, overwrite));
    if (opener.joinable())
      opener.join();
    checkpointer.waitForReplacedRemoval();
    if (root) {
      EXPECT_FALSE(createPosixStorage()->exists(staging));
      EXPECT_FALSE(gate->timedOut) << "a save waited for the removal of what it replaced";
    }
    saved.values[rank] = status;
  });
  expectAllOk(saved.values);
  expectAllOk(loadOnRanks(two, target, 75));
  (void)createPosixStorage()->removeTree(work);
}

TEST(AsyncSave, ErrorsOfAnyRankComeFromWaitOnEveryRank) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile two = planFor(workedExample({2}));
  expectAllOk(saveOnRanks(two, work + "/exists", 61));
  // The target exists and no overwrite was asked for.
  PerRank<Status> exists(2);
  onRanks(2, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(two, std::move(comm), nullptr, {});
    ASSERT_TRUE(opened) << opened.error();
    Result<std::shared_ptr<PendingSave>> pending = (*opened)->saveAsync(work + "/exists");
    ASSERT_TRUE(pending) << pending.error();
    exists.values[rank] = statusOf((*pending)->wait());
  });
  expectAllFailWith(exists.values, "a checkpoint already exists", ErrorKind::InvalidArgument);
  // Rank 1 has no buffers: its snapshot fails, and so does every rank.
  PerRank<Status> unbound(2);
  onRanks(2, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened = Checkpointer::open(two, std::move(comm));
    ASSERT_TRUE(opened) << opened.error();
    if (rank == 0)
      ASSERT_TRUE((*opened)->allocate());
    Result<std::shared_ptr<PendingSave>> pending = (*opened)->saveAsync(work + "/unbound");
    ASSERT_TRUE(pending) << pending.error();
    unbound.values[rank] = statusOf((*pending)->wait());
  });
  expectAllFailWith(unbound.values, "rank 1: ", ErrorKind::InvalidArgument);
  std::unique_ptr<Storage> storage = createPosixStorage();
  EXPECT_FALSE(storage->exists(work + "/unbound"));
  EXPECT_FALSE(storage->exists(work + "/unbound.fsdp-staging"));
  // The checkpointer's destructor waits for a save nobody waited for.
  onRanks(2, [&](int64_t, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(two, std::move(comm), nullptr, {});
    ASSERT_TRUE(opened) << opened.error();
    ASSERT_TRUE((*opened)->fill(62));
    ASSERT_TRUE((*opened)->saveAsync(work + "/unwaited"));
  });
  expectAllOk(loadOnRanks(two, work + "/unwaited", 62));
  (void)storage->removeTree(work);
}

} // namespace
