//===- Verify.cpp - Check the bytes of a checkpoint -----------------------===//
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "RuntimeSupport.h"

#include <new>

namespace fsdp {
namespace runtime {

const char *verifyVerdict(VerifyCoverage coverage) {
  // A PyTorch checkpoint has no digest of what lies between its zip records
  // (headers, the central directory): only the records' CRCs are checked.
  return coverage == VerifyCoverage::EveryByte
             ? "every byte is covered and matches"
             : "every record's CRC matches; bytes between records are not covered without "
               ".fsdp-index";
}

Status verifyCheckpoint(const std::string &dir, Storage &storage, std::string &report,
                        VerifyCoverage *coverage) {
  DirIdentity identity = identityOf(storage, dir);
  try {
    Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(dir, storage);
    if (!reader)
      return explainIfReplaced(storage, dir, identity, reader.failure());
    if (coverage)
      *coverage = (*reader)->index() ? VerifyCoverage::EveryByte : VerifyCoverage::RecordCrcs;
    Status verified = (*reader)->verifyAll(report);
    Status explained = explainIfReplaced(storage, dir, identity, verified);
    if (!verified && !explained.error().empty() && explained.error() != verified.error())
      report.clear(); // the problems listed were those of two checkpoints mixed
    return explained;
  } catch (const std::bad_alloc &) {
    return makeError("out of memory while verifying " + dir, ErrorKind::IO, ENOMEM);
  }
}

} // namespace runtime
} // namespace fsdp
