// Comm over MPI (OpenMPI). Separate header so programs that do not use MPI
// do not need mpi.h; link shardsafe_mpi.
#pragma once

#include <mpi.h>

#include <memory>

#include "shardsafe/comm.h"

namespace shardsafe {

// Wraps `comm` (not owned, not freed; the caller keeps MPI initialised while
// the returned object is used). Collectives use MPI_Allgather(v) and
// MPI_Bcast; payloads over 2 GiB are sent in pieces.
std::unique_ptr<Comm> MakeMpiComm(MPI_Comm comm);

}  // namespace shardsafe
