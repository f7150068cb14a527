/* Bad input under MPI_ERRORS_RETURN gives the MPI error a user expects,
 * never a hang. Run with 2 processes. */
#include <mpi.h>
#include <stdio.h>

static int failures = 0;

#define EXPECT(call, want)                                                          \
    do {                                                                            \
        int rc_ = (call);                                                           \
        if (rc_ != (want)) {                                                        \
            fprintf(stderr, "line %d: %s gave %d, expected %d\n", __LINE__, #call, \
                    rc_, (want));                                                   \
            failures++;                                                             \
        }                                                                           \
    } while (0)

int main(int argc, char **argv) {
    int rank, size, x[10] = {0}, y[10], op, flag;
    MPI_Status st;
    MPI_Request rq;
    char text[MPI_MAX_ERROR_STRING];
    int len;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    EXPECT(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), MPI_SUCCESS);

    EXPECT(MPI_Send(x, 1, MPI_INT, size, 0, MPI_COMM_WORLD), MPI_ERR_RANK);
    EXPECT(MPI_Send(x, 1, MPI_INT, -5, 0, MPI_COMM_WORLD), MPI_ERR_RANK);
    EXPECT(MPI_Recv(x, 1, MPI_INT, size + 3, 0, MPI_COMM_WORLD, &st), MPI_ERR_RANK);
    EXPECT(MPI_Send(x, 1, MPI_INT, 0, -3, MPI_COMM_WORLD), MPI_ERR_TAG);
    EXPECT(MPI_Send(x, -1, MPI_INT, 0, 0, MPI_COMM_WORLD), MPI_ERR_COUNT);
    EXPECT(MPI_Send(x, 1, 999, 0, 0, MPI_COMM_WORLD), MPI_ERR_TYPE);
    EXPECT(MPI_Send(x, 1, MPI_DATATYPE_NULL, 0, 0, MPI_COMM_WORLD), MPI_ERR_TYPE);
    EXPECT(MPI_Send(NULL, 3, MPI_INT, 0, 0, MPI_COMM_WORLD), MPI_ERR_BUFFER);
    EXPECT(MPI_Send(x, 1, MPI_INT, 0, 0, 12345), MPI_ERR_COMM);
    EXPECT(MPI_Barrier(MPI_COMM_NULL), MPI_ERR_COMM);
    EXPECT(MPI_Allreduce(x, y, 1, MPI_INT, 77, MPI_COMM_WORLD), MPI_ERR_OP);
    EXPECT(MPI_Allreduce(x, y, 1, MPI_DOUBLE, MPI_BAND, MPI_COMM_WORLD), MPI_ERR_OP);
    EXPECT(MPI_Bcast(x, 1, MPI_INT, size, MPI_COMM_WORLD), MPI_ERR_ROOT);
    EXPECT(MPI_Reduce(x, y, 1, MPI_INT, MPI_SUM, -1, MPI_COMM_WORLD), MPI_ERR_ROOT);
    EXPECT(MPI_Allreduce(x, x, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_ERR_BUFFER);
    rq = 4242;
    EXPECT(MPI_Wait(&rq, &st), MPI_ERR_REQUEST);
    EXPECT(MPI_Op_free(&rq), MPI_ERR_OP);

    /* Truncation: 10 ints into a buffer of 5. */
    if (rank == 1) {
        EXPECT(MPI_Send(x, 10, MPI_INT, 0, 9, MPI_COMM_WORLD), MPI_SUCCESS);
        EXPECT(MPI_Isend(x, 10, MPI_INT, 0, 10, MPI_COMM_WORLD, &rq), MPI_SUCCESS);
        EXPECT(MPI_Wait(&rq, MPI_STATUS_IGNORE), MPI_SUCCESS);
    } else if (rank == 0) {
        EXPECT(MPI_Recv(y, 5, MPI_INT, 1, 9, MPI_COMM_WORLD, &st), MPI_ERR_TRUNCATE);
        if (st.MPI_ERROR != MPI_ERR_TRUNCATE || st.MPI_SOURCE != 1) {
            fprintf(stderr, "truncated status: error %d source %d\n", st.MPI_ERROR, st.MPI_SOURCE);
            failures++;
        }
        EXPECT(MPI_Irecv(y, 5, MPI_INT, 1, 10, MPI_COMM_WORLD, &rq), MPI_SUCCESS);
        EXPECT(MPI_Wait(&rq, &st), MPI_ERR_TRUNCATE);
    }
    /* A collective whose counts differ: truncation, not a hang. In a tree,
     * the processes that receive from the root report MPI_ERR_TRUNCATE;
     * the ones below them get the truncated data. */
    if (rank == 0) {
        EXPECT(MPI_Bcast(x, 4, MPI_INT, 0, MPI_COMM_WORLD), MPI_SUCCESS);
        flag = 0;
    } else {
        int rc = MPI_Bcast(y, 2, MPI_INT, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS && rc != MPI_ERR_TRUNCATE) {
            fprintf(stderr, "mismatched bcast gave %d\n", rc);
            failures++;
        }
        flag = rc == MPI_ERR_TRUNCATE;
    }
    EXPECT(MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), MPI_SUCCESS);
    if (!flag) {
        fprintf(stderr, "nobody reported the truncation\n");
        failures++;
    }
    /* After all that, the communicator still works. */
    EXPECT(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st), MPI_SUCCESS);
    if (flag) {
        fprintf(stderr, "a message is left over\n");
        failures++;
    }
    EXPECT(MPI_Allreduce(&failures, &op, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
    EXPECT(MPI_Error_string(MPI_ERR_TRUNCATE, text, &len), MPI_SUCCESS);
    if (rank == 0) {
        if (op != 0) {
            fprintf(stderr, "%d failures\n", op);
            return 1;
        }
        printf("PASS errors (%s)\n", text);
    }
    MPI_Finalize();
    return 0;
}
