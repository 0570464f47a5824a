//===- FSDPLimits.h - Counts the compiler accepts ---------------*- C++ -*-===//
//
// The lowered IR and the checkpoint plan hold entries in proportion to these
// counts (a rank range per world rank and group, a key per global expert
// tensor). Past them the compiler would only run out of memory, so the
// importer and the verifiers refuse them by name (docs/ModelDescription.md,
// "Limits").
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPLIMITS_H
#define FSDP_DIALECT_FSDP_IR_FSDPLIMITS_H

#include <cstdint>

namespace fsdp {
namespace limits {

/// World ranks (the product of the mesh's axes).
constexpr int64_t kMaxRanks = int64_t(1) << 24;
/// Experts of one experts unit (its `count`).
constexpr int64_t kMaxExperts = int64_t(1) << 20;
/// Global expert tensors of a model: every experts unit's count times the
/// parameters of one expert, summed. Each is a checkpoint key of its own.
constexpr int64_t kMaxExpertTensors = int64_t(1) << 24;
/// Elements of one parameter: its bytes (at most 8 per element) fit in 64
/// bits and its element offsets, padded, in int64_t.
constexpr int64_t kMaxParamElements = int64_t(1) << 60;
/// Rank ranges of a lowered model: world ranks times parameter groups (each
/// group lists one range per world rank).
constexpr int64_t kMaxRankRanges = int64_t(1) << 27;

} // namespace limits
} // namespace fsdp

#endif // FSDP_DIALECT_FSDP_IR_FSDPLIMITS_H
