/* immediate.c: immediate data with and without payload: the receive
 * completes with VIP_STATUS_IMMEDIATE and the sender's ImmediateData;
 * sends without VIP_CONTROL_IMMEDIATE do not set the bit. */
#include "common.h"

#define COUNT 40

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static region r;

static unsigned long size_of(unsigned i) { return (i % 4 == 0) ? 0 : (unsigned long)i * 37; }
static int has_imm(unsigned i) { return i % 3 != 2; }
static uint32_t imm_of(unsigned i) { return 0xdead0000u + i * 0x101u; }

static int parent(void)
{
    VIP_VI_HANDLE vi;
    VIP_DESCRIPTOR *d = NULL;
    unsigned i;

    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 65536, 0, 0), NULL, NULL);
    connect_to(nic, vi, disc("imm"));
    barrier(1);
    for (i = 0; i < COUNT; i++) {
        unsigned long n = size_of(i);
        d = desc_at(&r, 64 * (size_t)(i % 8));
        fill(r.base + 4096, n, i);
        desc_simple(d, r.base + 4096, r.mh, (uint32_t)n);
        if (n == 0)
            d->CS.SegCount = 0;
        if (has_imm(i)) {
            d->CS.Control |= VIP_CONTROL_IMMEDIATE;
            d->CS.ImmediateData = imm_of(i);
        } else {
            d->CS.ImmediateData = 0x5555aaaa;
        }
        OK(VipPostSend(vi, d, r.mh));
        send_wait(vi, d);
        CHECK_EQ(d->CS.Status & ~(unsigned)VIP_STATUS_IMMEDIATE, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    }
    barrier(2);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_VI_HANDLE vi;
    unsigned i;

    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 64 * COUNT + COUNT * 2048, 0, 0);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 65536, 0, 0), NULL, NULL);
    /* All receives before the first send; each its own buffer. */
    for (i = 0; i < COUNT; i++) {
        VIP_DESCRIPTOR *d = desc_at(&r, 64 * (size_t)i);
        desc_simple(d, r.base + 64 * COUNT + (size_t)i * 2048, r.mh, 2048);
        d->CS.ImmediateData = 0x12345678;
        OK(VipPostRecv(vi, d, r.mh));
    }
    accept_on(nic, vi, disc("imm"));
    barrier(1);
    for (i = 0; i < COUNT; i++) {
        VIP_DESCRIPTOR *d = recv_wait(vi, desc_at(&r, 64 * (size_t)i));
        unsigned long n = size_of(i);
        long bad;
        if (has_imm(i)) {
            CHECK_MSG(d->CS.Status == (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_IMMEDIATE),
                      "message %u: status 0x%x", i, (unsigned)d->CS.Status);
            CHECK_MSG(d->CS.ImmediateData == imm_of(i), "message %u: immediate 0x%x", i,
                      (unsigned)d->CS.ImmediateData);
        } else {
            CHECK_MSG(d->CS.Status == (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE),
                      "message %u: status 0x%x", i, (unsigned)d->CS.Status);
        }
        CHECK_EQ(d->CS.Length, n);
        bad = check_fill(r.base + 64 * COUNT + (size_t)i * 2048, n, i);
        CHECK_MSG(bad == -1, "message %u: byte %ld differs", i, bad);
    }
    barrier(2);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("immediate", 120, parent, child); }
