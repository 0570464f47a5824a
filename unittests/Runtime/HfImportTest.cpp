//===- HfImportTest.cpp - Hugging Face models into a plan's layout --------===//
//
// Ranks as threads (the MultiRank* tests ThreadSanitizer runs), each with
// several worker threads: a checkpoint exported as safetensors (one file,
// and shards) loads into other world sizes and into a simulated device with
// every model element checked and the optimizer state zero; a file that
// lacks a tensor fails every rank alike.
//
//===----------------------------------------------------------------------===//
#include "MultiRank.h"
#include "fsdp/Format/Safetensors.h"
#include "fsdp/Runtime/Export.h"
#include "fsdp/Runtime/HfImport.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

using namespace fsdp;
using namespace fsdp::multirank;
using fsdp::testmodels::workedExample;

namespace {

/// Every rank of `plan` loads the model in `dir` (3 workers each), checks
/// SEED's values of the model's keys and that the optimizer state is zero.
std::vector<Status> loadHfOnRanks(const plan::PlanFile &plan, const std::string &dir,
                                  uint32_t seed, const BackendOf &backendOf = {}) {
  PerRank<Status> statuses(plan.worldSize());
  onRanks(plan.worldSize(), [&](int64_t rank, std::unique_ptr<Communicator> comm) {
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(plan, std::move(comm), nullptr, backendOf);
    Status status = opened ? Status::success() : Status(opened.failure());
    if (status)
      status = (*opened)->fill(seed + 1); // state the load must replace or zero
    if (status) {
      HfLoadOptions options;
      options.threads = 3;
      options.stagingBytes = 64; // a few elements per block: many blocks per piece
      Result<LoadResult> loaded = (*opened)->loadHuggingFace(dir, options);
      status = loaded ? Status::success() : Status(loaded.failure());
      if (loaded && loaded->step && *loaded->step != 0.0f)
        status = makeError("step " + std::to_string(loaded->step.value_or(-1)));
    }
    if (status)
      status = (*opened)->check(seed, KeySelection{{"model"}, {}});
    if (status) {
      // Zeroed, not the other seed's: checking that seed fails on every piece.
      for (const plan::ReadItem &read : (*opened)->plan().reads)
        if (read.source == plan::ItemSource::Buffer && read.buffer.elements > 0 &&
            read.key.rfind("optimizer.", 0) == 0) {
          Result<RankBuffers *> buffers = (*opened)->buffers();
          Result<BufferView> view = (*buffers)->get(read.buffer.group, read.buffer.role);
          std::vector<char> bytes(view->bytes);
          if (Status copied = view->copyOut(0, bytes.size(), bytes.data()); !copied)
            status = copied;
          else if (std::any_of(bytes.begin(), bytes.end(), [](char c) { return c != 0; }))
            status = makeError(read.key + ": optimizer state not zeroed");
          break;
        }
    }
    statuses.values[rank] = status;
  });
  return statuses.values;
}

} // namespace

TEST(MultiRankHf, ExportedModelLoadsIntoOtherLayoutsAndDevices) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile four = planFor(workedExample({4}));
  expectAllOk(saveOnRanks(four, work + "/ckpt", 21));
  std::unique_ptr<Storage> storage = createPosixStorage();
  ExportOptions single;
  ASSERT_TRUE(exportSafetensors(work + "/ckpt", work + "/hf", *storage, single));
  ExportOptions sharded;
  sharded.maxShardBytes = 64; // a file per tensor
  Result<ExportResult> shards = exportSafetensors(work + "/ckpt", work + "/shards", *storage, sharded);
  ASSERT_TRUE(shards) << shards.error();
  EXPECT_GT(shards->files.size(), 2u);
  for (int64_t size : {1, 3})
    expectAllOk(loadHfOnRanks(planFor(workedExample({size})), work + "/hf", 21));
  expectAllOk(loadHfOnRanks(
      planFor(workedExample({2, 2}, {layout::Placement::Replicate, layout::Placement::Shard})),
      work + "/shards", 21));
  // Memory the host may not touch: pieces cast and copied in through staging.
  expectAllOk(loadHfOnRanks(planFor(workedExample({3})), work + "/shards", 21, slowDevice));
  // Another seed is found out.
  for (const Status &status : loadHfOnRanks(planFor(workedExample({2})), work + "/hf", 22))
    EXPECT_FALSE(status);
  (void)storage->removeTree(work);
}

TEST(MultiRankHf, AMissingTensorFailsEveryRank) {
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  // p0 and p2 only: p1 is missing.
  Result<safetensors::FileLayout> layout = safetensors::layoutFile(
      {{"p0", dcp::DType::Float32, {5, 3}}, {"p2", dcp::DType::BFloat16, {4, 4}}}, {});
  ASSERT_TRUE(layout) << layout.error();
  std::string file = layout->header + std::string(layout->fileBytes - layout->header.size(), '\0');
  std::filesystem::create_directories(work + "/hf");
  std::ofstream(work + "/hf/model.safetensors", std::ios::binary) << file;
  expectAllFailWith(loadHfOnRanks(planFor(workedExample({3})), work + "/hf", 1),
                    "model.p1: " + work + "/hf has no tensor 'p1' (2 tensors there",
                    ErrorKind::Incompatible);
  std::unique_ptr<Storage> storage = createPosixStorage();
  (void)storage->removeTree(work);
}
