/* srq.c: shared receive queues, an extension of via-rs (not VIPL 1.0).
 * On a verbs device (SUITE_DEVICE=rxe0): two VIs of the parent, accepted
 * from two VIs of the child, take their receives from one SRQ; VipSrqWait
 * names the VI and the descriptor of each message, in the order posted,
 * with length and data; the refusals (bad handles, VipPostRecv on an
 * attached VI, VipDestroySrq while a VI is attached, a stale handle) are
 * clean statuses; destroying the SRQ flushes what is still posted. On a
 * kind of NIC without SRQs, VipCreateSrq is VIP_INVALID_PARAMETER. */
#include "common.h"

#define N 4
/* Which VI (0 or 1) of the child sends message i. */
static const int plan[N] = {0, 1, 1, 0};

static int verbs_device(void)
{
    const char *d = getenv("SUITE_DEVICE");
    return d != NULL && strncmp(d, "rxe", 3) == 0;
}

static VIP_DESCRIPTOR *rdesc(region *r, unsigned i) { return desc_at(r, 64 * (size_t)i); }
static unsigned char *rbuf(region *r, unsigned i) { return r->base + 4096 + 1024 * (size_t)i; }

static int parent(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    region r = region_new(nic, tag, 65536, 0, 0);
    VIP_SRQ_HANDLE srq = NULL, none = NULL;
    VIP_VI_HANDLE vi[2], who = NULL;
    VIP_DESCRIPTOR *d = NULL;
    VIP_RETURN rc = VipCreateSrq(nic, tag, 16, &srq);
    unsigned i;
    int k;
    if (!verbs_device()) {
        EXPECT_RC(rc, VIP_INVALID_PARAMETER);
        barrier(1);
        region_free(&r);
        OK(VipCloseNic(nic));
        return 0;
    }
    OK(rc);
    EXPECT_RC(VipCreateSrq(nic, tag, 0, &none), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreateSrq(nic, tag, 16, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreateSrq(NULL, tag, 16, &none), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipPostSrqRecv(NULL, rdesc(&r, 0), r.mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipPostSrqRecv(srq, NULL, r.mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipSrqDone(srq, NULL, &d), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipSrqDone(srq, &who, &d), VIP_NOT_DONE);
    EXPECT_RC(VipSrqWait(srq, 10, &who, &d), VIP_TIMEOUT);
    for (i = 0; i < N + 1; i++) {
        desc_simple(rdesc(&r, i), rbuf(&r, i), r.mh, 1024);
        OK(VipPostSrqRecv(srq, rdesc(&r, i), r.mh));
    }
    for (k = 0; k < 2; k++) {
        vi[k] = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 65536, 0, 0), NULL, NULL);
        OK(VipSetViSrq(vi[k], srq));
    }
    /* An attached VI has no receive queue of its own. */
    desc_simple(rdesc(&r, 20), rbuf(&r, 20), r.mh, 64);
    EXPECT_RC(VipPostRecv(vi[0], rdesc(&r, 20), r.mh), VIP_INVALID_STATE);
    accept_on(nic, vi[0], disc("srq-a"));
    accept_on(nic, vi[1], disc("srq-b"));
    EXPECT_RC(VipSetViSrq(vi[0], NULL), VIP_INVALID_STATE);
    barrier(1);
    for (i = 0; i < N; i++) {
        OK(VipSrqWait(srq, WAIT_MS, &who, &d));
        CHECK_MSG(who == vi[plan[i]], "message %u: received by the wrong VI", i);
        CHECK(d == rdesc(&r, i));
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
        CHECK_EQ(d->CS.Length, 100 + 10 * i);
        CHECK_EQ(check_fill(rbuf(&r, i), 100 + 10 * i, i), -1);
    }
    EXPECT_RC(VipSrqDone(srq, &who, &d), VIP_NOT_DONE);
    EXPECT_RC(VipDestroySrq(srq), VIP_INVALID_STATE);
    barrier(2);
    for (k = 0; k < 2; k++) {
        OK(VipDisconnect(vi[k]));
        OK(VipSetViSrq(vi[k], NULL));
    }
    OK(VipDestroySrq(srq));
    /* The receive still posted was flushed; the handle is stale now. */
    CHECK_STATUS(rdesc(&r, N), VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_DESC_FLUSHED_ERROR);
    EXPECT_RC(VipDestroySrq(srq), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipSrqDone(srq, &who, &d), VIP_INVALID_PARAMETER);
    for (k = 0; k < 2; k++)
        OK(VipDestroyVi(vi[k]));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE tag;
    region r;
    VIP_VI_HANDLE vi[2];
    unsigned i;
    int k;
    if (!verbs_device()) {
        barrier(1);
        return 0;
    }
    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    for (k = 0; k < 2; k++)
        vi[k] = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 65536, 0, 0), NULL, NULL);
    connect_to(nic, vi[0], disc("srq-a"));
    connect_to(nic, vi[1], disc("srq-b"));
    barrier(1);
    for (i = 0; i < N; i++) {
        VIP_DESCRIPTOR *d = desc_at(&r, 64 * (size_t)i);
        fill(rbuf(&r, i), 100 + 10 * i, i);
        desc_simple(d, rbuf(&r, i), r.mh, 100 + 10 * i);
        OK(VipPostSend(vi[plan[i]], d, r.mh));
        send_wait(vi[plan[i]], d);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    }
    barrier(2);
    for (k = 0; k < 2; k++) {
        CHECK(wait_state(vi[k], VIP_STATE_ERROR, BOUND_MS));
        OK(VipDisconnect(vi[k]));
        OK(VipDestroyVi(vi[k]));
    }
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void)
{
    return run_pair("srq", 120, parent, child);
}
