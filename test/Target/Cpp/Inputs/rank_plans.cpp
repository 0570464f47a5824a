// Each of three ranks' embedded plan files, read as the runtime reads them:
// a plan file of that rank alone, with this library's identity.
#include "big.h"

#include "fsdp/Plan/PlanFile.h"

#include <cstdio>

int main() {
  for (int64_t rank : {int64_t(0), big::kWorldSize / 2, big::kWorldSize - 1}) {
    std::string_view bytes = big::rankPlan(rank);
    fsdp::Result<fsdp::plan::PlanFile> file = fsdp::plan::PlanFile::fromBytes(std::string(bytes));
    if (!file || file->planId() != big::kPlanId || file->ranks() != std::vector<int64_t>{rank}) {
      std::fprintf(stderr, "rank %lld: not its plan file\n", static_cast<long long>(rank));
      return 1;
    }
    fsdp::Result<fsdp::plan::RankPlan> plan = file->rank(rank);
    if (!plan) {
      std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(rank), plan.error().c_str());
      return 1;
    }
    std::printf("rank %lld of %lld: %zu buffers, %zu writes%s\n", static_cast<long long>(rank),
                static_cast<long long>(big::kWorldSize), plan->buffers.size(), plan->writes.size(),
                file->hasGlobal() ? ", with the global part" : "");
  }
  return 0;
}
