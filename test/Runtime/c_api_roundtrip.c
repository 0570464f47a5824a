/* The C API end to end, compiled as C: a world-of-one save of the worked
 * example, with buffers bound from caller memory, then a load into
 * runtime-allocated buffers, checked element by element, and a verify.
 * usage: c_api_roundtrip PLAN DIR */
#include "fsdp/Runtime/fsdp_runtime.h"

#include <stdio.h>
#include <stdlib.h>

static int fail(const char *what, const char *error) {
  fprintf(stderr, "c_api_roundtrip: %s: %s\n", what, error);
  return 1;
}

int main(int argc, char **argv) {
  char error[512];
  fsdp_checkpointer *saver = NULL, *loader = NULL;
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
  if (fsdp_fill_from_seed(saver, 17, error, sizeof error))
    return fail("fill", error);
  if (fsdp_save(saver, argv[2], 0, 3.0f, error, sizeof error))
    return fail("save", error);
  if (fsdp_save(saver, argv[2], 0, 3.0f, error, sizeof error) == 0)
    return fail("second save", "succeeded without overwrite");
  printf("second save refused: %s\n", error);
  if (fsdp_verify(argv[2], error, sizeof error))
    return fail("verify", error);
  if (fsdp_open(argv[1], 1, &loader, error, sizeof error))
    return fail("open for load", error);
  if (fsdp_check_against_seed(loader, 17, error, sizeof error) == 0)
    return fail("check before load", "zeroed buffers passed the check");
  if (fsdp_load(loader, argv[2], 0, error, sizeof error))
    return fail("load", error);
  if (fsdp_check_against_seed(loader, 17, error, sizeof error))
    return fail("check", error);
  printf("C API round trip: rank %lld of %lld, %zu buffers, every element checked\n",
         (long long)fsdp_rank(loader), (long long)fsdp_world_size(loader), count);
  fsdp_close(saver);
  fsdp_close(loader);
  for (size_t i = 0; i < count && i < 64; ++i)
    free(memory[i]);
  return 0;
}
