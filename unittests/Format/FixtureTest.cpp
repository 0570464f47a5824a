//===- FixtureTest.cpp - A real PyTorch 2.11 DCP checkpoint ---------------===//
//
// test/Inputs/torch-fsdp2-ws2: FSDP2 on 2 ranks, saved by
// torch.distributed.checkpoint, with values.json holding what PyTorch reads
// back (dcp_to_torch_save). Every key, chunk and element must match, and our
// writer must reproduce every item byte for byte.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Format/Zip.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

using namespace fsdp;
using namespace fsdp::dcp;
using json = nlohmann::ordered_json;

namespace {

const std::string kCheckpoint = std::string(FSDP_TEST_INPUTS) + "/torch-fsdp2-ws2/checkpoint";

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Fixture : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    values_ = new json(json::parse(readFile(std::string(FSDP_TEST_INPUTS) +
                                            "/torch-fsdp2-ws2/values.json")));
    auto md = parseMetadata(readFile(kCheckpoint + "/.metadata"));
    if (!md)
      metadataError_ = new std::string(md.error());
    else
      metadata_ = new Metadata(md.take());
    files_ = new std::map<std::string, std::string>();
    for (const char *name : {"__0_0.distcp", "__1_0.distcp"})
      (*files_)[name] = readFile(kCheckpoint + "/" + name);
  }
  static void TearDownTestSuite() {
    delete values_;
    delete metadata_;
    delete metadataError_;
    delete files_;
  }
  void SetUp() override {
    ASSERT_EQ(metadataError_, nullptr) << *metadataError_;
    ASSERT_EQ(files_->at("__0_0.distcp").size(), 34269u) << "fixture missing";
  }

  /// The bytes [offset, offset + length) of a data file.
  static std::string_view itemBytes(const StorageInfo &info) {
    const std::string &file = files_->at(info.relativePath);
    EXPECT_LE(info.offset + info.length, file.size());
    return std::string_view(file).substr(info.offset, info.length);
  }

  static json *values_;
  static Metadata *metadata_;
  static std::string *metadataError_;
  static std::map<std::string, std::string> *files_;
};

json *Fixture::values_ = nullptr;
Metadata *Fixture::metadata_ = nullptr;
std::string *Fixture::metadataError_ = nullptr;
std::map<std::string, std::string> *Fixture::files_ = nullptr;

} // namespace

TEST_F(Fixture, MetadataMatchesValuesJson) {
  const json &expected = (*values_)["metadata"];
  const Metadata &md = *metadata_;
  ASSERT_EQ(md.stateDictMetadata.size(), expected.size());
  size_t position = 0, chunks = 0, bytesItems = 0;
  for (const auto &[key, want] : expected.items()) {
    const auto &[fqn, entry] = md.stateDictMetadata[position++];
    EXPECT_EQ(fqn, key); // same order as PyTorch's
    if (want.contains("bytes")) {
      EXPECT_TRUE(entry.isBytes) << key;
      ++bytesItems;
      continue;
    }
    ASSERT_FALSE(entry.isBytes) << key;
    EXPECT_EQ("torch." + std::string(dtypeInfo(entry.properties.dtype).name),
              want["dtype"].get<std::string>())
        << key;
    EXPECT_EQ(entry.properties.layout, "torch.strided");
    EXPECT_FALSE(entry.properties.requiresGrad);
    EXPECT_EQ(entry.size, want["shape"].get<Dims>()) << key;
    ASSERT_EQ(entry.chunks.size(), want["chunks"].size()) << key;
    for (size_t i = 0; i < entry.chunks.size(); ++i) {
      EXPECT_EQ(entry.chunks[i].offsets, want["chunks"][i][0].get<Dims>()) << key;
      EXPECT_EQ(entry.chunks[i].sizes, want["chunks"][i][1].get<Dims>()) << key;
      // The default planner's index hint is the chunk's position.
      bool found = false;
      for (const auto &[index, info] : md.storageData)
        if (index.fqn == key && index.offset == entry.chunks[i].offsets) {
          EXPECT_EQ(index.index, static_cast<int64_t>(i)) << key;
          found = true;
        }
      EXPECT_TRUE(found) << key;
    }
    chunks += entry.chunks.size();
  }
  EXPECT_EQ(bytesItems, 12u);
  EXPECT_EQ(md.storageData.size(), chunks + bytesItems);
  EXPECT_EQ(md.version, "1.0.0");
  ASSERT_TRUE(md.storageMeta);
  EXPECT_EQ(md.storageMeta->checkpointId, "/root/out/fsdp2_ws2"); // a PosixPath
  EXPECT_EQ(md.storageMeta->saveId, "44e95c25-0e38-4291-aff3-f6b9057fcfe2");
  EXPECT_EQ(md.storageMeta->loadId, std::nullopt);
  EXPECT_TRUE(md.storageMeta->modules.empty());
  ASSERT_TRUE(md.plannerData);
  EXPECT_EQ(md.plannerData->size(), expected.size());
  auto path = [&](const std::string &key) {
    for (const auto &[k, parts] : *md.plannerData)
      if (k == key)
        return parts;
    return std::vector<PathPart>{};
  };
  EXPECT_EQ(path("optimizer.param_groups.0.lr"),
            (std::vector<PathPart>{std::string("optimizer"), std::string("param_groups"),
                                   int64_t(0), std::string("lr")}));
  EXPECT_EQ(path("optimizer.state.fc1.weight.step"),
            (std::vector<PathPart>{std::string("optimizer"), std::string("state"),
                                   std::string("fc1.weight"), std::string("step")}));
  EXPECT_EQ(path("model.worked.p0"),
            (std::vector<PathPart>{std::string("model"), std::string("worked.p0")}));
}

TEST_F(Fixture, EveryValueMatches) {
  const Metadata &md = *metadata_;
  const json &values = (*values_)["values"];
  ASSERT_EQ(values.size(), md.stateDictMetadata.size());
  size_t elementsChecked = 0;
  for (const auto &[key, want] : values.items()) {
    const StorageMetadata *entry = md.find(key);
    ASSERT_TRUE(entry) << key;
    if (entry->isBytes) {
      const StorageInfo *info = md.findStorage(key, std::nullopt);
      ASSERT_TRUE(info) << key;
      zip::MemorySource source(itemBytes(*info));
      auto item = zip::openTorchSaveItem(source);
      ASSERT_TRUE(item) << key << ": " << item.error();
      EXPECT_EQ(item->findRecord("data/0"), nullptr);
      auto doc = pickle::read(item->dataPkl);
      ASSERT_TRUE(doc) << key << ": " << doc.error();
      auto repr = pickle::toPythonRepr(*doc->root());
      ASSERT_TRUE(repr) << repr.error();
      EXPECT_EQ(*repr, want["object"].get<std::string>()) << key;
      continue;
    }
    const Dims shape = want["shape"].get<Dims>();
    ASSERT_EQ(shape, entry->size) << key;
    ASSERT_EQ(entry->properties.dtype, DType::Float32) << key;
    int64_t numel = 1;
    for (int64_t d : shape)
      numel *= d;
    const json &expected = want["values"];
    ASSERT_EQ(expected.size(), static_cast<size_t>(numel)) << key;
    std::vector<float> global(static_cast<size_t>(numel), 0.0f);
    std::vector<int> covered(static_cast<size_t>(numel), 0);

    for (const ChunkMetadata &chunk : entry->chunks) {
      const StorageInfo *info = md.findStorage(key, chunk.offsets);
      ASSERT_TRUE(info) << key;
      zip::MemorySource source(itemBytes(*info));
      auto item = zip::openTorchSaveItem(source);
      ASSERT_TRUE(item) << key << ": " << item.error();
      EXPECT_EQ(item->archiveName, "archive");
      EXPECT_EQ(item->version, 3);
      auto record = zip::decodeTensorPickle(item->dataPkl);
      ASSERT_TRUE(record) << key << ": " << record.error();
      EXPECT_EQ(record->dtype, DType::Float32);
      EXPECT_EQ(record->size, chunk.sizes) << key;
      EXPECT_EQ(record->location, "cpu");
      const zip::Entry *data = item->findRecord("data/" + record->storageKey);
      ASSERT_TRUE(data) << key;
      EXPECT_EQ(data->dataOffset % 64, 0u);
      EXPECT_EQ(data->size, record->storageBytes()) << key;
      ASSERT_TRUE(zip::verifyEntryCrc(source, *data)) << key;
      int64_t chunkNumel = 1;
      for (int64_t d : chunk.sizes)
        chunkNumel *= d;
      std::vector<float> local(static_cast<size_t>(chunkNumel));
      std::string_view bytes = itemBytes(*info);
      ASSERT_TRUE(zip::copyToContiguous(*record, bytes.data() + data->dataOffset, data->size,
                                        local.data()));
      // Scatter the chunk (row-major) into the global tensor.
      std::vector<int64_t> index(chunk.sizes.size(), 0);
      for (int64_t i = 0; i < chunkNumel; ++i) {
        int64_t flat = 0;
        for (size_t d = 0; d < shape.size(); ++d)
          flat = flat * shape[d] + chunk.offsets[d] + index[d];
        global[static_cast<size_t>(flat)] = local[static_cast<size_t>(i)];
        ++covered[static_cast<size_t>(flat)];
        for (size_t d = index.size(); d-- > 0;) {
          if (++index[d] < chunk.sizes[d])
            break;
          index[d] = 0;
        }
      }
    }
    for (int64_t i = 0; i < numel; ++i) {
      ASSERT_EQ(covered[static_cast<size_t>(i)], 1) << key << " element " << i;
      ASSERT_EQ(static_cast<double>(global[static_cast<size_t>(i)]),
                expected[static_cast<size_t>(i)].get<double>())
          << key << " element " << i;
      ++elementsChecked;
    }
  }
  EXPECT_EQ(elementsChecked, 3 * (16 * 8 + 16 + 4 * 16 + 4 + 15 + 7 + 16) + 7u);
}

TEST_F(Fixture, ItemsArePackedBackToBack) {
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
  for (const auto &[index, info] : metadata_->storageData)
    ranges[info.relativePath].emplace_back(info.offset, info.length);
  ASSERT_EQ(ranges.size(), 2u);
  for (auto &[file, list] : ranges) {
    std::sort(list.begin(), list.end());
    uint64_t end = 0;
    for (const auto &[offset, length] : list) {
      EXPECT_EQ(offset, end) << file;
      end = offset + length;
    }
    EXPECT_EQ(end, files_->at(file).size()) << file;
  }
}

TEST_F(Fixture, WriterReproducesEveryItemByteForByte) {
  size_t tensors = 0, objects = 0;
  for (const auto &[index, info] : metadata_->storageData) {
    std::string_view original = itemBytes(info);
    zip::MemorySource source(original);
    auto item = zip::openTorchSaveItem(source);
    ASSERT_TRUE(item) << index.fqn << ": " << item.error();
    const zip::Entry *idEntry = item->findRecord(".data/serialization_id");
    ASSERT_TRUE(idEntry);
    zip::TorchSaveOptions options;
    options.serializationId = *zip::readEntry(source, *idEntry);

    if (const zip::Entry *data = item->findRecord("data/0")) {
      auto record = zip::decodeTensorPickle(item->dataPkl);
      ASSERT_TRUE(record) << record.error();
      auto pkl = zip::encodeTensorPickle(*record);
      ASSERT_TRUE(pkl) << pkl.error();
      EXPECT_EQ(*pkl, item->dataPkl) << index.fqn;
      auto layout = zip::planTensorItem(*pkl, data->size, options);
      ASSERT_TRUE(layout) << layout.error();
      EXPECT_EQ(layout->dataOffset, data->dataOffset) << index.fqn;
      EXPECT_EQ(layout->totalSize, info.length) << index.fqn;
      std::string_view payload = original.substr(data->dataOffset, data->size);
      layout->setDataCrc(zip::crc32(payload.data(), payload.size()));
      std::string ours = layout->header + std::string(payload) + layout->trailer;
      EXPECT_TRUE(ours == original) << index.fqn;
      ++tensors;
    } else {
      auto doc = pickle::read(item->dataPkl);
      ASSERT_TRUE(doc) << doc.error();
      pickle::Writer w(pickle::Writer::Options{/*memoizeAll=*/true});
      ASSERT_TRUE(w.writeValue(*doc->root()));
      auto pkl = w.finish();
      ASSERT_TRUE(pkl);
      EXPECT_EQ(*pkl, item->dataPkl) << index.fqn;
      auto ours = zip::buildObjectItem(*pkl, options);
      ASSERT_TRUE(ours) << ours.error();
      EXPECT_TRUE(*ours == original) << index.fqn;
      ++objects;
    }
  }
  EXPECT_EQ(tensors, metadata_->storageData.size() - 12);
  EXPECT_EQ(objects, 12u);
}

TEST_F(Fixture, MetadataSurvivesOurWriter) {
  auto bytes = serializeMetadata(*metadata_);
  ASSERT_TRUE(bytes) << bytes.error();
  auto back = parseMetadata(*bytes);
  ASSERT_TRUE(back) << back.error();
  EXPECT_TRUE(*back == *metadata_);
  // Protocol 2 without per-object memo is a little larger than PyTorch's
  // protocol 4 with it, but the same order of magnitude.
  EXPECT_LT(bytes->size(), 3 * readFile(kCheckpoint + "/.metadata").size());
}
