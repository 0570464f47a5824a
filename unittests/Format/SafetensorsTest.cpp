//===- SafetensorsTest.cpp - The safetensors file layout ------------------===//
#include "fsdp/Format/Safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace fsdp;
using namespace fsdp::safetensors;

namespace {

/// The header's JSON, after checking the length prefix and the padding.
nlohmann::json parseHeader(const std::string &header) {
  EXPECT_GE(header.size(), 8u);
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<uint8_t>(header[i])) << (8 * i);
  EXPECT_EQ(length + 8, header.size());
  EXPECT_EQ(header.size() % 8, 0u) << "the data must start 8-byte aligned";
  return nlohmann::json::parse(header.substr(8));
}

TEST(Safetensors, TensorsBackToBackInTheOrderGiven) {
  Result<FileLayout> layout =
      layoutFile({{"model.embed_tokens.weight", dcp::DType::Float32, {2, 3}},
                  {"model.norm.weight", dcp::DType::BFloat16, {4}},
                  {"step", dcp::DType::Int64, {}}},
                 {{"format", "pt"}});
  ASSERT_TRUE(layout) << layout.error();
  nlohmann::json header = parseHeader(layout->header);
  EXPECT_EQ(header["__metadata__"], nlohmann::json({{"format", "pt"}}));
  EXPECT_EQ(header["model.embed_tokens.weight"]["dtype"], "F32");
  EXPECT_EQ(header["model.embed_tokens.weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["model.embed_tokens.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["model.norm.weight"]["dtype"], "BF16");
  EXPECT_EQ(header["model.norm.weight"]["data_offsets"], nlohmann::json({24, 32}));
  EXPECT_EQ(header["step"]["shape"], nlohmann::json::array());
  EXPECT_EQ(header["step"]["data_offsets"], nlohmann::json({32, 40}));
  uint64_t data = layout->header.size();
  EXPECT_EQ(layout->fileOffsets, (std::vector<uint64_t>{data, data + 24, data + 32}));
  EXPECT_EQ(layout->byteCounts, (std::vector<uint64_t>{24, 8, 8}));
  EXPECT_EQ(layout->fileBytes, data + 40);
  // The header lists the tensors as the data holds them.
  EXPECT_LT(layout->header.find("model.embed_tokens.weight"), layout->header.find("step"));
}

TEST(Safetensors, EmptyTensorsAndNoMetadata) {
  Result<FileLayout> layout = layoutFile({{"empty", dcp::DType::Float16, {0, 5}}}, {});
  ASSERT_TRUE(layout) << layout.error();
  nlohmann::json header = parseHeader(layout->header);
  EXPECT_FALSE(header.contains("__metadata__"));
  EXPECT_EQ(header["empty"]["data_offsets"], nlohmann::json({0, 0}));
  EXPECT_EQ(layout->fileBytes, layout->header.size());
}

TEST(Safetensors, DTypeNames) {
  const std::pair<dcp::DType, const char *> names[] = {
      {dcp::DType::Float64, "F64"},   {dcp::DType::Float32, "F32"}, {dcp::DType::Float16, "F16"},
      {dcp::DType::BFloat16, "BF16"}, {dcp::DType::Int64, "I64"},   {dcp::DType::Int8, "I8"},
      {dcp::DType::UInt8, "U8"},      {dcp::DType::Bool, "BOOL"},
      // What PyTorch 2.15 saves through torch.storage.UntypedStorage, in the
      // names safetensors 0.8 gives them.
      {dcp::DType::UInt16, "U16"},    {dcp::DType::UInt32, "U32"},  {dcp::DType::UInt64, "U64"},
      {dcp::DType::Complex64, "C64"}, {dcp::DType::Float8E4M3FN, "F8_E4M3"},
      {dcp::DType::Float8E5M2, "F8_E5M2"}, {dcp::DType::Float8E4M3FNUZ, "F8_E4M3FNUZ"},
      {dcp::DType::Float8E5M2FNUZ, "F8_E5M2FNUZ"}};
  for (const auto &[dtype, name] : names) {
    Result<std::string> found = dtypeName(dtype);
    ASSERT_TRUE(found) << name;
    EXPECT_EQ(*found, name);
  }
  for (dcp::DType none : {dcp::DType::Complex128, dcp::DType::Complex32,
                          dcp::DType::Float8E8M0FNU}) {
    Result<std::string> refused = dtypeName(none);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.kind(), ErrorKind::Incompatible);
  }
}

TEST(Safetensors, RefusesWhatReadersWouldRefuse) {
  auto refusal = [](const std::vector<TensorSpec> &tensors) {
    Result<FileLayout> layout = layoutFile(tensors, {});
    EXPECT_FALSE(layout);
    return layout ? std::string() : layout.error();
  };
  EXPECT_NE(
      refusal({{"w", dcp::DType::Float32, {1}}, {"w", dcp::DType::Float32, {1}}}).find("repeated"),
      std::string::npos);
  EXPECT_NE(refusal({{"", dcp::DType::Float32, {1}}}).find("empty"), std::string::npos);
  EXPECT_NE(refusal({{"__metadata__", dcp::DType::Float32, {1}}}).find("reserved"),
            std::string::npos);
  EXPECT_NE(refusal({{"w", dcp::DType::Float32, {-1}}}).find("invalid shape"), std::string::npos);
  EXPECT_NE(refusal({{"w", dcp::DType::Complex128, {1}}}).find("no dtype for"), std::string::npos);
  EXPECT_NE(refusal({{"bad\xff", dcp::DType::Float32, {1}}}).find("UTF-8"), std::string::npos);
  // A header past the 100 MB readers accept.
  std::vector<TensorSpec> many;
  for (int i = 0; i < 1700; ++i)
    many.push_back({std::to_string(i) + std::string(60000, 'x'), dcp::DType::Float32, {1}});
  EXPECT_NE(refusal(many).find("past the 100000000 readers accept"), std::string::npos);
}

} // namespace
