/*
 * vipl_count.c: the VIPL calls of one 8-byte round trip, counted.
 *
 * One process, one thread, two VIs of one NIC connected to each other
 * (peer-to-peer), a registered buffer each. Every round does what each
 * side of a ping-pong does once per round trip: VipPostRecv on the
 * receiver, VipPostSend on the sender (the engine runs the send in the
 * posting thread: the copy and both completions happen here), then
 * VipRecvDone and VipSendDone. Each call sits in its own non-inlined
 * function, so that `tools/count.sh` (callgrind) attributes instructions
 * to the call and, inside it, to the provider's source files. After the
 * rounds, as many polls of the two empty queues (`failed_poll`: what a
 * polling loop repeats until a completion comes).
 *
 * With "apart", the data lies in buffers registered apart from the
 * descriptors' (the layout of via-bench's ping-pong, and of programs that
 * register their data buffers on their own).
 *
 *   vipl_count [rounds] [apart]   (default 20000, after 2000 warm-up rounds)
 *
 * Built and run by tools/count.sh against include/vipl.h and libvipl.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <vipl.h>

#include "bench.h"

static void *alloc_aligned(size_t n)
{
    void *p;
    if (posix_memalign(&p, 4096, n))
        exit(1);
    memset(p, 0, n);
    return p;
}

static VIP_VI_HANDLE va, vb;
static VIP_DESCRIPTOR *sd, *rd;
static VIP_MEM_HANDLE ma, mb;

__attribute__((noinline)) void step_post_recv(void) { OK(VipPostRecv(vb, rd, mb)); }
__attribute__((noinline)) void step_post_send(void) { OK(VipPostSend(va, sd, ma)); }
__attribute__((noinline)) void step_recv_done(void)
{
    VIP_DESCRIPTOR *d;
    while (VipRecvDone(vb, &d) == VIP_NOT_DONE)
        ;
    if (d != rd || (d->CS.Status & VIP_STATUS_ERROR_MASK)) {
        fprintf(stderr, "receive: status 0x%x\n", (unsigned)d->CS.Status);
        exit(1);
    }
}
__attribute__((noinline)) void step_send_done(void)
{
    VIP_DESCRIPTOR *d;
    while (VipSendDone(va, &d) == VIP_NOT_DONE)
        ;
    if (d != sd || (d->CS.Status & VIP_STATUS_ERROR_MASK)) {
        fprintf(stderr, "send: status 0x%x\n", (unsigned)d->CS.Status);
        exit(1);
    }
}
__attribute__((noinline)) void round_trip(void)
{
    step_post_recv();
    step_post_send();
    step_recv_done();
    step_send_done();
}

/* A poll that finds nothing, on each queue: the period of a polling loop,
 * which bounds how late a completion is noticed. */
__attribute__((noinline)) void failed_poll(void)
{
    VIP_DESCRIPTOR *d;
    if (VipRecvDone(vb, &d) != VIP_NOT_DONE || VipSendDone(va, &d) != VIP_NOT_DONE) {
        fprintf(stderr, "a poll of an empty queue did not answer VIP_NOT_DONE\n");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 20000;
    int apart = argc > 2 && strcmp(argv[2], "apart") == 0;
    VIP_NIC_HANDLE nic;
    VIP_NIC_ATTRIBUTES na;
    VIP_VI_ATTRIBUTES at;
    VIP_VI_ATTRIBUTES ra;
    VIP_MEM_ATTRIBUTES mat;
    char da[64], db[64];
    unsigned char *bufa = alloc_aligned(8192), *bufb = alloc_aligned(8192);

    open_default(&nic, &na, &at, &mat);
    OK(VipCreateVi(nic, &at, NULL, NULL, &va));
    OK(VipCreateVi(nic, &at, NULL, NULL, &vb));
    OK(VipRegisterMem(nic, bufa, 8192, &mat, &ma));
    OK(VipRegisterMem(nic, bufb, 8192, &mat, &mb));
    /* The data 4 KiB into each buffer, or at the start of its own. */
    unsigned char *data_a = bufa + 4096, *data_b = bufb + 4096;
    VIP_MEM_HANDLE mda = ma, mdb = mb;
    if (apart) {
        data_a = alloc_aligned(4096);
        data_b = alloc_aligned(4096);
        OK(VipRegisterMem(nic, data_a, 4096, &mat, &mda));
        OK(VipRegisterMem(nic, data_b, 4096, &mat, &mdb));
    }
    snprintf(da, sizeof da, "count-a-%d", (int)getpid());
    snprintf(db, sizeof db, "count-b-%d", (int)getpid());
    OK(VipConnectPeerRequest(va, addr(&na, da), addr(&na, db), 10000));
    OK(VipConnectPeerRequest(vb, addr(&na, db), addr(&na, da), 10000));
    OK(VipConnectPeerWait(va, &ra));
    OK(VipConnectPeerWait(vb, &ra));

    /* Descriptors at the start of each buffer. */
    sd = (VIP_DESCRIPTOR *)bufa;
    rd = (VIP_DESCRIPTOR *)bufb;
    sd->CS.SegCount = 1;
    sd->CS.Control = VIP_CONTROL_OP_SENDRECV;
    sd->CS.Length = 8;
    sd->DS[0].Local.Data.Address = data_a;
    sd->DS[0].Local.Handle = mda;
    sd->DS[0].Local.Length = 8;
    rd->CS.SegCount = 1;
    rd->CS.Control = VIP_CONTROL_OP_SENDRECV;
    rd->CS.Length = 64;
    rd->DS[0].Local.Data.Address = data_b;
    rd->DS[0].Local.Handle = mdb;
    rd->DS[0].Local.Length = 64;
    memcpy(data_a, "8 bytes!", 8);

    for (long i = 0; i < 2000; i++)
        round_trip();
    for (long i = 0; i < rounds; i++)
        round_trip();
    for (long i = 0; i < rounds; i++)
        failed_poll();
    if (memcmp(data_b, "8 bytes!", 8) != 0) {
        fprintf(stderr, "data did not arrive\n");
        return 1;
    }
    OK(VipDisconnect(va));
    OK(VipDisconnect(vb));
    printf("%ld rounds\n", rounds + 2000);
    return 0;
}
