/*
 * What tools/vmpi-count.sh counts: per round, one 8-byte ping-pong round
 * trip (`round_trip`: rank 0 sends then receives, rank 1 receives then
 * sends) or one MPI_Allreduce of doubles (`allreduce_call`, 8 bytes
 * unless a size is given).
 * Both functions are kept out of line so callgrind can collect just them
 * (--toggle-collect).
 *
 *   count [pingpong|allreduce] [rounds] [allreduce bytes]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank;
static char sbuf[8], rbuf[8];
static double *sv, *rv;
static int count = 1;

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
    MPI_Allreduce(sv, rv, count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "pingpong";
    int rounds = argc > 2 ? atoi(argv[2]) : 20000, i;
    if (argc > 3 && atoi(argv[3]) >= 8)
        count = atoi(argv[3]) / 8;
    sv = calloc(count, sizeof *sv);
    rv = calloc(count, sizeof *rv);
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
