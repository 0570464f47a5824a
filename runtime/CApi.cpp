//===- CApi.cpp - C API of the checkpoint runtime -------------------------===//
#include "fsdp/Runtime/fsdp_runtime.h"
#include "fsdp/Runtime/Checkpoint.h"

#include <cstring>
#include <optional>
#include <sys/stat.h>

using namespace fsdp;
using namespace fsdp::runtime;

struct fsdp_checkpointer {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Storage> storage;
  std::optional<plan::PlanFile> planFile;
  plan::RankPlan plan;
  std::map<std::pair<int32_t, plan::BufferRole>, void *> memory;
  std::optional<RankBuffers> buffers;
};

namespace {

int report(char *error, size_t size, const std::string &message) {
  if (error && size) {
    size_t n = std::min(size - 1, message.size());
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return 1;
}

Result<RankBuffers *> buffersOf(fsdp_checkpointer *c) {
  if (!c->buffers) {
    Result<RankBuffers> wrapped = RankBuffers::wrap(c->plan, c->memory);
    if (!wrapped)
      return propagate(wrapped, wrapped.error() + " (bind it with fsdp_bind_buffer)");
    c->buffers = wrapped.take();
  }
  return &*c->buffers;
}

} // namespace

extern "C" {

int fsdp_open(const char *planPath, int allocate, fsdp_checkpointer **out, char *error,
              size_t errorSize) {
  auto c = std::make_unique<fsdp_checkpointer>();
  if (launchedByMpi()) {
    Result<std::unique_ptr<Communicator>> comm = createMpiCommunicator(nullptr, nullptr);
    if (!comm)
      return report(error, errorSize, comm.error());
    c->comm = comm.take();
  } else {
    c->comm = createSingleProcessCommunicator();
  }
  c->storage = createPosixStorage();
  std::string path = planPath ? planPath : "";
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode))
    path += "/" + plan::planFileName(c->comm->rank());
  Result<plan::PlanFile> file = plan::PlanFile::open(path);
  if (!file)
    return report(error, errorSize, file.error());
  if (file->worldSize() != c->comm->size())
    return report(error, errorSize,
                  path + ": the plan is for " + std::to_string(file->worldSize()) +
                      " ranks but " + std::to_string(c->comm->size()) + " are running");
  Result<plan::RankPlan> rankPlan = file->rank(c->comm->rank());
  if (!rankPlan)
    return report(error, errorSize, rankPlan.error());
  c->planFile = file.take();
  c->plan = rankPlan.take();
  if (allocate) {
    Result<RankBuffers> buffers = RankBuffers::allocate(c->plan);
    if (!buffers)
      return report(error, errorSize, buffers.error());
    c->buffers = buffers.take();
  }
  *out = c.release();
  return 0;
}

void fsdp_close(fsdp_checkpointer *c) { delete c; }

int64_t fsdp_rank(const fsdp_checkpointer *c) { return c->comm->rank(); }
int64_t fsdp_world_size(const fsdp_checkpointer *c) { return c->comm->size(); }
size_t fsdp_buffer_count(const fsdp_checkpointer *c) { return c->plan.buffers.size(); }

int fsdp_buffer_info_at(const fsdp_checkpointer *c, size_t index, fsdp_buffer_info *info) {
  if (index >= c->plan.buffers.size() || !info)
    return 1;
  const plan::LocalBuffer &buffer = c->plan.buffers[index];
  *info = {buffer.group, static_cast<int32_t>(buffer.role), static_cast<int32_t>(buffer.dtype),
           buffer.elements, buffer.aliasesMainWeight ? 1 : 0};
  return 0;
}

void *fsdp_buffer_data(fsdp_checkpointer *c, int32_t group, int32_t role) {
  Result<RankBuffers *> buffers = buffersOf(c);
  if (!buffers)
    return nullptr;
  Result<BufferView> view = (*buffers)->get(group, static_cast<plan::BufferRole>(role));
  return view ? view->data : nullptr;
}

int fsdp_bind_buffer(fsdp_checkpointer *c, int32_t group, int32_t role, void *data, char *error,
                     size_t errorSize) {
  if (role < FSDP_MAIN_WEIGHT || role > FSDP_EXP_AVG_SQ)
    return report(error, errorSize, "unknown buffer role " + std::to_string(role));
  c->memory[{group, static_cast<plan::BufferRole>(role)}] = data;
  c->buffers.reset(); // rebuilt from the bindings on next use
  return 0;
}

int fsdp_save(fsdp_checkpointer *c, const char *dir, int overwrite, float step, char *error,
              size_t errorSize) {
  Result<RankBuffers *> buffers = buffersOf(c);
  if (!buffers)
    return report(error, errorSize, buffers.error());
  SaveOptions options;
  options.overwrite = overwrite != 0;
  options.step = step;
  Result<TransferStats> stats =
      saveCheckpoint(*c->planFile, c->plan, **buffers, dir ? dir : "", *c->comm, *c->storage, options);
  return stats ? 0 : report(error, errorSize, stats.error());
}

int fsdp_load(fsdp_checkpointer *c, const char *dir, int skipSync, char *error, size_t errorSize) {
  Result<RankBuffers *> buffers = buffersOf(c);
  if (!buffers)
    return report(error, errorSize, buffers.error());
  LoadOptions options;
  options.syncModelWeights = skipSync == 0;
  Result<LoadResult> loaded =
      loadCheckpoint(c->plan, **buffers, dir ? dir : "", *c->comm, *c->storage, options);
  return loaded ? 0 : report(error, errorSize, loaded.error());
}

int fsdp_verify(const char *dir, char *error, size_t errorSize) {
  std::unique_ptr<Storage> storage = createPosixStorage();
  std::string problems;
  Status status = verifyCheckpoint(dir ? dir : "", *storage, problems);
  return status ? 0 : report(error, errorSize, problems.empty() ? status.error() : problems);
}

int fsdp_fill_from_seed(fsdp_checkpointer *c, uint32_t seed, char *error, size_t errorSize) {
  Result<RankBuffers *> buffers = buffersOf(c);
  if (!buffers)
    return report(error, errorSize, buffers.error());
  Status status = fillFromSeed(c->plan, **buffers, seed);
  return status ? 0 : report(error, errorSize, status.error());
}

int fsdp_check_against_seed(fsdp_checkpointer *c, uint32_t seed, char *error, size_t errorSize) {
  Result<RankBuffers *> buffers = buffersOf(c);
  if (!buffers)
    return report(error, errorSize, buffers.error());
  Status status = checkAgainstSeed(c->plan, **buffers, seed);
  return status ? 0 : report(error, errorSize, status.error());
}

} // extern "C"
