/*
 * vipl_reghit.c: VipRegisterMem and VipDeregisterMem of buffers registered
 * before, as a message layer that registers around every message does.
 *
 * One process, one NIC; `n` rounds over `b` buffers of `len` bytes each:
 * register all of them, then deregister all of them (times apart), after
 * 100 warm-up rounds. The first round moves the pages; every later
 * registration is a hit (a parked registration or the pin-down cache).
 * Each timed interval contains one clock read, whose cost (measured first,
 * 30-50 ns in a VM) is subtracted: with one buffer it would otherwise be a
 * third of the figure. The whole loop without clock reads is reported too.
 *
 *   vipl_reghit [rounds] [bytes] [buffers] [rdma]   (default 20000 65536 32 0)
 *
 * `rdma` 1 registers with RDMA write and read enabled (what a message layer
 * with a rendezvous protocol asks for).
 *
 * Built and run by tools/reghit.sh against include/vipl.h and libvipl.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <vipl.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000;
    size_t len = argc > 2 ? (size_t)atol(argv[2]) : 65536;
    int b = argc > 3 ? atoi(argv[3]) : 32, i;
    long r;
    double reg = 0, dereg = 0;
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE tag;
    VIP_MEM_ATTRIBUTES a;
    VIP_MEM_HANDLE *h = calloc((size_t)b, sizeof *h);
    unsigned char *buf;

    if (n < 1 || len < 1 || b < 1 || !h || posix_memalign((void **)&buf, 4096, len * (size_t)b))
        return 2;
    for (i = 0; (size_t)i < len * (size_t)b; i++)
        buf[i] = (unsigned char)i;
    if (VipOpenNic(NULL, &nic) != VIP_SUCCESS || VipCreatePtag(nic, &tag) != VIP_SUCCESS)
        return 1;
    /* The cost of one clock read, as it lands inside each interval. */
    double clk = now(), c0 = clk;
    for (i = 0; i < 100000; i++)
        clk = now();
    clk = (clk - c0) / 100000;
    a.Ptag = tag;
    a.EnableRdmaWrite = argc > 4 && atoi(argv[4]) ? VIP_TRUE : VIP_FALSE;
    a.EnableRdmaRead = a.EnableRdmaWrite;
    for (r = 0; r < n + 100; r++) {
        double t0 = now(), t1, t2;
        for (i = 0; i < b; i++)
            if (VipRegisterMem(nic, buf + (size_t)i * len, len, &a, &h[i]) != VIP_SUCCESS)
                return 1;
        t1 = now();
        for (i = 0; i < b; i++)
            if (VipDeregisterMem(nic, buf + (size_t)i * len, h[i]) != VIP_SUCCESS)
                return 1;
        t2 = now();
        if (r >= 100) {
            reg += t1 - t0;
            dereg += t2 - t1;
        }
    }
    /* The same rounds without clock reads: register + deregister. */
    double p0 = now();
    for (r = 0; r < n; r++) {
        for (i = 0; i < b; i++)
            if (VipRegisterMem(nic, buf + (size_t)i * len, len, &a, &h[i]) != VIP_SUCCESS)
                return 1;
        for (i = 0; i < b; i++)
            if (VipDeregisterMem(nic, buf + (size_t)i * len, h[i]) != VIP_SUCCESS)
                return 1;
    }
    double pair = (now() - p0) * 1e9 / (double)n / b;
    printf("VipRegisterMem (hit) %.1f ns, VipDeregisterMem %.1f ns (%d buffers of %zu bytes; "
           "clock read %.1f ns subtracted; both, untimed loop: %.1f ns)\n",
           (reg / (double)n - clk) * 1e9 / b, (dereg / (double)n - clk) * 1e9 / b, b, len,
           clk * 1e9, pair);
    return VipCloseNic(nic) == VIP_SUCCESS ? 0 : 1;
}
