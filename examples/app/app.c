/* The same from C, through the generated C entry point tiny_open and the C
 * API of fsdp_runtime.h: buffers allocated by the program from the generated
 * table (tiny_buffers), filled, saved, loaded back by a second checkpointer
 * with runtime-owned buffers, and checked.
 *
 *   mpirun -np 2 app-c DIR */
#include "tiny_ckpt.h"

#include <stdio.h>
#include <stdlib.h>

static int fail(const char *what, int code, const char *error) {
  fprintf(stderr, "app-c: %s: %s\n", what, error);
  return code ? code : 1;
}

int main(int argc, char **argv) {
  char error[512] = "";
  fsdp_checkpointer *saver = NULL, *loader = NULL;
  void *memory[TINY_BUFFER_COUNT] = {0};
  long long bytes = 0;
  int code;
  if (argc != 2) {
    fprintf(stderr, "usage: mpirun -np %d %s DIR\n", TINY_WORLD_SIZE, argv[0]);
    return 2;
  }

  if ((code = tiny_open(0, &saver, error, sizeof error)))
    return fail("open", code, error);
  for (size_t i = 0; i < TINY_BUFFER_COUNT; ++i) {
    const fsdp_buffer_info *buffer = &tiny_buffers[i];
    size_t size = (size_t)buffer->elements * tiny_element_size(buffer->dtype);
    memory[i] = calloc(size ? size : 1, 1);
    if (!memory[i])
      return fail("allocate", 1, "out of memory");
    if ((code =
             fsdp_bind_buffer(saver, buffer->group, buffer->role, memory[i], error, sizeof error)))
      return fail("bind", code, error);
    bytes += (long long)size;
  }
  if ((code = fsdp_fill_from_seed(saver, 9, error, sizeof error)))
    return fail("fill", code, error);
  if ((code = fsdp_save(saver, argv[1], 0, 1.0f, error, sizeof error)))
    return fail("save", code, error);

  if ((code = tiny_open(1, &loader, error, sizeof error)))
    return fail("open for load", code, error);
  if ((code = fsdp_load(loader, argv[1], 0, error, sizeof error)))
    return fail("load", code, error);
  if ((code = fsdp_check_against_seed(loader, 9, error, sizeof error)))
    return fail("check", code, error);

  printf("app (C): rank %lld of %d saved and loaded %d buffers (%lld bytes) in %s, every "
         "element checked\n",
         (long long)fsdp_rank(loader), TINY_WORLD_SIZE, TINY_BUFFER_COUNT, bytes, argv[1]);
  fsdp_close(saver);
  fsdp_close(loader);
  for (size_t i = 0; i < TINY_BUFFER_COUNT; ++i)
    free(memory[i]);
  return 0;
}
