// Comm over MPI (OpenMPI). Separate header so programs that do not use MPI
// do not need mpi.h; link ss_comm_mpi.
#pragma once

// Only MPI's C API is used: keep mpi.h from pulling in the C++ bindings,
// which need an extra library (libmpi_cxx) at link time.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstddef>
#include <memory>

#include "shardsafe/comm.h"

namespace shardsafe {

// Wraps `comm` (not owned, not freed; the caller keeps MPI initialised while
// the returned object is used). Collective: every rank of `comm` must call
// it, because it duplicates `comm` (MPI_Comm_dup) so that shardsafe's
// messages never mix with the caller's and MPI errors come back as
// Unavailable (the duplicate uses MPI_ERRORS_RETURN) instead of aborting.
// Destroy the object before MPI_Finalize (afterwards the duplicate is left
// alone). Collectives use MPI_Allgather(v) and MPI_Bcast; payloads are sent
// in pieces of at most `max_piece_bytes` per rank per call (and at most
// INT_MAX bytes per call in all), so sizes over 2 GiB work. Tests lower
// `max_piece_bytes` to exercise the pieces with small payloads.
std::unique_ptr<Comm> MakeMpiComm(MPI_Comm comm, size_t max_piece_bytes = size_t{1} << 30);

}  // namespace shardsafe
