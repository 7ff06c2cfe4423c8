// An MPI program's own #include <mpi.h> comes before shardsafe's header:
// it must still compile without MPI's C++ bindings, which nothing links.
#include <mpi.h>

#include <cstdio>

#include "shardsafe/mpi_comm.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size = 0;
  {
    auto comm = shardsafe::MakeMpiComm(MPI_COMM_WORLD);
    size = comm->size();
    std::printf("rank %d of %d\n", comm->rank(), size);
  }
  MPI_Finalize();
  return size >= 1 ? 0 : 1;
}
