//===- LiveItem.h - Items a caller supplies at each save --------*- C++ -*-===//
//
// The plan decides every item of a checkpoint but those a training job only
// knows when it saves: the optimizer's hyper-parameters as they are now (the
// LR scheduler changes lr, adds initial_lr; there may be several param
// groups), the LR scheduler's and the data loader's state, RNG states. The
// caller hands them to each save (SaveOptions::liveItems): a bytes item (a
// complete torch.save archive, what DCP's BYTE_IO item holds) or a small
// tensor (its raw C-contiguous little-endian elements). Only the committing
// rank's are written, into `__live_0.distcp`, and added to `.metadata` and
// both indexes (docs/CheckpointFormat.md, "Live items").
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_LIVEITEM_H
#define FSDP_RUNTIME_LIVEITEM_H

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Support/Result.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp {
namespace runtime {

/// The data file the committing rank writes live items into.
constexpr const char *kLiveFileName = "__live_0.distcp";
/// Limits on what a save takes (kind InvalidArgument beyond them).
constexpr uint64_t kMaxLiveKeyBytes = uint64_t(64) << 10;
constexpr uint64_t kMaxLiveItemBytes = uint64_t(1) << 30;
constexpr uint64_t kMaxLiveTotalBytes = uint64_t(4) << 30;

struct LiveItem {
  /// The checkpoint key: "optimizer.param_groups.1.lr", "extra.rng.cpu.3".
  std::string key;
  bool isTensor = false;
  /// Tensors: dtype and shape (empty: a 0-d tensor).
  dcp::DType dtype = dcp::DType::UInt8;
  dcp::Dims shape;
  /// A bytes item: the complete torch.save archive (written as it is). A
  /// tensor: its raw C-contiguous little-endian elements, exactly numel x
  /// element size bytes.
  std::string data;
  /// The key's planner_data path (how dcp_to_torch_save nests it), e.g.
  /// {"optimizer", "param_groups", 1, "lr"}; empty: the key as one part.
  std::vector<dcp::PathPart> path;
};

/// What a save checks before it writes anything: keys non-empty, at most
/// kMaxLiveKeyBytes, valid UTF-8 without NUL, unique; a tensor's dtype
/// known, its shape non-negative and its data numel x element size bytes
/// (overflow-checked); a bytes item a torch.save archive; path parts
/// strings of at most kMaxLiveKeyBytes; every item at most
/// kMaxLiveItemBytes, all at most kMaxLiveTotalBytes. Errors (kind
/// InvalidArgument) name the key.
Status checkLiveItems(const std::vector<LiveItem> &items);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_LIVEITEM_H
