//===- Verify.cpp - Check every byte of a checkpoint ----------------------===//
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/CheckpointReader.h"

#include <new>

namespace fsdp {
namespace runtime {

Status verifyCheckpoint(const std::string &dir, Storage &storage, std::string &report) {
  try {
    Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(dir, storage);
    if (!reader)
      return reader.failure();
    return (*reader)->verifyAll(report);
  } catch (const std::bad_alloc &) {
    return makeError("out of memory while verifying " + dir, ErrorKind::IO, ENOMEM);
  }
}

} // namespace runtime
} // namespace fsdp
