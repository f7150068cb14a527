/* gather.c: gather on send and scatter on receive with several segments
 * on both sides (up to MaxSegmentsPerDesc, zero-length segments, segments
 * in different regions), checked byte by byte; SegCount above the limit;
 * a scatter list too short for the message. */
#include "common.h"

#define MSG 50000

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static region dr, a, b; /* descriptors; two data regions */
static unsigned long max_segs;

/* Splits `total` bytes into `n` segment lengths (some zero when n > 2). */
static void split(unsigned long total, unsigned n, uint32_t *len, uint32_t seed)
{
    unsigned i;
    unsigned long left = total;
    for (i = 0; i < n; i++) {
        unsigned long l;
        if (i == n - 1)
            l = left;
        else if (n > 2 && (i + seed) % 5 == 3)
            l = 0;
        else
            l = left / (n - i) + ((i * 7919 + seed) % 97);
        if (l > left)
            l = left;
        len[i] = (uint32_t)l;
        left -= l;
    }
}

/* Segment i lives in region a or b (alternating), at a scattered offset. */
static unsigned char *seg_addr(unsigned i, VIP_MEM_HANDLE *h)
{
    region *r = (i % 2) ? &b : &a;
    *h = r->mh;
    return r->base + 1 + (size_t)(i / 2) * (MSG + 100) + (i % 3) * 13;
}

static VIP_DESCRIPTOR *build(size_t off, unsigned n, unsigned long total, uint32_t seed)
{
    VIP_DESCRIPTOR *d = desc_at(&dr, off);
    uint32_t len[64];
    unsigned i;
    split(total, n, len, seed);
    desc_init(d, VIP_CONTROL_OP_SENDRECV, n);
    for (i = 0; i < n; i++) {
        VIP_MEM_HANDLE h;
        unsigned char *p = seg_addr(i, &h);
        desc_local(d, i, p, h, len[i]);
    }
    d->CS.Length = (uint32_t)total;
    return d;
}

/* Writes (sender) or checks (receiver) the message through the segments of d. */
static void through(VIP_DESCRIPTOR *d, int write, uint32_t seed, unsigned long total)
{
    unsigned char *whole = malloc(total + 1);
    unsigned long at = 0;
    unsigned i;
    long bad;
    CHECK(whole != NULL);
    if (write)
        fill(whole, total, seed);
    for (i = 0; i < d->CS.SegCount && at < total; i++) {
        unsigned char *p = d->DS[i].Local.Data.Address;
        unsigned long l = d->DS[i].Local.Length;
        if (l > total - at)
            l = total - at;
        if (write)
            memcpy(p, whole + at, l);
        else
            memcpy(whole + at, p, l);
        at += l;
    }
    CHECK_EQ(at, total);
    if (!write) {
        bad = check_fill(whole, total, seed);
        CHECK_MSG(bad == -1, "scattered message: byte %ld differs", bad);
    }
    free(whole);
}

static void setup(void)
{
    nic = open_nic();
    tag = new_ptag(nic);
    max_segs = nic_attrs(nic).MaxSegmentsPerDesc;
    CHECK(max_segs >= 2 && max_segs <= 64);
    dr = region_new(nic, tag, 64 * 4096, 0, 0);
    a = region_new(nic, tag, (MSG + 100) * 33, 0, 0);
    b = region_new(nic, tag, (MSG + 100) * 33, 0, 0);
}

static void teardown(void)
{
    region_free(&dr);
    region_free(&a);
    region_free(&b);
    OK(VipCloseNic(nic));
}

/* Segment counts tried: sender's and receiver's. */
static unsigned pairs[][2] = {{1, 1}, {2, 1}, {1, 2}, {3, 5}, {5, 3}, {0, 0}, {0, 0}, {7, 2}, {4, 4}};

static int parent(void)
{
    VIP_VI_HANDLE vi;
    VIP_DESCRIPTOR *d;
    unsigned i, n;

    setup();
    pairs[5][0] = pairs[5][1] = (unsigned)max_segs;
    pairs[6][0] = (unsigned)max_segs;
    pairs[6][1] = 1;
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 1 << 20, 0, 0), NULL, NULL);

    /* SegCount above the limit is refused at post time (receive: any state). */
    d = build(0, 2, 100, 1);
    d->CS.SegCount = (VIP_UINT16)(max_segs + 1);
    EXPECT_RC(VipPostRecv(vi, d, dr.mh), VIP_DESCRIPTOR_ERROR);
    d->CS.SegCount = 0xffff;
    EXPECT_RC(VipPostRecv(vi, d, dr.mh), VIP_DESCRIPTOR_ERROR);

    accept_on(nic, vi, disc("g"));
    n = sizeof pairs / sizeof pairs[0];
    for (i = 0; i < n; i++) {
        unsigned long total = MSG - i * 1000;
        barrier(10 + (int)i); /* the child posted its scatter list */
        d = build(0, pairs[i][0], total, i);
        through(d, 1, 500 + i, total);
        OK(VipPostSend(vi, d, dr.mh));
        send_wait(vi, d);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    }
    /* The same limit on the send side, connected. */
    d = build(0, 2, 100, 1);
    d->CS.SegCount = (VIP_UINT16)(max_segs + 1);
    EXPECT_RC(VipPostSend(vi, d, dr.mh), VIP_DESCRIPTOR_ERROR);
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);

    /* Longer than the scatter list. */
    barrier(50);
    d = build(0, 3, 3000, 9);
    through(d, 1, 900, 3000);
    OK(VipPostSend(vi, d, dr.mh));
    send_wait(vi, d);
    barrier(51);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    teardown();
    return 0;
}

static int child(void)
{
    VIP_VI_HANDLE vi;
    VIP_DESCRIPTOR *d;
    unsigned i, n;

    setup();
    pairs[5][0] = pairs[5][1] = (unsigned)max_segs;
    pairs[6][0] = (unsigned)max_segs;
    pairs[6][1] = 1;
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 1 << 20, 0, 0), NULL, NULL);
    connect_to(nic, vi, disc("g"));
    n = sizeof pairs / sizeof pairs[0];
    for (i = 0; i < n; i++) {
        unsigned long total = MSG - i * 1000;
        /* Room for the message plus some slack in the last segment. */
        d = build(4096, pairs[i][1], total + 50, i + 100);
        memset(a.base, 0, a.len);
        memset(b.base, 0, b.len);
        OK(VipPostRecv(vi, d, dr.mh));
        barrier(10 + (int)i);
        recv_wait(vi, d);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
        CHECK_EQ(d->CS.Length, total);
        through(d, 0, 500 + i, total);
    }

    /* A scatter list of 1000 bytes for a 3000-byte message. */
    d = build(4096, 4, 1000, 3);
    OK(VipPostRecv(vi, d, dr.mh));
    barrier(50);
    recv_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_LENGTH_ERROR);
    barrier(51);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    teardown();
    return 0;
}

int main(void) { return run_pair("gather", 120, parent, child); }
