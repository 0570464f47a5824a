//===- CommitChunkIndexTest.cpp - The plan's chunk index and the commit ---===//
//
// The planner builds the checkpoint's chunk index without checksums and the
// commit fills them in instead of parsing `.metadata`. Both must give the
// bytes the parse path gives: checked here on the index alone and through
// whole saves from plans with and without it.
//
//===----------------------------------------------------------------------===//
#include "../Runtime/MultiRank.h"
#include "fsdp/Format/ChunkIndex.h"
#include "fsdp/Plan/PlanFile.h"
#include "fsdp/Runtime/Storage.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

using namespace fsdp;
using namespace fsdp::plan;

namespace {

using fsdp::testmodels::workedExample;

PlanFile planOf(const ModelLayout &model, bool chunkIndex) {
  PlanFileOptions options;
  options.chunkIndex = chunkIndex;
  Result<std::string> bytes = buildPlanFile(model, options);
  EXPECT_TRUE(bytes) << bytes.error();
  Result<PlanFile> file = PlanFile::fromBytes(bytes.take(), "plan");
  EXPECT_TRUE(file) << file.error();
  return file.take();
}

/// Fake checksums for every item of `.metadata`, as a save gathers them.
std::vector<integrity::ItemChecksum> itemsOf(const dcp::Metadata &metadata) {
  std::vector<integrity::ItemChecksum> items;
  uint64_t digest = 0x1234;
  for (const auto &[index, info] : metadata.storageData)
    items.push_back({index.fqn, info.relativePath, info.offset, info.length, digest += 977});
  return items;
}

std::vector<ModelLayout> models() {
  return {workedExample({1}), workedExample({4}), workedExample({3}),
          workedExample({2, 2}, {layout::Placement::Replicate, layout::Placement::Shard})};
}

TEST(PlanChunkIndex, IsTheParsePathsIndex) {
  for (const ModelLayout &model : models()) {
    PlanFile plan = planOf(model, true);
    Result<std::string> metadata = plan.metadataBytes();
    ASSERT_TRUE(metadata) << metadata.error();
    Result<std::string> index = plan.chunkIndexBytes();
    ASSERT_TRUE(index) << index.error();
    ASSERT_FALSE(index->empty());
    Result<dcp::Metadata> parsed = dcp::parseMetadata(*metadata);
    ASSERT_TRUE(parsed) << parsed.error();
    uint64_t length = metadata->size(), xxh3 = integrity::xxh3(metadata->data(), length);
    Result<std::string> expected = chunkindex::build(*parsed, nullptr, length, xxh3);
    ASSERT_TRUE(expected) << expected.error();
    EXPECT_TRUE(*index == *expected);

    // Filling checksums gives build()'s bytes with them.
    std::vector<integrity::ItemChecksum> items = itemsOf(*parsed);
    Result<std::string> withSums = chunkindex::build(*parsed, &items, length, xxh3);
    ASSERT_TRUE(withSums) << withSums.error();
    std::string filled = *index;
    Result<bool> ok = chunkindex::fillChecksums(filled, items, length, xxh3);
    ASSERT_TRUE(ok) << ok.error();
    EXPECT_TRUE(*ok);
    EXPECT_TRUE(filled == *withSums);
    Result<std::unique_ptr<chunkindex::ChunkIndex>> opened =
        chunkindex::ChunkIndex::fromBytes(filled, "filled");
    ASSERT_TRUE(opened) << opened.error();
    EXPECT_TRUE((*opened)->hasChecksums());
  }
}

TEST(PlanChunkIndex, OlderPlansHaveNone) {
  PlanFile plan = planOf(workedExample({4}), false);
  Result<std::string> index = plan.chunkIndexBytes();
  ASSERT_TRUE(index) << index.error();
  EXPECT_TRUE(index->empty());
}

TEST(PlanChunkIndex, FillingChecksFitsAndLengths) {
  PlanFile plan = planOf(workedExample({4}), true);
  std::string metadata = *plan.metadataBytes();
  std::string index = *plan.chunkIndexBytes();
  uint64_t length = metadata.size(), xxh3 = integrity::xxh3(metadata.data(), length);
  std::vector<integrity::ItemChecksum> items = itemsOf(*dcp::parseMetadata(metadata));

  // A bytes item of another size: the commit must patch `.metadata`.
  std::vector<integrity::ItemChecksum> resized = items;
  for (integrity::ItemChecksum &item : resized)
    if (item.key.rfind("optimizer.param_groups.", 0) == 0) {
      item.length += 5;
      break;
    }
  std::string copy = index;
  Result<bool> ok = chunkindex::fillChecksums(copy, resized, length, xxh3);
  ASSERT_TRUE(ok) << ok.error();
  EXPECT_FALSE(*ok);

  // A tensor item of another size, or none at all: internal errors.
  std::vector<integrity::ItemChecksum> wrong = items;
  for (integrity::ItemChecksum &item : wrong)
    if (item.key == "model.p0") {
      item.length += 1;
      break;
    }
  copy = index;
  ok = chunkindex::fillChecksums(copy, wrong, length, xxh3);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.kind(), ErrorKind::Internal);
  EXPECT_NE(ok.error().find("model.p0"), std::string::npos) << ok.error();

  std::vector<integrity::ItemChecksum> missing;
  for (const integrity::ItemChecksum &item : items)
    if (item.key != "optimizer.state.p2.exp_avg")
      missing.push_back(item);
  copy = index;
  ok = chunkindex::fillChecksums(copy, missing, length, xxh3);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.kind(), ErrorKind::Internal);
  EXPECT_NE(ok.error().find("optimizer.state.p2.exp_avg"), std::string::npos) << ok.error();

  // An index of another `.metadata`.
  copy = index;
  ok = chunkindex::fillChecksums(copy, items, length, xxh3 + 1);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.kind(), ErrorKind::Internal);
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(PlanChunkIndex, SavesWithAndWithoutItAreByteIdentical) {
  using namespace fsdp::multirank;
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  for (const ModelLayout &model : models()) {
    expectAllOk(saveOnRanks(planOf(model, true), work + "/with", 7));
    expectAllOk(saveOnRanks(planOf(model, false), work + "/without", 7));
    for (const char *name : {".fsdp-chunks", ".fsdp-index", ".metadata"}) {
      std::string with = readFile(work + "/with/" + name);
      EXPECT_FALSE(with.empty()) << name;
      EXPECT_TRUE(with == readFile(work + "/without/" + name)) << name;
    }
    std::unique_ptr<runtime::Storage> storage = runtime::createPosixStorage();
    (void)storage->removeTree(work + "/with");
    (void)storage->removeTree(work + "/without");
  }
  std::unique_ptr<runtime::Storage> storage = runtime::createPosixStorage();
  (void)storage->removeTree(work);
}

} // namespace
