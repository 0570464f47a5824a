//===- Stats.cpp - Per-rank statistics as JSON ----------------------------===//
#include "fsdp/Runtime/Checkpoint.h"

#include <nlohmann/json.hpp>

namespace fsdp {
namespace runtime {

std::string statsJson(const std::string &op, const std::vector<TransferStats> &ranks) {
  nlohmann::ordered_json json{{"op", op}};
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    const TransferStats &stats = ranks[rank];
    nlohmann::ordered_json entry{{"rank", rank},
                                 {"seconds", stats.seconds},
                                 {"stall_seconds", stats.stallSeconds},
                                 {"bytes_read_storage", stats.bytesReadStorage},
                                 {"bytes_written_storage", stats.bytesWrittenStorage},
                                 {"bytes_from_peers", stats.bytesFromPeers}};
    if (stats.readers) {
      entry["readers"] = stats.readers;
      entry["bytes_read_in_place"] = stats.bytesReadInPlace;
    }
    list.push_back(std::move(entry));
  }
  json["ranks"] = list;
  return json.dump(1) + "\n";
}

} // namespace runtime
} // namespace fsdp
