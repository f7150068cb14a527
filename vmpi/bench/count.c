/*
 * What tools/vmpi-count.sh counts: per round, one 8-byte ping-pong round
 * trip (`round_trip`: rank 0 sends then receives, rank 1 receives then
 * sends) or one 8-byte MPI_Allreduce of a double (`allreduce_call`).
 * Both functions are kept out of line so callgrind can collect just them
 * (--toggle-collect).
 *
 *   count [pingpong|allreduce] [rounds]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank;
static char sbuf[8], rbuf[8];
static double sv = 1.0, rv;

__attribute__((noinline)) void round_trip(void) {
    if (rank == 0) {
        MPI_Send(sbuf, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
        MPI_Recv(rbuf, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
        MPI_Recv(rbuf, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(sbuf, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
    }
}

__attribute__((noinline)) void allreduce_call(void) {
    MPI_Allreduce(&sv, &rv, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "pingpong";
    int rounds = argc > 2 ? atoi(argv[2]) : 20000, i;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (i = 0; i < rounds; i++) {
        if (!strcmp(what, "allreduce"))
            allreduce_call();
        else
            round_trip();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("%s %d rounds\n", what, rounds);
    MPI_Finalize();
    return 0;
}
