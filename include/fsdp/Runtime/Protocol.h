//===- Protocol.h - The protocol between ranks, in one place ----*- C++ -*-===//
//
// Every collective decision of a save, a load or a tool goes through these
// calls, rooted at the plan's committing rank: each rank contributes its
// status (and a payload); the root learns them all, decides, and every rank
// leaves with the same verdict. A failure is reported on every rank as the
// first failing rank's error ("rank R: ..."), its kind kept, so every
// process of a job exits the same way.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_PROTOCOL_H
#define FSDP_RUNTIME_PROTOCOL_H

#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/Communicator.h"

#include <functional>
#include <string>
#include <vector>

namespace fsdp {
namespace runtime {

/// Every rank learns the first failing rank's error, or success.
Status agree(Communicator &comm, const Status &local, int64_t root);

/// As agree; when every rank succeeded, `decide` runs on the root over every
/// rank's payload (rank order), and its verdict reaches every rank.
Status agreeThenDecide(Communicator &comm, const Status &local, const std::string &payload,
                       int64_t root,
                       const std::function<Status(const std::vector<std::string> &)> &decide);

/// `decide` runs on the root alone; its result (a payload, or its error
/// with the kind kept) reaches every rank. For decisions only one rank may
/// make (a job root's retention).
Result<std::string> decideOnRoot(Communicator &comm, int64_t root,
                                 const std::function<Result<std::string>()> &decide);

/// Strings for a broadcast: each a u32 length (little-endian) and its bytes.
std::string encodeStrings(const std::vector<std::string> &strings);
Result<std::vector<std::string>> decodeStrings(const std::string &bytes);

/// Every rank's statistics on the root (rank order); empty elsewhere.
Result<std::vector<TransferStats>> gatherStats(Communicator &comm, const TransferStats &stats,
                                               int64_t root);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_PROTOCOL_H
