//===- DataPlane.cpp - Replica groups, and bytes over their communicator --===//
#include "fsdp/Runtime/DataPlane.h"
#include "fsdp/Support/LittleEndian.h"

#include <algorithm>
#include <map>
#include <xxhash.h>

namespace fsdp {
namespace runtime {

std::string replicaDigest(const plan::RankPlan &plan) {
  // Every field that decides which bytes land where, each framed, so that
  // no two different read lists serialize alike.
  std::string text;
  auto number = [&](uint64_t value) { le::putU64(text, value); };
  auto dims = [&](const dcp::Dims &values) {
    number(values.size());
    for (int64_t value : values)
      number(static_cast<uint64_t>(value));
  };
  for (const plan::ReadItem &read : plan.reads) {
    if (read.source != plan::ItemSource::Buffer)
      continue;
    number(read.key.size());
    text += read.key;
    number(static_cast<uint64_t>(read.dtype));
    dims(read.globalShape);
    dims(read.chunkOffsets);
    dims(read.chunkSizes);
    number(static_cast<uint64_t>(read.buffer.group));
    number(static_cast<uint64_t>(read.buffer.role));
    number(static_cast<uint64_t>(read.buffer.localOffset));
    number(static_cast<uint64_t>(read.buffer.elements));
  }
  XXH128_hash_t hash = XXH3_128bits(text.data(), text.size());
  std::string digest;
  le::putU64(digest, hash.low64);
  le::putU64(digest, hash.high64);
  return digest;
}

Result<std::unique_ptr<Communicator>> splitReplicaGroup(const plan::RankPlan &plan,
                                                        Communicator &comm, int64_t root,
                                                        bool evenAlone) {
  Result<std::vector<std::string>> digests = comm.gather(replicaDigest(plan), root);
  if (!digests)
    return propagate(digests, "finding the replica groups: " + digests.error());
  // The root names each group by its lowest rank and every rank learns its
  // own; a leading word says whether any group has two members.
  std::string colors;
  if (comm.rank() == root) {
    std::map<std::string, int64_t> firstRank;
    bool shared = false;
    le::putU64(colors, 0);
    for (size_t rank = 0; rank < digests->size(); ++rank) {
      auto [found, added] = firstRank.emplace((*digests)[rank], rank);
      shared = shared || !added;
      le::putU64(colors, static_cast<uint64_t>(found->second));
    }
    le::setU64(colors, 0, shared);
  }
  Result<std::string> all = comm.broadcast(colors, root);
  if (!all)
    return propagate(all, "finding the replica groups: " + all.error());
  if (all->size() != static_cast<size_t>(comm.size() + 1) * 8)
    return makeError("finding the replica groups: the root sent " + std::to_string(all->size()) +
                         " bytes for " + std::to_string(comm.size()) + " ranks",
                     ErrorKind::Internal);
  if (!le::getU64(all->data()) && !evenAlone)
    return std::unique_ptr<Communicator>();
  int64_t color = static_cast<int64_t>(le::getU64(all->data() + (comm.rank() + 1) * 8));
  return comm.split(color, comm.rank());
}

namespace {

/// Bytes over the group's own communicator: host memory in place, device
/// memory through a host staging buffer in pieces.
class CommunicatorDataPlane : public ReplicaDataPlane {
public:
  CommunicatorDataPlane(std::unique_ptr<Communicator> group, uint64_t stagingBytes)
      : group_(std::move(group)), stagingBytes_(std::max<uint64_t>(stagingBytes, 4096)) {}
  Communicator &group() override { return *group_; }
  const char *name() const override { return "communicator"; }

  Status broadcast(const std::vector<Transfer> &transfers, MemoryBackend &backend) override {
    if (backend.hostAccessible()) {
      for (const Transfer &transfer : transfers)
        if (Status status = group_->broadcastInPlace(transfer.data, transfer.bytes, transfer.root);
            !status)
          return status;
      return Status::success();
    }
    // Every member goes through every piece's broadcast even after a copy
    // failed (the others wait for it); the first failure is returned.
    Status first;
    std::string staging(std::min<uint64_t>(stagingBytes_, largest(transfers)), '\0');
    for (const Transfer &transfer : transfers)
      for (uint64_t at = 0; at < transfer.bytes; at += staging.size()) {
        uint64_t size = std::min<uint64_t>(staging.size(), transfer.bytes - at);
        char *device = static_cast<char *>(transfer.data) + at;
        bool sending = group_->rank() == transfer.root;
        if (sending)
          if (Status status = backend.copyOut(device, staging.data(), size).get(); !status && first)
            first = status;
        if (Status status = group_->broadcastInPlace(staging.data(), size, transfer.root); !status)
          return status; // the communicator itself failed: nothing more can run
        if (!sending)
          if (Status status = backend.copyIn(staging.data(), device, size).get(); !status && first)
            first = status;
      }
    return first;
  }

private:
  static uint64_t largest(const std::vector<Transfer> &transfers) {
    uint64_t most = 0;
    for (const Transfer &transfer : transfers)
      most = std::max(most, transfer.bytes);
    return most;
  }
  std::unique_ptr<Communicator> group_;
  uint64_t stagingBytes_;
};

} // namespace

bool ncclBuilt() {
#ifdef FSDP_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<ReplicaDataPlane> createCommunicatorDataPlane(std::unique_ptr<Communicator> group,
                                                              uint64_t stagingBytes) {
  return std::make_unique<CommunicatorDataPlane>(std::move(group), stagingBytes);
}

} // namespace runtime
} // namespace fsdp
