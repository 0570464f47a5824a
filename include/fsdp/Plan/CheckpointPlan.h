//===- CheckpointPlan.h - Static per-rank checkpoint plans -----*- C++ -*-===//
//
// A checkpoint plan says, for every rank, which items it writes on save
// (checkpoint key, chunk box, where the bytes come from in its buffers,
// where they go in which file) and which it reads on a load into the same
// layout; and, once, for the committing rank, the complete DCP `.metadata`.
// Everything a save needs is decided here, ahead of time: no planning
// collective at save time.
//
// Keys follow Megatron-FSDP's experimental save_checkpoint through PyTorch
// DCP (docs/CheckpointFormat.md): `model.<fqn>` (main weights; one key per
// FQN of a tied parameter), `optimizer.state.<fqn>.<state>` (each of the
// optimizer's state tensors, named as their buffer roles, and `step` where the
// optimizer keeps one) and one bytes item per hyper-parameter
// `optimizer.param_groups.0.<name>`. An experts group's keys carry global
// expert numbers (docs/Experts.md), one entry per expert.
//
// Costs: planning one rank is O(that rank's items) (plus its replicas' for
// HSDP reads); the global metadata is O(all items) and built once.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_PLAN_CHECKPOINTPLAN_H
#define FSDP_PLAN_CHECKPOINTPLAN_H

#include "fsdp/Plan/ModelLayout.h"

#include <cstdint>
#include <memory>
#include <string>
#include <optional>
#include <vector>

namespace fsdp {
namespace plan {

/// Plans are versioned; a reader refuses versions it does not know.
constexpr uint32_t kPlanFormatVersion = 1;
/// Item starts are aligned so the runtime writes large aligned blocks.
constexpr uint64_t kItemAlignment = 4096;

/// The optimizer's state per parameter: its state tensors
/// (OptimizerSpec::stateRoles, sharded like the main weights and named as
/// their buffer roles) and, for Adam and AdamW, the step count, a 0-d f32
/// tensor on every rank.
inline constexpr const char *kStepStateName = "step";
/// `optimizer.state.<fqn>.<state>`.
std::string optimizerStateKey(const std::string &fqn, const char *state);

enum class ItemSource : uint8_t {
  Buffer, // elements of one of the rank's group buffers
  Step,   // the optimizer step count, a 0-d f32 tensor
  Bytes,  // a fixed payload (a pickled hyper-parameter)
};

/// Where an item's elements live in a rank's buffers.
struct BufferRef {
  int32_t group = -1;
  BufferRole role = BufferRole::MainWeight;
  int64_t localOffset = 0; // element offset in the rank's local shard
  int64_t elements = 0;
};

/// Where a buffer piece's data starts in a page of its file: where the
/// piece itself starts in a page of its buffer (buffers are page aligned), so
/// a load in the same layout reads it with direct I/O straight into place.
/// None where that is not a multiple of 64 (the data then starts at the next
/// one, as in PyTorch's files).
std::optional<uint64_t> pieceDataPageOffset(const BufferRef &buffer, dcp::DType dtype);

struct WriteItem {
  std::string key;
  ItemSource source = ItemSource::Buffer;
  dcp::DType dtype = dcp::DType::Float32;
  dcp::Dims globalShape;
  dcp::Dims chunkOffsets;
  dcp::Dims chunkSizes;
  BufferRef buffer;    // Buffer items
  std::string payload; // Bytes items: the complete torch.save archive
  uint32_t file = 0;   // index into RankPlan::files
  uint64_t itemOffset = 0;
  uint64_t itemLength = 0;
  uint64_t dataOffset = 0; // absolute offset of the raw bytes in the file
  uint64_t dataLength = 0;
};

/// A read for a load into the same layout: raw bytes at dataOffset of file.
struct ReadItem {
  std::string key;
  ItemSource source = ItemSource::Buffer;
  dcp::DType dtype = dcp::DType::Float32;
  dcp::Dims globalShape;
  dcp::Dims chunkOffsets;
  dcp::Dims chunkSizes;
  BufferRef buffer;
  std::string file;
  uint64_t itemOffset = 0;
  uint64_t itemLength = 0;
  uint64_t dataOffset = 0;
  uint64_t dataLength = 0;
};

struct LocalBuffer {
  int32_t group = 0;
  BufferRole role = BufferRole::MainWeight;
  dcp::DType dtype = dcp::DType::Float32;
  int64_t elements = 0;   // the group's shard size
  int64_t rangeBegin = 0; // where the shard starts in the group's buffer
  bool aliasesMainWeight = false;
};

struct FileSpec {
  std::string name;
  uint64_t size = 0;
};

struct RankPlan {
  int64_t rank = 0;
  std::vector<int64_t> coords;
  std::vector<LocalBuffer> buffers;
  std::vector<FileSpec> files;
  std::vector<WriteItem> writes;
  std::vector<ReadItem> reads;
};

/// The data file a rank writes (DCP's FileSystemWriter naming).
std::string dataFileName(int64_t rank);

// Where the plans put a group's elements, as the planner computes it:
// exposed so the plan emitter can check it against the verified IR's `ranks`
// and `pieces` (lib/Target/CheckpointPlan).

/// The elements shard `shard` of a group covers.
layout::Range shardRange(const GroupSpec &group, int64_t shard);
/// Where each rank's range of a group's buffers begins, by rank.
std::vector<int64_t> rankRangeBegins(const ModelLayout &model, const GroupSpec &group);
/// A member's part in one shard.
struct ShardPiece {
  int64_t shard = 0;
  layout::Piece piece;
};
/// Every non-empty part of `member`, in shard order: O(shards it touches).
std::vector<ShardPiece> memberPieces(const GroupSpec &group, const MemberSpec &member);

/// Plans ranks of one model. Construction is O(world size + parameters);
/// each planRank is then O(that rank's items) (plus its replicas' for HSDP).
/// The model must outlive the planner.
class CheckpointPlanner {
public:
  static Result<CheckpointPlanner> create(const ModelLayout &model);
  CheckpointPlanner(CheckpointPlanner &&) noexcept;
  CheckpointPlanner &operator=(CheckpointPlanner &&) noexcept;
  ~CheckpointPlanner();

  Result<RankPlan> planRank(int64_t rank);
  Result<dcp::Metadata> globalMetadata();
  /// The pickled globalMetadata() (serializeMetadata's bytes) streamed to
  /// `sink` as it is written, holding about 40 bytes per chunk rather than
  /// the Metadata or the pickle. Returns the pickle's size. With
  /// `chunkIndex`, also builds the checkpoint's chunk index without
  /// checksums (chunkindex::build's bytes for this pickle, from the same
  /// ~40 bytes a chunk plus 96 a record), or empty when a tensor has more
  /// dimensions than an index holds.
  Result<uint64_t> streamGlobalMetadata(const dcp::ByteSink &sink,
                                        std::string *chunkIndex = nullptr);

  class Impl;

private:
  explicit CheckpointPlanner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Plans one rank. Errors name the key at fault.
Result<RankPlan> planRank(const ModelLayout &model, int64_t rank);

/// The complete DCP metadata of a save: every key, every chunk, where each
/// item lies. O(all items).
Result<dcp::Metadata> planGlobalMetadata(const ModelLayout &model);

/// The DCP `.metadata` pickle of a save, streamed to `sink` (see
/// CheckpointPlanner::streamGlobalMetadata). Returns its size.
Result<uint64_t> streamGlobalMetadata(const ModelLayout &model, const dcp::ByteSink &sink);

/// A stable identity of the model layout a plan was built from (xxh3-64 of
/// its canonical form): checkpoints record it, loads compare it.
uint64_t planIdentity(const ModelLayout &model);

} // namespace plan
} // namespace fsdp

#endif // FSDP_PLAN_CHECKPOINTPLAN_H
