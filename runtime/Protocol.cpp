//===- Protocol.cpp - The protocol between ranks --------------------------===//
#include "fsdp/Runtime/Protocol.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace fsdp {
namespace runtime {

namespace {

// On the wire: "O" + payload, or "E" + the kind's digit + the message.
std::string encodeOutcome(const Status &status, const std::string &payload = "") {
  if (status)
    return "O" + payload;
  return "E" + std::string(1, static_cast<char>('0' + static_cast<int>(status.kind()))) +
         status.error();
}

struct Outcome {
  Status status;
  std::string payload;
};

Outcome decodeOutcome(const std::string &bytes) {
  if (!bytes.empty() && bytes[0] == 'O')
    return {Status::success(), bytes.substr(1)};
  if (bytes.size() < 2 || bytes[0] != 'E' || bytes[1] < '0' ||
      bytes[1] > '0' + static_cast<int>(ErrorKind::Busy))
    return {makeError("a rank sent no readable answer"), ""};
  return {makeError(bytes.substr(2), static_cast<ErrorKind>(bytes[1] - '0')), ""};
}

} // namespace

Status agreeThenDecide(Communicator &comm, const Status &local, const std::string &payload,
                       int64_t root,
                       const std::function<Status(const std::vector<std::string> &)> &decide) {
  Result<std::vector<std::string>> gathered = comm.gather(encodeOutcome(local, payload), root);
  if (!gathered)
    return gathered.failure();
  std::string verdict;
  if (comm.rank() == root) {
    Status decided = Status::success();
    std::vector<std::string> payloads;
    for (size_t r = 0; r < gathered->size() && decided; ++r) {
      Outcome outcome = decodeOutcome((*gathered)[r]);
      if (!outcome.status)
        decided = comm.size() > 1
                      ? Status(propagate(outcome.status, "rank " + std::to_string(r) + ": " +
                                                             outcome.status.error()))
                      : outcome.status;
      payloads.push_back(std::move(outcome.payload));
    }
    if (decided && decide)
      decided = decide(payloads);
    verdict = encodeOutcome(decided);
  }
  Result<std::string> shared = comm.broadcast(verdict, root);
  if (!shared)
    return shared.failure();
  return decodeOutcome(*shared).status;
}

Status agree(Communicator &comm, const Status &local, int64_t root) {
  return agreeThenDecide(comm, local, "", root, nullptr);
}

Result<std::string> decideOnRoot(Communicator &comm, int64_t root,
                                 const std::function<Result<std::string>()> &decide) {
  std::string outcome;
  if (comm.rank() == root) {
    Result<std::string> decided = decide();
    outcome = decided ? encodeOutcome(Status::success(), *decided)
                      : encodeOutcome(Status(decided.failure()));
  }
  Result<std::string> shared = comm.broadcast(outcome, root);
  if (!shared)
    return shared.failure();
  Outcome received = decodeOutcome(*shared);
  if (!received.status)
    return received.status.failure();
  return received.payload;
}

std::string encodeStrings(const std::vector<std::string> &strings) {
  std::string out;
  for (const std::string &text : strings) {
    uint32_t length = static_cast<uint32_t>(text.size());
    for (int shift = 0; shift < 32; shift += 8)
      out.push_back(static_cast<char>((length >> shift) & 0xFF));
    out += text;
  }
  return out;
}

Result<std::vector<std::string>> decodeStrings(const std::string &bytes) {
  std::vector<std::string> strings;
  for (size_t at = 0; at < bytes.size();) {
    if (bytes.size() - at < 4)
      return makeError("a list sent between ranks is truncated", ErrorKind::Internal);
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i)
      length |= uint32_t(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
    at += 4;
    if (bytes.size() - at < length)
      return makeError("a list sent between ranks is truncated", ErrorKind::Internal);
    strings.push_back(bytes.substr(at, length));
    at += length;
  }
  return strings;
}

Result<std::vector<TransferStats>> gatherStats(Communicator &comm, const TransferStats &stats,
                                               int64_t root) {
  char line[320];
  std::snprintf(line, sizeof(line),
                "%" PRIu64 " %" PRIu64 " %.9f %.9f %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
                " %" PRIu64,
                stats.bytes, stats.items, stats.seconds, stats.stallSeconds,
                stats.bytesReadStorage, stats.bytesWrittenStorage, stats.bytesFromPeers,
                stats.readers, stats.bytesReadInPlace);
  Result<std::vector<std::string>> all = comm.gather(line, root);
  if (!all)
    return all.failure();
  std::vector<TransferStats> out;
  for (const std::string &entry : *all) {
    TransferStats rank;
    if (std::sscanf(entry.c_str(),
                    "%" SCNu64 " %" SCNu64 " %lf %lf %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                    " %" SCNu64,
                    &rank.bytes, &rank.items, &rank.seconds, &rank.stallSeconds,
                    &rank.bytesReadStorage, &rank.bytesWrittenStorage, &rank.bytesFromPeers,
                    &rank.readers, &rank.bytesReadInPlace) != 9)
      return makeError("a rank sent unreadable statistics");
    out.push_back(rank);
  }
  return out;
}

} // namespace runtime
} // namespace fsdp
