//===- CApi.cpp - C API of the checkpoint runtime -------------------------===//
//
// A thin driver over Checkpointer: each call converts, forwards, and turns
// an error into its kind's code and one line in the caller's buffer.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/CHandle.h"
#include "fsdp/Runtime/Checkpointer.h"
#include "fsdp/Runtime/fsdp_runtime.h"

#include <cstring>
#include <new>

using namespace fsdp;
using namespace fsdp::runtime;

// The C header's numbers are the C++ enums' (converted by static_cast below).
static_assert(FSDP_MAIN_WEIGHT == static_cast<int>(plan::BufferRole::MainWeight) &&
                  FSDP_MODEL_WEIGHT == static_cast<int>(plan::BufferRole::ModelWeight) &&
                  FSDP_MAIN_GRAD == static_cast<int>(plan::BufferRole::MainGrad) &&
                  FSDP_EXP_AVG == static_cast<int>(plan::BufferRole::ExpAvg) &&
                  FSDP_EXP_AVG_SQ == static_cast<int>(plan::BufferRole::ExpAvgSq) &&
                  FSDP_MAX_EXP_AVG_SQ == static_cast<int>(plan::BufferRole::MaxExpAvgSq) &&
                  FSDP_MOMENTUM_BUFFER == static_cast<int>(plan::BufferRole::MomentumBuffer) &&
                  FSDP_MOMENTUM_BUFFER == static_cast<int>(plan::kLastBufferRole),
              "fsdp_runtime.h's role constants disagree with plan::BufferRole");

/// A C caller's role number as the plan's role; out-of-range numbers become
/// one no buffer has (never truncated into a real role).
static plan::BufferRole roleOf(int32_t role) {
  if (role < 0 || role > static_cast<int32_t>(plan::kLastBufferRole))
    return static_cast<plan::BufferRole>(0xff);
  return static_cast<plan::BufferRole>(role);
}
static_assert(static_cast<int>(dcp::DType::Float64) == 0 &&
                  static_cast<int>(dcp::DType::Float32) == 1 &&
                  static_cast<int>(dcp::DType::Float16) == 2 &&
                  static_cast<int>(dcp::DType::BFloat16) == 3,
              "fsdp_buffer_info.dtype's documented codes disagree with dcp::DType");
static_assert(FSDP_OK == 0 && FSDP_ERROR_FAILED == errorKindExitCode(ErrorKind::Internal) &&
                  FSDP_ERROR_INVALID_ARGUMENT == errorKindExitCode(ErrorKind::InvalidArgument) &&
                  FSDP_ERROR_NOT_FOUND == errorKindExitCode(ErrorKind::NotFound) &&
                  FSDP_ERROR_CORRUPT == errorKindExitCode(ErrorKind::Corrupt) &&
                  FSDP_ERROR_INCOMPATIBLE == errorKindExitCode(ErrorKind::Incompatible) &&
                  FSDP_ERROR_IO == errorKindExitCode(ErrorKind::IO) &&
                  FSDP_ERROR_BUSY == errorKindExitCode(ErrorKind::Busy),
              "fsdp_runtime.h's error codes disagree with errorKindExitCode");

struct fsdp_checkpointer {
  std::unique_ptr<Checkpointer> runtime;
  std::shared_ptr<PendingSave> pending; // the save in the background, until waited for
};

namespace {

int report(char *error, size_t size, const Error &failure) {
  if (error && size) {
    size_t n = std::min(size - 1, failure.message.size());
    std::memcpy(error, failure.message.data(), n);
    error[n] = '\0';
  }
  return errorKindExitCode(failure.kind);
}

int finish(const Status &status, char *error, size_t size) {
  return status ? FSDP_OK : report(error, size, status.failure());
}

Status callback(int code, const char *what) {
  if (code == 0)
    return Status::success();
  return makeError(std::string("the caller's ") + what + " failed (returned " +
                       std::to_string(code) + ")",
                   ErrorKind::IO);
}

CommunicatorCallbacks callbacksOf(const fsdp_comm &comm) {
  CommunicatorCallbacks callbacks;
  callbacks.rank = comm.rank;
  callbacks.size = comm.size;
  if (comm.gather)
    callbacks.gather = [comm](const void *data, size_t size, void *out, int64_t root) {
      return callback(comm.gather(comm.context, data, size, out, root), "gather");
    };
  if (comm.broadcast)
    callbacks.broadcast = [comm](void *data, size_t size, int64_t root) {
      return callback(comm.broadcast(comm.context, data, size, root), "broadcast");
    };
  if (comm.barrier)
    callbacks.barrier = [comm]() { return callback(comm.barrier(comm.context), "barrier"); };
  return callbacks;
}

int openWith(const char *planPath, int allocate, Result<std::unique_ptr<Communicator>> comm,
             fsdp_checkpointer **out, char *error, size_t errorSize) {
  if (!out)
    return report(error, errorSize,
                  makeError("no place for the checkpointer", ErrorKind::InvalidArgument));
  *out = nullptr;
  if (!comm)
    return report(error, errorSize, comm.failure());
  Result<std::unique_ptr<Checkpointer>> opened =
      Checkpointer::open(planPath ? planPath : "", comm.take());
  if (!opened)
    return report(error, errorSize, opened.failure());
  if (allocate)
    if (Status status = (*opened)->allocate(); !status)
      return report(error, errorSize, status.failure());
  *out = new (std::nothrow) fsdp_checkpointer{opened.take()};
  return *out ? FSDP_OK : report(error, errorSize, makeError("out of memory"));
}

} // namespace

fsdp_checkpointer *fsdp::runtime::toCHandle(std::unique_ptr<Checkpointer> checkpointer) {
  if (!checkpointer)
    return nullptr;
  return new (std::nothrow) fsdp_checkpointer{std::move(checkpointer), nullptr};
}

extern "C" {

int fsdp_open(const char *planPath, int allocate, fsdp_checkpointer **out, char *error,
              size_t errorSize) {
  return openWith(planPath, allocate, createDefaultCommunicator(nullptr, nullptr), out, error,
                  errorSize);
}

int fsdp_open_with_comm(const char *planPath, int allocate, const fsdp_comm *comm,
                        fsdp_checkpointer **out, char *error, size_t errorSize) {
  if (!comm)
    return report(error, errorSize, makeError("no communicator", ErrorKind::InvalidArgument));
  return openWith(planPath, allocate, createCallbackCommunicator(callbacksOf(*comm)), out, error,
                  errorSize);
}

void fsdp_close(fsdp_checkpointer *c) { delete c; }

int64_t fsdp_rank(const fsdp_checkpointer *c) { return c->runtime->rank(); }
int64_t fsdp_world_size(const fsdp_checkpointer *c) { return c->runtime->worldSize(); }
size_t fsdp_buffer_count(const fsdp_checkpointer *c) { return c->runtime->plan().buffers.size(); }

int fsdp_buffer_info_at(const fsdp_checkpointer *c, size_t index, fsdp_buffer_info *info) {
  const std::vector<plan::LocalBuffer> &buffers = c->runtime->plan().buffers;
  if (index >= buffers.size() || !info)
    return FSDP_ERROR_INVALID_ARGUMENT;
  const plan::LocalBuffer &buffer = buffers[index];
  *info = {buffer.group, static_cast<int32_t>(buffer.role), static_cast<int32_t>(buffer.dtype),
           buffer.elements, buffer.aliasesMainWeight ? 1 : 0};
  return FSDP_OK;
}

void *fsdp_buffer_data(fsdp_checkpointer *c, int32_t group, int32_t role) {
  Result<RankBuffers *> buffers = c->runtime->buffers();
  if (!buffers)
    return nullptr;
  Result<BufferView> view = (*buffers)->get(group, roleOf(role));
  return view ? view->data : nullptr;
}

int fsdp_bind_buffer(fsdp_checkpointer *c, int32_t group, int32_t role, void *data, char *error,
                     size_t errorSize) {
  return finish(c->runtime->bind(group, roleOf(role), data), error,
                errorSize);
}

int fsdp_save(fsdp_checkpointer *c, const char *dir, int overwrite, float step, char *error,
              size_t errorSize) {
  SaveOptions options;
  options.overwrite = overwrite != 0;
  options.step = step;
  Result<TransferStats> stats = c->runtime->save(dir ? dir : "", options);
  return stats ? FSDP_OK : report(error, errorSize, stats.failure());
}

int fsdp_save_async(fsdp_checkpointer *c, const char *dir, int overwrite, float step,
                    double *stallSeconds, char *error, size_t errorSize) {
  SaveOptions options;
  options.overwrite = overwrite != 0;
  options.step = step;
  Result<std::shared_ptr<PendingSave>> started = c->runtime->saveAsync(dir ? dir : "", options);
  if (!started)
    return report(error, errorSize, started.failure());
  c->pending = started.take();
  if (stallSeconds)
    *stallSeconds = c->pending->stallSeconds();
  return FSDP_OK;
}

int fsdp_wait_save(fsdp_checkpointer *c, char *error, size_t errorSize) {
  if (!c->pending)
    return FSDP_OK;
  Result<TransferStats> outcome = c->pending->wait();
  c->pending.reset();
  return outcome ? FSDP_OK : report(error, errorSize, outcome.failure());
}

int fsdp_load(fsdp_checkpointer *c, const char *dir, int skipSync, char *error, size_t errorSize) {
  LoadOptions options;
  options.syncModelWeights = skipSync == 0;
  options.readTensorItems = false; // the C API returns none
  Result<LoadResult> loaded = c->runtime->load(dir ? dir : "", options);
  return loaded ? FSDP_OK : report(error, errorSize, loaded.failure());
}

int fsdp_verify(const char *dir, char *error, size_t errorSize) {
  std::unique_ptr<Storage> storage = createPosixStorage();
  std::string problems;
  Status status = verifyCheckpoint(dir ? dir : "", *storage, problems);
  if (status)
    return FSDP_OK;
  // The first problem says the most; the verdict counts them.
  std::string first = problems.substr(0, problems.find('\n'));
  return report(
      error, errorSize,
      propagate(status, first.empty() ? status.error() : first + " (" + status.error() + ")"));
}

int fsdp_fill_from_seed(fsdp_checkpointer *c, uint32_t seed, char *error, size_t errorSize) {
  return finish(c->runtime->fill(seed), error, errorSize);
}

int fsdp_check_against_seed(fsdp_checkpointer *c, uint32_t seed, char *error, size_t errorSize) {
  return finish(c->runtime->check(seed), error, errorSize);
}

} // extern "C"
