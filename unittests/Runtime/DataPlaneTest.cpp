//===- DataPlaneTest.cpp - Replica groups and the communicator data plane -===//
#include "MultiRank.h"
#include "fsdp/Runtime/DataPlane.h"

#include <cstring>
#include <numeric>

using namespace fsdp;
using namespace fsdp::runtime;
using namespace fsdp::multirank;
using layout::Placement;

namespace {

plan::ModelLayout hsdp(int64_t replicas, int64_t shards) {
  return testmodels::workedExample({replicas, shards}, {Placement::Replicate, Placement::Shard});
}

/// The worked example's parameters, large enough (1.2 MB of state) that the
/// items, not `.metadata` and the indexes, are most of what a load reads.
plan::ModelLayout largeHsdp(int64_t replicas, int64_t shards) {
  plan::ModelLayout model = hsdp(replicas, shards);
  model.groups[0] = testmodels::makeGroup("", {{"p0"}, {"p1"}, {"p2"}},
                                          {{512, 64}, {1024}, {256, 256}}, {replicas, shards},
                                          {Placement::Replicate, Placement::Shard});
  return model;
}

TEST(ReplicaDigest, EqualForReplicasOnlyAndMindsEveryField) {
  plan::ModelLayout model = hsdp(2, 2);
  Result<plan::RankPlan> r0 = plan::planRank(model, 0), r1 = plan::planRank(model, 1),
                         r2 = plan::planRank(model, 2);
  ASSERT_TRUE(r0 && r1 && r2);
  // Ranks (0, 0) and (1, 0) hold the same shard; (0, 1) another.
  std::vector<int64_t> coords0 = r0->coords, coords2 = r2->coords;
  ASSERT_EQ(coords0[1], coords2[1]);
  EXPECT_EQ(replicaDigest(*r0), replicaDigest(*r2));
  EXPECT_NE(replicaDigest(*r0), replicaDigest(*r1));
  EXPECT_EQ(replicaDigest(*r0).size(), 16u);
  // Any field of a read that decides where bytes land changes the digest.
  plan::RankPlan changed = *r0;
  for (plan::ReadItem &read : changed.reads)
    if (read.source == plan::ItemSource::Buffer) {
      read.buffer.localOffset += 1;
      break;
    }
  EXPECT_NE(replicaDigest(changed), replicaDigest(*r0));
}

TEST(ReplicaGroups, SplitGroupsRanksThatLoadTheSameBytes) {
  plan::ModelLayout model = hsdp(3, 2); // 6 ranks: groups {0,2,4} and {1,3,5}
  PerRank<std::pair<int64_t, int64_t>> places(6);
  onRanks(6, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<plan::RankPlan> rankPlan = plan::planRank(model, rank);
    ASSERT_TRUE(rankPlan);
    Result<std::unique_ptr<Communicator>> group = splitReplicaGroup(*rankPlan, *comm, 0);
    ASSERT_TRUE(group) << group.error();
    ASSERT_TRUE(*group);
    places.values[rank] = {(*group)->rank(), (*group)->size()};
  });
  for (int64_t rank = 0; rank < 6; ++rank)
    EXPECT_EQ(places.values[rank], std::make_pair(rank / 2, int64_t(3))) << rank;
}

TEST(ReplicaGroups, NoGroupWhenNoTwoRanksShareUnlessAskedFor) {
  plan::ModelLayout model = testmodels::workedExample({4});
  PerRank<int64_t> sizes(4);
  onRanks(4, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<plan::RankPlan> rankPlan = plan::planRank(model, rank);
    ASSERT_TRUE(rankPlan);
    Result<std::unique_ptr<Communicator>> none = splitReplicaGroup(*rankPlan, *comm, 0);
    ASSERT_TRUE(none);
    EXPECT_FALSE(*none);
    Result<std::unique_ptr<Communicator>> alone =
        splitReplicaGroup(*rankPlan, *comm, 0, /*evenAlone=*/true);
    ASSERT_TRUE(alone && *alone);
    sizes.values[rank] = (*alone)->size();
  });
  EXPECT_EQ(sizes.values, std::vector<int64_t>(4, 1));
}

/// Three members each own one transfer; every member ends with all three.
void broadcastsReachEveryMember(const BackendOf &backendOf) {
  constexpr uint64_t kBytes = 3 * 100000 + 17; // pieces larger than the staging
  onRanks(3, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    std::shared_ptr<MemoryBackend> backend = backendOf();
    std::unique_ptr<ReplicaDataPlane> plane =
        createCommunicatorDataPlane(std::move(comm), /*stagingBytes=*/65536);
    Result<void *> memory = backend->allocate(kBytes);
    ASSERT_TRUE(memory);
    std::vector<char> host(kBytes, 0);
    uint64_t third = kBytes / 3;
    std::vector<ReplicaDataPlane::Transfer> transfers;
    for (int64_t member = 0; member < 3; ++member) {
      uint64_t begin = member * third, end = member == 2 ? kBytes : begin + third;
      transfers.push_back({static_cast<char *>(*memory) + begin, end - begin, member});
      if (member == rank)
        for (uint64_t i = begin; i < end; ++i)
          host[i] = static_cast<char>(i * 31 + member);
    }
    ASSERT_TRUE(backend->copyIn(host.data(), *memory, kBytes).get());
    Status status = plane->broadcast(transfers, *backend);
    ASSERT_TRUE(status) << status.error();
    std::vector<char> out(kBytes);
    ASSERT_TRUE(backend->copyOut(*memory, out.data(), kBytes).get());
    for (uint64_t i = 0; i < kBytes; ++i) {
      int64_t member = std::min<int64_t>(2, static_cast<int64_t>(i / third));
      ASSERT_EQ(out[i], static_cast<char>(i * 31 + member)) << "rank " << rank << " byte " << i;
    }
    EXPECT_STREQ(plane->name(), "communicator");
    backend->release(*memory);
  });
}

TEST(CommunicatorDataPlane, BroadcastsHostMemoryInPlace) {
  broadcastsReachEveryMember([] { return createHostBackend(); });
}

TEST(CommunicatorDataPlane, StagesDeviceMemoryThroughTheHost) {
  broadcastsReachEveryMember([] { return createSimulatedDeviceBackend(); });
}

/// Every rank of an HSDP mesh loads, checks, and reports what it read.
std::vector<TransferStats> loadAndCheck(const plan::PlanFile &plan, const std::string &dir,
                                        uint32_t seed, bool share, const BackendOf &backendOf) {
  PerRank<TransferStats> stats(plan.worldSize());
  onRanks(plan.worldSize(), [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(plan, std::move(comm), nullptr, backendOf);
    ASSERT_TRUE(opened) << opened.error();
    (*opened)->shareReplicaReads(share);
    Result<LoadResult> loaded = (*opened)->load(dir);
    ASSERT_TRUE(loaded) << loaded.error();
    Status checked = (*opened)->check(seed);
    EXPECT_TRUE(checked) << "rank " << rank << ": " << checked.error();
    stats.values[rank] = loaded->stats;
  });
  return stats.values;
}

void hsdpLoadsReadEachByteOnce(const BackendOf &backendOf) {
  std::string dir = tempDir() + "/ckpt";
  plan::PlanFile plan = planFor(largeHsdp(2, 3));
  for (const Status &status : saveOnRanks(plan, dir, 11, {}, backendOf))
    ASSERT_TRUE(status) << status.error();
  std::vector<TransferStats> shared = loadAndCheck(plan, dir, 11, true, backendOf);
  std::vector<TransferStats> alone = loadAndCheck(plan, dir, 11, false, backendOf);
  uint64_t sharedRead = 0, aloneRead = 0, fromPeers = 0, loaded = 0;
  for (size_t rank = 0; rank < shared.size(); ++rank) {
    sharedRead += shared[rank].bytesReadStorage;
    aloneRead += alone[rank].bytesReadStorage;
    fromPeers += shared[rank].bytesFromPeers;
    loaded += shared[rank].bytes;
    EXPECT_EQ(shared[rank].bytes, alone[rank].bytes) << rank; // the same bytes land
    EXPECT_EQ(alone[rank].bytesFromPeers, 0u);
  }
  // Half the piece bytes came from the other replica, so half were read.
  EXPECT_EQ(fromPeers * 2, loaded);
  EXPECT_LT(sharedRead, aloneRead * 6 / 10);
  EXPECT_GT(sharedRead, aloneRead * 4 / 10);
}

TEST(ReplicaLoads, HostBuffersReadEachByteOncePerGroup) {
  hsdpLoadsReadEachByteOnce({});
}

TEST(ReplicaLoads, DeviceBuffersReadEachByteOncePerGroup) {
  hsdpLoadsReadEachByteOnce([] { return slowDevice(); });
}

TEST(ReplicaLoads, ADataPlaneThatCannotStartFailsEveryRank) {
  std::string dir = tempDir() + "/ckpt";
  plan::PlanFile plan = planFor(hsdp(2, 2));
  for (const Status &status : saveOnRanks(plan, dir, 3))
    ASSERT_TRUE(status) << status.error();
  PerRank<Status> statuses(4);
  onRanks(4, [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(plan, std::move(comm), nullptr, {});
    ASSERT_TRUE(opened);
    // Rank 3's data plane fails to start (as NCCL may): every rank's load fails.
    (*opened)->useDataPlane(
        [rank](std::unique_ptr<Communicator> group) -> Result<std::unique_ptr<ReplicaDataPlane>> {
          if (rank == 3)
            return makeError("no data plane here", ErrorKind::IO);
          return createCommunicatorDataPlane(std::move(group));
        });
    Result<LoadResult> loaded = (*opened)->load(dir);
    statuses.values[rank] = loaded ? Status::success() : Status(loaded.failure());
  });
  for (const Status &status : statuses.values) {
    ASSERT_FALSE(status);
    EXPECT_NE(status.error().find("no data plane here"), std::string::npos) << status.error();
  }
}

TEST(Pinning, StagingPoolAndSnapshotArePinnedByTheDeviceBackend) {
  plan::PlanFile plan = planFor(testmodels::workedExample({1}));
  std::shared_ptr<MemoryBackend> device = createSimulatedDeviceBackend();
  onRanks(1, [&](int64_t, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened = Checkpointer::open(plan, std::move(comm));
    ASSERT_TRUE(opened);
    Checkpointer &checkpointer = **opened;
    checkpointer.useMemoryBackend(device);
    EXPECT_EQ(device->pinnedHostBytes(), 0u);
    ASSERT_TRUE(checkpointer.reserveStaging(2, 1 << 20)); // 4 blocks of 256 KiB
    EXPECT_EQ(device->pinnedHostBytes(), uint64_t(1) << 20);
    ASSERT_TRUE(checkpointer.allocate()); // keeps the pool reserved above
    EXPECT_EQ(device->pinnedHostBytes(), uint64_t(1) << 20);
    ASSERT_TRUE(checkpointer.reserveSnapshot());
    EXPECT_GT(device->pinnedHostBytes(), uint64_t(1) << 20);
  });
  EXPECT_EQ(device->pinnedHostBytes(), 0u); // everything unpinned with the checkpointer
}

TEST(Pinning, HostBuffersPinNothingAndStagingIsReservedBeforeTheFirstSave) {
  std::shared_ptr<MemoryBackend> device = createSimulatedDeviceBackend();
  {
    StagingPool pool(4096, 3, device);
    EXPECT_EQ(device->pinnedHostBytes(), 3u * 4096);
  }
  EXPECT_EQ(device->pinnedHostBytes(), 0u);
  StagingPool unpinned(4096, 2);
  EXPECT_EQ(unpinned.blocks(), 2u);
}

} // namespace
