//===- MpiCommunicator.h - A caller's MPI communicator ----------*- C++ -*-===//
//
// For trainers that already run MPI: the runtime over their communicator (a
// sub-communicator included). Only for builds with MPI (FSDP_HAVE_MPI);
// including this header needs <mpi.h>.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_MPICOMMUNICATOR_H
#define FSDP_RUNTIME_MPICOMMUNICATOR_H

#include "fsdp/Runtime/Communicator.h"

// The C API only: the deprecated C++ bindings need their own library.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

namespace fsdp {
namespace runtime {

/// The runtime over a duplicate of `comm` (MPI must be initialized; the
/// caller keeps `comm` and finalizes MPI). Errors come back as values.
Result<std::unique_ptr<Communicator>> wrapMpiCommunicator(MPI_Comm comm);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_MPICOMMUNICATOR_H
