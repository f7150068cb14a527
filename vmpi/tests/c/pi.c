/* pi by the midpoint rule: n broadcast from 0, partial sums reduced. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, n = 0, i;
    double h, sum = 0.0, mypi, pi = 0.0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0)
        n = 100000;
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    h = 1.0 / (double)n;
    for (i = rank + 1; i <= n; i += size) {
        double x = h * ((double)i - 0.5);
        sum += 4.0 / (1.0 + x * x);
    }
    mypi = h * sum;
    MPI_Reduce(&mypi, &pi, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (fabs(pi - 3.141592653589793238) > 1e-8) {
            fprintf(stderr, "pi = %.16f\n", pi);
            return 1;
        }
        printf("PASS pi %.12f\n", pi);
    }
    MPI_Finalize();
    return 0;
}
