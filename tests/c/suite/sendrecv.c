/* sendrecv.c: send/receive of every size 0..4096 and 2^k-1, 2^k, 2^k+1 up
 * to 1 MiB, echoed back, data checked both ways, on every reliability
 * level (the full sweep on reliable delivery); then a message longer than
 * the receive buffer (VIP_STATUS_LENGTH_ERROR). Also built with ASan. */
#include "common.h"

#define MAX (1UL << 20)

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static region r;
/* Layout of r: descriptors in the first page, then two MAX buffers. */
#define TX (4096UL)
#define RX (4096UL + MAX)

static unsigned long sizes[8192];
static unsigned n_sizes;

static void make_sizes(int full)
{
    unsigned long k, s;
    n_sizes = 0;
    if (full) {
        for (s = 0; s <= 4096; s++)
            sizes[n_sizes++] = s;
    } else {
        unsigned long small[] = {0, 1, 2, 3, 63, 64, 65, 100, 4095, 4096};
        for (s = 0; s < sizeof small / sizeof small[0]; s++)
            sizes[n_sizes++] = small[s];
    }
    for (k = 13; k <= 20; k++) {
        sizes[n_sizes++] = (1UL << k) - 1;
        sizes[n_sizes++] = 1UL << k;
        if ((1UL << k) + 1 <= MAX)
            sizes[n_sizes++] = (1UL << k) + 1;
    }
    sizes[n_sizes++] = 1000003;
    sizes[n_sizes++] = 12345;
}

static VIP_DESCRIPTOR *rdesc(unsigned i) { return desc_at(&r, 64 * (size_t)(2 + i % 2)); }
static VIP_DESCRIPTOR *sdesc(void) { return desc_at(&r, 0); }

static void post_recv(VIP_VI_HANDLE vi, unsigned i)
{
    VIP_DESCRIPTOR *d = rdesc(i);
    desc_simple(d, r.base + RX, r.mh, MAX);
    OK(VipPostRecv(vi, d, r.mh));
}

static void send_msg(VIP_VI_HANDLE vi, unsigned long n, uint32_t seed)
{
    VIP_DESCRIPTOR *d = sdesc();
    fill(r.base + TX, n, seed);
    desc_simple(d, r.base + TX, r.mh, (uint32_t)n);
    if (n == 0)
        d->CS.SegCount = 0;
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
}

static void recv_msg(VIP_VI_HANDLE vi, unsigned i, unsigned long n, uint32_t seed)
{
    VIP_DESCRIPTOR *d = recv_wait(vi, rdesc(i));
    long bad;
    CHECK_MSG(d->CS.Status == (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE),
              "size %lu: receive status 0x%x", n, (unsigned)d->CS.Status);
    CHECK_MSG(d->CS.Length == n, "size %lu: received length %u", n, (unsigned)d->CS.Length);
    bad = check_fill(r.base + RX, n, seed);
    CHECK_MSG(bad == -1, "size %lu: byte %ld differs", n, bad);
}

static VIP_VI_HANDLE setup(VIP_RELIABILITY_LEVEL level, int server, const char *d)
{
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, level, MAX, 0, 0), NULL, NULL);
    post_recv(vi, 0);
    if (server)
        accept_on(nic, vi, d);
    else
        connect_to(nic, vi, d);
    return vi;
}

/* The parent sends message i; the child checks it, posts its next receive,
 * and echoes it; the parent checks the echo. */
static void sweep_parent(VIP_RELIABILITY_LEVEL level, const char *d, int full)
{
    VIP_VI_HANDLE vi = setup(level, 1, d);
    unsigned i;
    make_sizes(full);
    barrier(1);
    for (i = 0; i < n_sizes; i++) {
        send_msg(vi, sizes[i], i);
        recv_msg(vi, i, sizes[i], i + 1000000);
        post_recv(vi, i + 1);
    }
    barrier(2);
    OK(VipDisconnect(vi));
    recv_wait(vi, rdesc(n_sizes));
    OK(VipDestroyVi(vi));
}

static void sweep_child(VIP_RELIABILITY_LEVEL level, const char *d, int full)
{
    VIP_VI_HANDLE vi = setup(level, 0, d);
    unsigned i;
    make_sizes(full);
    barrier(1);
    for (i = 0; i < n_sizes; i++) {
        recv_msg(vi, i, sizes[i], i);
        post_recv(vi, i + 1);
        send_msg(vi, sizes[i], i + 1000000);
    }
    barrier(2);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    recv_wait(vi, rdesc(n_sizes));
    OK(VipDestroyVi(vi));
}

static void setup_common(void)
{
    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 4096 + 2 * MAX, 0, 0);
}

static int parent(void)
{
    VIP_VI_HANDLE vi;
    VIP_DESCRIPTOR *d;
    setup_common();
    sweep_parent(VIP_SERVICE_RELIABLE_DELIVERY, disc("rd"), 1);
    sweep_parent(VIP_SERVICE_RELIABLE_RECEPTION, disc("rr"), 0);
    sweep_parent(VIP_SERVICE_UNRELIABLE, disc("ur"), 0);

    /* Too long for the receive buffer: the receive completes with
     * LENGTH_ERROR and nothing beyond the buffer is written. */
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, MAX, 0, 0), NULL, NULL);
    accept_on(nic, vi, disc("len"));
    barrier(3);
    send_msg(vi, 5000, 77);
    barrier(4);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    (void)d;
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_VI_HANDLE vi;
    VIP_DESCRIPTOR *d;
    long bad;
    setup_common();
    sweep_child(VIP_SERVICE_RELIABLE_DELIVERY, disc("rd"), 1);
    sweep_child(VIP_SERVICE_RELIABLE_RECEPTION, disc("rr"), 0);
    sweep_child(VIP_SERVICE_UNRELIABLE, disc("ur"), 0);

    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, MAX, 0, 0), NULL, NULL);
    d = rdesc(0);
    memset(r.base + RX, 0xee, 8192);
    desc_simple(d, r.base + RX, r.mh, 4096);
    OK(VipPostRecv(vi, d, r.mh));
    connect_to(nic, vi, disc("len"));
    barrier(3);
    recv_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_LENGTH_ERROR);
    for (bad = 4096; bad < 8192; bad++)
        CHECK_MSG(r.base[RX + (unsigned long)bad] == 0xee, "byte %ld past the receive buffer was written", bad);
    barrier(4);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("sendrecv", 300, parent, child); }
