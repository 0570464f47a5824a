//===- ZipTest.cpp - Stored zip writer/reader, torch.save items -----------===//
//
// Byte-for-byte agreement with PyTorch's own items is checked against the
// real checkpoint in FixtureTest.cpp; CPython's zipfile reads what we write
// here (test/Format/metadata_python_check.py), zip64 included.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/Zip.h"

#include "../TestSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

using namespace fsdp;
using namespace fsdp::zip;
using namespace std::string_literals;
using dcp::Dims;
using dcp::DType;

namespace {

using fsdp_test::fromHex;

std::string tempPath(const std::string &name) {
  return ::testing::TempDir() + "fsdp-zip-" + std::to_string(getpid()) + "-" + name;
}

std::pair<int, std::string> runPythonCheck(const std::string &args) {
  return fsdp_test::runCapturingOutput(
      std::string(FSDP_PYTHON3) + " " + FSDP_FORMAT_PYTHON_CHECK + " " + args,
      tempPath("python.log"));
}

bool havePython() { return !std::string(FSDP_PYTHON3).empty(); }

/// float32 [3, 4] with element i = i * 0.5, as one complete item.
struct SmallTensorItem {
  TensorRecord record;
  std::string data;
  ItemLayout layout;
  std::string bytes;
};

SmallTensorItem smallTensorItem() {
  SmallTensorItem item;
  item.record = *contiguousTensor(DType::Float32, {3, 4});
  for (int i = 0; i < 12; ++i) {
    float v = i * 0.5f;
    item.data.append(reinterpret_cast<const char *>(&v), sizeof v);
  }
  auto pkl = encodeTensorPickle(item.record);
  EXPECT_TRUE(pkl) << pkl.error();
  auto layout = planTensorItem(*pkl, item.data.size());
  EXPECT_TRUE(layout) << layout.error();
  item.layout = *layout;
  item.layout.setDataCrc(crc32(item.data.data(), item.data.size()));
  item.bytes = item.layout.header + item.data + item.layout.trailer;
  return item;
}

std::string openError(const std::string &bytes) {
  MemorySource source(bytes);
  auto item = openTorchSaveItem(source);
  return item ? std::string("(no error)") : item.error();
}

/// An item whose streamed data is `dataSize` zero bytes, never materialized.
class VirtualItem : public ByteSource {
public:
  explicit VirtualItem(const ItemLayout &layout) : layout_(layout) {}
  uint64_t size() const override { return layout_.totalSize; }
  Status read(uint64_t offset, void *out, size_t count) const override {
    auto *dst = static_cast<char *>(out);
    for (size_t i = 0; i < count; ++i) {
      uint64_t at = offset + i;
      if (at < layout_.header.size())
        dst[i] = layout_.header[at];
      else if (at < layout_.dataOffset + layout_.dataSize)
        dst[i] = 0;
      else
        dst[i] = layout_.trailer[at - layout_.dataOffset - layout_.dataSize];
    }
    return Status::success();
  }

private:
  const ItemLayout &layout_;
};

/// CRC-32 of `n` zero bytes by doubling with crc32Combine.
uint32_t crcOfZeros(uint64_t n) {
  std::string block(1 << 16, '\0');
  uint32_t blockCrc = crc32(block.data(), block.size());
  uint32_t result = 0;
  uint64_t done = 0;
  uint32_t piece = blockCrc;
  uint64_t pieceSize = block.size();
  uint64_t blocks = n / block.size();
  for (uint64_t bit = 1; bit <= blocks && bit; bit <<= 1) {
    if (blocks & bit) {
      result = done ? crc32Combine(result, piece, pieceSize) : piece;
      done += pieceSize;
    }
    piece = crc32Combine(piece, piece, pieceSize);
    pieceSize *= 2;
  }
  uint64_t rest = n - done;
  std::string tail(static_cast<size_t>(rest), '\0');
  return crc32(tail.data(), tail.size(), result);
}

} // namespace

TEST(ZipWriter, InlineArchiveRoundTrip) {
  std::vector<RecordSpec> records(3);
  records[0].name = "a/first";
  records[0].bytes = "hello";
  records[1].name = "a/empty";
  records[2].name = "a/third record";
  records[2].bytes = std::string(1000, 'x');
  auto layout = planArchive(records);
  ASSERT_TRUE(layout) << layout.error();
  EXPECT_TRUE(layout->trailer.empty());
  EXPECT_EQ(layout->header.size(), layout->totalSize);
  MemorySource source(layout->header);
  auto entries = readDirectory(source);
  ASSERT_TRUE(entries) << entries.error();
  ASSERT_EQ(entries->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const Entry &e = (*entries)[i];
    EXPECT_EQ(e.name, records[i].name);
    EXPECT_EQ(e.dataOffset % 64, 0u);
    EXPECT_EQ(e.flags, 0x0808);
    auto bytes = readEntry(source, e);
    ASSERT_TRUE(bytes) << bytes.error();
    EXPECT_EQ(*bytes, records[i].bytes);
  }
}

TEST(ZipWriter, TensorItemRoundTrip) {
  SmallTensorItem item = smallTensorItem();
  EXPECT_EQ(item.bytes.size(), item.layout.totalSize);
  EXPECT_EQ(item.layout.dataOffset % 64, 0u);
  MemorySource source(item.bytes);
  auto opened = openTorchSaveItem(source);
  ASSERT_TRUE(opened) << opened.error();
  EXPECT_EQ(opened->archiveName, "archive");
  EXPECT_EQ(opened->version, 3);
  EXPECT_FALSE(opened->bigEndian);
  std::vector<std::string> names;
  for (const Entry &e : opened->entries)
    names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"archive/data.pkl", "archive/.format_version",
                                             "archive/.storage_alignment", "archive/byteorder",
                                             "archive/data/0", "archive/version",
                                             "archive/.data/serialization_id"}));
  auto record = decodeTensorPickle(opened->dataPkl);
  ASSERT_TRUE(record) << record.error();
  EXPECT_EQ(record->size, (Dims{3, 4}));
  EXPECT_EQ(record->stride, (Dims{4, 1}));
  EXPECT_EQ(record->storageElements, 12u);
  const Entry *data = opened->findRecord("data/" + record->storageKey);
  ASSERT_TRUE(data);
  EXPECT_EQ(data->dataOffset, item.layout.dataOffset);
  EXPECT_EQ(data->size, 48u);
  EXPECT_TRUE(verifyEntryCrc(source, *data));
  std::string out(48, '\0');
  ASSERT_TRUE(copyToContiguous(*record, item.bytes.data() + data->dataOffset, data->size, &out[0]));
  EXPECT_EQ(out, item.data);
}

TEST(ZipWriter, TensorDataStartsWhereAskedInItsPage) {
  // Each multiple of 64 in a page: the data lands there (padding of up to a
  // page), and the archive reads back with its data at that offset.
  std::string data(48, '\x5a');
  for (uint64_t inPage = 0; inPage < kDataPage; inPage += kDataAlignment) {
    auto layout = planContiguousTensorItem(DType::Float32, {3, 4}, inPage);
    ASSERT_TRUE(layout) << layout.error();
    EXPECT_EQ(layout->dataOffset % kDataPage, inPage);
    EXPECT_LT(layout->dataOffset, 2 * kDataPage);
    layout->setDataCrc(crc32(data.data(), data.size()));
    std::string bytes = layout->header + data + layout->trailer;
    ASSERT_EQ(bytes.size(), layout->totalSize);
    MemorySource source(bytes);
    auto opened = openTorchSaveItem(source);
    ASSERT_TRUE(opened) << inPage << ": " << opened.error();
    const Entry *record = opened->findRecord("data/0");
    ASSERT_TRUE(record);
    EXPECT_EQ(record->dataOffset, layout->dataOffset);
    EXPECT_TRUE(verifyEntryCrc(source, *record));
  }
  // Where PyTorch's writer puts the data anyway: the same bytes as without.
  auto natural = planContiguousTensorItem(DType::Float32, {3, 4});
  ASSERT_TRUE(natural);
  auto same = planContiguousTensorItem(DType::Float32, {3, 4}, natural->dataOffset % kDataPage);
  ASSERT_TRUE(same);
  EXPECT_EQ(same->header, natural->header);
  EXPECT_EQ(same->trailer, natural->trailer);
  for (uint64_t bad : {uint64_t(32), kDataPage, kDataPage + 64}) {
    auto refused = planContiguousTensorItem(DType::Float32, {3, 4}, bad);
    ASSERT_FALSE(refused) << bad;
    EXPECT_NE(refused.error().find("is not a multiple of 64 below 4096"), std::string::npos)
        << refused.error();
  }
}

TEST(ZipWriter, CPythonReadsTensorItem) {
  if (!havePython())
    GTEST_SKIP() << "python3 not found at configure time";
  SmallTensorItem item = smallTensorItem();
  std::string path = tempPath("tensor.zip");
  std::ofstream(path, std::ios::binary) << item.bytes;
  auto [code, output] = runPythonCheck("--tensor-item " + path);
  std::remove(path.c_str());
  EXPECT_EQ(code, 0) << output;
}

TEST(ZipWriter, CPythonReadsObjectItem) {
  pickle::Writer w(pickle::Writer::Options{true});
  w.real(0.9);
  w.real(0.999);
  w.tupleOf(2);
  auto pkl = w.finish();
  ASSERT_TRUE(pkl);
  auto bytes = buildObjectItem(*pkl);
  ASSERT_TRUE(bytes) << bytes.error();
  MemorySource source(*bytes);
  auto opened = openTorchSaveItem(source);
  ASSERT_TRUE(opened) << opened.error();
  EXPECT_EQ(opened->findRecord("data/0"), nullptr);
  auto doc = pickle::read(opened->dataPkl);
  ASSERT_TRUE(doc);
  EXPECT_EQ(*pickle::toPythonRepr(*doc->root()), "(0.9, 0.999)");
  if (!havePython())
    GTEST_SKIP() << "python3 not found at configure time";
  std::string path = tempPath("object.zip");
  std::ofstream(path, std::ios::binary) << *bytes;
  auto [code, output] = runPythonCheck("--object-item " + path + " '(0.9, 0.999)'");
  std::remove(path.c_str());
  EXPECT_EQ(code, 0) << output;
}

TEST(ZipWriter, Zip64BeyondFourGiB) {
  const uint64_t dataBytes = (uint64_t(5) << 30) + 3;
  auto record = contiguousTensor(DType::UInt8, {static_cast<int64_t>(dataBytes)});
  ASSERT_TRUE(record);
  auto pkl = encodeTensorPickle(*record);
  ASSERT_TRUE(pkl);
  auto planned = planTensorItem(*pkl, dataBytes, {"archive", "0000000000000000000100000000000000000002"});
  ASSERT_TRUE(planned) << planned.error();
  ItemLayout layout = *planned;
  EXPECT_EQ(layout.dataOffset % 64, 0u);
  EXPECT_EQ(layout.totalSize, layout.header.size() + dataBytes + layout.trailer.size());
  layout.setDataCrc(crcOfZeros(dataBytes));

  VirtualItem source(layout);
  auto entries = readDirectory(source);
  ASSERT_TRUE(entries) << entries.error();
  ASSERT_EQ(entries->size(), 7u);
  const Entry &data = (*entries)[4];
  EXPECT_EQ(data.name, "archive/data/0");
  EXPECT_EQ(data.size, dataBytes);
  EXPECT_EQ(data.dataOffset, layout.dataOffset);
  EXPECT_EQ(data.crc, crcOfZeros(dataBytes));
  const Entry &version = (*entries)[5];
  EXPECT_GT(version.headerOffset, uint64_t(0xFFFFFFFF));
  EXPECT_EQ(version.dataOffset % 64, 0u);
  auto opened = openTorchSaveItem(source);
  ASSERT_TRUE(opened) << opened.error();
  EXPECT_EQ(opened->version, 3);
  auto id = readEntry(source, (*entries)[6]);
  ASSERT_TRUE(id);
  EXPECT_EQ(*id, "0000000000000000000100000000000000000002");

  if (!havePython())
    GTEST_SKIP() << "python3 not found at configure time";
  // A sparse file: only the header and trailer take disk space.
  std::string path = tempPath("zip64.zip");
  {
    std::ofstream out(path, std::ios::binary);
    out << layout.header;
    out.seekp(static_cast<std::streamoff>(layout.dataOffset + dataBytes));
    out << layout.trailer;
  }
  auto [code, output] = runPythonCheck("--zip64-item " + path + " " + std::to_string(dataBytes));
  std::remove(path.c_str());
  EXPECT_EQ(code, 0) << output;
}

TEST(ZipCrc, CombineEqualsDirect) {
  std::mt19937 rng(7);
  std::string data(300000, '\0');
  for (char &c : data)
    c = static_cast<char>(rng());
  uint32_t whole = crc32(data.data(), data.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(4096), size_t(299999)}) {
    uint32_t a = crc32(data.data(), cut);
    uint32_t b = crc32(data.data() + cut, data.size() - cut);
    EXPECT_EQ(crc32Combine(a, b, data.size() - cut), whole) << cut;
  }
  EXPECT_EQ(crcOfZeros(1000003), crc32(std::string(1000003, '\0').data(), 1000003));
}

TEST(ZipCrc, KnownValuesAndChaining) {
  // The standard CRC-32 check value, and zlib's for a byte pattern: the same
  // values whichever implementation (ISA-L or zlib) is built in.
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32("", 0), 0u);
  std::string pattern(1 << 20, '\0');
  for (size_t i = 0; i < pattern.size(); ++i)
    pattern[i] = static_cast<char>(i * 31 + (i >> 8));
  uint32_t whole = crc32(pattern.data(), pattern.size());
  uint32_t chained = 0;
  for (size_t at = 0; at < pattern.size(); at += 4093)
    chained = crc32(pattern.data() + at, std::min<size_t>(4093, pattern.size() - at), chained);
  EXPECT_EQ(chained, whole);
  EXPECT_EQ(whole, static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef *>(pattern.data()),
                                                 static_cast<uInt>(pattern.size()))));
}

TEST(ZipReader, EveryTruncationFails) {
  SmallTensorItem item = smallTensorItem();
  for (size_t n = 0; n < item.bytes.size(); ++n) {
    std::string error = openError(item.bytes.substr(0, n));
    EXPECT_EQ(error.rfind("zip: ", 0), 0u) << n << ": " << error;
  }
  // Losing the front breaks every offset.
  EXPECT_NE(openError(item.bytes.substr(64)).find("zip: "), std::string::npos);
}

TEST(ZipReader, BadCrc) {
  SmallTensorItem item = smallTensorItem();
  std::string corrupt = item.bytes;
  corrupt[64] ^= 0x01; // first byte of data.pkl's data
  EXPECT_EQ(openError(corrupt).find("zip: CRC mismatch in entry 'archive/data.pkl'"), 0u)
      << openError(corrupt);
  corrupt = item.bytes;
  corrupt[item.layout.dataOffset + 5] ^= 0x40; // inside data/0
  MemorySource source(corrupt);
  auto opened = openTorchSaveItem(source); // data/0 is not read here
  ASSERT_TRUE(opened) << opened.error();
  Status s = verifyEntryCrc(source, *opened->findRecord("data/0"));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().find("zip: CRC mismatch in entry 'archive/data/0'"), 0u) << s.error();
}

TEST(ZipReader, DeflatedEntriesAreRefused) {
  // CPython zipfile, ZIP_DEFLATED: archive/data.pkl deflated, version stored.
  std::string deflated =
      fromHex("504b0304140000000800f5b37d5d931af9d0080000002000000010000000617263686976652f"
              "646174612e706b6c6b60f2d36bc08301504b030414000000000000002100d19e675502000000"
              "020000000f000000617263686976652f76657273696f6e330a504b01021403140000000800f5"
              "b37d5d931af9d00800000020000000100000000000000000000000800100000000617263686976"
              "652f646174612e706b6c504b0102140314000000000000002100d19e67550200000002000000"
              "0f0000000000000000000000800136000000617263686976652f76657273696f6e504b0506000000"
              "00020002007b000000650000000000");
  MemorySource source(deflated);
  auto entries = readDirectory(source);
  ASSERT_TRUE(entries) << entries.error();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].method, 8);
  auto bytes = readEntry(source, (*entries)[0]);
  ASSERT_FALSE(bytes);
  EXPECT_EQ(bytes.error(), "zip: entry 'archive/data.pkl' is deflate-compressed; only "
                           "stored entries are supported");
  EXPECT_EQ(*readEntry(source, (*entries)[1]), "3\n");
  EXPECT_EQ(openError(deflated), bytes.error());
}

TEST(ZipReader, HeaderInconsistencies) {
  SmallTensorItem item = smallTensorItem();
  MemorySource good(item.bytes);
  auto entries = *readDirectory(good);
  // Find the central directory entry of data.pkl: the first one.
  size_t central = item.bytes.find("PK\x01\x02"s);
  ASSERT_NE(central, std::string::npos);

  std::string renamed = item.bytes;
  renamed[30] = 'X'; // first letter of data.pkl's name in its local header
  EXPECT_NE(openError(renamed).find("local header names 'Xrchive/data.pkl'"), std::string::npos)
      << openError(renamed);

  std::string encrypted = item.bytes;
  encrypted[central + 8] |= 0x01;
  EXPECT_EQ(openError(encrypted), "zip: entry 'archive/data.pkl' is encrypted");

  std::string methods = item.bytes;
  methods[central + 10] = 8;
  EXPECT_EQ(openError(methods),
            "zip: entry 'archive/data.pkl': local and central compression methods differ");
  methods[8] = 8; // and in the local header: a deflated entry
  EXPECT_EQ(openError(methods), "zip: entry 'archive/data.pkl' is deflate-compressed; only "
                                "stored entries are supported");

  // The zip64 end record's central directory offset points past it.
  size_t zip64End = item.bytes.find("PK\x06\x06"s);
  ASSERT_NE(zip64End, std::string::npos);
  std::string offsets = item.bytes;
  offsets[zip64End + 48 + 3] = 0x10;
  EXPECT_NE(openError(offsets).find("central directory ["), std::string::npos)
      << openError(offsets);

  std::string disks = item.bytes;
  disks[zip64End + 16] = 1;
  EXPECT_EQ(openError(disks), "zip: multi-disk archives are not supported");
  (void)entries;
}

/// Reads of `base`, the bytes of each recorded.
class RecordingSource : public ByteSource {
public:
  explicit RecordingSource(const ByteSource &base) : base_(base) {}
  uint64_t size() const override { return base_.size(); }
  Status read(uint64_t offset, void *out, size_t count) const override {
    reads.push_back(count);
    return base_.read(offset, out, count);
  }
  mutable std::vector<size_t> reads;

private:
  const ByteSource &base_;
};

TEST(ZipReader, TheEndRecordIsReadFromTheLastPageUnlessACommentHidesIt) {
  // A 1 MiB tensor item: opening it reads no more than a page at a time
  // (a load opens every item, each read waiting behind the disk's queue).
  Result<ItemLayout> layout = planContiguousTensorItem(DType::Float32, {256, 1024});
  ASSERT_TRUE(layout) << layout.error();
  VirtualItem item(*layout);
  RecordingSource recorded(item);
  auto opened = openTorchSaveItem(recorded);
  ASSERT_TRUE(opened) << opened.error();
  ASSERT_FALSE(recorded.reads.empty());
  EXPECT_LE(*std::max_element(recorded.reads.begin(), recorded.reads.end()), 4096u);
  // An end record behind a comment longer than a page: found in the
  // second, wider window.
  SmallTensorItem small = smallTensorItem();
  std::string commented = small.bytes;
  const uint64_t comment = 10000;
  commented[commented.size() - 2] = static_cast<char>(comment & 0xFF);
  commented[commented.size() - 1] = static_cast<char>(comment >> 8);
  commented.append(comment, 'c');
  MemorySource source(commented);
  auto found = openTorchSaveItem(source);
  ASSERT_TRUE(found) << found.error();
  EXPECT_EQ(found->entries.size(), 7u);
  // One whose comment runs past the end is still no zip.
  commented.resize(commented.size() - 1);
  EXPECT_NE(openError(commented).find("no end of central directory record"), std::string::npos)
      << openError(commented);
}

TEST(ZipReader, SingleByteCorruptionNeverCrashes) {
  SmallTensorItem item = smallTensorItem();
  for (size_t i = 0; i < item.bytes.size(); ++i) {
    for (uint8_t flip : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xff)}) {
      std::string corrupt = item.bytes;
      corrupt[i] = static_cast<char>(corrupt[i] ^ flip);
      MemorySource source(corrupt);
      auto opened = openTorchSaveItem(source);
      if (opened) {
        auto record = decodeTensorPickle(opened->dataPkl);
        (void)record;
      }
    }
  }
}

TEST(TorchSaveItem, StructuralErrors) {
  auto archive = [](std::vector<std::pair<std::string, std::string>> files) {
    std::vector<RecordSpec> records;
    for (auto &[name, bytes] : files) {
      RecordSpec r;
      r.name = name;
      r.bytes = bytes;
      records.push_back(r);
    }
    return planArchive(records)->header;
  };
  std::string pkl = "\x80\x02N.";
  EXPECT_EQ(openError(archive({{"archive/data.pkl", pkl}})),
            "zip: torch.save archive has no version record");
  EXPECT_EQ(openError(archive({{"archive/version", "3\n"}})),
            "zip: torch.save archive has no data.pkl");
  EXPECT_EQ(openError(archive({{"archive/data.pkl", pkl}, {"archive/version", "99\n"}})),
            "zip: torch.save archive: unsupported version '99\n'");
  EXPECT_EQ(openError(archive({{"archive/data.pkl", pkl}, {"other/version", "3\n"}})),
            "zip: torch.save archive: record 'other/version' is outside folder 'archive'");
  EXPECT_EQ(openError(archive({{"data.pkl", pkl}})),
            "zip: torch.save archive: first record 'data.pkl' is not inside a folder");
  EXPECT_EQ(openError(archive(
                {{"a/data.pkl", pkl}, {"a/.data/version", "2"}, {"a/byteorder", "middle"}})),
            "zip: torch.save archive: unknown byteorder 'middle'");
  std::string bigEndian =
      archive({{"x/data.pkl", pkl}, {"x/.data/version", "2"}, {"x/byteorder", "big"}});
  MemorySource big(bigEndian);
  auto opened = openTorchSaveItem(big);
  ASSERT_TRUE(opened) << opened.error();
  EXPECT_TRUE(opened->bigEndian);
  EXPECT_EQ(opened->version, 2);
  EXPECT_EQ(opened->archiveName, "x");
}

TEST(TensorPickle, EveryDTypeRoundTrips) {
  for (DType dtype :
       {DType::Float64,        DType::Float32,       DType::Float16,        DType::BFloat16,
        DType::Int64,          DType::Int32,         DType::Int16,          DType::Int8,
        DType::UInt8,          DType::Bool,          DType::Complex32,      DType::Complex64,
        DType::Complex128,     DType::Float8E4M3FN,  DType::Float8E4M3FNUZ, DType::Float8E5M2,
        DType::Float8E5M2FNUZ, DType::Float8E8M0FNU, DType::UInt16,         DType::UInt32,
        DType::UInt64}) {
    const dcp::DTypeInfo &info = dcp::dtypeInfo(dtype);
    for (const Dims &size : {Dims{}, Dims{7}, Dims{2, 3}, Dims{2, 1, 3}, Dims{1, 2, 1, 2, 2}}) {
      auto record = contiguousTensor(dtype, size);
      ASSERT_TRUE(record);
      auto pkl = encodeTensorPickle(*record);
      ASSERT_TRUE(pkl) << pkl.error();
      std::string rebuild = info.legacyStorage ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3";
      EXPECT_EQ(pkl->find("\x80\x02"
                          "ctorch._utils\n" +
                          rebuild + "\n"),
                0u)
          << info.name;
      auto back = decodeTensorPickle(*pkl);
      ASSERT_TRUE(back) << info.name << ": " << back.error();
      EXPECT_EQ(back->dtype, dtype);
      EXPECT_EQ(back->size, record->size);
      EXPECT_EQ(back->stride, record->stride);
      EXPECT_EQ(back->storageElements, record->storageElements);
      EXPECT_EQ(back->storageBytes(), record->storageBytes());
    }
  }
}

TEST(TensorPickle, StridedViewsAndOffsets) {
  // A transposed view of a 2x3 storage (size (3, 2), stride (1, 3)),
  // starting one element in: storage of 7 elements.
  TensorRecord record;
  record.dtype = DType::Int16;
  record.storageElements = 7;
  record.storageOffset = 1;
  record.size = {3, 2};
  record.stride = {1, 3};
  auto pkl = encodeTensorPickle(record);
  ASSERT_TRUE(pkl);
  auto back = decodeTensorPickle(*pkl);
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(back->storageOffset, 1);
  EXPECT_EQ(back->stride, (Dims{1, 3}));
  int16_t storage[7] = {-1, 0, 1, 2, 3, 4, 5};
  int16_t out[6] = {};
  ASSERT_TRUE(copyToContiguous(*back, storage, sizeof storage, out));
  EXPECT_EQ(std::vector<int16_t>(out, out + 6), (std::vector<int16_t>{0, 3, 1, 4, 2, 5}));
  // Big-endian items are swapped per element.
  ASSERT_TRUE(copyToContiguous(*back, storage, sizeof storage, out, /*swapBytes=*/true));
  EXPECT_EQ(out[1], static_cast<int16_t>(0x0300));
  // A storage record shorter than the pickle says.
  EXPECT_FALSE(copyToContiguous(*back, storage, 4, out));

  // Storage offset 2: the view reaches element 7 of 7. The writer refuses
  // it, and so does the reader.
  record.storageOffset = 2;
  auto refused = encodeTensorPickle(record);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().find("reaches past the storage of 7 elements"), std::string::npos)
      << refused.error();
  std::string shifted = *pkl;
  size_t at = shifted.find("QK\x01"); // BINPERSID, then the storage offset
  ASSERT_NE(at, std::string::npos);
  shifted[at + 2] = 2;
  auto outside = decodeTensorPickle(shifted);
  ASSERT_FALSE(outside);
  EXPECT_NE(outside.error().find("reaches past the storage of 7 elements"), std::string::npos)
      << outside.error();
}

TEST(TensorPickle, OlderRebuildForms) {
  auto storagePid = [](pickle::Writer &w, const char *cls, int64_t numel) {
    w.mark();
    w.string("storage");
    w.global("torch", cls);
    w.string("0");
    w.string("cpu");
    w.integer(numel);
    w.tupleFromMark();
    w.persistentId();
  };
  // _rebuild_tensor(storage, offset, size, stride)
  pickle::Writer v1;
  v1.global("torch._utils", "_rebuild_tensor");
  v1.mark();
  storagePid(v1, "DoubleStorage", 4);
  v1.integer(0);
  v1.intTuple({4});
  v1.intTuple({1});
  v1.tupleFromMark();
  v1.reduce();
  auto record = decodeTensorPickle(*v1.finish());
  ASSERT_TRUE(record) << record.error();
  EXPECT_EQ(record->dtype, DType::Float64);
  EXPECT_EQ(record->size, Dims{4});

  // _rebuild_parameter(_rebuild_tensor_v2(...), True, OrderedDict())
  pickle::Writer param;
  param.global("torch._utils", "_rebuild_parameter");
  param.global("torch._utils", "_rebuild_tensor_v2");
  param.mark();
  storagePid(param, "BFloat16Storage", 6);
  param.integer(0);
  param.intTuple({2, 3});
  param.intTuple({3, 1});
  param.boolean(false);
  param.global("collections", "OrderedDict");
  param.emptyTuple();
  param.reduce();
  param.tupleFromMark();
  param.reduce();
  param.boolean(true);
  param.global("collections", "OrderedDict");
  param.emptyTuple();
  param.reduce();
  param.tupleOf(3);
  param.reduce();
  record = decodeTensorPickle(*param.finish());
  ASSERT_TRUE(record) << record.error();
  EXPECT_EQ(record->dtype, DType::BFloat16);
  EXPECT_TRUE(record->requiresGrad);
  EXPECT_EQ(record->stride, (Dims{3, 1}));
}

TEST(TensorPickle, Errors) {
  auto error = [](const std::string &pkl) {
    auto record = decodeTensorPickle(pkl);
    return record ? std::string("(no error)") : record.error();
  };
  EXPECT_EQ(error("\x80\x02N."), "tensor data.pkl: not a _rebuild_tensor, _rebuild_tensor_v2 or "
                                 "_rebuild_tensor_v3 call");
  pickle::Writer w;
  w.global("torch._utils", "_rebuild_tensor_v2");
  w.mark();
  w.integer(1); // not a persistent id
  w.integer(0);
  w.intTuple({1});
  w.intTuple({1});
  w.boolean(false);
  w.none();
  w.tupleFromMark();
  w.reduce();
  EXPECT_EQ(error(*w.finish()), "tensor data.pkl: storage is not a persistent id "
                                "('storage', class, key, location, numel)");
  // Storage classes outside the allow-list never get as far as the decoder.
  pickle::Writer q;
  q.global("torch", "QInt8Storage");
  EXPECT_NE(error(*q.finish()).find("global 'torch.QInt8Storage' is not allowed"),
            std::string::npos);
}
