//===- ExportTest.cpp - Checkpoints exported as safetensors ---------------===//
#include "MultiRank.h"
#include "fsdp/Runtime/Export.h"

#include <fstream>
#include <nlohmann/json.hpp>

using namespace fsdp;
using namespace fsdp::runtime;
using namespace fsdp::multirank;

namespace {

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The JSON header of a safetensors file.
nlohmann::json header(const std::string &path) {
  std::string bytes = readFile(path);
  EXPECT_GE(bytes.size(), 8u);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = length << 8 | static_cast<uint8_t>(bytes[i]);
  return nlohmann::json::parse(bytes.substr(8, length));
}

TEST(ParseByteSize, HuggingFaceUnits) {
  EXPECT_EQ(*parseByteSize("5GB"), 5'000'000'000u);
  EXPECT_EQ(*parseByteSize("500mb"), 500'000'000u);
  EXPECT_EQ(*parseByteSize("2GiB"), uint64_t(2) << 30);
  EXPECT_EQ(*parseByteSize("40KB"), 40'000u);
  EXPECT_EQ(*parseByteSize("1234"), 1234u);
  for (const char *bad : {"", "GB", "5XB", "0", "-1GB", "1.5GB", "99999999999999999GB"}) {
    Result<uint64_t> parsed = parseByteSize(bad);
    ASSERT_FALSE(parsed) << bad;
    EXPECT_EQ(parsed.kind(), ErrorKind::InvalidArgument) << bad;
  }
}

class ExportTest : public ::testing::Test {
protected:
  void SetUp() override {
    work_ = tempDir();
    ASSERT_FALSE(work_.empty());
    plan::PlanFile plan = planFor(testmodels::workedExample({2}));
    for (const Status &status : saveOnRanks(plan, work_ + "/ckpt", 4))
      ASSERT_TRUE(status) << status.error();
  }
  std::string work_;
  std::unique_ptr<Storage> storage_ = createPosixStorage();
};

TEST_F(ExportTest, ModelKeysOnlyOneFileWhenItFits) {
  Result<ExportResult> exported = exportSafetensors(work_ + "/ckpt", work_ + "/out", *storage_);
  ASSERT_TRUE(exported) << exported.error();
  EXPECT_EQ(exported->tensors, 3u); // p0, p1, p2: no optimizer state
  EXPECT_EQ(exported->files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(exported->bytes, (15u + 7u + 16u) * 4u);
  EXPECT_EQ(exported->largestTensorBytes, 16u * 4u);
  nlohmann::json json = header(work_ + "/out/model.safetensors");
  EXPECT_EQ(json["__metadata__"]["format"], "pt");
  EXPECT_EQ(json["p0"]["dtype"], "F32");
  EXPECT_EQ(json["p0"]["shape"], nlohmann::json::array({5, 3}));
  EXPECT_FALSE(json.contains("optimizer.state.p0.exp_avg"));
  EXPECT_FALSE(storage_->exists(work_ + "/out.fsdp-staging"));
}

TEST_F(ExportTest, ShardsKeepTensorsWholeAndIndexThem) {
  ExportOptions options;
  // In bf16, p0 is 30 bytes, p1 14, p2 32: p0 and p1 fill the first file.
  options.maxShardBytes = 60;
  options.dtype = dcp::DType::BFloat16;
  Result<ExportResult> exported =
      exportSafetensors(work_ + "/ckpt", work_ + "/sharded", *storage_, options);
  ASSERT_TRUE(exported) << exported.error();
  ASSERT_EQ(exported->files.size(), 3u); // two shards and the index
  EXPECT_EQ(exported->files[0], "model-00001-of-00002.safetensors");
  nlohmann::json index = nlohmann::json::parse(readFile(work_ + "/sharded/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], (15 + 7 + 16) * 2);
  EXPECT_EQ(index["weight_map"]["p0"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["p1"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["p2"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(header(work_ + "/sharded/model-00002-of-00002.safetensors")["p2"]["dtype"], "BF16");
}

TEST_F(ExportTest, RefusesExistingOutputAndNonFloatingCasts) {
  ASSERT_TRUE(exportSafetensors(work_ + "/ckpt", work_ + "/out", *storage_));
  Result<ExportResult> again = exportSafetensors(work_ + "/ckpt", work_ + "/out", *storage_);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.kind(), ErrorKind::InvalidArgument);
  ExportOptions options;
  options.dtype = dcp::DType::Int32;
  Result<ExportResult> cast = exportSafetensors(work_ + "/ckpt", work_ + "/int", *storage_, options);
  ASSERT_FALSE(cast);
  EXPECT_NE(cast.error().find("floating"), std::string::npos) << cast.error();
  Result<ExportResult> missing = exportSafetensors(work_ + "/none", work_ + "/x", *storage_);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.kind(), ErrorKind::NotFound);
  EXPECT_FALSE(storage_->exists(work_ + "/x"));
}

} // namespace
