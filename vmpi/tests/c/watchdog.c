/* A thread other than the one blocked in MPI asks MPI_Initialized (MPI
 * allows that from any thread at any time) and ends the job with
 * MPI_Abort: neither may wait for the blocked call (the common-case
 * calls hold the library's handle table while they run). The main thread
 * of rank 0 waits in MPI_Recv for a message nobody sends; via-run must
 * exit with the abort's code, 42. The many MPI_Initialized calls make sure
 * most of them come while MPI_Recv runs (no sleep needed). */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>

static void *watchdog(void *arg) {
    int flag = 0, i;
    (void)arg;
    for (i = 0; i < 200000; i++) {
        MPI_Initialized(&flag);
        if (!flag)
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("initialized %d\n", flag);
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 42);
    return NULL;
}

int main(int argc, char **argv) {
    int x = 0, provided, rank;
    pthread_t t;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0 && pthread_create(&t, NULL, watchdog, NULL) != 0)
        return 2;
    /* Blocks: nobody sends. */
    MPI_Recv(&x, 1, MPI_INT, MPI_ANY_SOURCE, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    printf("not reached\n");
    MPI_Finalize();
    return 0;
}
