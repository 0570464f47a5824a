//===- PlanFile.cpp - The checkpoint plan file ----------------------------===//
#include "fsdp/Plan/PlanFile.h"
#include "fsdp/Format/Limits.h"
#include "PlanSchema_generated.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace fsdp {
namespace plan {

namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

static_assert(kMaxPlanFileBytes == FLATBUFFERS_MAX_BUFFER_SIZE,
              "the plan file limit is FlatBuffers' buffer limit");
// The schema's ItemSource is plan::ItemSource, converted by number.
static_assert(static_cast<int>(fb::ItemSource::Buffer) == static_cast<int>(ItemSource::Buffer) &&
                  static_cast<int>(fb::ItemSource::Step) == static_cast<int>(ItemSource::Step) &&
                  static_cast<int>(fb::ItemSource::Bytes) == static_cast<int>(ItemSource::Bytes) &&
                  fb::ItemSource::MAX == fb::ItemSource::Bytes,
              "PlanSchema.fbs's ItemSource disagrees with plan::ItemSource");

std::string sizeText(uint64_t bytes) {
  char text[32];
  if (bytes >= (uint64_t(1) << 20))
    std::snprintf(text, sizeof(text), "%.1f MiB", bytes / double(1 << 20));
  else
    std::snprintf(text, sizeof(text), "%llu bytes", static_cast<unsigned long long>(bytes));
  return text;
}

/// The error for a plan past the FlatBuffers limit, saying what to do.
Error tooLarge(uint64_t maxBytes, const std::string &what, const std::string &advice) {
  return makeError("a plan file holds at most " + std::to_string(maxBytes) +
                       " bytes (FlatBuffers' 32-bit offsets: 2 GiB) but " + what + ": " + advice,
                   ErrorKind::InvalidArgument);
}

/// zlib's deflate fed piece by piece, so the `.metadata` of a large world is
/// never held inflated.
class Deflater {
public:
  Deflater() { ok_ = deflateInit(&stream_, Z_BEST_SPEED) == Z_OK; }
  ~Deflater() {
    if (ok_)
      deflateEnd(&stream_);
  }
  Deflater(const Deflater &) = delete;
  Deflater &operator=(const Deflater &) = delete;

  Status write(std::string_view bytes) {
    while (!bytes.empty()) {
      // zlib counts in 32 bits.
      size_t piece = std::min<size_t>(bytes.size(), size_t(1) << 30);
      stream_.next_in = reinterpret_cast<Bytef *>(const_cast<char *>(bytes.data()));
      stream_.avail_in = static_cast<uInt>(piece);
      if (Status status = pump(Z_NO_FLUSH); !status)
        return status;
      bytes.remove_prefix(piece);
    }
    return Status::success();
  }
  Result<std::string> finish() {
    stream_.avail_in = 0;
    if (Status status = pump(Z_FINISH); !status)
      return status.failure();
    return std::move(out_);
  }
  size_t size() const { return out_.size(); }

private:
  Status pump(int flush) {
    if (!ok_)
      return makeError("deflate: cannot initialize zlib");
    char buffer[1 << 16];
    int rc;
    do {
      stream_.next_out = reinterpret_cast<Bytef *>(buffer);
      stream_.avail_out = sizeof(buffer);
      rc = deflate(&stream_, flush);
      if (rc == Z_STREAM_ERROR)
        return makeError("deflate failed");
      out_.append(buffer, sizeof(buffer) - stream_.avail_out);
    } while (stream_.avail_out == 0);
    if (flush == Z_FINISH && rc != Z_STREAM_END)
      return makeError("deflate did not finish");
    return Status::success();
  }

  z_stream stream_{};
  bool ok_ = false;
  std::string out_;
};

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

Offset<fb::BufferRef> writeRef(FlatBufferBuilder &fbb, const BufferRef &ref) {
  return fb::CreateBufferRef(fbb, ref.group, static_cast<uint8_t>(ref.role), ref.localOffset,
                             ref.elements);
}

std::string buildRankPart(const RankPlan &plan) {
  FlatBufferBuilder fbb(1024);
  std::vector<Offset<fb::LocalBuffer>> buffers;
  for (const LocalBuffer &buffer : plan.buffers)
    buffers.push_back(fb::CreateLocalBuffer(fbb, buffer.group, static_cast<uint8_t>(buffer.role),
                                            static_cast<uint8_t>(buffer.dtype), buffer.elements,
                                            buffer.rangeBegin, buffer.aliasesMainWeight));
  std::vector<Offset<fb::DataFile>> files;
  for (const FileSpec &file : plan.files)
    files.push_back(fb::CreateDataFileDirect(fbb, file.name.c_str(), file.size));
  std::vector<Offset<fb::WriteItem>> writes;
  for (const WriteItem &item : plan.writes) {
    auto key = fbb.CreateString(item.key);
    auto shape = fbb.CreateVector(item.globalShape);
    auto offsets = fbb.CreateVector(item.chunkOffsets);
    auto sizes = fbb.CreateVector(item.chunkSizes);
    auto ref = writeRef(fbb, item.buffer);
    Offset<flatbuffers::Vector<uint8_t>> payload;
    if (!item.payload.empty())
      payload = fbb.CreateVector(reinterpret_cast<const uint8_t *>(item.payload.data()),
                                 item.payload.size());
    writes.push_back(fb::CreateWriteItem(fbb, key, static_cast<fb::ItemSource>(item.source),
                                         static_cast<uint8_t>(item.dtype), shape, offsets, sizes,
                                         ref, payload, item.file, item.itemOffset, item.itemLength,
                                         item.dataOffset, item.dataLength));
  }
  std::vector<Offset<fb::ReadItem>> reads;
  for (const ReadItem &item : plan.reads) {
    auto key = fbb.CreateString(item.key);
    auto offsets = fbb.CreateVector(item.chunkOffsets);
    auto sizes = fbb.CreateVector(item.chunkSizes);
    auto ref = writeRef(fbb, item.buffer);
    auto file = fbb.CreateString(item.file);
    auto shape = fbb.CreateVector(item.globalShape);
    reads.push_back(fb::CreateReadItem(fbb, key, static_cast<fb::ItemSource>(item.source),
                                       static_cast<uint8_t>(item.dtype), offsets, sizes, ref, file,
                                       item.itemOffset, item.itemLength, item.dataOffset,
                                       item.dataLength, shape));
  }
  auto root =
      fb::CreateRankPlanDirect(fbb, plan.rank, &plan.coords, &buffers, &files, &writes, &reads);
  fbb.Finish(root);
  return std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fbb.GetSize());
}

/// The global part. The chunk index goes in only when asked for and when
/// the part then stays within `indexBudget` (what the file has left).
Result<std::string> buildGlobalPart(const ModelLayout &model, CheckpointPlanner &planner,
                                    uint64_t maxBytes, bool withChunkIndex, uint64_t indexBudget) {
  // The `.metadata` streams from the planner through deflate: at 16,384
  // ranks it is ~670 MB inflated, ~40 MB deflated.
  Deflater deflater;
  std::string chunkIndex;
  Result<uint64_t> pickled = planner.streamGlobalMetadata(
      [&](std::string_view bytes) -> Status {
        if (Status status = deflater.write(bytes); !status)
          return status;
        if (deflater.size() > maxBytes)
          return tooLarge(maxBytes, "the DCP .metadata alone passes that deflated",
                          "the plan format cannot carry this checkpoint's .metadata");
        return Status::success();
      },
      withChunkIndex ? &chunkIndex : nullptr);
  if (!pickled)
    return pickled.failure();
  Result<std::string> deflated = deflater.finish();
  if (!deflated)
    return deflated.failure();
  // The chunk index (576 MB at 16,384 ranks) deflated too; dropped when it
  // would not fit, the commit then builds it from the parsed `.metadata`.
  std::string indexDeflated;
  uint64_t indexSize = chunkIndex.size();
  if (!chunkIndex.empty()) {
    Deflater indexDeflater;
    if (Status status = indexDeflater.write(chunkIndex); !status)
      return status.failure();
    chunkIndex = std::string();
    Result<std::string> index = indexDeflater.finish();
    if (!index)
      return index.failure();
    indexDeflated = index.take();
  }
  auto build = [&](bool withIndex) {
    FlatBufferBuilder fbb(deflated->size() + (withIndex ? indexDeflated.size() : 0) + 4096);
    // The builder fills back to front: the index first leaves the
    // `.metadata` first in the file, where it was.
    Offset<flatbuffers::Vector<uint8_t>> index;
    if (withIndex)
      index = fbb.CreateVector(reinterpret_cast<const uint8_t *>(indexDeflated.data()),
                               indexDeflated.size());
    auto bytes =
        fbb.CreateVector(reinterpret_cast<const uint8_t *>(deflated->data()), deflated->size());
    std::vector<Offset<fb::GroupInfo>> groups;
    for (const GroupSpec &group : model.groups)
      groups.push_back(
          fb::CreateGroupInfoDirect(fbb, group.unit.c_str(), static_cast<uint8_t>(group.dtype),
                                    group.requiresGrad, group.chunk, group.size, group.shardSize));
    auto groupVector = fbb.CreateVector(groups);
    auto params = fbb.CreateVectorOfStrings(model.optimizerParams);
    fbb.Finish(fb::CreateGlobalPart(fbb, /*metadata=*/0, groupVector, params, bytes, *pickled,
                                    index, withIndex ? indexSize : 0));
    return std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fbb.GetSize());
  };
  std::string part = build(!indexDeflated.empty());
  if (part.size() > std::min(maxBytes, indexBudget) && !indexDeflated.empty())
    part = build(false);
  if (part.size() > maxBytes)
    return tooLarge(maxBytes, "the global part is " + std::to_string(part.size()) + " bytes",
                    "the plan format cannot carry this checkpoint's .metadata");
  return part;
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

struct OwnedBytes : PlanFile::Bytes {
  explicit OwnedBytes(std::string text) : storage(std::move(text)) {
    data = reinterpret_cast<const uint8_t *>(storage.data());
    size = storage.size();
  }
  std::string storage;
};

struct MappedBytes : PlanFile::Bytes {
  ~MappedBytes() override {
    if (data)
      munmap(const_cast<uint8_t *>(data), size);
  }
};

const fb::Plan *root(const PlanFile::Bytes &bytes) { return fb::GetPlan(bytes.data); }

/// Copies a vector of int64 with memcpy: FlatBuffers' verifier checks only
/// the 4-byte length prefix's alignment, so a corrupt file may hold such a
/// vector at an address that is not 8-byte aligned.
dcp::Dims dims(const flatbuffers::Vector<int64_t> *vector) {
  if (!vector)
    return {};
  dcp::Dims out(vector->size());
  if (!out.empty())
    std::memcpy(out.data(), vector->Data(), out.size() * sizeof(int64_t));
  return out;
}

BufferRef readRef(const fb::BufferRef *ref) {
  if (!ref)
    return {};
  return {ref->group(), static_cast<BufferRole>(ref->role()), ref->local_offset(), ref->elements()};
}

/// A nested buffer's bytes, copied when they are not 8-byte aligned in
/// memory (our writer aligns them; a foreign or corrupt file may not).
const uint8_t *alignedNested(const flatbuffers::Vector<uint8_t> *vector, std::string &copy) {
  const uint8_t *data = vector->data();
  if (reinterpret_cast<uintptr_t>(data) % 8 == 0)
    return data;
  // std::string storage from operator new is 16-byte aligned.
  copy.assign(reinterpret_cast<const char *>(data), vector->size());
  return reinterpret_cast<const uint8_t *>(copy.data());
}

bool validDType(uint8_t value) { return value <= static_cast<uint8_t>(dcp::DType::UInt64); }
bool validRole(uint8_t value) { return value <= static_cast<uint8_t>(kLastBufferRole); }

} // namespace

namespace {

/// A nested FlatBuffer, 8-byte aligned so its 64-bit fields load aligned.
Offset<flatbuffers::Vector<uint8_t>> nestedVector(FlatBufferBuilder &fbb,
                                                  const std::string &bytes) {
  fbb.ForceVectorAlignment(bytes.size(), sizeof(uint8_t), 8);
  return fbb.CreateVector(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size());
}

/// Serializes the parts of `ranks` (sorted, unique) with one planner. Fails
/// as soon as a part would take the file past `maxBytes`, rather than build
/// a buffer FlatBuffers cannot address.
Result<std::string> serializePlan(const ModelLayout &model, CheckpointPlanner &planner,
                                  const std::vector<int64_t> &ranks, bool withGlobal,
                                  int64_t commitRank, uint64_t maxBytes,
                                  bool withChunkIndex = true) {
  // What a file holds besides its parts: the root table, the mesh and, per
  // part, a table, an offset and up to 8 bytes of alignment.
  uint64_t overhead = 4096 + 64 * ranks.size();
  for (const std::string &name : model.meshAxisNames)
    overhead += name.size() + 16;
  FlatBufferBuilder fbb(1 << 16);
  std::vector<Offset<fb::RankPart>> parts;
  for (int64_t rank : ranks) {
    Result<RankPlan> plan = planner.planRank(rank);
    if (!plan)
      return propagate(plan, "rank " + std::to_string(rank) + ": " + plan.error());
    std::string part = buildRankPart(*plan);
    uint64_t projected = fbb.GetSize() + part.size() + overhead;
    if (projected > maxBytes)
      return tooLarge(maxBytes,
                      "with rank " + std::to_string(rank) + " (part " +
                          std::to_string(parts.size() + 1) + " of the " +
                          std::to_string(ranks.size()) + " requested) this one passes " +
                          sizeText(projected),
                      "emit one file per rank (--plan-split-dir) or fewer ranks per file "
                      "(--plan-ranks)");
    auto bytes = nestedVector(fbb, part);
    parts.push_back(fb::CreateRankPart(fbb, rank, bytes));
  }
  Offset<flatbuffers::Vector<uint8_t>> global;
  if (withGlobal) {
    uint64_t used = fbb.GetSize() + overhead;
    Result<std::string> part = buildGlobalPart(model, planner, maxBytes, withChunkIndex,
                                               used < maxBytes ? maxBytes - used : 0);
    if (!part)
      return part.failure();
    uint64_t projected = fbb.GetSize() + part->size() + overhead;
    if (projected > maxBytes)
      return tooLarge(maxBytes,
                      "with the committing rank's global part (the deflated .metadata, " +
                          sizeText(part->size()) + ") this one passes " + sizeText(projected),
                      ranks.size() > 1 ? "emit one file per rank (--plan-split-dir) or fewer "
                                         "ranks per file (--plan-ranks)"
                                       : "the plan format cannot carry this checkpoint's "
                                         ".metadata");
    global = nestedVector(fbb, *part);
  }
  auto names = fbb.CreateVectorOfStrings(model.meshAxisNames);
  auto sizes = fbb.CreateVector(model.meshSizes);
  auto partVector = fbb.CreateVector(parts);
  fbb.Finish(fb::CreatePlan(fbb, kPlanFormatVersion, planIdentity(model), model.worldSize(), names,
                            sizes, commitRank, partVector, global),
             fb::PlanIdentifier());
  return std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fbb.GetSize());
}

constexpr int64_t kCommitRank = 0;

Result<std::vector<int64_t>> normalizeRanks(const ModelLayout &model, std::vector<int64_t> ranks) {
  int64_t world = model.worldSize();
  if (ranks.empty())
    for (int64_t rank = 0; rank < world; ++rank)
      ranks.push_back(rank);
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  if (ranks.front() < 0 || ranks.back() >= world)
    return makeError("rank " + std::to_string(ranks.front() < 0 ? ranks.front() : ranks.back()) +
                     " is outside the mesh of " + std::to_string(world) + " ranks");
  return ranks;
}

} // namespace

Result<std::string> buildPlanFile(const ModelLayout &model, const PlanFileOptions &options) {
  Result<std::vector<int64_t>> ranks = normalizeRanks(model, options.ranks);
  if (!ranks)
    return ranks.failure();
  Result<CheckpointPlanner> planner = CheckpointPlanner::create(model);
  if (!planner)
    return planner.failure();
  bool withGlobal = options.global == PlanFileOptions::Global::Always ||
                    (options.global == PlanFileOptions::Global::IfCommitRank &&
                     std::binary_search(ranks->begin(), ranks->end(), kCommitRank));
  return serializePlan(model, *planner, *ranks, withGlobal, kCommitRank, options.maxFileBytes,
                       options.chunkIndex);
}

std::string planFileName(int64_t rank) { return "rank-" + std::to_string(rank) + ".fsdpplan"; }

Result<uint64_t> writeSplitPlanFiles(const ModelLayout &model, const std::string &dir,
                                     std::vector<int64_t> ranks, uint64_t maxFileBytes) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return makeError(dir + ": cannot create: " + std::strerror(errno));
  auto write = [&](int64_t rank, const std::string &bytes) -> Status {
    std::string path = dir + "/" + planFileName(rank);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      return makeError(path + ": cannot create: " + std::strerror(errno));
    const char *cursor = bytes.data();
    size_t left = bytes.size();
    while (left > 0) {
      ssize_t wrote = ::write(fd, cursor, left);
      if (wrote < 0 && errno == EINTR)
        continue;
      if (wrote <= 0) {
        int error = errno;
        ::close(fd);
        return makeError(path + ": write failed: " + std::strerror(error));
      }
      cursor += wrote;
      left -= static_cast<size_t>(wrote);
    }
    if (::close(fd) != 0)
      return makeError(path + ": close failed: " + std::strerror(errno));
    return Status::success();
  };
  return forEachSplitPlanFile(model, std::move(ranks), write, maxFileBytes);
}

Result<uint64_t>
forEachSplitPlanFile(const ModelLayout &model, std::vector<int64_t> ranks,
                     const std::function<Status(int64_t rank, const std::string &bytes)> &sink,
                     uint64_t maxFileBytes) {
  Result<std::vector<int64_t>> normalized = normalizeRanks(model, std::move(ranks));
  if (!normalized)
    return normalized.failure();
  Result<CheckpointPlanner> planner = CheckpointPlanner::create(model);
  if (!planner)
    return planner.failure();
  uint64_t total = 0;
  for (int64_t rank : *normalized) {
    Result<std::string> bytes =
        serializePlan(model, *planner, {rank}, rank == kCommitRank, kCommitRank, maxFileBytes);
    if (!bytes)
      return bytes.failure();
    if (Status status = sink(rank, *bytes); !status)
      return status.failure();
    total += bytes->size();
  }
  return total;
}

Result<PlanFile> PlanFile::verified(std::shared_ptr<const Bytes> bytes, std::string name) {
  if (bytes->size < 8 || !fb::PlanBufferHasIdentifier(bytes->data))
    return makeError(name + ": not an fsdp checkpoint plan (no FSPL identifier)");
  // Verifies the outer table only: each nested part is verified when its
  // rank reads it, so opening costs O(ranks), and a corrupt part fails only
  // the rank that owns it.
  flatbuffers::Verifier::Options verifierOptions;
  verifierOptions.max_depth = 16;
  verifierOptions.max_tables = 10000000;
  verifierOptions.check_nested_flatbuffers = false;
  flatbuffers::Verifier verifier(bytes->data, bytes->size, verifierOptions);
  if (!fb::VerifyPlanBuffer(verifier))
    return makeError(name + ": corrupt plan file (FlatBuffers verification failed)");
  const fb::Plan *plan = root(*bytes);
  if (plan->version() != kPlanFormatVersion)
    return makeError(name + ": plan format version " + std::to_string(plan->version()) +
                     " is not supported (this build reads version " +
                     std::to_string(kPlanFormatVersion) + ")");
  if (plan->world_size() < 1 || plan->world_size() > (int64_t(1) << 31))
    return makeError(name + ": world size " + std::to_string(plan->world_size()) +
                     " is out of range");
  if (plan->commit_rank() < 0 || plan->commit_rank() >= plan->world_size())
    return makeError(name + ": committing rank " + std::to_string(plan->commit_rank()) +
                     " is outside the world");
  if (plan->ranks())
    for (flatbuffers::uoffset_t i = 0; i < plan->ranks()->size(); ++i) {
      const fb::RankPart *part = plan->ranks()->Get(i);
      if (!part || !part->plan() || part->rank() < 0 || part->rank() >= plan->world_size() ||
          (i && plan->ranks()->Get(i - 1)->rank() >= part->rank()))
        return makeError(name + ": corrupt plan file (rank parts out of order)");
    }
  return PlanFile(std::move(bytes), std::move(name));
}

Result<PlanFile> PlanFile::fromBytes(std::string bytes, std::string name) {
  return verified(std::make_shared<OwnedBytes>(std::move(bytes)), std::move(name));
}

Result<PlanFile> PlanFile::open(const std::string &path) {
  // Never block on a FIFO; only a regular file is a plan.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return makeError(path + ": cannot open plan: " + std::strerror(errno),
                     errno == ENOENT ? ErrorKind::NotFound : ErrorKind::IO, errno);
  struct stat info;
  if (fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    return makeError(path + ": cannot stat plan: " + std::strerror(error), ErrorKind::IO, error);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return makeError(path + ": the plan is not a regular file", ErrorKind::InvalidArgument);
  }
  auto bytes = std::make_shared<MappedBytes>();
  if (info.st_size > 0) {
    void *mapped = mmap(nullptr, static_cast<size_t>(info.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      int error = errno;
      ::close(fd);
      return makeError(path + ": cannot map plan: " + std::strerror(error));
    }
    bytes->data = static_cast<const uint8_t *>(mapped);
    bytes->size = static_cast<size_t>(info.st_size);
  }
  ::close(fd);
  Result<PlanFile> plan = verified(std::move(bytes), path);
  if (!plan)
    return classify(plan, plan.error(), ErrorKind::Corrupt);
  return plan;
}

uint32_t PlanFile::version() const { return root(*bytes_)->version(); }
uint64_t PlanFile::planId() const { return root(*bytes_)->plan_id(); }
int64_t PlanFile::worldSize() const { return root(*bytes_)->world_size(); }
int64_t PlanFile::commitRank() const { return root(*bytes_)->commit_rank(); }

std::vector<std::string> PlanFile::meshAxisNames() const {
  std::vector<std::string> names;
  if (auto *list = root(*bytes_)->mesh_names())
    for (const flatbuffers::String *name : *list)
      names.push_back(name ? name->str() : "");
  return names;
}

std::vector<int64_t> PlanFile::meshSizes() const { return dims(root(*bytes_)->mesh_sizes()); }

std::vector<int64_t> PlanFile::ranks() const {
  std::vector<int64_t> ranks;
  if (auto *parts = root(*bytes_)->ranks())
    for (const fb::RankPart *part : *parts)
      ranks.push_back(part->rank());
  return ranks;
}

bool PlanFile::hasGlobal() const { return root(*bytes_)->global() != nullptr; }

Result<RankPlan> PlanFile::rank(int64_t rank) const {
  const auto *parts = root(*bytes_)->ranks();
  if (!parts)
    return makeError(name_ + ": plan holds no rank parts");
  // Parts are sorted by rank: bisect, then verify only this part.
  auto it = std::lower_bound(parts->begin(), parts->end(), rank,
                             [](const fb::RankPart *part, int64_t r) { return part->rank() < r; });
  if (it == parts->end() || it->rank() != rank)
    return makeError(name_ + ": plan has no part for rank " + std::to_string(rank) +
                     " (world size " + std::to_string(worldSize()) + ")");
  std::string copy;
  const uint8_t *data = alignedNested(it->plan(), copy);
  flatbuffers::Verifier verifier(data, it->plan()->size(), 16, 100000000);
  if (!verifier.VerifyBuffer<fb::RankPlan>(nullptr))
    return makeError(name_ + ": corrupt plan part for rank " + std::to_string(rank));
  const fb::RankPlan *part = flatbuffers::GetRoot<fb::RankPlan>(data);
  auto bad = [&](const std::string &what) {
    return makeError(name_ + ": corrupt plan part for rank " + std::to_string(rank) + ": " + what);
  };
  RankPlan plan;
  plan.rank = part->rank();
  if (plan.rank != rank)
    return bad("the part says it is rank " + std::to_string(plan.rank));
  plan.coords = dims(part->coords());
  // Bounds a runtime relies on before it allocates or indexes anything.
  constexpr auto kMaxBufferBytes = static_cast<int64_t>(limits::kMaxBufferBytes);
  std::map<std::pair<int32_t, BufferRole>, int64_t> bufferElements;
  if (part->buffers())
    for (const fb::LocalBuffer *buffer : *part->buffers()) {
      if (!validRole(buffer->role()) || !validDType(buffer->dtype()) || buffer->elements() < 0 ||
          buffer->group() < 0 || buffer->range_begin() < 0 ||
          buffer->elements() >
              kMaxBufferBytes /
                  dcp::dtypeInfo(static_cast<dcp::DType>(buffer->dtype())).elementSize)
        return bad("buffer of group " + std::to_string(buffer->group()));
      plan.buffers.push_back({buffer->group(), static_cast<BufferRole>(buffer->role()),
                              static_cast<dcp::DType>(buffer->dtype()), buffer->elements(),
                              buffer->range_begin(), buffer->aliases_main_weight()});
      bufferElements[{buffer->group(), static_cast<BufferRole>(buffer->role())}] =
          buffer->elements();
    }
  // A reference into the rank's buffers must lie inside one of them.
  auto refInside = [&](const BufferRef &ref) {
    auto found = bufferElements.find({ref.group, ref.role});
    return found != bufferElements.end() && ref.localOffset >= 0 && ref.elements >= 0 &&
           ref.localOffset <= found->second && ref.elements <= found->second - ref.localOffset;
  };
  // Data files are plain names in the checkpoint directory.
  auto plainName = [](const std::string &name) {
    return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
  };
  auto rangeInside = [](uint64_t itemOffset, uint64_t itemLength, uint64_t dataOffset,
                        uint64_t dataLength) {
    constexpr uint64_t kMax = limits::kMaxFileOffset;
    return itemOffset < kMax && itemLength < kMax && dataLength < kMax &&
           dataOffset >= itemOffset && dataOffset - itemOffset <= itemLength &&
           dataLength <= itemLength - (dataOffset - itemOffset);
  };
  if (part->files())
    for (const fb::DataFile *file : *part->files()) {
      if (!plainName(file->name()->str()))
        return bad("data file name '" + file->name()->str() + "' is not a plain file name");
      plan.files.push_back({file->name()->str(), file->size()});
    }
  if (part->writes())
    for (const fb::WriteItem *item : *part->writes()) {
      if (!validDType(item->dtype()) || item->file() >= plan.files.size() ||
          static_cast<uint8_t>(item->source()) > static_cast<uint8_t>(ItemSource::Bytes) ||
          (item->buffer() && !validRole(item->buffer()->role())))
        return bad("write item '" + item->key()->str() + "'");
      WriteItem write;
      write.key = item->key()->str();
      write.source = static_cast<ItemSource>(item->source());
      write.dtype = static_cast<dcp::DType>(item->dtype());
      write.globalShape = dims(item->global_shape());
      write.chunkOffsets = dims(item->chunk_offsets());
      write.chunkSizes = dims(item->chunk_sizes());
      write.buffer = readRef(item->buffer());
      if (item->payload())
        write.payload.assign(reinterpret_cast<const char *>(item->payload()->data()),
                             item->payload()->size());
      write.file = item->file();
      write.itemOffset = item->item_offset();
      write.itemLength = item->item_length();
      write.dataOffset = item->data_offset();
      write.dataLength = item->data_length();
      if (!rangeInside(write.itemOffset, write.itemLength,
                       write.source == ItemSource::Bytes ? write.itemOffset : write.dataOffset,
                       write.source == ItemSource::Bytes ? 0 : write.dataLength) ||
          (write.source == ItemSource::Bytes && write.payload.size() != write.itemLength) ||
          (write.source == ItemSource::Buffer &&
           (!refInside(write.buffer) ||
            write.dataLength != static_cast<uint64_t>(write.buffer.elements) *
                                    dcp::dtypeInfo(write.dtype).elementSize)))
        return bad("write item '" + write.key + "' points outside its item or buffer");
      plan.writes.push_back(std::move(write));
    }
  if (part->reads())
    for (const fb::ReadItem *item : *part->reads()) {
      if (!validDType(item->dtype()) ||
          static_cast<uint8_t>(item->source()) > static_cast<uint8_t>(ItemSource::Bytes) ||
          (item->buffer() && !validRole(item->buffer()->role())))
        return bad("read item '" + item->key()->str() + "'");
      plan.reads.push_back({item->key()->str(), static_cast<ItemSource>(item->source()),
                            static_cast<dcp::DType>(item->dtype()), dims(item->global_shape()),
                            dims(item->chunk_offsets()), dims(item->chunk_sizes()),
                            readRef(item->buffer()), item->file()->str(), item->item_offset(),
                            item->item_length(), item->data_offset(), item->data_length()});
      const ReadItem &read = plan.reads.back();
      if (!plainName(read.file) ||
          !rangeInside(read.itemOffset, read.itemLength, read.dataOffset, read.dataLength) ||
          (read.source == ItemSource::Buffer &&
           (!refInside(read.buffer) || read.chunkOffsets.size() != read.chunkSizes.size() ||
            read.globalShape.size() != read.chunkSizes.size())))
        return bad("read item '" + read.key + "' points outside its item or buffer");
    }
  return plan;
}

namespace {
/// The global part; `copy` holds it when it had to be realigned.
Result<const fb::GlobalPart *> globalPart(const PlanFile::Bytes &bytes, const std::string &name,
                                          std::string &copy) {
  const flatbuffers::Vector<uint8_t> *global = root(bytes)->global();
  if (!global)
    return makeError(name + ": plan has no global part (emit it with the committing rank)");
  const uint8_t *data = alignedNested(global, copy);
  flatbuffers::Verifier verifier(data, global->size(), 16, 100000000);
  if (!verifier.VerifyBuffer<fb::GlobalPart>(nullptr))
    return makeError(name + ": corrupt global part");
  return flatbuffers::GetRoot<fb::GlobalPart>(data);
}
} // namespace

namespace {
/// Inflates the deflated `.metadata`, which must come to exactly `size`
/// bytes; the file is untrusted, so the size is checked against what
/// deflate can produce before anything is allocated.
Result<std::string> inflateMetadata(const flatbuffers::Vector<uint8_t> &deflated, uint64_t size,
                                    const std::string &name, const char *content = ".metadata") {
  auto corrupt = [&](const std::string &what) {
    return makeError(name + ": corrupt global part (the deflated " + content + " " + what + ")",
                     ErrorKind::Corrupt);
  };
  // Deflate expands nothing more than 1032 times.
  if (size == 0 || size > 1032 * static_cast<uint64_t>(deflated.size()) + 1024)
    return corrupt("cannot inflate to the " + std::to_string(size) + " bytes it declares");
  // One spare byte, so that inflate never stops for want of room before the
  // stream's end, and a stream longer than declared shows.
  std::string out(size + 1, '\0');
  z_stream stream{};
  if (inflateInit(&stream) != Z_OK)
    return makeError(name + ": inflate: cannot initialize zlib");
  const uint8_t *in = deflated.data();
  size_t inLeft = deflated.size(), outDone = 0;
  int rc = Z_OK;
  while (rc == Z_OK) {
    // zlib counts in 32 bits: feed both sides at most 1 GiB at a time.
    if (stream.avail_in == 0 && inLeft > 0) {
      size_t piece = std::min<size_t>(inLeft, size_t(1) << 30);
      stream.next_in = const_cast<Bytef *>(in);
      stream.avail_in = static_cast<uInt>(piece);
      in += piece;
      inLeft -= piece;
    }
    if (stream.avail_out == 0 && outDone < out.size()) {
      size_t piece = std::min<size_t>(out.size() - outDone, size_t(1) << 30);
      stream.next_out = reinterpret_cast<Bytef *>(&out[outDone]);
      stream.avail_out = static_cast<uInt>(piece);
      outDone += piece;
    }
    rc = inflate(&stream, Z_NO_FLUSH);
  }
  uint64_t produced = stream.total_out;
  bool trailing = stream.avail_in > 0 || inLeft > 0;
  inflateEnd(&stream);
  if (rc != Z_STREAM_END)
    return corrupt(rc == Z_BUF_ERROR ? "is truncated or longer than declared"
                                     : "does not inflate (zlib error " + std::to_string(rc) + ")");
  if (produced != size || trailing)
    return corrupt("inflates to " + std::to_string(produced) + " bytes, not the " +
                   std::to_string(size) + " it declares");
  out.resize(size);
  return out;
}
} // namespace

Result<std::string> PlanFile::metadataBytes() const {
  std::string copy;
  Result<const fb::GlobalPart *> global = globalPart(*bytes_, name_, copy);
  if (!global)
    return global.failure();
  if (const flatbuffers::Vector<uint8_t> *metadata = (*global)->metadata())
    return std::string(reinterpret_cast<const char *>(metadata->data()), metadata->size());
  if (!(*global)->metadata_deflated())
    return makeError(name_ + ": global part has no metadata");
  return inflateMetadata(*(*global)->metadata_deflated(), (*global)->metadata_size(), name_);
}

Result<std::string> PlanFile::chunkIndexBytes() const {
  std::string copy;
  Result<const fb::GlobalPart *> global = globalPart(*bytes_, name_, copy);
  if (!global)
    return global.failure();
  const flatbuffers::Vector<uint8_t> *deflated = (*global)->chunk_index_deflated();
  if (!deflated || deflated->size() == 0)
    return std::string(); // an older plan, or none could be built
  return inflateMetadata(*deflated, (*global)->chunk_index_size(), name_, "chunk index");
}

Result<std::vector<PlanGroupInfo>> PlanFile::groups() const {
  std::string copy;
  Result<const fb::GlobalPart *> global = globalPart(*bytes_, name_, copy);
  if (!global)
    return global.failure();
  std::vector<PlanGroupInfo> groups;
  if ((*global)->groups())
    for (const fb::GroupInfo *group : *(*global)->groups()) {
      if (!validDType(group->dtype()))
        return makeError(name_ + ": corrupt group info");
      groups.push_back({group->unit() ? group->unit()->str() : "",
                        static_cast<dcp::DType>(group->dtype()), group->requires_grad(),
                        group->chunk(), group->size(), group->shard_size()});
    }
  return groups;
}

Result<std::vector<std::string>> PlanFile::optimizerParams() const {
  std::string copy;
  Result<const fb::GlobalPart *> global = globalPart(*bytes_, name_, copy);
  if (!global)
    return global.failure();
  std::vector<std::string> params;
  if ((*global)->optimizer_params())
    for (const flatbuffers::String *fqn : *(*global)->optimizer_params())
      params.push_back(fqn ? fqn->str() : "");
  return params;
}

Result<std::string> PlanFile::toJSON(std::optional<int64_t> onlyRank) const {
  using nlohmann::ordered_json;
  ordered_json out;
  out["format"] = "fsdp-plan-v" + std::to_string(version());
  char id[17];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(planId()));
  out["plan_id"] = id;
  out["world_size"] = worldSize();
  ordered_json mesh = ordered_json::array();
  std::vector<std::string> names = meshAxisNames();
  std::vector<int64_t> sizes = meshSizes();
  for (size_t i = 0; i < names.size() && i < sizes.size(); ++i)
    mesh.push_back({{"name", names[i]}, {"size", sizes[i]}});
  out["mesh"] = mesh;
  out["commit_rank"] = commitRank();
  auto dtypeName = [](dcp::DType dtype) { return dcp::dtypeInfo(dtype).name; };
  auto sourceName = [](ItemSource source) {
    return source == ItemSource::Buffer ? "buffer" : source == ItemSource::Step ? "step" : "bytes";
  };
  auto refJSON = [&](const BufferRef &ref) {
    return ordered_json{{"group", ref.group},
                        {"role", bufferRoleName(ref.role)},
                        {"local_offset", ref.localOffset},
                        {"elements", ref.elements}};
  };
  ordered_json rankList = ordered_json::array();
  for (int64_t r : ranks()) {
    if (onlyRank && *onlyRank != r)
      continue;
    Result<RankPlan> plan = rank(r);
    if (!plan)
      return plan.failure();
    ordered_json rankJSON{{"rank", plan->rank}, {"coords", plan->coords}};
    ordered_json buffers = ordered_json::array();
    for (const LocalBuffer &buffer : plan->buffers)
      buffers.push_back({{"group", buffer.group},
                         {"role", bufferRoleName(buffer.role)},
                         {"dtype", dtypeName(buffer.dtype)},
                         {"elements", buffer.elements},
                         {"range_begin", buffer.rangeBegin}});
    rankJSON["buffers"] = buffers;
    ordered_json files = ordered_json::array();
    for (const FileSpec &file : plan->files)
      files.push_back({{"name", file.name}, {"size", file.size}});
    rankJSON["files"] = files;
    ordered_json writes = ordered_json::array();
    for (const WriteItem &item : plan->writes) {
      ordered_json entry{{"key", item.key}, {"source", sourceName(item.source)}};
      if (item.source != ItemSource::Bytes) {
        entry["dtype"] = dtypeName(item.dtype);
        entry["global_shape"] = item.globalShape;
        entry["chunk_offsets"] = item.chunkOffsets;
        entry["chunk_sizes"] = item.chunkSizes;
      }
      if (item.source == ItemSource::Buffer)
        entry["from"] = refJSON(item.buffer);
      entry["file"] = plan->files[item.file].name;
      entry["item_offset"] = item.itemOffset;
      entry["item_length"] = item.itemLength;
      if (item.source != ItemSource::Bytes) {
        entry["data_offset"] = item.dataOffset;
        entry["data_length"] = item.dataLength;
      }
      writes.push_back(entry);
    }
    rankJSON["writes"] = writes;
    ordered_json reads = ordered_json::array();
    for (const ReadItem &item : plan->reads) {
      ordered_json entry{{"key", item.key},
                         {"source", sourceName(item.source)},
                         {"dtype", dtypeName(item.dtype)},
                         {"chunk_offsets", item.chunkOffsets},
                         {"chunk_sizes", item.chunkSizes}};
      if (item.source == ItemSource::Buffer)
        entry["to"] = refJSON(item.buffer);
      entry["file"] = item.file;
      entry["data_offset"] = item.dataOffset;
      entry["data_length"] = item.dataLength;
      reads.push_back(entry);
    }
    rankJSON["reads"] = reads;
    rankList.push_back(rankJSON);
  }
  out["ranks"] = rankList;
  if (hasGlobal()) {
    // Sizes only: inflating a large world's .metadata is metadataBytes()'s job.
    std::string copy;
    Result<const fb::GlobalPart *> global = globalPart(*bytes_, name_, copy);
    if (!global)
      return global.failure();
    if (const auto *metadata = (*global)->metadata())
      out["global"] = {{"metadata_bytes", metadata->size()}};
    else if (const auto *deflated = (*global)->metadata_deflated())
      out["global"] = {{"metadata_bytes", (*global)->metadata_size()},
                       {"metadata_deflated_bytes", deflated->size()}};
    else
      return makeError(name_ + ": global part has no metadata");
    if (const auto *index = (*global)->chunk_index_deflated()) {
      out["global"]["chunk_index_bytes"] = (*global)->chunk_index_size();
      out["global"]["chunk_index_deflated_bytes"] = index->size();
    }
  }
  // Replace, not throw: a corrupt plan may hold invalid UTF-8.
  return out.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

} // namespace plan
} // namespace fsdp
