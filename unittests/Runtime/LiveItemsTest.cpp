//===- LiveItemsTest.cpp - Items the caller supplies at each save ---------===//
//
// SaveOptions::liveItems on thread-group ranks: the committing rank's bytes
// and tensor items land in `__live_0.distcp` and in `.metadata`, the indexes
// cover them (verify passes), CheckpointReader and a load give them back;
// liveReplacesPlannedBytes drops the plan's hyper-parameters; other ranks'
// items are ignored; bad items fail the save on every rank with nothing
// committed; an async save carries them too.
//
//===----------------------------------------------------------------------===//

#include "MultiRank.h"
#include "fsdp/Format/Pickle.h"
#include "fsdp/Format/Zip.h"
#include "fsdp/Runtime/CheckpointReader.h"

#include <cstring>

using namespace fsdp;
using namespace fsdp::runtime;
using namespace fsdp::multirank;
using fsdp::testmodels::workedExample;

namespace {

/// torch.save of a float (a hyper-parameter as DCP saves it).
std::string floatArchive(double value) {
  pickle::Writer writer(pickle::Writer::Options{/*memoizeAll=*/true});
  writer.real(value);
  Result<std::string> pickled = writer.finish();
  EXPECT_TRUE(pickled) << pickled.error();
  Result<std::string> archive = zip::buildObjectItem(*pickled);
  EXPECT_TRUE(archive) << archive.error();
  return archive.take();
}

LiveItem bytesItem(std::string key, double value, std::vector<dcp::PathPart> path = {}) {
  LiveItem item;
  item.key = std::move(key);
  item.data = floatArchive(value);
  item.path = std::move(path);
  return item;
}

template <typename T>
LiveItem tensorItem(std::string key, dcp::DType dtype, dcp::Dims shape,
                    const std::vector<T> &values) {
  LiveItem item;
  item.key = std::move(key);
  item.isTensor = true;
  item.dtype = dtype;
  item.shape = std::move(shape);
  item.data.assign(reinterpret_cast<const char *>(values.data()), values.size() * sizeof(T));
  return item;
}

/// The items most tests save: a second param group's lr (a bytes item with
/// its planner path), an RNG state (uint8 [5]), a 0-d int64 and a float
/// matrix.
std::vector<LiveItem> someItems() {
  return {bytesItem("optimizer.param_groups.1.lr", 0.25, {"optimizer", "param_groups", 1, "lr"}),
          tensorItem<uint8_t>("extra.rng.cpu", dcp::DType::UInt8, {5}, {1, 2, 3, 250, 255}),
          tensorItem<int64_t>("extra.loader.position", dcp::DType::Int64, {}, {123456789012}),
          tensorItem<float>("extra.ema", dcp::DType::Float32, {2, 3},
                            {0.5f, -1.f, 2.f, 3.25f, 0.f, 1e30f})};
}

Status statusOf(const Result<TransferStats> &result) {
  return result ? Status::success() : Status(result.failure());
}

/// Every rank fills SEED and saves into `dir` with `options`, rank r's live
/// items those of `itemsOf(r)`.
std::vector<Status> saveWith(const plan::PlanFile &plan, const std::string &dir, uint32_t seed,
                             const std::function<SaveOptions(int64_t)> &optionsOf,
                             bool async = false) {
  PerRank<Status> statuses(plan.worldSize());
  onRanks(plan.worldSize(), [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(plan, std::move(comm), nullptr, {});
    Status status = opened ? Status::success() : Status(opened.failure());
    if (status)
      status = (*opened)->fill(seed);
    if (status && async) {
      Result<std::shared_ptr<PendingSave>> pending = (*opened)->saveAsync(dir, optionsOf(rank));
      status = pending ? (*opened)->fill(seed + 1) : Status(pending.failure());
      if (status)
        status = statusOf((*pending)->wait());
    } else if (status) {
      status = statusOf((*opened)->save(dir, optionsOf(rank)));
    }
    statuses.values[rank] = status;
  });
  return statuses.values;
}

/// Every rank loads `dir` and checks SEED; each rank's result.
std::vector<Result<LoadResult>> loadAll(const plan::PlanFile &plan, const std::string &dir,
                                        uint32_t seed) {
  std::vector<Result<LoadResult>> results(plan.worldSize(),
                                          makeError("not run", ErrorKind::Internal));
  onRanks(plan.worldSize(), [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(plan, std::move(comm), nullptr, {});
    if (!opened) {
      results[rank] = opened.failure();
      return;
    }
    Result<LoadResult> loaded = (*opened)->load(dir);
    if (loaded)
      if (Status checked = (*opened)->check(seed); !checked)
        loaded = checked.failure();
    results[rank] = std::move(loaded);
  });
  return results;
}

void expectVerifies(const std::string &dir) {
  std::string problems;
  std::unique_ptr<Storage> storage = createPosixStorage();
  Status verified = verifyCheckpoint(dir, *storage, problems);
  EXPECT_TRUE(verified) << verified.error() << "\n" << problems;
}

/// The live items of `expected` as `.metadata` and the reader hold them.
void expectItemsIn(const std::string &dir, const std::vector<LiveItem> &expected) {
  std::unique_ptr<Storage> storage = createPosixStorage();
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(dir, *storage);
  ASSERT_TRUE(reader) << reader.error();
  const dcp::Metadata &metadata = (*reader)->metadata();
  for (const LiveItem &item : expected) {
    SCOPED_TRACE(item.key);
    const dcp::StorageMetadata *saved = (*reader)->find(item.key);
    ASSERT_NE(saved, nullptr);
    EXPECT_EQ(saved->isBytes, !item.isTensor);
    ASSERT_TRUE(metadata.plannerData);
    auto path = std::find_if(metadata.plannerData->begin(), metadata.plannerData->end(),
                             [&](const auto &entry) { return entry.first == item.key; });
    ASSERT_NE(path, metadata.plannerData->end());
    EXPECT_EQ(path->second, item.path.empty() ? std::vector<dcp::PathPart>{item.key} : item.path);
    if (!item.isTensor) {
      const dcp::StorageInfo *where = (*reader)->storageOf(item.key, std::nullopt);
      ASSERT_NE(where, nullptr);
      EXPECT_EQ(where->relativePath, kLiveFileName);
      EXPECT_EQ(where->offset % 4096, 0u);
      Result<std::string> bytes = (*reader)->bytesItem(item.key);
      ASSERT_TRUE(bytes) << bytes.error();
      EXPECT_EQ(*bytes, item.data);
      continue;
    }
    EXPECT_EQ(saved->properties.dtype, item.dtype);
    EXPECT_EQ(saved->size, item.shape);
    ASSERT_EQ(saved->chunks.size(), 1u);
    EXPECT_EQ(saved->chunks[0].offsets, dcp::Dims(item.shape.size(), 0));
    EXPECT_EQ(saved->chunks[0].sizes, item.shape);
    const dcp::StorageInfo *where = (*reader)->storageOf(item.key, saved->chunks[0].offsets);
    ASSERT_NE(where, nullptr);
    EXPECT_EQ(where->relativePath, kLiveFileName);
    EXPECT_EQ(where->offset % 4096, 0u);
    Result<TensorItem *> opened = (*reader)->tensorItem(item.key, saved->chunks[0]);
    ASSERT_TRUE(opened) << opened.error();
    std::string data((*opened)->record.storageBytes(), '\0');
    ASSERT_TRUE((*reader)->readStorage(**opened, data.data()));
    EXPECT_EQ(data, item.data);
  }
}

void expectTensorItems(const LoadResult &loaded, const std::vector<LiveItem> &expected) {
  size_t tensors = 0;
  for (const LiveItem &item : expected) {
    SCOPED_TRACE(item.key);
    if (!item.isTensor) {
      auto found = loaded.bytesItems.find(item.key);
      ASSERT_NE(found, loaded.bytesItems.end());
      EXPECT_EQ(found->second, item.data);
      continue;
    }
    ++tensors;
    auto found = loaded.tensorItems.find(item.key);
    ASSERT_NE(found, loaded.tensorItems.end());
    EXPECT_TRUE(found->second.isTensor);
    EXPECT_EQ(found->second.key, item.key);
    EXPECT_EQ(found->second.dtype, item.dtype);
    EXPECT_EQ(found->second.shape, item.shape);
    EXPECT_EQ(found->second.data, item.data);
  }
  EXPECT_EQ(loaded.tensorItems.size(), tensors);
}

TEST(LiveItems, SavedByTheCommittingRankAndReadBack) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  std::vector<LiveItem> items = someItems();
  for (int64_t ranks : {1, 2}) {
    SCOPED_TRACE(ranks);
    plan::PlanFile plan = planFor(workedExample({ranks}));
    std::string dir = work + "/ckpt" + std::to_string(ranks);
    // Rank 1's items (a clash with a planned key, even) are ignored.
    expectAllOk(saveWith(plan, dir, 7, [&](int64_t rank) {
      SaveOptions options;
      if (rank == plan.commitRank())
        options.liveItems = items;
      else
        options.liveItems = {bytesItem("model.p0", 1.0), bytesItem("model.p0", 2.0)};
      return options;
    }));
    expectVerifies(dir);
    expectItemsIn(dir, items);
    // The planned items are all there too.
    std::unique_ptr<Storage> storage = createPosixStorage();
    Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(dir, *storage);
    ASSERT_TRUE(reader) << reader.error();
    EXPECT_NE((*reader)->find("optimizer.param_groups.0.lr"), nullptr);
    EXPECT_NE((*reader)->find("model.p0"), nullptr);
    EXPECT_TRUE(storage->exists(dir + "/" + chunkindex::kChunkIndexFileName));
    // A load (through the chunk index) gives every live item back on
    // every rank; the steps it reads are not tensor items.
    for (Result<LoadResult> &loaded : loadAll(plan, dir, 7)) {
      ASSERT_TRUE(loaded) << loaded.error();
      expectTensorItems(*loaded, items);
      EXPECT_EQ(loaded->bytesItems.count("optimizer.param_groups.0.lr"), 1u);
    }
  }
  (void)createPosixStorage()->removeTree(work);
}

TEST(LiveItems, ThroughTheMetadataWhenThereIsNoChunkIndex) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  std::vector<LiveItem> items = someItems();
  plan::PlanFile plan = planFor(workedExample({1}));
  expectAllOk(saveWith(plan, work + "/ckpt", 9, [&](int64_t) {
    SaveOptions options;
    options.liveItems = items;
    return options;
  }));
  std::unique_ptr<Storage> storage = createPosixStorage();
  ASSERT_TRUE(storage->removeTree(work + "/ckpt/" + chunkindex::kChunkIndexFileName));
  // Loads then read `.metadata` (and `.fsdp-index`).
  for (Result<LoadResult> &loaded : loadAll(plan, work + "/ckpt", 9)) {
    ASSERT_TRUE(loaded) << loaded.error();
    expectTensorItems(*loaded, items);
  }
  (void)storage->removeTree(work);
}

TEST(LiveItems, ReplacePlannedBytes) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  // Two param groups as the job has them now: group 0's lr changed.
  std::vector<LiveItem> items = {
      bytesItem("optimizer.param_groups.0.lr", 0.5, {"optimizer", "param_groups", 0, "lr"}),
      bytesItem("optimizer.param_groups.0.initial_lr", 1.0,
                {"optimizer", "param_groups", 0, "initial_lr"}),
      bytesItem("optimizer.param_groups.1.lr", 0.125, {"optimizer", "param_groups", 1, "lr"}),
      tensorItem<float>("extra.scale", dcp::DType::Float32, {}, {4.f})};
  for (int64_t ranks : {1, 2}) {
    SCOPED_TRACE(ranks);
    plan::PlanFile plan = planFor(workedExample({ranks}));
    std::string dir = work + "/ckpt" + std::to_string(ranks);
    expectAllOk(saveWith(plan, dir, 11, [&](int64_t) {
      SaveOptions options;
      options.liveItems = items;
      options.liveReplacesPlannedBytes = true;
      return options;
    }));
    expectVerifies(dir); // the planned bytes items are still in their files, unreferenced
    expectItemsIn(dir, items);
    std::unique_ptr<Storage> storage = createPosixStorage();
    Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(dir, *storage);
    ASSERT_TRUE(reader) << reader.error();
    std::vector<std::string> bytesKeys = (*reader)->bytesKeys();
    EXPECT_EQ(bytesKeys, (std::vector<std::string>{"optimizer.param_groups.0.initial_lr",
                                                   "optimizer.param_groups.0.lr",
                                                   "optimizer.param_groups.1.lr"}));
    for (const char *gone : {"optimizer.param_groups.0.betas", "optimizer.param_groups.0.params"})
      EXPECT_EQ((*reader)->find(gone), nullptr) << gone;
    const dcp::Metadata &metadata = (*reader)->metadata();
    for (const auto &[key, path] : *metadata.plannerData)
      EXPECT_TRUE(metadata.stateDictMetadata.end() !=
                  std::find_if(metadata.stateDictMetadata.begin(), metadata.stateDictMetadata.end(),
                               [&](const auto &entry) { return entry.first == key; }))
          << key;
    // The planned hyper-parameters are still checksummed.
    size_t planned = 0;
    for (const integrity::ItemChecksum &item : (*reader)->index()->items)
      planned += item.key == "optimizer.param_groups.0.betas";
    EXPECT_EQ(planned, 1u);
    for (Result<LoadResult> &loaded : loadAll(plan, dir, 11)) {
      ASSERT_TRUE(loaded) << loaded.error();
      expectTensorItems(*loaded, items);
      EXPECT_EQ(loaded->bytesItems.size(), 3u);
    }
  }
  // Replacing with nothing: no bytes items at all.
  plan::PlanFile plan = planFor(workedExample({1}));
  expectAllOk(saveWith(plan, work + "/none", 11, [&](int64_t) {
    SaveOptions options;
    options.liveReplacesPlannedBytes = true;
    return options;
  }));
  expectVerifies(work + "/none");
  std::unique_ptr<Storage> storage = createPosixStorage();
  Result<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::open(work + "/none", *storage);
  ASSERT_TRUE(reader) << reader.error();
  EXPECT_TRUE((*reader)->bytesKeys().empty());
  EXPECT_FALSE(storage->exists(work + "/none/" + kLiveFileName));
  (void)storage->removeTree(work);
}

TEST(LiveItems, AsyncSaveCarriesThem) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  std::vector<LiveItem> items = someItems();
  plan::PlanFile plan = planFor(workedExample({2}));
  expectAllOk(saveWith(
      plan, work + "/ckpt", 13,
      [&](int64_t) {
        SaveOptions options;
        options.liveItems = items;
        return options;
      },
      /*async=*/true));
  expectVerifies(work + "/ckpt");
  expectItemsIn(work + "/ckpt", items);
  for (Result<LoadResult> &loaded : loadAll(plan, work + "/ckpt", 13)) {
    ASSERT_TRUE(loaded) << loaded.error();
    expectTensorItems(*loaded, items);
  }
  (void)createPosixStorage()->removeTree(work);
}

TEST(LiveItems, BadItemsFailEveryRankWithNothingCommitted) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  std::unique_ptr<Storage> storage = createPosixStorage();
  plan::PlanFile plan = planFor(workedExample({2}));
  struct Case {
    const char *name;
    std::vector<LiveItem> items;
    bool replace;
    const char *error;
  };
  LiveItem wrongSize = tensorItem<float>("extra.t", dcp::DType::Float32, {2, 2}, {1.f, 2.f, 3.f});
  LiveItem negative = tensorItem<float>("extra.t", dcp::DType::Float32, {-1}, {});
  LiveItem huge =
      tensorItem<float>("extra.t", dcp::DType::Float32, {int64_t(1) << 40, int64_t(1) << 40}, {});
  LiveItem notArchive;
  notArchive.key = "extra.raw";
  notArchive.data = "not a torch.save archive";
  LiveItem nul = bytesItem(std::string("extra.a\0b", 9), 1.0);
  LiveItem longKey = bytesItem(std::string(kMaxLiveKeyBytes + 1, 'k'), 1.0);
  LiveItem badUtf8 = bytesItem("extra.\xff", 1.0);
  std::vector<Case> cases = {
      {"duplicate",
       {bytesItem("extra.a", 1.0), bytesItem("extra.a", 2.0)},
       false,
       "live item 'extra.a' is given twice"},
      {"planned-bytes",
       {bytesItem("optimizer.param_groups.0.lr", 1.0)},
       false,
       "live item 'optimizer.param_groups.0.lr': the plan saves this key"},
      {"planned-tensor",
       {tensorItem<float>("model.p1", dcp::DType::Float32, {}, {1.f})},
       true,
       "live item 'model.p1': the plan saves this key"},
      {"size", {wrongSize}, false, "takes 16 bytes, but its data has 12"},
      {"negative", {negative}, false, "negative size"},
      {"overflow", {huge}, false, "too many elements"},
      {"archive", {notArchive}, false, "must be a complete torch.save archive"},
      {"empty-key", {bytesItem("", 1.0)}, false, "empty key"},
      {"nul", {nul}, false, "NUL"},
      {"long-key", {longKey}, false, "the key has 65537 bytes"},
      {"utf8", {badUtf8}, false, "not valid UTF-8"},
  };
  for (const Case &test : cases) {
    SCOPED_TRACE(test.name);
    std::string dir = work + "/" + test.name;
    expectAllFailWith(saveWith(plan, dir, 3,
                               [&](int64_t rank) {
                                 SaveOptions options;
                                 if (rank == plan.commitRank())
                                   options.liveItems = test.items;
                                 options.liveReplacesPlannedBytes = test.replace;
                                 return options;
                               }),
                      test.error, ErrorKind::InvalidArgument);
    EXPECT_FALSE(storage->exists(dir));
    EXPECT_FALSE(storage->exists(dir + ".fsdp-staging"));
    EXPECT_FALSE(storage->exists(dir + ".fsdp-lock"));
  }
  // checkLiveItems alone says the same.
  EXPECT_FALSE(checkLiveItems({wrongSize}));
  EXPECT_TRUE(checkLiveItems(someItems()));
  (void)storage->removeTree(work);
}

TEST(LiveItems, UnplannedTensorsOfOneWholeChunkAreTensorItems) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  // Saved with an optimizer from two ranks, loaded by a plan without one:
  // the 0-d steps (one chunk each) come back as tensor items, the moments
  // only where one chunk holds the whole tensor.
  plan::PlanFile two = planFor(workedExample({2}));
  expectAllOk(saveOnRanks(two, work + "/ckpt", 5));
  plan::ModelLayout frozen = workedExample({2});
  frozen.optimizer.present = false;
  frozen.optimizerParams.clear();
  for (auto &group : frozen.groups)
    group = fsdp::testmodels::makeGroup("", {{"p0"}, {"p1"}, {"p2"}}, {{5, 3}, {7}, {4, 4}}, {2},
                                        {layout::Placement::Shard}, /*trainable=*/false);
  plan::PlanFile plan = planFor(frozen);
  std::unique_ptr<Storage> storage = createPosixStorage();
  Result<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::open(work + "/ckpt", *storage);
  ASSERT_TRUE(reader) << reader.error();
  for (Result<LoadResult> &loaded : loadAll(plan, work + "/ckpt", 5)) {
    ASSERT_TRUE(loaded) << loaded.error();
    size_t expected = 0;
    for (const auto &[key, saved] : (*reader)->metadata().stateDictMetadata) {
      if (saved.isBytes || key.rfind("model.", 0) == 0)
        continue;
      bool whole = saved.chunks.size() == 1;
      expected += whole;
      EXPECT_EQ(loaded->tensorItems.count(key), whole ? 1u : 0u) << key;
    }
    EXPECT_EQ(loaded->tensorItems.size(), expected);
    const LiveItem &step = loaded->tensorItems.at("optimizer.state.p0.step");
    EXPECT_EQ(step.dtype, dcp::DType::Float32);
    EXPECT_TRUE(step.shape.empty());
    float value = 0;
    ASSERT_EQ(step.data.size(), sizeof value);
    std::memcpy(&value, step.data.data(), sizeof value);
    EXPECT_EQ(value, 1.0f);
  }
  (void)storage->removeTree(work);
}

} // namespace
