/* Under MPI_ERRORS_ARE_FATAL (the default) a truncation ends the whole
 * job; via-run exits with the error class (MPI_ERR_TRUNCATE = 15). The
 * other rank is blocked in a receive that never comes: it must be killed. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, x[8] = {0};
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 1) {
        MPI_Send(x, 8, MPI_INT, 0, 1, MPI_COMM_WORLD);
        MPI_Recv(x, 1, MPI_INT, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 0) {
        MPI_Recv(x, 2, MPI_INT, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        printf("not reached\n");
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return 0;
}
