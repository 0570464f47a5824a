//===- CheckpointPlanTest.cpp - Per-rank plans and the global metadata ----===//
#include "fsdp/Plan/CheckpointPlan.h"
#include "fsdp/Format/Limits.h"
#include "../TestModels.h"
#include "fsdp/Layout/Overlap.h"
#include "fsdp/Plan/PlanFile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <unistd.h>

using namespace fsdp;
using namespace fsdp::plan;

namespace {

using fsdp::testmodels::makeGroup;
using fsdp::testmodels::moeExample;
using fsdp::testmodels::workedExample;

std::set<std::string> keysOf(const RankPlan &plan) {
  std::set<std::string> keys;
  for (const WriteItem &item : plan.writes)
    keys.insert(item.key +
                (item.chunkOffsets.empty() ? "" : "@" + std::to_string(item.chunkOffsets[0])));
  return keys;
}

/// Every invariant a plan must hold, over all ranks of `model`.
void checkWholePlan(const ModelLayout &model) {
  int64_t world = model.worldSize();
  std::map<std::string, std::vector<layout::Box>> chunksOf;
  std::map<std::string, dcp::Dims> shapeOf;
  std::map<std::pair<std::string, dcp::Dims>, std::pair<int64_t, const WriteItem *>> writer;
  std::vector<RankPlan> plans;
  for (int64_t rank = 0; rank < world; ++rank) {
    Result<RankPlan> plan = planRank(model, rank);
    ASSERT_TRUE(plan.ok()) << plan.error();
    plans.push_back(plan.take());
  }
  for (const RankPlan &plan : plans) {
    uint64_t end = 0;
    for (const WriteItem &item : plan.writes) {
      // Items are 4 KiB aligned, in file order, and never overlap.
      EXPECT_EQ(item.itemOffset % kItemAlignment, 0u) << item.key;
      EXPECT_GE(item.itemOffset, end) << item.key;
      end = item.itemOffset + item.itemLength;
      if (item.source != ItemSource::Bytes) {
        EXPECT_GE(item.dataOffset, item.itemOffset);
        EXPECT_LE(item.dataOffset + item.dataLength, end);
        EXPECT_EQ((item.dataOffset - item.itemOffset) % 64, 0u);
      }
      auto key = std::make_pair(item.key, item.chunkOffsets);
      EXPECT_EQ(writer.count(key), 0u) << item.key << " written twice";
      writer[key] = {plan.rank, &item};
      if (item.source == ItemSource::Buffer) {
        chunksOf[item.key].push_back({item.chunkOffsets, item.chunkSizes});
        shapeOf[item.key] = item.globalShape;
        int64_t elements = 1;
        for (int64_t size : item.chunkSizes)
          elements *= size;
        EXPECT_EQ(elements, item.buffer.elements);
        EXPECT_EQ(item.dataLength, elements * dcp::dtypeInfo(item.dtype).elementSize);
        // The data sits in its file's page where the piece sits in its
        // buffer's (a load reads it straight into place), where that keeps
        // zip's 64-byte alignment.
        uint64_t inBuffer = static_cast<uint64_t>(item.buffer.localOffset) *
                            dcp::dtypeInfo(item.dtype).elementSize;
        if (inBuffer % 64 == 0)
          EXPECT_EQ(item.dataOffset % 4096, inBuffer % 4096) << item.key;
      }
    }
    if (!plan.writes.empty())
      EXPECT_EQ(plan.files.at(0).size, end);
  }
  // Every tensor key is tiled exactly by its chunks.
  for (auto &[key, boxes] : chunksOf) {
    layout::Box whole{dcp::Dims(shapeOf[key].size(), 0), shapeOf[key]};
    EXPECT_TRUE(layout::covers(boxes, whole)) << key << " is not covered";
    int64_t total = 0;
    for (const layout::Box &box : boxes)
      total += layout::boxElements(box);
    EXPECT_EQ(total, layout::boxElements(whole)) << key << " has overlapping chunks";
  }
  // Reads: each rank reads exactly the pieces it holds, from their writer.
  for (const RankPlan &plan : plans) {
    for (const ReadItem &read : plan.reads) {
      auto found = writer.find({read.key, read.chunkOffsets});
      ASSERT_NE(found, writer.end()) << read.key << " read but never written";
      const WriteItem &write = *found->second.second;
      EXPECT_EQ(read.file, dataFileName(found->second.first)) << read.key;
      EXPECT_EQ(read.dataOffset, write.dataOffset) << read.key;
      EXPECT_EQ(read.dataLength, write.dataLength) << read.key;
    }
    // Same layout: the pieces this rank holds are the ones its shard writes.
    size_t bufferReads = 0;
    for (const ReadItem &read : plan.reads)
      bufferReads += read.source == ItemSource::Buffer;
    // Tied parameters' other FQNs are written but read once, by the leading FQN.
    std::set<std::string> secondaryKeys;
    for (const GroupSpec &group : model.groups)
      for (const MemberSpec &member : group.members)
        for (size_t f = 1; f < member.fqns.size(); ++f)
          secondaryKeys.insert("model." + member.fqns[f]);
    size_t held = 0;
    for (const auto &[key, entry] : writer) {
      const WriteItem &write = *entry.second;
      if (write.source != ItemSource::Buffer || secondaryKeys.count(write.key))
        continue;
      // Shards on the group's own mesh (an experts group's, per expert coordinate).
      std::vector<int64_t> shardOf = groupShardOfRank(model, model.groups[write.buffer.group]);
      held += shardOf[entry.first] == shardOf[plan.rank];
    }
    EXPECT_EQ(bufferReads, held) << "rank " << plan.rank;
  }
  // The global metadata agrees with the per-rank plans and survives a round trip.
  Result<dcp::Metadata> metadata = planGlobalMetadata(model);
  ASSERT_TRUE(metadata.ok()) << metadata.error();
  EXPECT_EQ(metadata->storageData.size(), writer.size());
  for (const auto &[index, storage] : metadata->storageData) {
    auto found = writer.find({index.fqn, index.offset.value_or(dcp::Dims())});
    ASSERT_NE(found, writer.end()) << index.fqn;
    EXPECT_EQ(storage.relativePath, dataFileName(found->second.first));
    EXPECT_EQ(storage.offset, found->second.second->itemOffset);
    EXPECT_EQ(storage.length, found->second.second->itemLength);
  }
  Result<std::string> pickled = dcp::serializeMetadata(*metadata);
  ASSERT_TRUE(pickled.ok()) << pickled.error();
  Result<dcp::Metadata> parsed = dcp::parseMetadata(*pickled);
  ASSERT_TRUE(parsed.ok()) << parsed.error();
  EXPECT_TRUE(*parsed == *metadata);
  // Streamed, the pickle has the same bytes, and so has the one rank 0's
  // plan carries (deflated).
  std::string streamed;
  Result<uint64_t> size = streamGlobalMetadata(model, [&](std::string_view piece) {
    streamed.append(piece);
    return Status::success();
  });
  ASSERT_TRUE(size.ok()) << size.error();
  EXPECT_EQ(*size, streamed.size());
  EXPECT_TRUE(streamed == *pickled);
  PlanFileOptions options;
  options.ranks = {0};
  Result<std::string> bytes = buildPlanFile(model, options);
  ASSERT_TRUE(bytes.ok()) << bytes.error();
  Result<PlanFile> file = PlanFile::fromBytes(bytes.take());
  ASSERT_TRUE(file.ok()) << file.error();
  Result<std::string> carried = file->metadataBytes();
  ASSERT_TRUE(carried.ok()) << carried.error();
  EXPECT_TRUE(*carried == *pickled);
}

TEST(CheckpointPlan, WorkedExamplePiecesPerRank) {
  ModelLayout model = workedExample();
  // The worked example: rank 0 holds p0 rows [0,4); rank 1 p0 row 4 and p2
  // row 0; rank 2 p2 rows [1,4); rank 3 all of p1. Steps go to rank i mod 4,
  // the 12 hyper-parameters to rank (3 + j) mod 4.
  std::vector<std::set<std::string>> expected = {
      {"model.p0@0", "optimizer.state.p0.exp_avg@0", "optimizer.state.p0.exp_avg_sq@0",
       "optimizer.state.p0.step", "optimizer.param_groups.0.betas",
       "optimizer.param_groups.0.maximize", "optimizer.param_groups.0.fused"},
      {"model.p0@4", "optimizer.state.p0.exp_avg@4", "optimizer.state.p0.exp_avg_sq@4",
       "model.p2@0", "optimizer.state.p2.exp_avg@0", "optimizer.state.p2.exp_avg_sq@0",
       "optimizer.state.p1.step", "optimizer.param_groups.0.eps",
       "optimizer.param_groups.0.foreach", "optimizer.param_groups.0.decoupled_weight_decay"},
      {"model.p2@1", "optimizer.state.p2.exp_avg@1", "optimizer.state.p2.exp_avg_sq@1",
       "optimizer.state.p2.step", "optimizer.param_groups.0.weight_decay",
       "optimizer.param_groups.0.capturable", "optimizer.param_groups.0.params"},
      {"model.p1@0", "optimizer.state.p1.exp_avg@0", "optimizer.state.p1.exp_avg_sq@0",
       "optimizer.param_groups.0.lr", "optimizer.param_groups.0.amsgrad",
       "optimizer.param_groups.0.differentiable"}};
  for (int64_t rank = 0; rank < 4; ++rank) {
    Result<RankPlan> plan = planRank(model, rank);
    ASSERT_TRUE(plan.ok()) << plan.error();
    EXPECT_EQ(keysOf(*plan), expected[rank]) << "rank " << rank;
  }
  Result<RankPlan> rank1 = planRank(model, 1);
  // p2's row 0 lies at local element 8 of rank 1's shard (worked example).
  for (const WriteItem &item : rank1->writes)
    if (item.key == "model.p2") {
      EXPECT_EQ(item.chunkOffsets, (dcp::Dims{0, 0}));
      EXPECT_EQ(item.chunkSizes, (dcp::Dims{1, 4}));
      EXPECT_EQ(item.buffer.localOffset, 8);
      EXPECT_EQ(item.buffer.elements, 4);
      EXPECT_EQ(item.dtype, dcp::DType::Float32); // main weights, not bf16
    }
  checkWholePlan(model);
}

// The rank ranges and pieces the plan emitter checks against the IR's
// `ranks` and `pieces` (test/Target/LayoutSVG/worked-example.mlir holds the
// worked example's IR).
TEST(CheckpointPlan, WorkedExampleRankRangesAndPiecesAreTheIRs) {
  ModelLayout model = workedExample();
  const GroupSpec &group = model.groups[0];
  EXPECT_EQ(rankRangeBegins(model, group), (std::vector<int64_t>{0, 12, 24, 36}));
  auto text = [&](size_t m) {
    std::string out;
    for (const ShardPiece &each : memberPieces(group, group.members[m]))
      out += std::to_string(each.shard) + ": [" + std::to_string(each.piece.rowOffset) + ", " +
             std::to_string(each.piece.rowOffset + each.piece.rows) + ") at " +
             std::to_string(each.piece.localOffset) + "; ";
    return out;
  };
  EXPECT_EQ(text(0), "0: [0, 4) at 0; 1: [4, 5) at 0; ");
  EXPECT_EQ(text(1), "3: [0, 7) at 0; ");
  EXPECT_EQ(text(2), "1: [0, 1) at 8; 2: [1, 4) at 0; ");
  // HSDP: two shards of 24, each held by one rank of each replica.
  ModelLayout hsdp = workedExample({2, 2}, {layout::Placement::Replicate, layout::Placement::Shard});
  EXPECT_EQ(rankRangeBegins(hsdp, hsdp.groups[0]), (std::vector<int64_t>{0, 24, 0, 24}));
}

TEST(CheckpointPlan, GlobalMetadataHasEveryKey) {
  ModelLayout model = workedExample();
  Result<dcp::Metadata> metadata = planGlobalMetadata(model);
  ASSERT_TRUE(metadata.ok()) << metadata.error();
  std::vector<std::string> keys;
  for (const auto &entry : metadata->stateDictMetadata)
    keys.push_back(entry.first);
  std::vector<std::string> expected = {"model.p0",
                                       "model.p1",
                                       "model.p2",
                                       "optimizer.state.p0.exp_avg",
                                       "optimizer.state.p0.exp_avg_sq",
                                       "optimizer.state.p1.exp_avg",
                                       "optimizer.state.p1.exp_avg_sq",
                                       "optimizer.state.p2.exp_avg",
                                       "optimizer.state.p2.exp_avg_sq",
                                       "optimizer.state.p0.step",
                                       "optimizer.state.p1.step",
                                       "optimizer.state.p2.step"};
  for (const char *name :
       {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
        "differentiable", "fused", "decoupled_weight_decay", "params"})
    expected.push_back(std::string("optimizer.param_groups.0.") + name);
  EXPECT_EQ(keys, expected);
  const dcp::StorageMetadata *p2 = metadata->find("model.p2");
  ASSERT_NE(p2, nullptr);
  EXPECT_EQ(p2->properties.dtype, dcp::DType::Float32);
  ASSERT_EQ(p2->chunks.size(), 2u);
  EXPECT_EQ(p2->chunks[0], (dcp::ChunkMetadata{{0, 0}, {1, 4}}));
  EXPECT_EQ(p2->chunks[1], (dcp::ChunkMetadata{{1, 0}, {3, 4}}));
  const dcp::StorageMetadata *step = metadata->find("optimizer.state.p1.step");
  ASSERT_NE(step, nullptr);
  EXPECT_TRUE(step->size.empty());
  ASSERT_EQ(step->chunks.size(), 1u);
  EXPECT_TRUE(step->chunks[0].offsets.empty());
}

TEST(CheckpointPlan, TiedParameterHasOneModelKeyPerFQN) {
  ModelLayout model;
  model.meshAxisNames = {"dp"};
  model.meshSizes = {2};
  model.optimizer.present = true;
  model.groups.push_back(makeGroup("", {{"embed.weight", "head.weight"}, {"norm"}}, {{16, 8}, {8}},
                                   {2}, {layout::Placement::Shard}));
  model.optimizerParams = {"embed.weight", "norm"};
  Result<dcp::Metadata> metadata = planGlobalMetadata(model);
  ASSERT_TRUE(metadata.ok()) << metadata.error();
  EXPECT_NE(metadata->find("model.embed.weight"), nullptr);
  EXPECT_NE(metadata->find("model.head.weight"), nullptr);
  EXPECT_NE(metadata->find("optimizer.state.embed.weight.exp_avg"), nullptr);
  EXPECT_EQ(metadata->find("optimizer.state.head.weight.exp_avg"), nullptr);
  checkWholePlan(model);
}

TEST(CheckpointPlan, HSDPReplicasWriteEachChunkOnceAndShareTheWork) {
  using layout::Placement;
  ModelLayout model;
  model.meshAxisNames = {"outer", "inner"};
  model.meshSizes = {3, 2};
  model.optimizer.present = true;
  std::vector<std::vector<std::string>> fqns;
  std::vector<layout::Shape> shapes;
  for (int i = 0; i < 12; ++i) {
    fqns.push_back({"w" + std::to_string(i)});
    shapes.push_back({8 + i, 4});
    model.optimizerParams.push_back("w" + std::to_string(i));
  }
  model.groups.push_back(
      makeGroup("", fqns, shapes, {3, 2}, {Placement::Replicate, Placement::Shard}));
  checkWholePlan(model);
  // The three replicas of inner shard 0 are ranks 0, 2 and 4; their tensor
  // bytes differ by at most one item's bytes.
  std::vector<uint64_t> bytes;
  uint64_t largest = 0;
  for (int64_t rank : {0, 2, 4}) {
    Result<RankPlan> plan = planRank(model, rank);
    ASSERT_TRUE(plan.ok());
    uint64_t total = 0;
    for (const WriteItem &item : plan->writes)
      if (item.source == ItemSource::Buffer) {
        total += item.dataLength;
        largest = std::max<uint64_t>(largest, item.dataLength);
      }
    bytes.push_back(total);
  }
  auto [low, high] = std::minmax_element(bytes.begin(), bytes.end());
  EXPECT_GT(*low, 0u);
  EXPECT_LE(*high - *low, largest);
}

TEST(CheckpointPlan, ExpertsAreSavedUnderGlobalNumbersOnce) {
  // EP 2 x EDP 2: ranks 0, 2 hold experts 0, 1; ranks 1, 3 experts 2, 3.
  ModelLayout model = moeExample({2, 2}, 2);
  checkWholePlan(model);
  Result<dcp::Metadata> metadata = planGlobalMetadata(model);
  ASSERT_TRUE(metadata.ok()) << metadata.error();
  std::vector<std::string> modelKeys, steps;
  for (const auto &entry : metadata->stateDictMetadata) {
    if (entry.first.rfind("model.experts.", 0) == 0)
      modelKeys.push_back(entry.first);
    if (entry.first.size() > 5 && entry.first.substr(entry.first.size() - 5) == ".step")
      steps.push_back(entry.first);
  }
  // Global order: every coordinate's experts in turn.
  EXPECT_EQ(modelKeys, (std::vector<std::string>{
                           "model.experts.fc1.weight0", "model.experts.fc1.weight1",
                           "model.experts.fc2.weight0", "model.experts.fc2.weight1",
                           "model.experts.fc1.weight2", "model.experts.fc1.weight3",
                           "model.experts.fc2.weight2", "model.experts.fc2.weight3"}));
  // Steps (and the pickled params, in the same order) list every global
  // expert after the dense parameters, as a model of all experts (EP 1) would.
  std::vector<std::string> ep1Order = {"optimizer.state.embed.step",
                                       "optimizer.state.router.step"};
  for (const char *stem : {"fc1", "fc2"})
    for (int g = 0; g < 4; ++g)
      ep1Order.push_back(std::string("optimizer.state.experts.") + stem + ".weight" +
                         std::to_string(g) + ".step");
  EXPECT_EQ(steps, ep1Order);
  for (const std::string &key : modelKeys) {
    const dcp::StorageMetadata *entry = metadata->find(key);
    ASSERT_NE(entry, nullptr);
    EXPECT_EQ(entry->chunks.size(), 1u) << key; // one EDP rank's piece each here
  }
  // Which rank writes which expert: rank 1 (ep 1, edp 0) writes fc1 of
  // global experts 2 and 3, and reads back exactly what it holds.
  Result<RankPlan> rank1 = planRank(model, 1);
  ASSERT_TRUE(rank1.ok()) << rank1.error();
  std::vector<std::string> written;
  for (const WriteItem &item : rank1->writes)
    if (item.key.rfind("model.experts.", 0) == 0)
      written.push_back(item.key);
  EXPECT_EQ(written,
            (std::vector<std::string>{"model.experts.fc1.weight2", "model.experts.fc1.weight3"}));
  for (const ReadItem &read : rank1->reads)
    if (read.key.rfind("model.experts.", 0) == 0)
      EXPECT_EQ(read.file, dataFileName(1)) << read.key;
  // Rank 3 (ep 1, edp 1) holds the second half of the experts' buffer.
  std::vector<int64_t> begins = rankRangeBegins(model, model.groups[1]);
  EXPECT_EQ(begins[0], 0);
  EXPECT_EQ(begins[1], 0);
  EXPECT_EQ(begins[2], model.groups[1].shardSize);
  EXPECT_EQ(begins[3], model.groups[1].shardSize);
  // Two expert coordinates of two shards each.
  EXPECT_EQ(groupShardCount(model, model.groups[1]), 4);
}

TEST(CheckpointPlan, ExpertKeysDoNotDependOnTheExpertParallelSize) {
  // 4 experts as EP 1 x EDP 4, EP 2 x EDP 2 and EP 4 x EDP 1: the same keys
  // and shapes, so any of them loads any other by key.
  auto keysOf = [](const ModelLayout &model) {
    std::map<std::string, dcp::Dims> keys;
    Result<dcp::Metadata> metadata = planGlobalMetadata(model);
    EXPECT_TRUE(metadata.ok()) << metadata.error();
    for (const auto &entry : metadata->stateDictMetadata)
      if (!entry.second.isBytes)
        keys[entry.first] = entry.second.size;
    return keys;
  };
  auto stepOrder = [](const ModelLayout &model) {
    std::vector<std::string> steps;
    Result<dcp::Metadata> metadata = planGlobalMetadata(model);
    EXPECT_TRUE(metadata.ok()) << metadata.error();
    for (const auto &entry : metadata->stateDictMetadata)
      if (entry.first.find(".step") != std::string::npos)
        steps.push_back(entry.first);
    return steps;
  };
  EXPECT_EQ(stepOrder(moeExample({4, 1}, 4)), stepOrder(moeExample({2, 2}, 2)));
  EXPECT_EQ(stepOrder(moeExample({4, 1}, 4)), stepOrder(moeExample({1, 4}, 1)));
  auto ep1 = keysOf(moeExample({4, 1}, 4));
  EXPECT_EQ(ep1, keysOf(moeExample({2, 2}, 2)));
  EXPECT_EQ(ep1, keysOf(moeExample({1, 4}, 1)));
  EXPECT_EQ(ep1.count("model.experts.fc2.weight3"), 1u);
  EXPECT_EQ(ep1.count("model.experts.fc2.weight4"), 0u);
  for (auto view : {std::vector<int64_t>{4, 1}, {1, 4}})
    checkWholePlan(moeExample(view, 4 / view.back()));
}

TEST(CheckpointPlan, HSDPExpertsWriteEachExpertOnce) {
  using layout::Placement;
  // erep 2 x edp 1 x ep 2: experts replicated over erep.
  ModelLayout model = moeExample({2, 1, 2}, 2, {Placement::Replicate, Placement::Shard});
  checkWholePlan(model); // each (key, chunk) written once
  std::set<std::string> writers0, writers2;
  for (int64_t rank : {0, 2}) {
    Result<RankPlan> plan = planRank(model, rank);
    ASSERT_TRUE(plan.ok()) << plan.error();
    for (const WriteItem &item : plan->writes)
      if (item.key.rfind("model.experts.", 0) == 0)
        (rank == 0 ? writers0 : writers2).insert(item.key);
  }
  // Ranks 0 and 2 replicate EP coordinate 0 and share its four experts' keys.
  EXPECT_FALSE(writers0.empty());
  EXPECT_FALSE(writers2.empty());
  for (const std::string &key : writers0)
    EXPECT_EQ(writers2.count(key), 0u) << key;
  EXPECT_EQ(writers0.size() + writers2.size(), 4u);
}

TEST(CheckpointPlan, RejectsExpertGroupsThatWouldCollide) {
  ModelLayout model = moeExample();
  auto errorOf = [](const ModelLayout &bad) {
    Result<RankPlan> plan = planRank(bad, 0);
    return plan.ok() ? std::string("(planned)") : plan.error();
  };
  ModelLayout beyond = model;
  beyond.groups[1].members[1].expert->local = 2;
  EXPECT_NE(errorOf(beyond).find("is local expert 2 but each rank holds 2"), std::string::npos)
      << errorOf(beyond);
  ModelLayout unnamed = model;
  unnamed.groups[1].members[0].expert.reset();
  EXPECT_NE(errorOf(unnamed).find("must be one untied parameter with a local expert number"),
            std::string::npos)
      << errorOf(unnamed);
  ModelLayout stray = model;
  stray.groups[0].members[0].expert = layout::ExpertName{"embed", 0, ""};
  EXPECT_NE(errorOf(stray).find("its group holds no experts"), std::string::npos)
      << errorOf(stray);
  // Local expert 1 of ep 0 and local expert 0 of ep 0 renamed to one name:
  // global weight1 twice.
  ModelLayout twice = model;
  twice.groups[1].members[0].fqns = {"experts.fc1.weight1"};
  twice.groups[1].members[0].expert = layout::ExpertName{"experts.fc1.weight", 1, ""};
  EXPECT_NE(errorOf(twice).find("FQN 'experts.fc1.weight1' appears twice"), std::string::npos)
      << errorOf(twice);
  ModelLayout misnamed = model;
  misnamed.groups[1].members[0].expert->head = "experts.fc9.weight";
  EXPECT_NE(errorOf(misnamed).find("does not split into its expert name"), std::string::npos)
      << errorOf(misnamed);
  ModelLayout none = model;
  none.groups[1].experts->perRank = 0;
  EXPECT_NE(errorOf(none).find("at least one expert"), std::string::npos) << errorOf(none);
  ModelLayout onlyExpertAxis = model;
  onlyExpertAxis.groups[1].experts->mesh = layout::ExpertMesh{{4}, 0};
  EXPECT_NE(errorOf(onlyExpertAxis).find("needs an axis besides the expert axis"),
            std::string::npos)
      << errorOf(onlyExpertAxis);
  ModelLayout wrongWorld = model;
  wrongWorld.groups[1].experts->mesh.viewSizes = {2, 4};
  ModelLayout shortWorld = model;
  shortWorld.groups[1].experts->mesh.viewSizes = {1, 2};
  EXPECT_NE(errorOf(shortWorld).find("multiply out to 2 ranks but the world mesh has 4"),
            std::string::npos)
      << errorOf(shortWorld);
  EXPECT_NE(errorOf(wrongWorld).find("more ranks than the world's 4"), std::string::npos)
      << errorOf(wrongWorld);
  // The experts' layout is that of their own mesh (2 ranks), not the world's.
  ModelLayout worldLayout = model;
  worldLayout.groups[1].shardSize /= 2;
  EXPECT_NE(errorOf(worldLayout), "(planned)");
  // planIdentity tells the expert meshes apart.
  EXPECT_NE(planIdentity(moeExample({2, 2}, 2)), planIdentity(moeExample({4, 1}, 4)));
}

TEST(CheckpointPlan, RandomModelsPlanConsistently) {
  using layout::Placement;
  std::mt19937_64 rng(20261129);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 150; ++trial) {
    ModelLayout model;
    int axes = static_cast<int>(pick(1, 2));
    for (int a = 0; a < axes; ++a) {
      model.meshAxisNames.push_back("a" + std::to_string(a));
      model.meshSizes.push_back(pick(1, 3));
    }
    model.optimizer.present = pick(0, 3) != 0;
    int groups = static_cast<int>(pick(1, 3));
    int counter = 0;
    for (int g = 0; g < groups; ++g) {
      std::vector<Placement> placements(axes, Placement::Shard);
      if (axes == 2 && pick(0, 1))
        placements[0] = Placement::Replicate;
      std::vector<std::vector<std::string>> fqns;
      std::vector<layout::Shape> shapes;
      for (int m = pick(1, 5); m > 0; --m) {
        layout::Shape shape{pick(1, 12)};
        for (int d = pick(0, 2); d > 0; --d)
          shape.push_back(pick(1, 4));
        fqns.push_back({"g" + std::to_string(g) + ".p" + std::to_string(counter++)});
        shapes.push_back(shape);
      }
      bool trainable = pick(0, 4) != 0;
      model.groups.push_back(
          makeGroup("u" + std::to_string(g), fqns, shapes, model.meshSizes, placements, trainable));
      if (trainable)
        for (const auto &names : fqns)
          model.optimizerParams.push_back(names.front());
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    checkWholePlan(model);
    if (::testing::Test::HasFailure())
      return;
  }
}

TEST(CheckpointPlan, RejectsBadInput) {
  ModelLayout model = workedExample();
  EXPECT_FALSE(planRank(model, 4).ok());
  EXPECT_FALSE(planRank(model, -1).ok());
  ModelLayout overlapping = model;
  overlapping.groups[0].members[2].offset = 12;
  Result<RankPlan> plan = planRank(overlapping, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().find("overlaps"), std::string::npos) << plan.error();
  ModelLayout duplicate = model;
  duplicate.groups[0].members[1].fqns = {"p0"};
  plan = planRank(duplicate, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().find("FQN 'p0' appears twice"), std::string::npos) << plan.error();
  ModelLayout noMoments = model;
  noMoments.groups[0].buffers.resize(3);
  plan = planRank(noMoments, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().find("needs a exp_avg buffer"), std::string::npos) << plan.error();
  ModelLayout amsgradWithoutBuffer = model;
  amsgradWithoutBuffer.optimizer.stateRoles.push_back(BufferRole::MaxExpAvgSq);
  plan = planRank(amsgradWithoutBuffer, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().find("needs a max_exp_avg_sq buffer"), std::string::npos)
      << plan.error();
  ModelLayout weightAsState = model;
  weightAsState.optimizer.stateRoles = {BufferRole::MainWeight};
  plan = planRank(weightAsState, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().find("main_weight twice or as state"), std::string::npos)
      << plan.error();
  ModelLayout twice = model;
  twice.optimizer.stateRoles = {BufferRole::ExpAvg, BufferRole::ExpAvg};
  EXPECT_FALSE(planRank(twice, 0).ok());
}

// What the runtime's readers would refuse (fsdp/Format/Limits.h) is refused
// when planning, by name, not found by the first save.
TEST(CheckpointPlan, RefusesWhatTheRuntimeWouldNotRead) {
  ModelLayout huge;
  huge.meshAxisNames = {"dp"};
  huge.meshSizes = {2};
  huge.optimizer.present = true;
  // 2^47 x 4 f32 elements on 2 ranks: 2^50 bytes per rank of main weights.
  huge.groups.push_back(makeGroup("big", {{"w"}}, {{int64_t(1) << 47, 4}}, {2},
                                  {layout::Placement::Shard}));
  huge.optimizerParams = {"w"};
  Result<RankPlan> plan = planRank(huge, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().find("main_weight buffer is 281474976710656 elements of 4 bytes per "
                              "rank, past the runtime's limit of 2^48 bytes"),
            std::string::npos)
      << plan.error();
  // The same over 16384 ranks: 2^37 bytes per rank, planned.
  ModelLayout fits = huge;
  fits.meshSizes = {16384};
  fits.groups = {makeGroup("big", {{"w"}}, {{int64_t(1) << 47, 4}}, {16384},
                           {layout::Placement::Shard})};
  EXPECT_TRUE(planRank(fits, 0).ok());

  ModelLayout longName = workedExample({1});
  std::string name(limits::kMaxKeyBytes, 'n');
  longName.groups[0].members[0].fqns = {name};
  longName.optimizerParams[0] = name;
  plan = planRank(longName, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().find("a parameter name of " + std::to_string(name.size()) +
                              " bytes (starting 'nnnn"),
            std::string::npos)
      << plan.error().substr(0, 300);
  EXPECT_LT(plan.error().size(), 400u); // the name is not repeated whole
}

/// The worked example with `roles` as the optimizer's state tensors in place
/// of Adam's two moments.
ModelLayout withStateRoles(ModelLayout model, std::vector<BufferRole> roles) {
  model.optimizer.stateRoles = roles;
  for (GroupSpec &group : model.groups) {
    std::vector<BufferSpec> buffers;
    for (const BufferSpec &buffer : group.buffers)
      if (!isOptimizerStateRole(buffer.role))
        buffers.push_back(buffer);
    for (BufferRole role : roles)
      buffers.push_back({role, dcp::DType::Float32, false});
    group.buffers = buffers;
  }
  return model;
}

std::vector<std::string> metadataKeys(const ModelLayout &model) {
  Result<dcp::Metadata> metadata = planGlobalMetadata(model);
  EXPECT_TRUE(metadata.ok()) << metadata.error();
  std::vector<std::string> keys;
  if (metadata.ok())
    for (const auto &entry : metadata->stateDictMetadata)
      keys.push_back(entry.first);
  return keys;
}

TEST(CheckpointPlan, AmsgradKeepsItsMaximumPerParameter) {
  ModelLayout model = withStateRoles(
      workedExample(), {BufferRole::ExpAvg, BufferRole::ExpAvgSq, BufferRole::MaxExpAvgSq});
  model.optimizer.amsgrad = true;
  std::vector<std::string> keys = metadataKeys(model);
  std::vector<std::string> expected = {"model.p0", "model.p1", "model.p2"};
  for (const char *fqn : {"p0", "p1", "p2"})
    for (const char *state : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"})
      expected.push_back(optimizerStateKey(fqn, state));
  for (const char *fqn : {"p0", "p1", "p2"})
    expected.push_back(optimizerStateKey(fqn, "step"));
  ASSERT_GE(keys.size(), expected.size());
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + expected.size()), expected);
  checkWholePlan(model);
  // Each rank reads its own piece of every state tensor back.
  Result<RankPlan> plan = planRank(model, 1);
  ASSERT_TRUE(plan.ok()) << plan.error();
  int maxima = 0;
  for (const ReadItem &read : plan->reads)
    maxima += read.buffer.role == BufferRole::MaxExpAvgSq;
  EXPECT_EQ(maxima, 2); // rank 1 holds pieces of p0 and p2
}

TEST(CheckpointPlan, SGDHasMomentumAndNoStep) {
  ModelLayout model = withStateRoles(workedExample(), {BufferRole::MomentumBuffer});
  model.optimizer.kind = OptimizerKind::SGD;
  model.optimizer.hasStep = false;
  model.optimizer.momentum = 0.9;
  std::vector<std::string> keys = metadataKeys(model);
  std::vector<std::string> expected = {"model.p0",
                                       "model.p1",
                                       "model.p2",
                                       "optimizer.state.p0.momentum_buffer",
                                       "optimizer.state.p1.momentum_buffer",
                                       "optimizer.state.p2.momentum_buffer"};
  // torch.optim.SGD's param group, in its order.
  for (const char *name : {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize",
                           "foreach", "differentiable", "fused", "params"})
    expected.push_back(std::string("optimizer.param_groups.0.") + name);
  EXPECT_EQ(keys, expected);
  checkWholePlan(model);
  for (int64_t rank = 0; rank < model.worldSize(); ++rank) {
    Result<RankPlan> plan = planRank(model, rank);
    ASSERT_TRUE(plan.ok()) << plan.error();
    for (const ReadItem &read : plan->reads)
      EXPECT_NE(read.source, ItemSource::Step) << read.key;
  }
  // Plain SGD keeps no state at all: only the model and the param group.
  ModelLayout plain = withStateRoles(workedExample(), {});
  plain.optimizer.kind = OptimizerKind::SGD;
  plain.optimizer.hasStep = false;
  EXPECT_EQ(metadataKeys(plain).size(), 3u + 10u);
  checkWholePlan(plain);
}

TEST(PlanFile, RoundTripsEveryRank) {
  ModelLayout model =
      workedExample({2, 2}, {layout::Placement::Replicate, layout::Placement::Shard});
  Result<std::string> bytes = buildPlanFile(model);
  ASSERT_TRUE(bytes.ok()) << bytes.error();
  Result<PlanFile> file = PlanFile::fromBytes(*bytes, "plan");
  ASSERT_TRUE(file.ok()) << file.error();
  EXPECT_EQ(file->version(), kPlanFormatVersion);
  EXPECT_EQ(file->planId(), planIdentity(model));
  EXPECT_EQ(file->worldSize(), 4);
  EXPECT_EQ(file->meshSizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(file->ranks(), (std::vector<int64_t>{0, 1, 2, 3}));
  for (int64_t rank = 0; rank < 4; ++rank) {
    Result<RankPlan> read = file->rank(rank);
    Result<RankPlan> direct = planRank(model, rank);
    ASSERT_TRUE(read.ok()) << read.error();
    ASSERT_EQ(read->writes.size(), direct->writes.size());
    for (size_t i = 0; i < read->writes.size(); ++i) {
      EXPECT_EQ(read->writes[i].key, direct->writes[i].key);
      EXPECT_EQ(read->writes[i].dataOffset, direct->writes[i].dataOffset);
      EXPECT_EQ(read->writes[i].payload, direct->writes[i].payload);
      EXPECT_EQ(read->writes[i].chunkSizes, direct->writes[i].chunkSizes);
    }
    ASSERT_EQ(read->reads.size(), direct->reads.size());
    EXPECT_EQ(read->buffers.size(), direct->buffers.size());
  }
  Result<std::string> metadata = file->metadataBytes();
  ASSERT_TRUE(metadata.ok()) << metadata.error();
  EXPECT_TRUE(dcp::parseMetadata(*metadata).ok());
  Result<std::vector<std::string>> params = file->optimizerParams();
  ASSERT_TRUE(params.ok());
  EXPECT_EQ(*params, model.optimizerParams);
  Result<std::string> json = file->toJSON(1);
  ASSERT_TRUE(json.ok()) << json.error();
  EXPECT_NE(json->find("\"rank\": 1"), std::string::npos);
}

TEST(PlanFile, OneRankCostsOneRank) {
  ModelLayout model = workedExample();
  PlanFileOptions options;
  options.ranks = {2};
  Result<std::string> bytes = buildPlanFile(model, options);
  ASSERT_TRUE(bytes.ok()) << bytes.error();
  Result<PlanFile> file = PlanFile::fromBytes(*bytes);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->ranks(), (std::vector<int64_t>{2}));
  EXPECT_FALSE(file->hasGlobal()); // only the committing rank carries it
  EXPECT_TRUE(file->rank(2).ok());
  Result<RankPlan> missing = file->rank(1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("no part for rank 1"), std::string::npos);
  EXPECT_FALSE(file->metadataBytes().ok());
}

TEST(PlanFile, PastTheSizeLimitSaysWhatToDo) {
  // FlatBuffers' 2 GiB, lowered to reach it: an error naming the limit and
  // the way out, never a corrupt file.
  ModelLayout model = workedExample();
  PlanFileOptions options;
  options.maxFileBytes = 12000;
  Result<std::string> bytes = buildPlanFile(model, options);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.kind(), ErrorKind::InvalidArgument);
  EXPECT_NE(bytes.error().find("a plan file holds at most 12000 bytes (FlatBuffers' 32-bit "
                               "offsets: 2 GiB) but with rank "),
            std::string::npos)
      << bytes.error();
  EXPECT_NE(bytes.error().find("emit one file per rank (--plan-split-dir)"), std::string::npos);
  // One file per rank fits.
  std::string dir = ::testing::TempDir() + "/fsdp-plan-limit";
  Result<uint64_t> written = writeSplitPlanFiles(model, dir, {}, 12000);
  ASSERT_TRUE(written.ok()) << written.error();
  for (int64_t rank = 0; rank < 4; ++rank)
    std::remove((dir + "/" + planFileName(rank)).c_str());
  ::rmdir(dir.c_str());
}

TEST(PlanFile, DeflatedMetadataIsChecked) {
  PlanFileOptions options;
  options.ranks = {0};
  Result<std::string> bytes = buildPlanFile(workedExample(), options);
  ASSERT_TRUE(bytes.ok()) << bytes.error();
  Result<PlanFile> file = PlanFile::fromBytes(*bytes);
  ASSERT_TRUE(file.ok());
  Result<std::string> metadata = file->metadataBytes();
  ASSERT_TRUE(metadata.ok()) << metadata.error();
  // The deflated bytes: a zlib stream (78 01) behind its 32-bit length.
  std::string plan = *bytes;
  size_t start = 0, length = 0;
  for (size_t at = 4; at + 2 <= plan.size() && !length; ++at) {
    uint32_t n;
    std::memcpy(&n, &plan[at - 4], 4);
    if (plan[at] == '\x78' && plan[at + 1] == '\x01' && n > 16 && at + n <= plan.size())
      start = at, length = n;
  }
  ASSERT_GT(length, 0u);
  plan[start + length / 2] ^= 0x5a;
  file = PlanFile::fromBytes(plan);
  ASSERT_TRUE(file.ok());
  metadata = file->metadataBytes();
  ASSERT_FALSE(metadata.ok());
  EXPECT_EQ(metadata.kind(), ErrorKind::Corrupt);
  EXPECT_NE(metadata.error().find("corrupt global part (the deflated .metadata"), std::string::npos)
      << metadata.error();
}

TEST(PlanFile, RejectsCorruptFiles) {
  Result<std::string> bytes = buildPlanFile(workedExample());
  ASSERT_TRUE(bytes.ok());
  Result<PlanFile> garbage = PlanFile::fromBytes("not a plan at all");
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.error().find("not an fsdp checkpoint plan"), std::string::npos);
  // Truncations and flipped bytes: refused or read, never a crash.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string mutated = *bytes;
    if (trial % 2)
      mutated.resize(std::uniform_int_distribution<size_t>(0, mutated.size() - 1)(rng));
    else
      for (int flips = 0; flips < 4; ++flips)
        mutated[std::uniform_int_distribution<size_t>(0, mutated.size() - 1)(rng)] ^=
            static_cast<char>(1 + rng() % 255);
    Result<PlanFile> file = PlanFile::fromBytes(mutated);
    if (!file)
      continue;
    for (int64_t rank : file->ranks())
      (void)file->rank(rank);
    (void)file->metadataBytes();
    (void)file->toJSON();
  }
}

} // namespace
