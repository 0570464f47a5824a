//===- PlanFile.h - The checkpoint plan file --------------------*- C++ -*-===//
//
// Plans are FlatBuffers (lib/Plan/PlanSchema.fbs): versioned, and laid out so
// a rank maps the file, verifies only its own nested part and reads it in
// O(its items). The global part (the DCP `.metadata` bytes, the groups and
// the optimizer's parameter list) is present once, for the committing rank.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_PLAN_PLANFILE_H
#define FSDP_PLAN_PLANFILE_H

#include "fsdp/Plan/CheckpointPlan.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {
namespace plan {

/// FlatBuffers addresses a buffer with 32-bit signed offsets, so a plan file
/// (and each part nested in it) stays below 2 GiB.
constexpr uint64_t kMaxPlanFileBytes = (uint64_t(1) << 31) - 1;

struct PlanFileOptions {
  /// Ranks whose parts to emit; empty means every rank.
  std::vector<int64_t> ranks;
  /// The global part: by default only when the committing rank is emitted.
  enum class Global { IfCommitRank, Always, Never } global = Global::IfCommitRank;
  /// A plan that would be larger fails, naming the limit, before it is
  /// built whole. Lower than kMaxPlanFileBytes only to test that check.
  uint64_t maxFileBytes = kMaxPlanFileBytes;
  /// The global part carries the checkpoint's chunk index (without
  /// checksums), so the commit need not parse `.metadata`. Off: a plan as
  /// older versions wrote it (tests compare the two commit paths).
  bool chunkIndex = true;
};

/// Plans the requested ranks of `model` and serializes them.
Result<std::string> buildPlanFile(const ModelLayout &model,
                                  const PlanFileOptions &options = {});

/// One plan file per requested rank (all when empty) in `dir`, named
/// planFileName(rank); the committing rank's carries the global part. For
/// large worlds, where a single file of every rank would pass the limit.
/// Returns the number of bytes written.
Result<uint64_t> writeSplitPlanFiles(const ModelLayout &model, const std::string &dir,
                                     std::vector<int64_t> ranks = {},
                                     uint64_t maxFileBytes = kMaxPlanFileBytes);
std::string planFileName(int64_t rank);

/// The files writeSplitPlanFiles would write, handed to `sink` one at a time
/// in rank order (the committing rank's with the global part), for writers
/// that put them elsewhere: fsdp-translate --emit-cpp embeds them. Only one
/// file is in memory at a time. Returns the number of bytes handed over; the
/// first error of the planner or of `sink` stops it.
Result<uint64_t>
forEachSplitPlanFile(const ModelLayout &model, std::vector<int64_t> ranks,
                     const std::function<Status(int64_t rank, const std::string &bytes)> &sink,
                     uint64_t maxFileBytes = kMaxPlanFileBytes);

struct PlanGroupInfo {
  std::string unit;
  dcp::DType dtype = dcp::DType::Float32;
  bool requiresGrad = true;
  int64_t chunk = 0, size = 0, shardSize = 0;
};

/// A plan file held in memory (read from disk or given bytes). Verifies the
/// outer table on open; each rank part and the global part when accessed.
class PlanFile {
public:
  static Result<PlanFile> open(const std::string &path);
  static Result<PlanFile> fromBytes(std::string bytes, std::string name = "<memory>");

  const std::string &name() const { return name_; }
  uint32_t version() const;
  uint64_t planId() const;
  int64_t worldSize() const;
  int64_t commitRank() const;
  std::vector<std::string> meshAxisNames() const;
  std::vector<int64_t> meshSizes() const;
  /// Ranks this file holds parts for, ascending.
  std::vector<int64_t> ranks() const;
  bool hasGlobal() const;

  Result<RankPlan> rank(int64_t rank) const;
  /// The pickled DCP `.metadata` the committing rank writes (inflated when
  /// the plan holds it deflated).
  Result<std::string> metadataBytes() const;
  /// The checkpoint's chunk index without checksums, inflated; empty when
  /// the plan has none (older plans; tensors of more than 4 dimensions):
  /// the commit then builds it from the parsed `.metadata`.
  Result<std::string> chunkIndexBytes() const;
  Result<std::vector<PlanGroupInfo>> groups() const;
  Result<std::vector<std::string>> optimizerParams() const;

  /// A JSON dump for people (every rank held, or one).
  Result<std::string> toJSON(std::optional<int64_t> onlyRank = std::nullopt) const;

  /// The file's bytes (mapped, or owned when built from memory).
  struct Bytes {
    virtual ~Bytes() = default;
    const uint8_t *data = nullptr;
    size_t size = 0;
  };

private:
  PlanFile(std::shared_ptr<const Bytes> bytes, std::string name)
      : bytes_(std::move(bytes)), name_(std::move(name)) {}
  static Result<PlanFile> verified(std::shared_ptr<const Bytes> bytes, std::string name);
  std::shared_ptr<const Bytes> bytes_;
  std::string name_;
};

} // namespace plan
} // namespace fsdp

#endif // FSDP_PLAN_PLANFILE_H
