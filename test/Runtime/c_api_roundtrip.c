/* The C API end to end, compiled as C: a world-of-one save of the worked
 * example, with buffers bound from caller memory, then a load into
 * runtime-allocated buffers over the caller's process group (callbacks),
 * checked element by element, and a verify; each kind of error returns its
 * own code.
 * usage: c_api_roundtrip PLAN DIR */
#include "fsdp/Runtime/fsdp_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const char *error) {
  fprintf(stderr, "c_api_roundtrip: %s: %s\n", what, error);
  return 1;
}

/* A group of one, as a trainer's bindings would provide it; counts calls. */
static int calls = 0;
static int gather_one(void *context, const void *data, size_t size, void *out, int64_t root) {
  (void)context;
  ++calls;
  if (root != 0)
    return 1;
  memcpy(out, data, size);
  return 0;
}
static int broadcast_one(void *context, void *data, size_t size, int64_t root) {
  (void)context, (void)data, (void)size;
  ++calls;
  return root == 0 ? 0 : 1;
}
static int barrier_one(void *context) {
  (void)context;
  ++calls;
  return 0;
}
static int broken_gather(void *context, const void *data, size_t size, void *out, int64_t root) {
  (void)context, (void)data, (void)size, (void)out, (void)root;
  return 5;
}

int main(int argc, char **argv) {
  char error[512];
  fsdp_checkpointer *saver = NULL, *loader = NULL, *broken = NULL;
  if (argc != 3)
    return fail("usage", "c_api_roundtrip PLAN DIR");
  if (fsdp_open(argv[1], 0, &saver, error, sizeof error))
    return fail("open", error);
  /* Caller-owned memory for every buffer the plan names. */
  void *memory[64] = {0};
  size_t count = fsdp_buffer_count(saver);
  for (size_t i = 0; i < count && i < 64; ++i) {
    fsdp_buffer_info info;
    fsdp_buffer_info_at(saver, i, &info);
    memory[i] = calloc((size_t)info.elements + 1, 8);
    if (fsdp_bind_buffer(saver, info.group, info.role, memory[i], error, sizeof error))
      return fail("bind", error);
  }
  /* Role numbers outside the enum are refused, never truncated into a real
   * role (259 would be exp_avg as a uint8). */
  if (count > 0 && fsdp_bind_buffer(saver, 0, 259, memory[0], error, sizeof error) !=
                       FSDP_ERROR_INVALID_ARGUMENT)
    return fail("bind role 259", "accepted");
  if (count > 0 && fsdp_bind_buffer(saver, 0, -1, memory[0], error, sizeof error) !=
                       FSDP_ERROR_INVALID_ARGUMENT)
    return fail("bind role -1", "accepted");
  if (fsdp_buffer_data(saver, 0, 256) != NULL)
    return fail("buffer_data role 256", "gave memory");
  if (fsdp_fill_from_seed(saver, 17, error, sizeof error))
    return fail("fill", error);
  if (fsdp_save(saver, argv[2], 0, 3.0f, error, sizeof error))
    return fail("save", error);
  int code = fsdp_save(saver, argv[2], 0, 3.0f, error, sizeof error);
  if (code == FSDP_OK)
    return fail("second save", "succeeded without overwrite");
  printf("second save refused (code %d): %s\n", code, error);
  if (fsdp_verify(argv[2], error, sizeof error))
    return fail("verify", error);
  /* An async save over the same target: the buffers are overwritten as
   * soon as it returns, and its error (the target exists) comes from the
   * wait. Then one to a new target, which holds the values of the start. */
  double stall = -1;
  if (fsdp_save_async(saver, argv[2], 0, 3.0f, &stall, error, sizeof error))
    return fail("async save", error);
  code = fsdp_wait_save(saver, error, sizeof error);
  if (code == FSDP_OK || stall < 0)
    return fail("async save", "an existing target was not refused from the wait");
  printf("async save refused from the wait (code %d): %s\n", code, error);
  char async_dir[4096];
  snprintf(async_dir, sizeof async_dir, "%s-async", argv[2]);
  if (fsdp_save_async(saver, async_dir, 0, 3.0f, NULL, error, sizeof error))
    return fail("async save", error);
  if (fsdp_fill_from_seed(saver, 18, error, sizeof error))
    return fail("fill after the return", error);
  if (fsdp_wait_save(saver, error, sizeof error))
    return fail("wait", error);
  if (fsdp_wait_save(saver, error, sizeof error))
    return fail("a second wait", error);

  fsdp_comm comm = {NULL, 0, 1, gather_one, broadcast_one, barrier_one};
  if (fsdp_open_with_comm(argv[1], 1, &comm, &loader, error, sizeof error))
    return fail("open for load", error);
  if (fsdp_check_against_seed(loader, 17, error, sizeof error) == FSDP_OK)
    return fail("check before load", "zeroed buffers passed the check");
  if (fsdp_load(loader, argv[2], 0, error, sizeof error))
    return fail("load", error);
  if (fsdp_check_against_seed(loader, 17, error, sizeof error))
    return fail("check", error);
  if (fsdp_load(loader, async_dir, 0, error, sizeof error))
    return fail("load of the async save", error);
  if (fsdp_check_against_seed(loader, 17, error, sizeof error))
    return fail("check of the async save", error);
  printf("C API round trip: rank %lld of %lld, %zu buffers, every element checked, "
         "%s collective calls through the callbacks\n",
         (long long)fsdp_rank(loader), (long long)fsdp_world_size(loader), count,
         calls > 0 ? "with" : "without");

  /* One code per kind. */
  code = fsdp_load(loader, "/nonexistent/checkpoint", 0, error, sizeof error);
  printf("missing checkpoint (code %d): %s\n", code, error);
  comm.size = 2;
  code = fsdp_open_with_comm(argv[1], 1, &comm, &broken, error, sizeof error);
  printf("plan for another world size (code %d): %s\n", code, error);
  comm.size = 1;
  comm.gather = broken_gather;
  if (fsdp_open_with_comm(argv[1], 1, &comm, &broken, error, sizeof error))
    return fail("open with a broken gather", error);
  code = fsdp_load(broken, argv[2], 0, error, sizeof error);
  printf("a failing callback (code %d): %s\n", code, error);
  fsdp_close(broken);
  fsdp_close(saver);
  fsdp_close(loader);
  for (size_t i = 0; i < count && i < 64; ++i)
    free(memory[i]);
  return 0;
}
