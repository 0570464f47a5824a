// The generated C++ API end to end, one process per rank: caller-owned
// buffers sized from the generated tables, the typed buffers, the test
// values saved; then a load into runtime-allocated buffers, checked.
// usage: mpirun -np 2 roundtrip DIR
#include "wx.h"

#include <cstdio>
#include <type_traits>
#include <vector>

namespace ckpt = wx::ckpt;

static int fail(const char *what, const fsdp::Error &error) {
  std::fprintf(stderr, "roundtrip: %s: %s\n", what, error.message.c_str());
  return fsdp::errorKindExitCode(error.kind) ? fsdp::errorKindExitCode(error.kind) : 1;
}

int main(int argc, char **argv) {
  if (argc != 2)
    return fail("usage", fsdp::makeError("mpirun -np 2 roundtrip DIR"));
  fsdp::Result<ckpt::Checkpoint> saver = ckpt::Checkpoint::open(/*allocate=*/false);
  if (!saver)
    return fail("open", saver.failure());
  // The caller's memory, from the generated table of this rank's buffers.
  std::vector<std::vector<uint64_t>> memory;
  int64_t bytes = 0;
  for (const ckpt::BufferInfo &buffer : ckpt::kBuffers) {
    if (ckpt::bufferElements(saver->rank(), buffer.group, buffer.role) != buffer.elements)
      return fail("bufferElements", fsdp::makeError("disagrees with kBuffers"));
    memory.emplace_back((buffer.bytes + 7) / 8);
    if (fsdp::Status status = saver->bind(buffer.group, buffer.role, memory.back().data()); !status)
      return fail("bind", status.failure());
    bytes += buffer.bytes;
  }
  // A typed buffer: group 0's main weights are f32 in the worked example.
  using MainWeight = ckpt::buffers::Group0MainWeight;
  static_assert(std::is_same_v<MainWeight::Element, float>, "f32 main weights");
  static_assert(MainWeight::elements == ckpt::kBuffers[0].elements, "the same table");
  if (saver->data<MainWeight>() != reinterpret_cast<float *>(memory[0].data()))
    return fail("data<B>", fsdp::makeError("not the bound memory"));
  if (fsdp::Status status = saver->fill(11); !status)
    return fail("fill", status.failure());
  if (auto saved = saver->save(argv[1]); !saved)
    return fail("save", saved.failure());

  fsdp::Result<ckpt::Checkpoint> loader = ckpt::Checkpoint::open();
  if (!loader)
    return fail("open for load", loader.failure());
  if (loader->check(11))
    return fail("check before load", fsdp::makeError("zeroed buffers passed"));
  if (auto loaded = loader->load(argv[1]); !loaded)
    return fail("load", loaded.failure());
  if (fsdp::Status status = loader->check(11); !status)
    return fail("check", status.failure());
  std::printf("C++: rank %lld of %lld: %zu buffers, %lld bytes, saved and loaded back, every "
              "element checked\n",
              static_cast<long long>(loader->rank()), static_cast<long long>(ckpt::kWorldSize),
              std::size(ckpt::kBuffers), static_cast<long long>(bytes));
  return 0;
}
