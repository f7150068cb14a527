/* Collectives from C against serial references: user operations (a
 * non-commutative 2x2 matrix product keeps rank order), MPI_IN_PLACE,
 * split and dup, scan, reduce_scatter, allgather, every root. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(c)                                                            \
    do {                                                                    \
        if (!(c)) {                                                         \
            fprintf(stderr, "rank %d line %d: %s\n", rank, __LINE__, #c); \
            failures++;                                                     \
        }                                                                   \
    } while (0)

/* inout = in x inout for 2x2 integer matrices (row major). */
static void matmul(void *in, void *inout, int *len, MPI_Datatype *dt) {
    long *a = in, *b = inout;
    int i;
    (void)dt;
    for (i = 0; i < *len / 4; i++, a += 4, b += 4) {
        long c0 = a[0] * b[0] + a[1] * b[2], c1 = a[0] * b[1] + a[1] * b[3];
        long c2 = a[2] * b[0] + a[3] * b[2], c3 = a[2] * b[1] + a[3] * b[3];
        b[0] = c0;
        b[1] = c1;
        b[2] = c2;
        b[3] = c3;
    }
}

static void mat_of(int r, long *m) {
    m[0] = 1;
    m[1] = r + 1;
    m[2] = 0;
    m[3] = 1 + (r % 2);
}

int main(int argc, char **argv) {
    int rank, size, root, i, n;
    MPI_Op mm;
    MPI_Comm half, dup;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Op_create(matmul, 0, &mm);

    /* Non-commutative reduce at every root and allreduce. */
    for (root = 0; root < size; root++) {
        long mine[4], got[4], want[4] = {1, 0, 0, 1}, t[4];
        int r;
        mat_of(rank, mine);
        for (r = 0; r < size; r++) {
            long m[4];
            mat_of(r, m);
            memcpy(t, want, sizeof t);
            /* want = want x m: matmul computes inout = in x inout. */
            memcpy(want, m, sizeof m);
            matmul(t, want, (int[]){4}, NULL);
        }
        MPI_Reduce(mine, got, 4, MPI_LONG, mm, root, MPI_COMM_WORLD);
        if (rank == root)
            CHECK(memcmp(got, want, sizeof got) == 0);
        MPI_Allreduce(mine, got, 4, MPI_LONG, mm, MPI_COMM_WORLD);
        CHECK(memcmp(got, want, sizeof got) == 0);
    }

    /* Scan with MPI_IN_PLACE; MAXLOC. */
    {
        int v = rank + 1;
        struct { double v; int i; } in, out;
        MPI_Scan(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(v == (rank + 1) * (rank + 2) / 2);
        in.v = (double)((rank * 7) % size);
        in.i = rank;
        MPI_Allreduce(&in, &out, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
        CHECK(out.v == (double)(size - 1));
    }

    /* Reduce_scatter with uneven counts (some zero). */
    {
        int *counts = malloc(sizeof(int) * size), total = 0, *send, *recv;
        for (i = 0; i < size; i++) {
            counts[i] = i % 3;
            total += counts[i];
        }
        send = malloc(sizeof(int) * (total + 1));
        recv = malloc(sizeof(int) * 3);
        for (i = 0; i < total; i++)
            send[i] = i * (rank + 1);
        MPI_Reduce_scatter(send, recv, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        n = 0;
        for (i = 0; i < rank; i++)
            n += counts[i];
        for (i = 0; i < counts[rank]; i++)
            CHECK(recv[i] == (n + i) * size * (size + 1) / 2);
        free(counts);
        free(send);
        free(recv);
    }

    /* Split into halves, dup, allgather inside. */
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);
    MPI_Comm_dup(half, &dup);
    {
        int hr, hs, *all;
        MPI_Comm_rank(dup, &hr);
        MPI_Comm_size(dup, &hs);
        CHECK(hs == (size + 1 - rank % 2) / 2);
        all = malloc(sizeof(int) * hs);
        MPI_Allgather(&rank, 1, MPI_INT, all, 1, MPI_INT, dup);
        /* key -rank: ranks in decreasing order. */
        for (i = 0; i < hs; i++)
            CHECK(all[i] % 2 == rank % 2 && (i == 0 || all[i] < all[i - 1]));
        CHECK(all[hr] == rank);
        free(all);
    }
    MPI_Comm_free(&dup);
    MPI_Comm_free(&half);
    CHECK(half == MPI_COMM_NULL);
    MPI_Op_free(&mm);

    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        if (failures) {
            fprintf(stderr, "%d failures\n", failures);
            return 1;
        }
        printf("PASS coll %d\n", size);
    }
    MPI_Finalize();
    return 0;
}
