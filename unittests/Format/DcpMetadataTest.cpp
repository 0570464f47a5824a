//===- DcpMetadataTest.cpp - DCP `.metadata` read, write, validate --------===//
//
// The real PyTorch-written `.metadata` is covered by FixtureTest.cpp. Here:
// our writer round-trips and is checked by CPython's unpickler against
// stand-in classes (test/Format/metadata_python_check.py); a hand-assembled
// protocol-4 pickle in PyTorch's style (memo sharing, LONG1, plain tuples,
// pathlib) and older variants parse; invalid metadata is refused with the
// key named.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/DcpMetadata.h"

#include "../TestSupport.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

using namespace fsdp;
using namespace fsdp::dcp;

namespace {

/// Must match EXPECTED_* in test/Format/metadata_python_check.py.
Metadata referenceMetadata() {
  Metadata md;
  auto tensor = [](DType dtype, Dims size, std::vector<ChunkMetadata> chunks) {
    StorageMetadata m;
    m.properties.dtype = dtype;
    m.size = std::move(size);
    m.chunks = std::move(chunks);
    return m;
  };
  StorageMetadata bytes;
  bytes.isBytes = true;
  md.stateDictMetadata = {
      {"model.w", tensor(DType::Float32, {5, 3}, {{{0, 0}, {3, 3}}, {{3, 0}, {2, 3}}})},
      {"model.b", tensor(DType::BFloat16, {7}, {{{0}, {7}}})},
      {"optimizer.state.w.step", tensor(DType::Float32, {}, {{{}, {}}})},
      {"big", tensor(DType::UInt8, {6000000000},
                     {{{0}, {3000000000}}, {{3000000000}, {3000000000}}})},
      {"optimizer.param_groups.0.lr", bytes},
      {"f8", tensor(DType::Float8E4M3FN, {2, 2, 2, 2, 2},
                    {{{0, 0, 0, 0, 0}, {2, 2, 2, 2, 2}}})},
  };
  auto info = [](std::string path, uint64_t offset, uint64_t length) {
    StorageInfo i;
    i.relativePath = std::move(path);
    i.offset = offset;
    i.length = length;
    return i;
  };
  StorageInfo compressed = info("__1_0.distcp", 5000000000, 3000001600);
  compressed.transformDescriptors = std::vector<std::string>{"stream.zstd/1"};
  md.storageData = {
      {{"model.w", Dims{0, 0}, 0}, info("__0_0.distcp", 0, 1833)},
      {{"model.w", Dims{3, 0}, 1}, info("__1_0.distcp", 0, 1705)},
      {{"model.b", Dims{0}, 0}, info("__0_0.distcp", 1833, 1577)},
      {{"optimizer.state.w.step", Dims{}, 0}, info("__0_0.distcp", 3410, 1577)},
      {{"big", Dims{0}, 0}, info("__0_0.distcp", 4987, 3000001600)},
      {{"big", Dims{3000000000}, 1}, compressed},
      {{"optimizer.param_groups.0.lr", std::nullopt, std::nullopt},
       info("__1_0.distcp", 1705, 1261)},
      {{"f8", Dims{0, 0, 0, 0, 0}, 0}, info("__0_0.distcp", 3000006587, 1600)},
  };
  md.plannerData = std::vector<std::pair<std::string, std::vector<PathPart>>>{
      {"model.w", {std::string("model"), std::string("w")}},
      {"model.b", {std::string("model"), std::string("b")}},
      {"optimizer.state.w.step",
       {std::string("optimizer"), std::string("state"), std::string("w"),
        std::string("step")}},
      {"big", {std::string("big")}},
      {"optimizer.param_groups.0.lr",
       {std::string("optimizer"), std::string("param_groups"), int64_t(0),
        std::string("lr")}},
      {"f8", {std::string("f8")}},
  };
  StorageMeta meta;
  meta.checkpointId = "/ckpt/run-1";
  meta.saveId = "5d0c3f4e-8a4b-4c53-9a4e-2b8f0c1d2e3f";
  md.storageMeta = meta;
  md.version = "1.0.0";
  return md;
}

std::string tempPath(const std::string &name) {
  return ::testing::TempDir() + "fsdp-format-" + std::to_string(getpid()) + "-" + name;
}

void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Runs the Python check script; returns its exit code and output.
std::pair<int, std::string> runPythonCheck(const std::string &args) {
  return fsdp_test::runCapturingOutput(
      std::string(FSDP_PYTHON3) + " " + FSDP_FORMAT_PYTHON_CHECK + " " + args,
      tempPath("python.log"));
}

/// Assembles a protocol-4 pickle the way CPython writes one: FRAME, every
/// string and object MEMOIZEd, repeats as BINGET.
class Protocol4 {
public:
  Protocol4() : out_("\x80\x04\x95" + std::string(8, '\0')) {}
  uint32_t memoize() {
    out_ += '\x94';
    return next_++;
  }
  uint32_t str(std::string_view s) {
    out_ += '\x8c';
    out_ += static_cast<char>(s.size());
    out_ += s;
    return memoize();
  }
  uint32_t str8(std::string_view s) {
    out_ += '\x8d';
    for (int i = 0; i < 8; ++i)
      out_ += static_cast<char>(uint64_t(s.size()) >> (8 * i));
    out_ += s;
    return memoize();
  }
  void get(uint32_t index) {
    if (index < 256) {
      out_ += 'h';
      out_ += static_cast<char>(index);
    } else {
      out_ += 'j';
      for (int i = 0; i < 4; ++i)
        out_ += static_cast<char>(index >> (8 * i));
    }
  }
  uint32_t global(std::optional<uint32_t> module, std::string_view moduleName,
                  std::string_view name) {
    module ? get(*module) : (void)str(moduleName);
    str(name);
    out_ += '\x93';
    return memoize();
  }
  void op(char c) { out_ += c; }
  /// An int as CPython writes it: BININT1/BININT2/BININT or LONG1.
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      out_ += static_cast<char>(v);
    } else if (v >= 0 && v < 65536) {
      out_ += 'M';
      out_ += static_cast<char>(v);
      out_ += static_cast<char>(v >> 8);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      for (int i = 0; i < 4; ++i)
        out_ += static_cast<char>(v >> (8 * i));
    } else {
      std::string raw;
      for (int i = 0; i < 8; ++i)
        raw += static_cast<char>(uint64_t(v) >> (8 * i));
      while (raw.size() > 1 && ((raw.back() == 0 && !(raw[raw.size() - 2] & 0x80)) ||
                                (raw.back() == '\xff' && (raw[raw.size() - 2] & 0x80))))
        raw.pop_back();
      out_ += '\x8a';
      out_ += static_cast<char>(raw.size());
      out_ += raw;
    }
  }
  /// A tuple of ints (memoized when non-empty).
  uint32_t intTuple(const Dims &dims) {
    if (dims.empty()) {
      out_ += ')';
      return UINT32_MAX;
    }
    if (dims.size() > 3)
      out_ += '(';
    for (int64_t d : dims)
      integer(d);
    out_ += dims.size() > 3 ? 't' : static_cast<char>('\x85' + dims.size() - 1);
    return memoize();
  }
  /// torch.Size(dims) through the memoized class.
  uint32_t size(uint32_t sizeClass, const Dims &dims) {
    get(sizeClass);
    return sizeArgs(dims);
  }
  /// torch.Size(dims) for the class on the stack.
  uint32_t sizeArgs(const Dims &dims) {
    intTuple(dims);
    out_ += '\x85';
    memoize();
    out_ += 'R';
    return memoize();
  }
  /// cls.__new__(cls) for the class on the stack.
  uint32_t construct() {
    out_ += ')';
    out_ += '\x81';
    return memoize();
  }
  /// cls.__new__(cls) for a memoized class.
  uint32_t newObject(uint32_t cls) {
    get(cls);
    return construct();
  }
  std::string finish() {
    out_ += '.';
    uint64_t frame = out_.size() - 11;
    for (int i = 0; i < 8; ++i)
      out_[3 + i] = static_cast<char>(frame >> (8 * i));
    return out_;
  }

private:
  std::string out_;
  uint32_t next_ = 0;
};

/// A PyTorch-style protocol-4 `.metadata`: memo sharing everywhere (module
/// and field strings, classes, dtype/layout/enum objects, one torch.Size
/// object shared by two chunks, FQNs shared with MetadataIndex), LONG1
/// sizes and offsets, Megatron-FSDP's plain tuples for one chunk, a pathlib
/// checkpoint_id, an unknown extra attribute.
std::string handMadeProtocol4() {
  Protocol4 p;
  const char *kMod = "torch.distributed.checkpoint.metadata";
  uint32_t mod = p.str(kMod);
  p.str("Metadata");
  p.op('\x93');
  p.memoize();
  p.construct();
  p.op('}');
  p.memoize();
  p.op('(');

  p.str("state_dict_metadata");
  p.op('}');
  p.memoize();
  p.op('(');
  // model.w: float32 [6, 3], chunks (0,0)/(3,3) and (3,0)/(3,3) sharing one
  // torch.Size for their sizes.
  uint32_t fqnW = p.str("model.w");
  uint32_t tsm = p.global(mod, "", "TensorStorageMetadata");
  p.construct();
  p.op('}');
  p.memoize();
  p.op('(');
  uint32_t keyProperties = p.str("properties");
  uint32_t tp = p.global(mod, "", "TensorProperties");
  p.construct();
  p.op('(');
  uint32_t f32 = p.global(std::nullopt, "torch", "float32");
  uint32_t torchStr = f32 - 2; // memoized just before: 'torch', 'float32'
  p.global(std::nullopt, "torch.serialization", "_get_layout");
  p.str("torch.strided");
  p.op('\x85');
  p.memoize();
  p.op('R');
  uint32_t layout = p.memoize();
  p.op('\x89');
  p.global(mod, "", "_MEM_FORMAT_ENCODING");
  p.integer(0);
  p.op('\x85');
  p.memoize();
  p.op('R');
  uint32_t contiguous = p.memoize();
  p.op('\x89');
  p.op('t');
  p.memoize();
  p.op('b');
  uint32_t keySize = p.str("size");
  uint32_t sizeClass = p.global(torchStr, "", "Size");
  p.sizeArgs({6, 3});
  uint32_t keyChunks = p.str("chunks");
  p.op(']');
  p.memoize();
  p.op('(');
  uint32_t csm = p.global(mod, "", "ChunkStorageMetadata");
  p.construct();
  p.op('}');
  p.memoize();
  p.op('(');
  uint32_t keyOffsets = p.str("offsets");
  uint32_t zeroZero = p.size(sizeClass, {0, 0});
  uint32_t keySizes = p.str("sizes");
  uint32_t threeThree = p.size(sizeClass, {3, 3});
  p.op('u');
  p.op('b');
  p.newObject(csm);
  p.op('}');
  p.memoize();
  p.op('(');
  p.get(keyOffsets);
  uint32_t threeZero = p.size(sizeClass, {3, 0});
  p.get(keySizes);
  p.get(threeThree); // the same torch.Size object
  p.op('u');
  p.op('b');
  p.op('e');
  p.op('u');
  p.op('b');

  // big: uint8 [6000000000], LONG1 everywhere; second chunk as plain
  // tuples (Megatron-FSDP).
  uint32_t fqnBig = p.str8("big"); // BINUNICODE8
  p.newObject(tsm);
  p.op('}');
  p.memoize();
  p.op('(');
  p.get(keyProperties);
  p.newObject(tp);
  p.op('(');
  p.global(torchStr, "", "uint8");
  p.get(layout);
  p.op('\x89');
  p.get(contiguous);
  p.op('\x89');
  p.op('t');
  p.memoize();
  p.op('b');
  p.get(keySize);
  p.size(sizeClass, {6000000000});
  p.get(keyChunks);
  p.op(']');
  p.memoize();
  p.op('(');
  p.newObject(csm);
  p.op('}');
  p.memoize();
  p.op('(');
  p.get(keyOffsets);
  uint32_t bigZero = p.size(sizeClass, {0});
  p.get(keySizes);
  p.size(sizeClass, {3000000000});
  p.op('u');
  p.op('b');
  p.newObject(csm);
  p.op('}');
  p.memoize();
  p.op('(');
  p.get(keyOffsets);
  p.intTuple({3000000000});
  p.get(keySizes);
  p.intTuple({3000000000});
  p.op('u');
  p.op('b');
  p.op('e');
  p.op('u');
  p.op('b');

  // step: 0-d, shares the float32 dtype, layout and enum objects.
  uint32_t fqnStep = p.str("optimizer.state.w.step");
  p.newObject(tsm);
  p.op('}');
  p.memoize();
  p.op('(');
  p.get(keyProperties);
  p.newObject(tp);
  p.op('(');
  p.get(f32);
  p.get(layout);
  p.op('\x89');
  p.get(contiguous);
  p.op('\x89');
  p.op('t');
  p.memoize();
  p.op('b');
  p.get(keySize);
  uint32_t scalar = p.size(sizeClass, {});
  p.get(keyChunks);
  p.op(']');
  p.memoize();
  p.newObject(csm);
  p.op('}');
  p.memoize();
  p.op('(');
  p.get(keyOffsets);
  p.get(scalar);
  p.get(keySizes);
  p.get(scalar);
  p.op('u');
  p.op('b');
  p.op('a'); // one chunk: APPEND
  p.op('u');
  p.op('b');

  uint32_t fqnLr = p.str("optimizer.param_groups.0.lr");
  p.global(mod, "", "BytesStorageMetadata");
  p.construct();
  p.op('u');

  p.str("planner_data");
  p.op('}');
  p.memoize();
  p.op('(');
  p.get(fqnW);
  uint32_t model = p.str("model");
  p.str("w");
  p.op('\x86');
  p.memoize();
  p.get(fqnLr);
  p.op('(');
  p.str("optimizer");
  p.str("param_groups");
  p.integer(0);
  p.str("lr");
  p.op('t');
  p.memoize();
  p.op('u');
  (void)model;

  p.str("storage_data");
  p.op('}');
  p.memoize();
  p.op('(');
  uint32_t indexClass = 0, infoClass = 0;
  uint32_t keyFqn = 0, keyIndex = 0, keyOffset = 0, keyPath = 0, keyLength = 0;
  uint32_t file0 = 0;
  auto entry = [&](uint32_t fqn, std::optional<uint32_t> offsetSize, const Dims *offsetTuple,
                   int64_t hint, const char *file, int64_t offset, int64_t length,
                   bool first) {
    if (first) {
      indexClass = p.global(mod, "", "MetadataIndex");
      p.construct();
    } else {
      p.newObject(indexClass);
    }
    p.op('}');
    p.memoize();
    p.op('(');
    first ? (void)(keyFqn = p.str("fqn")) : p.get(keyFqn);
    p.get(fqn);
    first ? (void)(keyIndex = p.str("index")) : p.get(keyIndex);
    hint >= 0 ? p.integer(hint) : p.op('N');
    if (offsetSize || offsetTuple) {
      first ? (void)(keyOffset = p.str("offset")) : p.get(keyOffset);
      if (offsetSize)
        p.get(*offsetSize);
      else
        p.intTuple(*offsetTuple);
    }
    p.op('u');
    p.op('b');
    if (first) {
      infoClass = p.global(std::nullopt, "torch.distributed.checkpoint.filesystem",
                           "_StorageInfo");
      p.construct();
    } else {
      p.newObject(infoClass);
    }
    p.op('}');
    p.memoize();
    p.op('(');
    first ? (void)(keyPath = p.str("relative_path")) : p.get(keyPath);
    if (first)
      file0 = p.str(file);
    else if (std::string(file) == "__0_0.distcp")
      p.get(file0);
    else
      p.str(file);
    p.get(keyOffset);
    p.integer(offset);
    first ? (void)(keyLength = p.str("length")) : p.get(keyLength);
    p.integer(length);
    p.op('u');
    p.op('b');
  };
  Dims bigSecond{3000000000};
  entry(fqnW, zeroZero, nullptr, 0, "__0_0.distcp", 0, 1833, true);
  entry(fqnW, threeZero, nullptr, 1, "__1_0.distcp", 0, 1833, false);
  entry(fqnBig, bigZero, nullptr, 0, "__0_0.distcp", 1833, 3000001600, false);
  entry(fqnBig, std::nullopt, &bigSecond, 1, "__1_0.distcp", 5000000000, 3000001600, false);
  entry(fqnStep, scalar, nullptr, 0, "__0_0.distcp", 3000003433, 1577, false);
  entry(fqnLr, std::nullopt, nullptr, -1, "__1_0.distcp", 1833, 1261, false);
  p.op('u');

  p.str("storage_meta");
  p.global(mod, "", "StorageMeta");
  p.construct();
  p.op('}');
  p.memoize();
  p.op('(');
  p.str("checkpoint_id");
  uint32_t posix = p.global(std::nullopt, "pathlib", "PosixPath");
  (void)posix;
  p.op('(');
  p.str("/");
  p.str("root");
  p.str("out");
  p.op('t');
  p.memoize();
  p.op('R');
  p.memoize();
  p.str("save_id");
  p.str("44e95c25-0e38-4291-aff3-f6b9057fcfe2");
  p.str("load_id");
  p.op('N');
  p.str("modules");
  p.op(']');
  p.memoize();
  p.op('u');
  p.op('b');

  p.str("mcore_data"); // Megatron-Core's extra attribute: ignored
  p.op('}');
  p.memoize();
  p.str("x");
  p.integer(1);
  p.op('s');

  p.str("version");
  p.str("1.0.0");
  p.op('u');
  p.op('b');
  return p.finish();
}

std::string parseError(const std::string &bytes) {
  auto md = parseMetadata(bytes);
  return md ? std::string("(no error)") : md.error();
}

} // namespace

TEST(DcpMetadata, RoundTrip) {
  Metadata md = referenceMetadata();
  auto bytes = serializeMetadata(md);
  ASSERT_TRUE(bytes) << bytes.error();
  EXPECT_EQ(bytes->substr(0, 2), "\x80\x02");
  EXPECT_EQ(bytes->find("pathlib"), std::string::npos);
  auto back = parseMetadata(*bytes);
  ASSERT_TRUE(back) << back.error();
  EXPECT_TRUE(*back == md);
  // Writing again gives the same bytes.
  auto again = serializeMetadata(*back);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *bytes);
}

TEST(DcpMetadata, CPythonUnpicklesWhatWeWrite) {
  if (std::string(FSDP_PYTHON3).empty())
    GTEST_SKIP() << "python3 not found at configure time";
  auto bytes = serializeMetadata(referenceMetadata());
  ASSERT_TRUE(bytes) << bytes.error();
  std::string path = tempPath(".metadata");
  writeFile(path, *bytes);
  auto [code, output] = runPythonCheck(path);
  std::remove(path.c_str());
  EXPECT_EQ(code, 0) << output;
}

TEST(DcpMetadata, HandMadeProtocol4) {
  std::string bytes = handMadeProtocol4();
  auto md = parseMetadata(bytes);
  ASSERT_TRUE(md) << md.error();
  ASSERT_EQ(md->stateDictMetadata.size(), 4u);
  const StorageMetadata *w = md->find("model.w");
  ASSERT_TRUE(w);
  EXPECT_FALSE(w->isBytes);
  EXPECT_EQ(w->properties.dtype, DType::Float32);
  EXPECT_EQ(w->properties.layout, "torch.strided");
  EXPECT_EQ(w->properties.memoryFormat, 0);
  EXPECT_EQ(w->size, (Dims{6, 3}));
  ASSERT_EQ(w->chunks.size(), 2u);
  EXPECT_EQ(w->chunks[1], (ChunkMetadata{{3, 0}, {3, 3}}));

  const StorageMetadata *big = md->find("big");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->properties.dtype, DType::UInt8);
  EXPECT_EQ(big->size, (Dims{6000000000}));
  ASSERT_EQ(big->chunks.size(), 2u);
  EXPECT_EQ(big->chunks[1], (ChunkMetadata{{3000000000}, {3000000000}}));

  const StorageMetadata *step = md->find("optimizer.state.w.step");
  ASSERT_TRUE(step);
  EXPECT_EQ(step->size, Dims{});
  ASSERT_EQ(step->chunks.size(), 1u);
  EXPECT_EQ(step->chunks[0], (ChunkMetadata{{}, {}}));
  EXPECT_TRUE(md->find("optimizer.param_groups.0.lr")->isBytes);

  const StorageInfo *second = md->findStorage("big", Dims{3000000000});
  ASSERT_TRUE(second);
  EXPECT_EQ(second->relativePath, "__1_0.distcp");
  EXPECT_EQ(second->offset, 5000000000u);
  EXPECT_EQ(second->length, 3000001600u);
  const StorageInfo *lr = md->findStorage("optimizer.param_groups.0.lr", std::nullopt);
  ASSERT_TRUE(lr);
  EXPECT_EQ(lr->offset, 1833u);
  EXPECT_EQ(md->storageData[5].first.index, std::nullopt);
  EXPECT_EQ(md->storageData[1].first.index, 1);

  ASSERT_TRUE(md->plannerData);
  ASSERT_EQ(md->plannerData->size(), 2u);
  EXPECT_EQ((*md->plannerData)[1].second,
            (std::vector<PathPart>{std::string("optimizer"), std::string("param_groups"),
                                   int64_t(0), std::string("lr")}));
  ASSERT_TRUE(md->storageMeta);
  EXPECT_EQ(md->storageMeta->checkpointId, "/root/out");
  EXPECT_EQ(md->storageMeta->saveId, "44e95c25-0e38-4291-aff3-f6b9057fcfe2");
  EXPECT_EQ(md->storageMeta->loadId, std::nullopt);
  EXPECT_EQ(md->version, "1.0.0");

  // Our writer's version of it reads back equal.
  auto rewritten = serializeMetadata(*md);
  ASSERT_TRUE(rewritten) << rewritten.error();
  auto back = parseMetadata(*rewritten);
  ASSERT_TRUE(back) << back.error();
  EXPECT_TRUE(*back == *md);
}

TEST(DcpMetadata, OlderVariants) {
  // Old sharded_tensor TensorProperties with a dict state, plain globals for
  // layout and memory format, a single-string pathlib._local path (3.13),
  // no planner_data / version.
  pickle::Writer w;
  const char *kMod = "torch.distributed.checkpoint.metadata";
  auto newObject = [&](const char *module, const char *cls) {
    w.global(module, cls);
    w.emptyTuple();
    w.newObj();
  };
  newObject(kMod, "Metadata");
  w.emptyDict();
  w.mark();
  w.string("state_dict_metadata");
  w.emptyDict();
  w.mark();
  w.string("x");
  newObject(kMod, "TensorStorageMetadata");
  w.emptyDict();
  w.mark();
  w.string("properties");
  newObject("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties");
  w.emptyDict();
  w.mark();
  w.string("dtype");
  w.global("torch", "bfloat16");
  w.string("layout");
  w.global("torch", "strided");
  w.string("requires_grad");
  w.boolean(true);
  w.string("memory_format");
  w.global("torch", "contiguous_format");
  w.string("pin_memory");
  w.boolean(false);
  w.setItems();
  w.build();
  w.string("size");
  w.intTuple({4});
  w.string("chunks");
  w.emptyList();
  newObject(kMod, "ChunkStorageMetadata");
  w.emptyDict();
  w.mark();
  w.string("offsets");
  w.intTuple({0});
  w.string("sizes");
  w.intTuple({4});
  w.setItems();
  w.build();
  w.append();
  w.setItems();
  w.build();
  w.setItems();
  w.string("storage_data");
  w.emptyDict();
  newObject(kMod, "MetadataIndex");
  w.emptyDict();
  w.mark();
  w.string("fqn");
  w.string("x");
  w.string("offset");
  w.intTuple({0});
  w.setItems();
  w.build();
  newObject("torch.distributed.checkpoint.filesystem", "_StorageInfo");
  w.emptyDict();
  w.mark();
  w.string("relative_path");
  w.string("__0_0.distcp");
  w.string("offset");
  w.integer(0);
  w.string("length");
  w.integer(10);
  w.setItems();
  w.build();
  w.setItem();
  w.string("storage_meta");
  newObject(kMod, "StorageMeta");
  w.emptyDict();
  w.mark();
  w.string("checkpoint_id");
  w.global("pathlib._local", "PosixPath");
  w.string("/data/ckpt");
  w.tupleOf(1);
  w.reduce();
  w.setItems();
  w.build();
  w.setItems();
  w.build();
  auto bytes = w.finish();
  ASSERT_TRUE(bytes) << bytes.error();
  auto md = parseMetadata(*bytes);
  ASSERT_TRUE(md) << md.error();
  const StorageMetadata *x = md->find("x");
  ASSERT_TRUE(x);
  EXPECT_EQ(x->properties.dtype, DType::BFloat16);
  EXPECT_TRUE(x->properties.requiresGrad);
  EXPECT_EQ(x->properties.memoryFormat, 0);
  EXPECT_FALSE(md->plannerData);
  EXPECT_FALSE(md->version);
  EXPECT_EQ(md->storageMeta->checkpointId, "/data/ckpt");
  EXPECT_EQ(md->storageMeta->saveId, "");
  EXPECT_EQ(md->storageData[0].first.index, std::nullopt);
}

TEST(DcpMetadata, ValidationNamesTheKey) {
  auto error = [](Metadata md) {
    auto bytes = serializeMetadata(md);
    return bytes ? std::string("(no error)") : bytes.error();
  };
  Metadata md = referenceMetadata();
  md.stateDictMetadata[0].second.chunks[1].sizes = {3, 3}; // rows 3..6 of 5
  EXPECT_EQ(error(md), "dcp metadata: 'model.w' chunk at (3, 0) size (3, 3): outside "
                       "the tensor (5, 3)");
  md = referenceMetadata();
  md.stateDictMetadata[1].second.chunks[0].offsets = {0, 0};
  EXPECT_EQ(error(md), "dcp metadata: 'model.b' chunk at (0, 0) size (7,): rank differs "
                       "from the tensor's (7,)");
  md = referenceMetadata();
  md.storageData.erase(md.storageData.begin() + 1);
  EXPECT_EQ(error(md), "dcp metadata: 'model.w' chunk at (3, 0) has no storage_data entry");
  md = referenceMetadata();
  md.storageData.push_back(md.storageData[0]);
  EXPECT_EQ(error(md), "dcp metadata: storage_data entry 'model.w' at (0, 0) appears twice");
  md = referenceMetadata();
  md.storageData[6].first.offset = Dims{0};
  EXPECT_EQ(error(md), "dcp metadata: storage_data entry 'optimizer.param_groups.0.lr' at "
                       "(0,) matches no chunk of state_dict_metadata");
  md = referenceMetadata();
  md.stateDictMetadata.push_back(md.stateDictMetadata[0]);
  EXPECT_EQ(error(md), "dcp metadata: key 'model.w' appears twice");
}

TEST(DcpMetadata, ReadErrorsNameThePlace) {
  // A state_dict_metadata value that is not a storage metadata object.
  pickle::Writer w;
  w.global("torch.distributed.checkpoint.metadata", "Metadata");
  w.emptyTuple();
  w.newObj();
  w.emptyDict();
  w.string("state_dict_metadata");
  w.emptyDict();
  w.string("model.w");
  w.integer(3);
  w.setItem();
  w.setItem();
  w.build();
  auto bytes = w.finish();
  ASSERT_TRUE(bytes);
  EXPECT_EQ(parseError(*bytes),
            "dcp metadata: state_dict_metadata['model.w']: expected a "
            "TensorStorageMetadata, got an int");

  // A disallowed class anywhere is refused before anything is built.
  pickle::Writer evil;
  evil.global("torch.distributed.checkpoint.metadata", "Metadata");
  evil.emptyTuple();
  evil.newObj();
  evil.emptyDict();
  evil.string("mcore_data");
  evil.global("os", "system");
  evil.string("true");
  evil.tupleOf(1);
  evil.reduce();
  evil.setItem();
  evil.build();
  auto evilBytes = evil.finish();
  ASSERT_TRUE(evilBytes);
  EXPECT_NE(parseError(*evilBytes).find("global 'os.system' is not allowed"),
            std::string::npos);

  // Not a Metadata at all.
  EXPECT_EQ(parseError("\x80\x02N."), "dcp metadata: Metadata: expected a Metadata, got None");
}

TEST(DcpMetadata, DTypeTable) {
  EXPECT_EQ(findDType("torch.bfloat16")->dtype, DType::BFloat16);
  EXPECT_EQ(findDType("float8_e5m2")->elementSize, 1u);
  EXPECT_EQ(findDType("complex128")->elementSize, 16u);
  EXPECT_EQ(findDType("int4"), nullptr);
  EXPECT_EQ(findDTypeByStorage("BFloat16Storage")->dtype, DType::BFloat16);
  EXPECT_EQ(findDTypeByStorage("UntypedStorage"), nullptr);
  EXPECT_EQ(dtypeInfo(DType::UInt16).legacyStorage, nullptr);
}

// A relative_path that is not a plain file name could send a reader outside
// the checkpoint directory: refused on read and on write.
TEST(DcpMetadata, RelativePathsArePlainNames) {
  for (const char *path : {"../evil.distcp", "sub/file", "/etc/passwd", "..", ""}) {
    Metadata md = referenceMetadata();
    md.storageData.front().second.relativePath = path;
    Status status = validateMetadata(md);
    ASSERT_FALSE(status.ok()) << path;
    EXPECT_NE(status.error().find("is not a plain file name"), std::string::npos) << status.error();
    EXPECT_FALSE(serializeMetadata(md).ok()) << path;
  }
}

namespace {
/// `md` through a MetadataStreamWriter with blocks of `blockBytes`, as
/// serializeMetadata does; each piece the sink gets is appended.
Result<std::string> streamMetadata(const Metadata &md, size_t blockBytes) {
  std::string out;
  MetadataStreamWriter writer(
      [&](std::string_view piece) {
        out.append(piece);
        return Status::success();
      },
      blockBytes);
  Result<uint64_t> written = writeMetadata(md, writer);
  if (!written)
    return written.failure();
  EXPECT_EQ(*written, out.size());
  return out;
}
} // namespace

TEST(DcpMetadata, StreamedInAnyBlocksIsSerialized) {
  Metadata md = referenceMetadata();
  // Past 1,000 entries, so SETITEMS/APPENDS batches span blocks.
  for (int i = 0; i < 1500; ++i) {
    StorageMetadata entry;
    entry.size = {2};
    entry.chunks = {{{0}, {1}}, {{1}, {1}}};
    std::string key = "t" + std::to_string(i);
    md.stateDictMetadata.emplace_back(key, entry);
    md.plannerData->push_back({key, {std::string("model"), key}});
    for (int64_t row : {0, 1}) {
      StorageInfo info;
      info.relativePath = "__" + std::to_string(row) + "_0.distcp";
      info.offset = static_cast<uint64_t>(4096 * i);
      info.length = 1577;
      md.storageData.push_back({{key, Dims{row}, row}, info});
    }
  }
  Result<std::string> whole = serializeMetadata(md);
  ASSERT_TRUE(whole) << whole.error();
  for (size_t block : {size_t(1), size_t(4093), size_t(1) << 20}) {
    Result<std::string> streamed = streamMetadata(md, block);
    ASSERT_TRUE(streamed) << streamed.error();
    EXPECT_EQ(*streamed, *whole) << "blocks of " << block;
  }
  md.plannerData.reset();
  md.storageMeta.reset();
  whole = serializeMetadata(md);
  ASSERT_TRUE(whole) << whole.error();
  Result<std::string> streamed = streamMetadata(md, 7);
  ASSERT_TRUE(streamed) << streamed.error();
  EXPECT_EQ(*streamed, *whole);
  Result<Metadata> back = parseMetadata(*streamed);
  ASSERT_TRUE(back) << back.error();
  EXPECT_TRUE(*back == md);
}

TEST(DcpMetadata, StreamWriterChecksEachEntry) {
  auto error = [](const Metadata &md) {
    Result<std::string> bytes = streamMetadata(md, 64);
    return bytes ? std::string("(no error)") : bytes.error();
  };
  // The messages validateMetadata gives, as far as one entry shows.
  Metadata md = referenceMetadata();
  md.stateDictMetadata[0].second.chunks[1].sizes = {3, 3};
  EXPECT_EQ(error(md), "dcp metadata: 'model.w' chunk at (3, 0) size (3, 3): outside "
                       "the tensor (5, 3)");
  md = referenceMetadata();
  md.stateDictMetadata.push_back(md.stateDictMetadata[0]);
  EXPECT_EQ(error(md), "dcp metadata: key 'model.w' appears twice");
  md = referenceMetadata();
  md.storageData[6].first.offset = Dims{0};
  EXPECT_EQ(error(md), "dcp metadata: storage_data entry 'optimizer.param_groups.0.lr' at "
                       "(0,) matches no chunk of state_dict_metadata");
  md = referenceMetadata();
  md.storageData.front().second.relativePath = "../evil";
  EXPECT_EQ(error(md), "dcp metadata: storage_data entry 'model.w' at (0, 0): relative_path "
                       "'../evil' is not a plain file name");
  // What needs the whole: counted at the end.
  md = referenceMetadata();
  md.storageData.erase(md.storageData.begin() + 1);
  EXPECT_EQ(error(md), "dcp metadata: 'model.w' has 2 chunks but 1 storage_data entries");
  // Calls out of order.
  MetadataStreamWriter writer([](std::string_view) { return Status::success(); });
  writer.storage("x", nullptr, std::nullopt, "f", 0, 1);
  Result<uint64_t> out = writer.finish(std::nullopt, std::nullopt);
  ASSERT_FALSE(out);
  EXPECT_NE(out.error().find("storage_data before planner_data"), std::string::npos);
  // The sink's failure stops the writer and is what finish reports.
  MetadataStreamWriter full([](std::string_view) { return Status(makeError("disk full")); }, 1);
  full.bytesItem("k");
  full.noPlannerData();
  EXPECT_EQ(full.status().error(), "disk full");
  out = full.finish(std::nullopt, std::nullopt);
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error(), "disk full");
}
