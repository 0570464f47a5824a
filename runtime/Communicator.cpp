//===- Communicator.cpp - One process alone -------------------------------===//
#include "fsdp/Runtime/Communicator.h"

#include <cstdlib>

namespace fsdp {
namespace runtime {

namespace {
class SingleProcessCommunicator : public Communicator {
public:
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  Status barrier() override { return Status::success(); }
  Result<std::vector<std::string>> gather(const std::string &bytes, int64_t) override {
    return std::vector<std::string>{bytes};
  }
  Result<std::string> broadcast(const std::string &bytes, int64_t) override { return bytes; }
};
} // namespace

std::unique_ptr<Communicator> createSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

bool launchedByMpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK");
}

} // namespace runtime
} // namespace fsdp
