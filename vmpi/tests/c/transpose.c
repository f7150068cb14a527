/* Transpose of an N x N matrix distributed by block rows, by Alltoall. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int rank, size, b, n, i, j, p, bad = 0;
    double *a, *send, *recv;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    b = 37; /* rows per process: blocks are b x b */
    n = b * size;
    a = malloc(sizeof(double) * b * n);
    send = malloc(sizeof(double) * b * n);
    recv = malloc(sizeof(double) * b * n);
    for (i = 0; i < b; i++)
        for (j = 0; j < n; j++)
            a[i * n + j] = (double)((rank * b + i) * n + j);
    /* Block p of my rows goes to p, transposed. */
    for (p = 0; p < size; p++)
        for (i = 0; i < b; i++)
            for (j = 0; j < b; j++)
                send[p * b * b + j * b + i] = a[i * n + p * b + j];
    MPI_Alltoall(send, b * b, MPI_DOUBLE, recv, b * b, MPI_DOUBLE, MPI_COMM_WORLD);
    /* Row i of my block rows of A^T: A^T[r][c] = A[c][r]. */
    for (p = 0; p < size; p++)
        for (i = 0; i < b; i++)
            for (j = 0; j < b; j++) {
                int r = rank * b + i, c = p * b + j;
                if (recv[p * b * b + i * b + j] != (double)(c * n + r))
                    bad++;
            }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (bad) {
        fprintf(stderr, "rank %d: %d wrong elements\n", rank, bad);
        return 1;
    }
    if (rank == 0)
        printf("PASS transpose %d\n", n);
    free(a);
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
