/*
 * vipl_pingpong.c: an 8-byte VIPL ping-pong between two processes, with
 * the half round trip split into its steps.
 *
 * The parent (A, CPU 0) and a forked child (B, CPU 1) each open the
 * default NIC, create a reliable VI, register one buffer holding a send
 * and a receive descriptor, and connect peer-to-peer. Every round A posts
 * a receive, posts a send, and polls both queues; B polls its receive,
 * posts a receive, posts its answer and polls its send. Polling only: no
 * clock is read in the measured calls, only the time-stamp counter
 * between them.
 *
 * Time stamps go into a shared anonymous mapping, so the half round trip
 * splits into (mean over the rounds after the first tenth):
 *   send -> notice    A's VipPostSend starts .. B's VipRecvDone returns it
 *                     (the send up to its status store, the line's travel,
 *                     the poll that sees it);
 *   notice -> send    B's VipRecvDone returned .. B's VipPostSend starts
 *                     (the VipPostRecv in between);
 * and B's VipPostSend and VipSendDone are timed on their own (the part of
 * VipPostSend after the status store is off the critical path).
 *
 *   vipl_pingpong [rounds]      (default 200000)
 *
 * Prints one line of JSON. Built and run by `tools/ab.py cpingpong`.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vipl.h>

#include "bench.h"
#include <x86intrin.h>

static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s); /* best effort */
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* Stamps, one array of `rounds` each, in memory both processes share. */
enum { A_SEND, B_NOTICE, B_SEND, B_SEND_END, B_DONE_END, NSTAMPS };
static uint64_t *stamp[NSTAMPS];

struct side {
    VIP_VI_HANDLE vi;
    VIP_MEM_HANDLE mh;
    VIP_DESCRIPTOR *sd, *rd;
};

static void wait_done(VIP_VI_HANDLE vi, int recv)
{
    VIP_DESCRIPTOR *d;
    while ((recv ? VipRecvDone(vi, &d) : VipSendDone(vi, &d)) == VIP_NOT_DONE)
        ;
    if (d->CS.Status & VIP_STATUS_ERROR_MASK) {
        fprintf(stderr, "%s: status 0x%x\n", recv ? "receive" : "send",
                (unsigned)d->CS.Status);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 200000;
    if (rounds < 10)
        rounds = 10;
    char da[64], db[64];
    snprintf(da, sizeof da, "pingpong-a-%d", (int)getpid());
    snprintf(db, sizeof db, "pingpong-b-%d", (int)getpid());
    uint64_t *sh = mmap(NULL, NSTAMPS * rounds * sizeof(uint64_t),
                        PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        exit(1);
    for (int k = 0; k < NSTAMPS; k++)
        stamp[k] = sh + k * rounds;

    pid_t child = fork();
    if (child < 0)
        exit(1);
    int b = child == 0;
    pin(b);

    VIP_NIC_HANDLE nic;
    VIP_NIC_ATTRIBUTES na;
    VIP_VI_ATTRIBUTES at, ra;
    VIP_MEM_ATTRIBUTES mat;
    open_default(&nic, &na, &at, &mat);

    struct side s;
    unsigned char *buf;
    if (posix_memalign((void **)&buf, 4096, 8192))
        exit(1);
    memset(buf, 0, 8192);
    OK(VipCreateVi(nic, &at, NULL, NULL, &s.vi));
    OK(VipRegisterMem(nic, buf, 8192, &mat, &s.mh));
    /* Send descriptor, receive descriptor, then the data 4 KiB in. */
    s.sd = (VIP_DESCRIPTOR *)buf;
    s.rd = (VIP_DESCRIPTOR *)(buf + 256);
    s.sd->CS.SegCount = 1;
    s.sd->CS.Control = VIP_CONTROL_OP_SENDRECV;
    s.sd->CS.Length = 8;
    s.sd->DS[0].Local.Data.Address = buf + 4096;
    s.sd->DS[0].Local.Handle = s.mh;
    s.sd->DS[0].Local.Length = 8;
    s.rd->CS.SegCount = 1;
    s.rd->CS.Control = VIP_CONTROL_OP_SENDRECV;
    s.rd->CS.Length = 64;
    s.rd->DS[0].Local.Data.Address = buf + 4096 + 64;
    s.rd->DS[0].Local.Handle = s.mh;
    s.rd->DS[0].Local.Length = 64;

    /* B's first receive is posted before the connection exists, so A's
     * first send finds it. */
    if (b)
        OK(VipPostRecv(s.vi, s.rd, s.mh));
    OK(VipConnectPeerRequest(s.vi, addr(&na, b ? db : da), addr(&na, b ? da : db),
                             10000));
    OK(VipConnectPeerWait(s.vi, &ra));

    if (b) {
        for (long i = 0; i < rounds; i++) {
            wait_done(s.vi, 1);
            stamp[B_NOTICE][i] = __rdtsc();
            OK(VipPostRecv(s.vi, s.rd, s.mh));
            stamp[B_SEND][i] = __rdtsc();
            OK(VipPostSend(s.vi, s.sd, s.mh));
            stamp[B_SEND_END][i] = __rdtsc();
            wait_done(s.vi, 0);
            stamp[B_DONE_END][i] = __rdtsc();
        }
        OK(VipDisconnect(s.vi));
        return 0;
    }

    long first = rounds / 10;
    double t0 = 0, c0 = 0;
    for (long i = 0; i < rounds; i++) {
        if (i == first) {
            t0 = now_ns();
            c0 = (double)__rdtsc();
        }
        OK(VipPostRecv(s.vi, s.rd, s.mh));
        stamp[A_SEND][i] = __rdtsc();
        OK(VipPostSend(s.vi, s.sd, s.mh));
        wait_done(s.vi, 0);
        wait_done(s.vi, 1);
    }
    double ns = now_ns() - t0, cycles = (double)__rdtsc() - c0;
    OK(VipDisconnect(s.vi));
    int st;
    waitpid(child, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "responder failed\n");
        return 1;
    }
    double per_ns = cycles / ns; /* time-stamp counter ticks per ns */
    double sn = 0, ns2 = 0, ps = 0, sd = 0;
    long n = 0;
    for (long i = first; i < rounds; i++, n++) {
        sn += (double)(stamp[B_NOTICE][i] - stamp[A_SEND][i]);
        ns2 += (double)(stamp[B_SEND][i] - stamp[B_NOTICE][i]);
        ps += (double)(stamp[B_SEND_END][i] - stamp[B_SEND][i]);
        sd += (double)(stamp[B_DONE_END][i] - stamp[B_SEND_END][i]);
    }
    printf("{\"rounds\": %ld, \"half_rtt_ns\": %.1f, \"send_to_notice_ns\": %.1f, "
           "\"notice_to_send_ns\": %.1f, \"post_send_ns\": %.1f, \"send_done_ns\": %.1f}\n",
           rounds - first, ns / (rounds - first) / 2, sn / per_ns / n, ns2 / per_ns / n,
           ps / per_ns / n, sd / per_ns / n);
    return 0;
}
