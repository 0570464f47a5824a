// For hostile-names.mlir: the generated string literals hold the mesh axis
// names' exact bytes, and the plan embedded from a path with a quote, a
// backslash and `??` is there. The generated header comes by -include.
#include <cstdio>

int main() {
  for (const char *name : hx::ckpt::kMeshAxisNames) {
    std::printf("axis");
    for (const char *c = name; *c; ++c)
      std::printf(" %02x", static_cast<unsigned char>(*c));
    std::printf("\n");
  }
  size_t size = 0;
  const void *plan = hx_rank_plan(0, &size);
  std::printf("rank 0 plan: %s\n", plan && size > 0 ? "embedded" : "missing");
  return 0;
}
