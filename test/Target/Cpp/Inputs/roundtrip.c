/* The generated C entry point, compiled as C: wx_open (runtime-allocated
 * buffers), then the C API of fsdp_runtime.h: fill, save, load into a second
 * checkpointer, check. usage: mpirun -np 2 roundtrip-c DIR */
#include "wx.h"

#include <stdio.h>

static int fail(const char *what, int code, const char *error) {
  fprintf(stderr, "roundtrip-c: %s (code %d): %s\n", what, code, error);
  return code ? code : 1;
}

int main(int argc, char **argv) {
  char error[512] = "";
  fsdp_checkpointer *saver = NULL, *loader = NULL;
  int code;
  if (argc != 2)
    return fail("usage", 2, "mpirun -np 2 roundtrip-c DIR");
  if ((code = wx_open(1, &saver, error, sizeof error)))
    return fail("open", code, error);
  if (fsdp_buffer_count(saver) != WX_BUFFER_COUNT)
    return fail("buffers", 1, "the plan and the generated table disagree");
  for (size_t i = 0; i < WX_BUFFER_COUNT; ++i) {
    fsdp_buffer_info info;
    fsdp_buffer_info_at(saver, i, &info);
    if (info.group != wx_buffers[i].group || info.role != wx_buffers[i].role ||
        info.dtype != wx_buffers[i].dtype || info.elements != wx_buffers[i].elements ||
        info.elements != wx_buffer_elements(fsdp_rank(saver), info.group, info.role))
      return fail("buffers", 1, "the plan and the generated table disagree");
  }
  size_t plan_size = 0;
  if (!wx_rank_plan(fsdp_rank(saver), &plan_size) || plan_size == 0 ||
      wx_rank_plan(WX_WORLD_SIZE, &plan_size))
    return fail("rank plan", 1, "wrong span");
  if ((code = fsdp_fill_from_seed(saver, 23, error, sizeof error)))
    return fail("fill", code, error);
  if ((code = fsdp_save(saver, argv[1], 0, 2.0f, error, sizeof error)))
    return fail("save", code, error);
  if ((code = wx_open(1, &loader, error, sizeof error)))
    return fail("open for load", code, error);
  if ((code = fsdp_load(loader, argv[1], 0, error, sizeof error)))
    return fail("load", code, error);
  if ((code = fsdp_check_against_seed(loader, 23, error, sizeof error)))
    return fail("check", code, error);
  printf("C: rank %lld of %d: %d buffers of %lld elements in group 0's main weights, "
         "saved and loaded back, every element checked\n",
         (long long)fsdp_rank(loader), WX_WORLD_SIZE, WX_BUFFER_COUNT,
         (long long)wx_buffers[WX_GROUP0_MAIN_WEIGHT].elements);
  fsdp_close(saver);
  fsdp_close(loader);
  return 0;
}
