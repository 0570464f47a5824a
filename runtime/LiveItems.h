//===- LiveItems.h - Writing the caller's live items at a commit -*- C++ -*-===//
//
// Internal to the runtime: what the committing rank does with
// SaveOptions::liveItems (include/fsdp/Runtime/LiveItem.h) between the
// agreement and the integrity index: the plan's `.metadata` (parsed) loses
// its bytes items when asked, the live keys are checked against what
// remains, the items are written to `__live_0.distcp` and their entries
// added.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_LIVEITEMS_H
#define FSDP_RUNTIME_LIVEITEMS_H

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Runtime/LiveItem.h"
#include "fsdp/Runtime/Storage.h"

#include <functional>
#include <string>
#include <vector>

namespace fsdp {
namespace runtime {

/// Removes every bytes item from `metadata` (its state_dict_metadata,
/// storage_data and planner_data entries); the items stay in their files.
void dropBytesItems(dcp::Metadata &metadata);
/// Drops every key `drop(key, saved)` chooses: its entry, its chunks'
/// storage and its planner path.
void dropKeys(dcp::Metadata &metadata,
              const std::function<bool(const std::string &, const dcp::StorageMetadata &)> &drop);

/// Every live key must be new to `metadata`, whose files must not include
/// kLiveFileName (kind InvalidArgument, naming the key).
Status checkLiveKeysAreNew(const dcp::Metadata &metadata, const std::vector<LiveItem> &items);

/// Writes `items` (checked by checkLiveItems) into `dir`/kLiveFileName in
/// order, each at a multiple of 4 KiB, zeros between them, through the page
/// cache; then fsync. One checksum per item, in order, appended to
/// `checksums`; `bytes` grows by the items' bytes.
Status writeLiveFile(Storage &storage, const std::string &dir, const std::vector<LiveItem> &items,
                     std::vector<integrity::ItemChecksum> &checksums, uint64_t &bytes);

/// Adds each item's entries to `metadata`: state_dict_metadata (a bytes
/// item, or a tensor of one chunk covering it), storage_data (where
/// `checksums`, writeLiveFile's, say it lies) and planner_data (when the
/// metadata has planner data).
void addLiveItems(dcp::Metadata &metadata, const std::vector<LiveItem> &items,
                  const std::vector<integrity::ItemChecksum> &checksums);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_LIVEITEMS_H
