/*
 * The benchmark of vmpi-bench: one C source, built once with vmpicc
 * (vmpi over via) and once with Open MPI's mpicc, run under each one's
 * launcher in the same run. Prints one line per measurement:
 *     RESULT <test> <np> <bytes> <microseconds>
 * Times are per operation: the mean over the iterations of the slowest
 * process (MPI_MAX of each process's mean), after warm-up; the number of
 * iterations is calibrated so that each measurement takes about 0.1 s.
 *
 *   mpibench [pingpong|bw|barrier|bcast|allreduce|reduce|sweep]...
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;
static char *sbuf, *rbuf;
#define MAXBYTES (4 << 20)
#define TARGET_S 0.1

typedef void (*op_fn)(int bytes);

static void op_barrier(int bytes) {
    (void)bytes;
    MPI_Barrier(MPI_COMM_WORLD);
}
static void op_bcast(int bytes) { MPI_Bcast(sbuf, bytes, MPI_BYTE, 0, MPI_COMM_WORLD); }
static void op_allreduce(int bytes) {
    MPI_Allreduce(sbuf, rbuf, bytes / 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}
static void op_reduce(int bytes) {
    MPI_Reduce(sbuf, rbuf, bytes / 8, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
}

/* Runs `iters` operations; the slowest process's mean in microseconds. */
static double timed(op_fn f, int bytes, int iters) {
    double t0, t, max;
    int i;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (i = 0; i < iters; i++)
        f(bytes);
    t = (MPI_Wtime() - t0) / iters * 1e6;
    MPI_Allreduce(&t, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return max;
}

/* Iterations for about TARGET_S, agreed by every process. */
static int calibrate(op_fn f, int bytes) {
    double t = timed(f, bytes, 3);
    int iters = (int)(TARGET_S * 1e6 / (t > 0.05 ? t : 0.05));
    if (iters < 5)
        iters = 5;
    /* About TARGET_S for small messages too (a cap of 20,000 made an 8-byte
     * ping-pong a 12 ms window, where one sleep before it showed). */
    if (iters > 2000000)
        iters = 2000000;
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return iters;
}

static void coll(const char *name, op_fn f, int bytes) {
    int iters = calibrate(f, bytes);
    double us;
    timed(f, bytes, iters / 10 + 1); /* warm-up */
    us = timed(f, bytes, iters);
    if (rank == 0)
        printf("RESULT %s %d %d %.3f\n", name, size, bytes, us);
    fflush(stdout);
}

static int pp_bytes;
static void op_pingpong(int bytes) {
    (void)bytes;
    if (rank == 0) {
        MPI_Send(sbuf, pp_bytes, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
        MPI_Recv(rbuf, pp_bytes, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
        MPI_Recv(rbuf, pp_bytes, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(sbuf, pp_bytes, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
    }
}

/* Half round trip of a ping-pong between ranks 0 and 1. */
static void pingpong(int bytes) {
    int iters;
    double us;
    pp_bytes = bytes;
    iters = calibrate(op_pingpong, bytes);
    timed(op_pingpong, bytes, iters / 10 + 1);
    us = timed(op_pingpong, bytes, iters) / 2;
    if (rank == 0)
        printf("RESULT pingpong %d %d %.3f\n", size, bytes, us);
    fflush(stdout);
}

#define WINDOW 16
static void op_bw(int bytes) {
    MPI_Request rq[WINDOW];
    int i;
    (void)bytes;
    if (rank == 0) {
        for (i = 0; i < WINDOW; i++)
            MPI_Isend(sbuf, pp_bytes, MPI_BYTE, 1, 2, MPI_COMM_WORLD, &rq[i]);
        MPI_Waitall(WINDOW, rq, MPI_STATUSES_IGNORE);
        MPI_Recv(rbuf, 1, MPI_BYTE, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
        for (i = 0; i < WINDOW; i++)
            MPI_Irecv(rbuf, pp_bytes, MPI_BYTE, 0, 2, MPI_COMM_WORLD, &rq[i]);
        MPI_Waitall(WINDOW, rq, MPI_STATUSES_IGNORE);
        MPI_Send(sbuf, 1, MPI_BYTE, 0, 3, MPI_COMM_WORLD);
    }
}

/* Streaming bandwidth 0 -> 1 (a window of 16 messages, then an ack):
 * reported as microseconds per message (MB/s = bytes / us). */
static void bw(int bytes) {
    int iters;
    double us;
    pp_bytes = bytes;
    iters = calibrate(op_bw, bytes);
    timed(op_bw, bytes, iters / 10 + 1);
    us = timed(op_bw, bytes, iters) / WINDOW;
    if (rank == 0)
        printf("RESULT bw %d %d %.3f\n", size, bytes, us);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int a, b;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    sbuf = malloc(MAXBYTES);
    rbuf = malloc(MAXBYTES);
    memset(sbuf, 1, MAXBYTES);
    memset(rbuf, 0, MAXBYTES);
    for (a = 1; a < argc; a++) {
        const char *t = argv[a];
        if (!strcmp(t, "pingpong")) {
            pingpong(8);
        } else if (!strcmp(t, "bw")) {
            bw(1 << 20);
        } else if (!strcmp(t, "sweep")) {
            /* Ping-pong across sizes (the eager/rendezvous threshold). */
            for (b = 1024; b <= 256 * 1024; b *= 2)
                pingpong(b);
        } else if (!strcmp(t, "barrier")) {
            coll("barrier", op_barrier, 0);
        } else {
            op_fn f = !strcmp(t, "bcast") ? op_bcast : !strcmp(t, "allreduce") ? op_allreduce
                    : !strcmp(t, "reduce") ? op_reduce : NULL;
            if (!f) {
                if (rank == 0)
                    fprintf(stderr, "unknown test %s\n", t);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
            static const int sizes[] = {8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20};
            for (b = 0; b < (int)(sizeof sizes / sizeof sizes[0]); b++)
                coll(t, f, sizes[b]);
        }
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
