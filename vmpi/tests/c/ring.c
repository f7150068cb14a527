/* A token goes around the ring ROUNDS times; each rank adds its rank. */
#include <mpi.h>
#include <stdio.h>

#define ROUNDS 50

int main(int argc, char **argv) {
    int rank, size, token = 0, r;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (r = 0; r < ROUNDS; r++) {
        if (rank == 0) {
            token += 0;
            MPI_Send(&token, 1, MPI_INT, (rank + 1) % size, 7, MPI_COMM_WORLD);
            MPI_Recv(&token, 1, MPI_INT, size - 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Status st;
            int n;
            MPI_Recv(&token, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            MPI_Get_count(&st, MPI_INT, &n);
            if (st.MPI_SOURCE != rank - 1 || st.MPI_TAG != 7 || n != 1) {
                fprintf(stderr, "rank %d: bad status %d %d %d\n", rank, st.MPI_SOURCE, st.MPI_TAG, n);
                return 1;
            }
            token += rank;
            MPI_Send(&token, 1, MPI_INT, (rank + 1) % size, 7, MPI_COMM_WORLD);
        }
    }
    if (rank == 0) {
        int want = ROUNDS * (size - 1) * size / 2;
        if (token != want) {
            fprintf(stderr, "token %d, expected %d\n", token, want);
            return 1;
        }
        printf("PASS ring %d\n", size);
    }
    MPI_Finalize();
    return 0;
}
