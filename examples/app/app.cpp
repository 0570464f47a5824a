// Checkpoints a model's FSDP buffers from C++ through its generated library
// (tiny_ckpt.h, made by fsdp_add_checkpoint_library): this rank's buffers are
// allocated by the program from the generated table, filled with the test
// values, saved, loaded back into the same layout and checked.
//
//   mpirun -np 2 app DIR
#include "tiny_ckpt.h"

#include <cstdio>
#include <memory>
#include <vector>

namespace {

int fail(const char *what, const fsdp::Error &error) {
  std::fprintf(stderr, "app: %s: %s\n", what, error.message.c_str());
  int code = fsdp::errorKindExitCode(error.kind);
  return code ? code : 1;
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpirun -np %lld %s DIR\n",
                 static_cast<long long>(tiny::kWorldSize), argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const uint32_t seed = 7;

  // This process's rank of the embedded plan; the program owns the memory.
  fsdp::Result<tiny::Checkpoint> saver = tiny::Checkpoint::open(/*allocate=*/false);
  if (!saver)
    return fail("open", saver.failure());
  std::vector<std::unique_ptr<uint64_t[]>> memory;
  int64_t bytes = 0;
  for (const tiny::BufferInfo &buffer : tiny::kBuffers) {
    memory.emplace_back(new uint64_t[(buffer.bytes + 7) / 8]());
    if (fsdp::Status status = saver->bind(buffer.group, buffer.role, memory.back().get()); !status)
      return fail("bind", status.failure());
    bytes += buffer.bytes;
  }

  // The deterministic test values (what a trainer's weights would be), saved.
  if (fsdp::Status status = saver->fill(seed); !status)
    return fail("fill", status.failure());
  // A typed view of one buffer: the root unit's f32 main weights.
  using Embeddings = tiny::buffers::Group0MainWeight;
  const float *weights = saver->data<Embeddings>();
  if (auto saved = saver->save(dir); !saved)
    return fail("save", saved.failure());

  // Loaded back into the same layout (runtime-owned buffers), then checked:
  // every element, and the typed buffer against the saved one.
  fsdp::Result<tiny::Checkpoint> loader = tiny::Checkpoint::open(/*allocate=*/true);
  if (!loader)
    return fail("open for load", loader.failure());
  if (auto loaded = loader->load(dir); !loaded)
    return fail("load", loaded.failure());
  if (fsdp::Status status = loader->check(seed); !status)
    return fail("check", status.failure());
  const float *loadedWeights = loader->data<Embeddings>();
  for (int64_t i = 0; i < Embeddings::elements; ++i)
    if (loadedWeights[i] != weights[i])
      return fail("compare", fsdp::makeError("group 0's main weights differ"));

  std::printf("app (C++): rank %lld of %lld saved and loaded %zu buffers (%lld bytes) in %s, "
              "every element checked\n",
              static_cast<long long>(loader->rank()), static_cast<long long>(tiny::kWorldSize),
              std::size(tiny::kBuffers), static_cast<long long>(bytes), dir.c_str());
  return 0;
}
