//===- MemoryBackendTest.cpp - Host memory and the simulated device -------===//
#include "../../runtime/Loader.h"
#include "../../runtime/ModelWeightRefresh.h"
#include "fsdp/Runtime/Buffers.h"
#include "fsdp/Runtime/Cast.h"
#include "fsdp/Runtime/MemoryBackend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

using namespace fsdp;
using namespace fsdp::runtime;

namespace {

TEST(SimulatedDevice, HostAccessFaultsAndCopiesCarryTheBytes) {
  std::shared_ptr<MemoryBackend> device = createSimulatedDeviceBackend();
  EXPECT_FALSE(device->hostAccessible());
  EXPECT_EQ(device->kind(), MemoryKind::Device);
  Result<void *> memory = device->allocate(10000);
  ASSERT_TRUE(memory) << memory.error();
  // The host never reads device memory: here it would fault at once.
  EXPECT_DEATH({ std::printf("%d\n", *static_cast<volatile char *>(*memory)); }, "");
  std::string zeros(10000, 'x');
  ASSERT_TRUE(device->copyOut(*memory, zeros.data(), zeros.size()).get());
  EXPECT_EQ(zeros, std::string(10000, '\0')); // allocated zeroed
  std::string pattern(4000, '\0');
  for (size_t i = 0; i < pattern.size(); ++i)
    pattern[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(device->copyIn(pattern.data(), static_cast<char *>(*memory) + 100, 4000).get());
  std::string back(4000, '\0');
  ASSERT_TRUE(device->copyOut(static_cast<char *>(*memory) + 100, back.data(), 4000).get());
  EXPECT_EQ(back, pattern);
  // A copy past the allocation is an error, not a write somewhere.
  EXPECT_FALSE(device->copyOut(static_cast<char *>(*memory) + 9000, back.data(), 4000).get());
  device->release(*memory);
}

TEST(SimulatedDevice, CopiesCompleteLaterOnTheDevicesThread) {
  SimulatedDeviceOptions options;
  options.copyDelay = std::chrono::milliseconds(50);
  std::shared_ptr<MemoryBackend> device = createSimulatedDeviceBackend(options);
  Result<void *> memory = device->allocate(64);
  ASSERT_TRUE(memory);
  char host[64] = {1};
  auto start = std::chrono::steady_clock::now();
  std::future<Status> copy = device->copyIn(host, *memory, sizeof(host));
  // Issued, not done: the caller must wait on the completion.
  EXPECT_EQ(copy.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  EXPECT_TRUE(copy.get());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  device->release(*memory);
}

TEST(SimulatedDevice, CastsInDeviceMemory) {
  std::shared_ptr<MemoryBackend> device = createSimulatedDeviceBackend();
  Result<void *> main = device->allocate(3 * sizeof(float));
  Result<void *> model = device->allocate(3 * 2);
  ASSERT_TRUE(main && model);
  float values[3] = {1.0f, -2.5f, 1.00390625f}; // the last rounds to even in bf16
  ASSERT_TRUE(device->copyIn(values, *main, sizeof(values)).get());
  ASSERT_TRUE(device->cast(dcp::DType::Float32, *main, dcp::DType::BFloat16, *model, 3));
  uint16_t bf16[3];
  ASSERT_TRUE(device->copyOut(*model, bf16, sizeof(bf16)).get());
  EXPECT_EQ(bf16[0], 0x3F80);
  EXPECT_EQ(bf16[1], 0xC020);
  EXPECT_EQ(bf16[2], 0x3F80);
  device->release(*main);
  device->release(*model);
}

// CUDA refuses a copy whose host side crosses the edge of a registration;
// the simulated device does too, so a caller that pins in pieces and copies
// across them fails here and not only on a GPU.
TEST(SimulatedDevice, CopiesStayWithinOnePinnedRange) {
  std::shared_ptr<MemoryBackend> device = createSimulatedDeviceBackend();
  Result<void *> memory = device->allocate(8192);
  ASSERT_TRUE(memory);
  std::vector<char> host(4 * 4096, 'h');
  char *first = host.data() + 4096, *second = host.data() + 2 * 4096;
  ASSERT_TRUE(device->pinHostMemory(first, 4096));
  ASSERT_TRUE(device->pinHostMemory(second, 4096));
  EXPECT_EQ(device->pinnedHostBytes(), 8192u);
  EXPECT_TRUE(device->copyOut(*memory, first, 4096).get());
  EXPECT_TRUE(device->copyIn(second + 100, *memory, 3000).get());
  Status across = device->copyOut(*memory, first + 2048, 4096).get();
  ASSERT_FALSE(across);
  EXPECT_NE(across.error().find("past the end of pinned host memory"), std::string::npos)
      << across.error();
  // From pageable memory into pinned memory: refused as well.
  std::vector<char> pageable(8192);
  EXPECT_TRUE(device->copyIn(pageable.data(), *memory, 8192).get());
  Status into = device->copyIn(first - 1024, *memory, 2048).get();
  EXPECT_FALSE(into) << "a copy starting before the pinned range and running into it";
  // Unpinned, the same range is plain pageable memory.
  device->unpinHostMemory(first, 4096);
  device->unpinHostMemory(second, 4096);
  EXPECT_EQ(device->pinnedHostBytes(), 0u);
  EXPECT_TRUE(device->copyOut(*memory, first + 2048, 4096).get());
  device->release(*memory);
}

std::future<Status> finishedWith(Status status) {
  std::promise<Status> promise;
  promise.set_value(std::move(status));
  return promise.get_future();
}

TEST(BandStaging, ReadsIntoOneBlockWhileTheOtherIsCopiedIn) {
  StagingPool pool(4096, 2);
  BandStaging staging(&pool);
  Result<char *> first = staging.take(4096);
  ASSERT_TRUE(first);
  std::promise<Status> slowCopy;
  ASSERT_TRUE(staging.copying(slowCopy.get_future(), "model.a"));
  // The next band goes into the other block while the first copy runs.
  Result<char *> second = staging.take(100);
  ASSERT_TRUE(second);
  EXPECT_NE(*first, *second);
  ASSERT_TRUE(staging.copying(finishedWith(Status::success()), "model.b"));
  // The third band needs the first block: it waits for its copy, whose
  // failure it reports under the key that copy was for.
  std::thread device([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    slowCopy.set_value(makeError("CUDA copy in failed", ErrorKind::Internal));
  });
  auto start = std::chrono::steady_clock::now();
  Result<char *> third = staging.take(4096);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(25));
  device.join();
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error(), "model.a: CUDA copy in failed");
  EXPECT_TRUE(staging.finish());
  // Both blocks are back in the pool.
  EXPECT_EQ(pool.acquire(2).size(), 2u);
}

TEST(BandStaging, ABandLargerThanABlockIsCopiedAtOnceFromMemoryOfItsOwn) {
  StagingPool pool(4096, 2);
  BandStaging staging(&pool);
  Result<char *> big = staging.take(10000);
  ASSERT_TRUE(big);
  std::memset(*big, 1, 10000); // its own memory, of the band's size
  Status failed = staging.copying(finishedWith(makeError("no device", ErrorKind::IO)), "w");
  EXPECT_FALSE(failed); // waited for at once
  EXPECT_EQ(failed.error(), "w: no device");
  BandStaging unpooled;
  ASSERT_TRUE(unpooled.take(10));
  EXPECT_TRUE(unpooled.copying(finishedWith(Status::success()), "x"));
  EXPECT_TRUE(unpooled.finish());
  // A failure left pending is reported by finish, once.
  ASSERT_TRUE(staging.take(100));
  ASSERT_TRUE(staging.copying(finishedWith(makeError("lost", ErrorKind::IO)), "y"));
  Status finished = staging.finish();
  EXPECT_EQ(finished.error(), "y: lost");
  EXPECT_TRUE(staging.finish());
}

TEST(StagingPool, GroupsOfBlocksWaitForEachOther) {
  StagingPool pool(5000, 3); // rounded up to whole pages
  EXPECT_EQ(pool.blockBytes(), 8192u);
  std::vector<char *> first = pool.acquire(2);
  ASSERT_EQ(first.size(), 2u);
  std::atomic<bool> got{false};
  std::thread taker([&] {
    std::vector<char *> second = pool.acquire(2); // one is free: waits for a pair
    got = true;
    pool.release(second);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got); // back-pressure: no partial grant
  pool.release(first);
  taker.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(pool.acquire(3).size(), 3u); // every block back
}

/// Two groups: one whose model weight spans several of the host's cast
/// pieces (4 Mi elements, not a multiple), one small, another dtype.
plan::RankPlan castPlan() {
  plan::RankPlan plan;
  auto add = [&](int32_t group, plan::BufferRole role, dcp::DType dtype, int64_t elements) {
    plan::LocalBuffer buffer;
    buffer.group = group;
    buffer.role = role;
    buffer.dtype = dtype;
    buffer.elements = elements;
    plan.buffers.push_back(buffer);
  };
  add(0, plan::BufferRole::MainWeight, dcp::DType::Float32, (int64_t(9) << 20) + 3);
  add(0, plan::BufferRole::ModelWeight, dcp::DType::BFloat16, (int64_t(9) << 20) + 3);
  add(1, plan::BufferRole::MainWeight, dcp::DType::Float32, 1001);
  add(1, plan::BufferRole::ModelWeight, dcp::DType::Float16, 1001);
  return plan;
}

/// The model weights one whole-buffer cast per group gives, from main
/// weights filled with varied values.
std::vector<std::string> castByHand(RankBuffers &buffers) {
  std::vector<std::string> out;
  for (int32_t group : {0, 1}) {
    BufferView main = *buffers.get(group, plan::BufferRole::MainWeight);
    BufferView model = *buffers.get(group, plan::BufferRole::ModelWeight);
    std::vector<float> values(static_cast<size_t>(main.elements));
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<float>(i % 65521) * 0.37f - 9000.5f;
    EXPECT_TRUE(main.copyIn(0, main.bytes, values.data()));
    std::string expected(model.bytes, '\0');
    EXPECT_TRUE(castElements(main.dtype, values.data(), model.dtype, expected.data(),
                             static_cast<uint64_t>(model.elements)));
    out.push_back(expected);
  }
  return out;
}

/// A model weight's bytes (compared by EXPECT_TRUE(a == b): EXPECT_EQ's
/// diff of two 18 MB strings fills the machine's memory).
std::string modelBytes(RankBuffers &buffers, int32_t group) {
  BufferView model = *buffers.get(group, plan::BufferRole::ModelWeight);
  std::string bytes(model.bytes, 'x');
  EXPECT_TRUE(model.copyOut(0, model.bytes, bytes.data()));
  return bytes;
}

TEST(RefreshModelWeights, HostPiecesOnManyThreadsEqualOneCastPerGroup) {
  plan::RankPlan plan = castPlan();
  Result<RankBuffers> buffers = RankBuffers::allocate(plan);
  ASSERT_TRUE(buffers) << buffers.error();
  std::vector<std::string> expected = castByHand(*buffers);
  // One group alone leaves the other as it was (zero).
  ASSERT_TRUE(refreshModelWeights(plan, *buffers, 1, 3));
  EXPECT_TRUE(modelBytes(*buffers, 1) == expected[1]);
  EXPECT_TRUE(modelBytes(*buffers, 0) == std::string(expected[0].size(), '\0'));
  ASSERT_TRUE(refreshModelWeights(plan, *buffers, -1, 3));
  EXPECT_TRUE(modelBytes(*buffers, 0) == expected[0]);
  EXPECT_TRUE(modelBytes(*buffers, 1) == expected[1]);
}

TEST(RefreshModelWeights, ADeviceCastsEachBufferInItsOwnMemory) {
  plan::RankPlan plan = castPlan();
  Result<RankBuffers> buffers = RankBuffers::allocate(plan, createSimulatedDeviceBackend());
  ASSERT_TRUE(buffers) << buffers.error();
  std::vector<std::string> expected = castByHand(*buffers);
  ASSERT_TRUE(refreshModelWeights(plan, *buffers, -1, 4));
  EXPECT_TRUE(modelBytes(*buffers, 0) == expected[0]);
  EXPECT_TRUE(modelBytes(*buffers, 1) == expected[1]);
}

TEST(RefreshModelWeights, AMissingMainWeightIsAnErrorOfEveryWayToCastOrCheck) {
  plan::RankPlan plan = castPlan();
  plan.buffers.erase(plan.buffers.begin() + 2); // group 1's main weight
  Result<RankBuffers> buffers = RankBuffers::allocate(plan);
  ASSERT_TRUE(buffers) << buffers.error();
  ModelWeightRefresh refresh(plan, *buffers);
  EXPECT_FALSE(refresh.castsAsLanded(0)); // nothing casts as it lands
  for (Status status : {refreshModelWeights(plan, *buffers, -1, 2), refresh.finish(2),
                        checkModelWeights(plan, *buffers)}) {
    ASSERT_FALSE(status);
    EXPECT_NE(status.error().find("main_weight"), std::string::npos) << status.error();
  }
}

TEST(ModelWeightRefresh, BytesCastAsTheyLandTheRestAtTheEnd) {
  plan::RankPlan plan = castPlan();
  Result<RankBuffers> buffers = RankBuffers::allocate(plan);
  ASSERT_TRUE(buffers) << buffers.error();
  std::vector<std::string> expected = castByHand(*buffers);
  BufferView main = *buffers->get(0, plan::BufferRole::MainWeight);
  const char *base = static_cast<const char *>(main.data);
  ModelWeightRefresh refresh(plan, *buffers);
  ASSERT_TRUE(refresh.castsAsLanded(0));
  ASSERT_TRUE(refresh.castsAsLanded(1));
  EXPECT_FALSE(refresh.castsAsLanded(7)); // no such group
  // Elements 0-9 land whole, 10 is cut at both ends by two landings, 11-19
  // land, 20-29 never do; bytes outside the buffer are not its.
  refresh.landed(0, base, 42);
  refresh.landed(0, base + 42, 38);
  refresh.landed(0, base + 4 * 20 - 1, 0);
  refresh.landed(0, base - 4, 8);
  refresh.landed(0, base + main.bytes - 4, 8);
  std::string model = modelBytes(*buffers, 0);
  EXPECT_EQ(model.substr(0, 20), expected[0].substr(0, 20)); // elements 0-9
  EXPECT_EQ(model.substr(20, 2), std::string(2, '\0'));      // element 10: cut, not cast yet
  EXPECT_EQ(model.substr(22, 18), expected[0].substr(22, 18));
  EXPECT_TRUE(model.substr(40) == std::string(model.size() - 40, '\0'));
  EXPECT_EQ(modelBytes(*buffers, 1), std::string(expected[1].size(), '\0'));
  EXPECT_FALSE(checkModelWeights(plan, *buffers));
  ASSERT_TRUE(refresh.finish(3));
  EXPECT_TRUE(modelBytes(*buffers, 0) == expected[0]);
  EXPECT_TRUE(modelBytes(*buffers, 1) == expected[1]);
  EXPECT_TRUE(checkModelWeights(plan, *buffers));
}

TEST(ModelWeightRefresh, BytesCopiedInAreCastOnTheWayTheRestAtTheEnd) {
  plan::RankPlan plan = castPlan();
  Result<RankBuffers> buffers = RankBuffers::allocate(plan);
  ASSERT_TRUE(buffers) << buffers.error();
  std::vector<std::string> expected = castByHand(*buffers);
  BufferView main = *buffers->get(0, plan::BufferRole::MainWeight);
  BufferView mainOfOne = *buffers->get(1, plan::BufferRole::MainWeight);
  // What a load copies in: the main weights' values, from elsewhere.
  std::string values(main.bytes, '\0'), valuesOfOne(mainOfOne.bytes, '\0');
  ASSERT_TRUE(main.copyOut(0, main.bytes, values.data()));
  ASSERT_TRUE(mainOfOne.copyOut(0, mainOfOne.bytes, valuesOfOne.data()));
  std::memset(main.data, 0, main.bytes);
  char *base = static_cast<char *>(main.data);
  ModelWeightRefresh refresh(plan, *buffers);
  // As BytesCastAsTheyLandTheRestAtTheEnd, copied in: elements 0-9 whole,
  // 10 cut by two copies, 11-19; bytes outside the buffer only copied.
  refresh.copyLanded(0, base, values.data(), 42);
  refresh.copyLanded(0, base + 42, values.data() + 42, 38);
  refresh.copyLanded(0, base + 4 * 20 - 1, values.data(), 0);
  std::string outside(8, 'x'), copied(8, '\0');
  refresh.copyLanded(0, copied.data(), outside.data(), 8);
  EXPECT_EQ(copied, outside);
  // Group 1's whole buffer at once, on the one-pass f32 -> f16 path.
  refresh.copyLanded(1, static_cast<char *>(mainOfOne.data), valuesOfOne.data(),
                     mainOfOne.bytes);
  EXPECT_TRUE(std::memcmp(base, values.data(), 80) == 0);
  std::string model = modelBytes(*buffers, 0);
  EXPECT_EQ(model.substr(0, 20), expected[0].substr(0, 20)); // elements 0-9
  EXPECT_EQ(model.substr(20, 2), std::string(2, '\0'));      // element 10: cut, not cast yet
  EXPECT_EQ(model.substr(22, 18), expected[0].substr(22, 18));
  EXPECT_TRUE(model.substr(40) == std::string(model.size() - 40, '\0'));
  EXPECT_TRUE(modelBytes(*buffers, 1) == expected[1]);
  // The rest of group 0's main weight lands as a read straight in would.
  std::memcpy(base + 80, values.data() + 80, main.bytes - 80);
  ASSERT_TRUE(refresh.finish(3));
  EXPECT_TRUE(modelBytes(*buffers, 0) == expected[0]);
  EXPECT_TRUE(checkModelWeights(plan, *buffers));
}

TEST(ModelWeightRefresh, ADeviceCastsOnlyAtTheEnd) {
  plan::RankPlan plan = castPlan();
  Result<RankBuffers> buffers = RankBuffers::allocate(plan, createSimulatedDeviceBackend());
  ASSERT_TRUE(buffers) << buffers.error();
  std::vector<std::string> expected = castByHand(*buffers);
  ModelWeightRefresh refresh(plan, *buffers);
  EXPECT_FALSE(refresh.castsAsLanded(0)); // the host may not touch its bytes
  ASSERT_TRUE(refresh.finish(2));
  EXPECT_TRUE(modelBytes(*buffers, 0) == expected[0]);
  EXPECT_TRUE(modelBytes(*buffers, 1) == expected[1]);
}

TEST(CheckModelWeights, NamesTheFirstStaleElement) {
  plan::RankPlan plan = castPlan();
  Result<RankBuffers> buffers = RankBuffers::allocate(plan);
  ASSERT_TRUE(buffers) << buffers.error();
  (void)castByHand(*buffers);
  ASSERT_TRUE(refreshModelWeights(plan, *buffers, -1, 2));
  ASSERT_TRUE(checkModelWeights(plan, *buffers));
  // Group 0's element 5 Mi + 1 (the second piece of the check) goes stale.
  BufferView model = *buffers->get(0, plan::BufferRole::ModelWeight);
  uint64_t stale = (uint64_t(5) << 20) + 1;
  static_cast<uint16_t *>(model.data)[stale] ^= 1;
  Status status = checkModelWeights(plan, *buffers);
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error(), "group 0 model_weight element " + std::to_string(stale) +
                                " is not its main_weight cast to bfloat16");
}

} // namespace
