//===- Inspect.h - Describe any DCP checkpoint directory -------*- C++ -*-===//
#ifndef FSDP_RUNTIME_INSPECT_H
#define FSDP_RUNTIME_INSPECT_H

#include "fsdp/Runtime/Storage.h"
#include "fsdp/Support/Result.h"

#include <ostream>
#include <string>

namespace fsdp {
namespace runtime {

struct InspectOptions {
  bool json = false;
  /// Decode bytes items (hyper-parameters) and print their values.
  bool values = true;
};

/// Lists the keys, shapes, dtypes, chunks and files of the DCP checkpoint
/// in `dir` (ours or PyTorch's), as text or JSON, through the checkpoint
/// reader: `.metadata` and, for bytes items, only their bytes (checked);
/// never executes pickled code, and escapes every byte that came from a file.
Status inspectCheckpoint(const std::string &dir, Storage &storage, const InspectOptions &options,
                         std::ostream &out);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_INSPECT_H
