/*===- fsdp_runtime.h - C API of the checkpoint runtime ----------*- C -*-===*
 *
 * For embedding in training code that is not C++: open a plan for this
 * process's rank, give the runtime its buffers (or let it allocate them),
 * save, load, verify. fsdp_open uses MPI_COMM_WORLD in processes started by
 * mpirun (the MPI rank is the plan's flat rank) and a world of one
 * otherwise; fsdp_open_with_comm runs over the caller's process group
 * through callbacks. Every call returns FSDP_OK (0) on success, or the code
 * of the error's kind (below; docs/Errors.md) with a one-line message in
 * `error`.
 *
 *===----------------------------------------------------------------------===*/
#ifndef FSDP_RUNTIME_FSDP_RUNTIME_H
#define FSDP_RUNTIME_FSDP_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_checkpointer fsdp_checkpointer;

/* Return codes: one per kind of error, the same as fsdp-ckpt's exit codes. */
enum {
  FSDP_OK = 0,
  FSDP_ERROR_FAILED = 1,           /* anything else (a check mismatch, a bug) */
  FSDP_ERROR_INVALID_ARGUMENT = 2, /* a bad call, value or plan for another world size */
  FSDP_ERROR_NOT_FOUND = 3,        /* no such file or committed checkpoint */
  FSDP_ERROR_CORRUPT = 4,          /* checksum mismatch, truncated or malformed file */
  FSDP_ERROR_INCOMPATIBLE = 5,     /* key, shape, dtype or coverage not as the plan needs */
  FSDP_ERROR_IO = 6,               /* the operating system refused */
  FSDP_ERROR_BUSY = 7              /* another save holds the target */
};

/* The caller's process group. Each call is collective over the group and
 * returns 0 on success (anything else fails the operation with
 * FSDP_ERROR_IO). Sizes are in bytes and equal on every rank. */
typedef struct fsdp_comm {
  void *context;
  int64_t rank;
  int64_t size;
  /* Every rank's `size` bytes at `data`, in rank order, into `out` on
   * `root` (size x group size bytes); `out` is unused elsewhere. */
  int (*gather)(void *context, const void *data, size_t size, void *out, int64_t root);
  /* `size` bytes at `data` on `root` into `data` on every rank. */
  int (*broadcast)(void *context, void *data, size_t size, int64_t root);
  int (*barrier)(void *context);
} fsdp_comm;

/* Buffer roles, as in the plan. */
enum {
  FSDP_MAIN_WEIGHT = 0,
  FSDP_MODEL_WEIGHT = 1,
  FSDP_MAIN_GRAD = 2,
  FSDP_EXP_AVG = 3,
  FSDP_EXP_AVG_SQ = 4,
  FSDP_MAX_EXP_AVG_SQ = 5,  /* Adam/AdamW with amsgrad */
  FSDP_MOMENTUM_BUFFER = 6  /* SGD with momentum */
};

typedef struct {
  int32_t group;
  int32_t role;
  int32_t dtype;    /* fsdp::dcp::DType: 0 f64, 1 f32, 2 f16, 3 bf16, ... */
  int64_t elements; /* of this rank's shard */
  int aliases_main_weight;
} fsdp_buffer_info;

/* Opens `plan_path` (a plan file or a directory of per-rank plans) for this
 * process's rank. With `allocate`, the runtime allocates every buffer,
 * zeroed; otherwise bind each one with fsdp_bind_buffer before a save or
 * load. */
int fsdp_open(const char *plan_path, int allocate, fsdp_checkpointer **out, char *error,
              size_t error_size);
/* As fsdp_open, over the caller's process group (`comm` is copied; its
 * context must outlive the checkpointer). */
int fsdp_open_with_comm(const char *plan_path, int allocate, const fsdp_comm *comm,
                        fsdp_checkpointer **out, char *error, size_t error_size);
void fsdp_close(fsdp_checkpointer *checkpointer);

int64_t fsdp_rank(const fsdp_checkpointer *checkpointer);
int64_t fsdp_world_size(const fsdp_checkpointer *checkpointer);
size_t fsdp_buffer_count(const fsdp_checkpointer *checkpointer);
int fsdp_buffer_info_at(const fsdp_checkpointer *checkpointer, size_t index,
                        fsdp_buffer_info *info);
/* The buffer's memory (allocated or bound), or NULL. */
void *fsdp_buffer_data(fsdp_checkpointer *checkpointer, int32_t group, int32_t role);
/* Uses caller-owned memory for one buffer (at least elements x element size
 * bytes), replacing what was there. */
int fsdp_bind_buffer(fsdp_checkpointer *checkpointer, int32_t group, int32_t role, void *data,
                     char *error, size_t error_size);

int fsdp_save(fsdp_checkpointer *checkpointer, const char *dir, int overwrite, float step,
              char *error, size_t error_size);
/* Starts a save and returns once every byte it saves is copied into host
 * memory the checkpointer owns (reserved by the first async save and
 * reused): the buffers may change from then on. The writes, fsync and
 * commit run in the background; `stall_seconds` (may be NULL) gets how long
 * the call held the caller. Any error of the save, any rank's, comes from
 * fsdp_wait_save. Every other collective call waits for it first. */
int fsdp_save_async(fsdp_checkpointer *checkpointer, const char *dir, int overwrite, float step,
                    double *stall_seconds, char *error, size_t error_size);
/* Waits for the save running in the background: FSDP_OK once it has
 * committed (or when none was started), else its error. */
int fsdp_wait_save(fsdp_checkpointer *checkpointer, char *error, size_t error_size);
/* Loads any DCP checkpoint into the plan's layout; refreshes model_weight
 * from main_weight unless `skip_model_weight_sync`. */
int fsdp_load(fsdp_checkpointer *checkpointer, const char *dir, int skip_model_weight_sync,
              char *error, size_t error_size);
int fsdp_verify(const char *dir, char *error, size_t error_size);

/* The deterministic test values (docs/TestValues.md). fsdp_check_against_seed
 * is collective: one rank's mismatch fails every rank. */
int fsdp_fill_from_seed(fsdp_checkpointer *checkpointer, uint32_t seed, char *error,
                        size_t error_size);
int fsdp_check_against_seed(fsdp_checkpointer *checkpointer, uint32_t seed, char *error,
                            size_t error_size);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_RUNTIME_FSDP_RUNTIME_H */
