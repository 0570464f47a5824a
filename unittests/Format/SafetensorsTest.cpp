//===- SafetensorsTest.cpp - The safetensors file layout ------------------===//
#include "fsdp/Format/Safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string_view>

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

/// A whole file: the layout's header, then its data (zeros).
std::string fileOf(const FileLayout &layout) {
  std::string file = layout.header;
  file.resize(layout.fileBytes, '\0');
  return file;
}

/// The 8-byte little-endian length a file starts with.
std::string lengthPrefix(uint64_t length) {
  std::string prefix;
  for (int i = 0; i < 8; ++i)
    prefix.push_back(static_cast<char>(length >> (8 * i)));
  return prefix;
}

/// A file whose header is `json` (padded to 8 bytes), then `dataBytes` of
/// data.
std::string fileWith(std::string json, uint64_t dataBytes) {
  json.append((8 - json.size() % 8) % 8, ' ');
  return lengthPrefix(json.size()) + json + std::string(dataBytes, '\0');
}

/// The error of a call expected to fail (none if it did not).
template <typename T> Error failureOf(const Result<T> &result) {
  EXPECT_FALSE(result);
  return result ? Error{} : result.failure();
}

/// The file's header, read as a reader would: the length, then the JSON.
Result<FileHeader> readHeader(const std::string &file) {
  Result<uint64_t> length = headerLength(file.data(), file.size());
  if (!length)
    return length.failure();
  return safetensors::parseHeader(std::string_view(file).substr(8, *length), file.size());
}

/// Why a file with header `json` and `dataBytes` of data is refused.
Error headerFailure(const std::string &json, uint64_t dataBytes) {
  return failureOf(readHeader(fileWith(json, dataBytes)));
}

Error indexFailure(std::string_view json) { return failureOf(parseIndex(json)); }

/// The error is of `kind` and says `phrase`.
::testing::AssertionResult refused(const Error &error, ErrorKind kind, const std::string &phrase) {
  if (error.kind != kind)
    return ::testing::AssertionFailure() << "kind " << errorKindName(error.kind) << ", not "
                                         << errorKindName(kind) << ": " << error.message;
  if (error.message.find(phrase) == std::string::npos)
    return ::testing::AssertionFailure() << "'" << phrase << "' is not in: " << error.message;
  return ::testing::AssertionSuccess();
}

TEST(Safetensors, ReadsBackWhatLayoutFileWrites) {
  // Every dtype with a safetensors name, in shapes of 0 to 3 dimensions,
  // and an empty tensor that shares its offset with the next.
  std::vector<TensorSpec> specs;
  for (unsigned value = 0; value <= static_cast<unsigned>(dcp::DType::UInt64); ++value) {
    dcp::DType dtype = static_cast<dcp::DType>(value);
    Result<std::string> name = dtypeName(dtype);
    if (!name)
      continue;
    dcp::Dims shape;
    for (unsigned dim = 0; dim < value % 4; ++dim)
      shape.push_back(2 + dim);
    specs.push_back({"model." + *name, dtype, shape});
  }
  specs.insert(specs.begin() + 3, TensorSpec{"model.empty", dcp::DType::Float32, {3, 0}});
  Result<FileLayout> layout = layoutFile(specs, {{"format", "pt"}, {"origin", "fsdp"}});
  ASSERT_TRUE(layout) << layout.error();
  std::string file = fileOf(*layout);

  Result<uint64_t> length = headerLength(file.data(), file.size());
  ASSERT_TRUE(length) << length.error();
  EXPECT_EQ(*length, layout->header.size() - 8);
  Result<FileHeader> header =
      safetensors::parseHeader(std::string_view(file).substr(8, *length), file.size());
  ASSERT_TRUE(header) << header.error();
  EXPECT_EQ(header->dataStart, layout->header.size());
  EXPECT_EQ(header->metadata,
            (std::map<std::string, std::string>{{"format", "pt"}, {"origin", "fsdp"}}));
  // Back in the order written: layoutFile lays them out as given.
  ASSERT_EQ(header->tensors.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorEntry &entry = header->tensors[i];
    EXPECT_EQ(entry.name, specs[i].name);
    EXPECT_EQ(entry.dtype, specs[i].dtype) << entry.name;
    EXPECT_EQ(entry.shape, specs[i].shape) << entry.name;
    EXPECT_EQ(entry.begin, layout->fileOffsets[i]) << entry.name;
    EXPECT_EQ(entry.bytes, layout->byteCounts[i]) << entry.name;
  }
  EXPECT_EQ(header->tensors.back().begin + header->tensors.back().bytes, file.size());
}

TEST(Safetensors, ReadsAFileWithoutTensors) {
  Result<FileLayout> layout = layoutFile({}, {});
  ASSERT_TRUE(layout) << layout.error();
  Result<FileHeader> header = readHeader(fileOf(*layout));
  ASSERT_TRUE(header) << header.error();
  EXPECT_TRUE(header->tensors.empty());
  EXPECT_TRUE(header->metadata.empty());
  EXPECT_EQ(header->dataStart, layout->header.size());
}

TEST(Safetensors, DTypeOfInvertsDTypeName) {
  unsigned named = 0;
  for (unsigned value = 0; value <= static_cast<unsigned>(dcp::DType::UInt64); ++value) {
    dcp::DType dtype = static_cast<dcp::DType>(value);
    Result<std::string> name = dtypeName(dtype);
    if (!name)
      continue;
    ++named;
    Result<dcp::DType> back = dtypeOf(*name);
    ASSERT_TRUE(back) << *name << ": " << back.error();
    EXPECT_EQ(*back, dtype) << *name;
  }
  EXPECT_EQ(named, 18u); // all but Complex32, Complex128 and Float8E8M0FNU
  for (const char *unknown : {"F128", "f32", "", "float32", "BF16 "}) {
    Result<dcp::DType> refusal = dtypeOf(unknown);
    ASSERT_FALSE(refusal) << unknown;
    EXPECT_TRUE(refused(failureOf(refusal), ErrorKind::Incompatible, "unknown safetensors dtype"));
  }
}

TEST(Safetensors, RefusesLengthsThatDoNotFitTheFile) {
  std::string file = fileWith(R"({"__metadata__":{}})", 16);
  EXPECT_TRUE(refused(failureOf(headerLength(file.data(), 7)), ErrorKind::Corrupt,
                      "7 bytes, shorter than the 8-byte header length"));
  EXPECT_TRUE(refused(failureOf(headerLength(file.data(), 0)), ErrorKind::Corrupt,
                      "shorter than the 8-byte header length"));
  // The file cut inside the header.
  EXPECT_TRUE(refused(failureOf(headerLength(file.data(), 8 + 23)), ErrorKind::Corrupt,
                      "header length 24 passes the end of the 31-byte file"));
  // Lengths past 100 MB are refused before the file's size is looked at.
  for (uint64_t length : {kMaxHeaderBytes + 1, uint64_t(1) << 40, UINT64_MAX})
    EXPECT_TRUE(refused(failureOf(headerLength(lengthPrefix(length).data(), UINT64_MAX)),
                        ErrorKind::Corrupt, "passes the 100000000 bytes readers accept"))
        << length;
  Result<uint64_t> largest =
      headerLength(lengthPrefix(kMaxHeaderBytes).data(), 8 + kMaxHeaderBytes);
  ASSERT_TRUE(largest) << largest.error();
  EXPECT_EQ(*largest, kMaxHeaderBytes);
  EXPECT_TRUE(refused(failureOf(headerLength(lengthPrefix(1).data(), 64)), ErrorKind::Corrupt,
                      "no JSON object"));
  // parseHeader checks the JSON it is given against the file, too.
  EXPECT_TRUE(refused(failureOf(safetensors::parseHeader("{}", 9)), ErrorKind::Corrupt,
                      "does not fit the file"));
}

TEST(Safetensors, RefusesHeadersThatAreNotAnObject) {
  EXPECT_TRUE(refused(headerFailure(R"({"w": {"dtype": "F32")", 0), ErrorKind::Corrupt,
                      "the header is not valid JSON"));
  EXPECT_TRUE(refused(headerFailure("not json", 0), ErrorKind::Corrupt, "is not valid JSON"));
  for (const char *json : {"[]", R"("text")", "12", "null"})
    EXPECT_TRUE(
        refused(headerFailure(json, 0), ErrorKind::Corrupt, "the header is not a JSON object"))
        << json;
  // The top object, a tensor's object and its arrays; no deeper.
  EXPECT_TRUE(refused(headerFailure(R"({"w": {"dtype": "F32", "shape": [[1]], )"
                                    R"("data_offsets": [0, 4]}})",
                                    4),
                      ErrorKind::Corrupt, "the header nests deeper than it may"));
  EXPECT_TRUE(refused(headerFailure(std::string(5000, '[') + std::string(5000, ']'), 0),
                      ErrorKind::Corrupt, "nests deeper than it may"));
  EXPECT_TRUE(
      refused(headerFailure(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                            R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                            8),
              ErrorKind::Corrupt, "the header names 'w' twice"));
  EXPECT_TRUE(
      refused(headerFailure(R"({"w": [1]})", 0), ErrorKind::Corrupt, "'w' is not an object"));
  EXPECT_TRUE(refused(headerFailure(R"({"w": {"dtype": "F32", "shape": [1]}})", 4),
                      ErrorKind::Corrupt, "'w' needs exactly dtype"));
  EXPECT_TRUE(
      refused(headerFailure(R"({"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4),
              ErrorKind::Corrupt, "a tensor name is empty"));
}

TEST(Safetensors, RefusesTensorsOutsideOrAcrossEachOther) {
  EXPECT_TRUE(
      refused(headerFailure(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                            R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                            12),
              ErrorKind::Corrupt, "'b' and 'a' overlap in the file"));
  // The same bytes twice is an overlap too.
  EXPECT_TRUE(
      refused(headerFailure(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                            R"( "b": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})",
                            8),
              ErrorKind::Corrupt, "overlap in the file"));
  // The tensors must tile the data: no hole, nothing after the last.
  EXPECT_TRUE(
      refused(headerFailure(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                            R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                            12),
              ErrorKind::Corrupt, "bytes [4, 8) of the data belong to no tensor"));
  EXPECT_TRUE(
      refused(headerFailure(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 9),
              ErrorKind::Corrupt, "5 bytes after the last tensor"));
  EXPECT_TRUE(
      refused(headerFailure(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 7),
              ErrorKind::Corrupt, "'w' has data_offsets [0, 8) outside the file's 7 data bytes"));
  EXPECT_TRUE(
      refused(headerFailure(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8),
              ErrorKind::Corrupt, "outside the file's"));
  EXPECT_TRUE(refused(headerFailure(R"({"w": {"dtype": "U8", "shape": [1], )"
                                    R"("data_offsets": [18446744073709551615, 0]}})",
                                    8),
                      ErrorKind::Corrupt, "outside the file's"));
  EXPECT_TRUE(
      refused(headerFailure(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 8),
              ErrorKind::Corrupt, "data_offsets that are not non-negative integers"));
  // Bytes that do not match the dtype and shape, including a product that
  // wraps 2^64 to the bytes given.
  EXPECT_TRUE(
      refused(headerFailure(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8),
              ErrorKind::Corrupt, "'w' is 4 bytes in the file, not what its dtype and shape take"));
  EXPECT_TRUE(
      refused(headerFailure(R"({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})", 8),
              ErrorKind::Corrupt, "not what its dtype and shape take"));
  EXPECT_TRUE(refused(headerFailure(R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], )"
                                    R"("data_offsets": [0, 0]}})",
                                    0),
                      ErrorKind::Corrupt, "not what its dtype and shape take"));
  // Back to back, and an empty tensor inside another's bytes, read.
  Result<FileHeader> header =
      readHeader(fileWith(R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},)"
                          R"( "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                          R"( "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
                          16));
  ASSERT_TRUE(header) << header.error();
  ASSERT_EQ(header->tensors.size(), 3u);
  EXPECT_EQ(header->tensors[0].name, "a");
  EXPECT_EQ(header->tensors[1].name, "e");
  EXPECT_EQ(header->tensors[2].name, "b");
  EXPECT_EQ(header->tensors[2].begin, header->dataStart + 8);
}

TEST(Safetensors, RefusesBadShapesAndDTypes) {
  for (const char *shape : {"[-1]", "[2, -3]", "[1.5]", "[2.0]", R"(["2"])", "[null]", "[true]",
                            "[9223372036854775808]"})
    EXPECT_TRUE(refused(headerFailure(std::string(R"({"w": {"dtype": "U8", "shape": )") + shape +
                                          R"(, "data_offsets": [0, 0]}})",
                                      0),
                        ErrorKind::Corrupt,
                        "'w' has a dimension that is not a non-negative integer"))
        << shape;
  auto ones = [](size_t dims) {
    std::string shape = "[";
    for (size_t i = 0; i < dims; ++i)
      shape += i ? ", 1" : "1";
    return shape + "]";
  };
  EXPECT_TRUE(refused(headerFailure(R"({"w": {"dtype": "F32", "shape": )" + ones(kMaxDims + 1) +
                                        R"(, "data_offsets": [0, 4]}})",
                                    4),
                      ErrorKind::Corrupt, "'w' has 65 dimensions, more than 64"));
  Result<FileHeader> most = readHeader(fileWith(
      R"({"w": {"dtype": "F32", "shape": )" + ones(kMaxDims) + R"(, "data_offsets": [0, 4]}})", 4));
  ASSERT_TRUE(most) << most.error();
  EXPECT_EQ(most->tensors[0].shape.size(), kMaxDims);
  EXPECT_TRUE(refused(
      headerFailure(R"({"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})", 16),
      ErrorKind::Incompatible, "'w': unknown safetensors dtype 'F128'"));
  EXPECT_TRUE(
      refused(headerFailure(R"({"w": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4),
              ErrorKind::Corrupt, "needs exactly dtype (a string)"));
}

TEST(Safetensors, RefusesMetadataThatIsNotStrings) {
  for (const char *metadata : {R"("pt")", "[]", "null", "1"})
    EXPECT_TRUE(refused(headerFailure(std::string(R"({"__metadata__": )") + metadata + "}", 0),
                        ErrorKind::Corrupt, "__metadata__ is not an object"))
        << metadata;
  for (const char *value : {"1", "null", "[]", R"({"x": "y"})"})
    EXPECT_TRUE(refused(
        headerFailure(std::string(R"({"__metadata__": {"format": "pt", "a": )") + value + "}}", 0),
        ErrorKind::Corrupt, "__metadata__ 'a' is not a string"))
        << value;
}

TEST(Safetensors, ReadsAShardIndex) {
  Result<std::map<std::string, std::string>> files = parseIndex(
      R"({"metadata": {"total_size": 48, "nested": {"a": [1]}},)"
      R"( "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",)"
      R"( "lm_head.weight": "model-00002-of-00002.safetensors"}})");
  ASSERT_TRUE(files) << files.error();
  EXPECT_EQ(*files, (std::map<std::string, std::string>{
                        {"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                        {"lm_head.weight", "model-00002-of-00002.safetensors"}}));
  Result<std::map<std::string, std::string>> empty = parseIndex(R"({"weight_map": {}})");
  ASSERT_TRUE(empty) << empty.error();
  EXPECT_TRUE(empty->empty());
}

TEST(Safetensors, RefusesShardIndexesThatNameOtherPlaces) {
  for (const char *file : {"../x", "a/b", "", ".", "..", "/etc/passwd"})
    EXPECT_TRUE(refused(indexFailure(std::string(R"({"weight_map": {"w": ")") + file + R"("}})"),
                        ErrorKind::Corrupt, "puts 'w' in something that is not a plain file name"))
        << file;
  EXPECT_TRUE(refused(indexFailure(R"({"weight_map": {"w": 1}})"), ErrorKind::Corrupt,
                      "not a plain file name"));
  EXPECT_TRUE(refused(indexFailure(R"({"metadata": {}})"), ErrorKind::Corrupt,
                      "the index has no weight_map object"));
  for (const char *map : {"[]", R"("model.safetensors")", "null"})
    EXPECT_TRUE(refused(indexFailure(std::string(R"({"weight_map": )") + map + "}"),
                        ErrorKind::Corrupt, "the index has no weight_map object"))
        << map;
  EXPECT_TRUE(refused(indexFailure("[]"), ErrorKind::Corrupt, "the index is not a JSON object"));
  EXPECT_TRUE(refused(indexFailure("{"), ErrorKind::Corrupt, "the index is not valid JSON"));
  EXPECT_TRUE(refused(indexFailure(R"({"weight_map": {}, "weight_map": {"w": "a"}})"),
                      ErrorKind::Corrupt, "the index names 'weight_map' twice"));
  // A tensor the map names twice (nlohmann alone would keep the last).
  EXPECT_TRUE(refused(indexFailure(R"({"weight_map": {"w": "a", "w": "b"}})"),
                      ErrorKind::Corrupt, "the index names 'w' twice"));
  EXPECT_TRUE(refused(indexFailure(R"({"metadata": {"a": {"b": [[1]]}}, "weight_map": {}})"),
                      ErrorKind::Corrupt, "the index nests deeper than it may"));
  // Past 64 MiB the index is not parsed at all.
  std::string large(kMaxIndexBytes + 1, ' ');
  EXPECT_TRUE(refused(indexFailure(large), ErrorKind::Corrupt,
                      "the index is 67108865 bytes, more than the 67108864 read"));
}

} // namespace
