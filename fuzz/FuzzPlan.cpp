//===- FuzzPlan.cpp - libFuzzer target: plan files and the integrity index -===//
//
// Any input as a plan file: the outer verification, every rank part, the
// global part and the JSON dump must fail cleanly or succeed within bounds.
// The same bytes are also read as an integrity index.
//
// With -DFSDP_FUZZ_MAKE_SEED the program instead writes a valid plan (the
// worked example of docs/MegatronFSDPLayout.md) to argv[1], the fuzzer's seed.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Plan/PlanFile.h"

#include <cstdint>
#include <cstdio>
#include <string>

#ifdef FSDP_FUZZ_MAKE_SEED
int main(int argc, char **argv) {
  using namespace fsdp;
  if (argc != 2)
    return 2;
  plan::ModelLayout model;
  model.meshAxisNames = {"dp"};
  model.meshSizes = {4};
  model.optimizer.present = true;
  plan::GroupSpec group;
  group.dtype = dcp::DType::BFloat16;
  group.placements = {layout::Placement::Shard};
  group.chunk = 12;
  group.size = 48;
  group.shardSize = 12;
  group.buffers = {{plan::BufferRole::MainWeight, dcp::DType::Float32, false},
                   {plan::BufferRole::ModelWeight, dcp::DType::BFloat16, false},
                   {plan::BufferRole::ExpAvg, dcp::DType::Float32, false},
                   {plan::BufferRole::ExpAvgSq, dcp::DType::Float32, false}};
  group.members = {{{"p0"}, {5, 3}, 0}, {{"p1"}, {7}, 36}, {{"p2"}, {4, 4}, 20}};
  model.groups.push_back(group);
  model.optimizerParams = {"p0", "p1", "p2"};
  Result<std::string> bytes = plan::buildPlanFile(model);
  if (!bytes) {
    std::fprintf(stderr, "%s\n", bytes.error().c_str());
    return 1;
  }
  FILE *out = std::fopen(argv[1], "wb");
  if (!out)
    return 1;
  std::fwrite(bytes->data(), 1, bytes->size(), out);
  return std::fclose(out) == 0 ? 0 : 1;
}
#else
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace fsdp;
  std::string bytes(reinterpret_cast<const char *>(data), size);
  (void)integrity::parseIndex(bytes);
  Result<plan::PlanFile> file = plan::PlanFile::fromBytes(std::move(bytes));
  if (!file)
    return 0;
  for (int64_t rank : file->ranks())
    (void)file->rank(rank);
  (void)file->metadataBytes();
  (void)file->groups();
  (void)file->optimizerParams();
  (void)file->toJSON();
  return 0;
}
#endif
