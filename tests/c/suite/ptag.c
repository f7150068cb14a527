/* ptag.c: protection tags: create/destroy, in use by VIs and regions,
 * tags of another NIC, the MaxPtags limit, and a send whose data lies in
 * a region of another tag (two processes, unreliable VIs). */
#include "common.h"

static VIP_MEM_HANDLE reg_with(VIP_NIC_HANDLE nic, void *p, size_t n, VIP_PROTECTION_HANDLE tag)
{
    VIP_MEM_ATTRIBUTES ma;
    VIP_MEM_HANDLE mh = 0;
    ma.Ptag = tag;
    ma.EnableRdmaWrite = VIP_FALSE;
    ma.EnableRdmaRead = VIP_FALSE;
    OK(VipRegisterMem(nic, p, n, &ma, &mh));
    return mh;
}

static void local_checks(void)
{
    VIP_NIC_HANDLE nic = open_nic(), other = open_nic();
    VIP_NIC_ATTRIBUTES na = nic_attrs(nic);
    VIP_PROTECTION_HANDLE tags[16], t, u, foreign = new_ptag(other), *many;
    VIP_VI_ATTRIBUTES va, qa;
    VIP_MEM_ATTRIBUTES ma;
    VIP_VI_HANDLE vi;
    VIP_VI_STATE st;
    VIP_BOOLEAN se, re;
    VIP_MEM_HANDLE mh;
    static char buf[8192];
    unsigned long i, n;

    /* Distinct tags; destroyed tags are stale. */
    for (i = 0; i < 16; i++) {
        unsigned long j;
        tags[i] = new_ptag(nic);
        for (j = 0; j < i; j++)
            CHECK(tags[i] != tags[j]);
    }
    for (i = 0; i < 16; i++)
        OK(VipDestroyPtag(nic, tags[i]));
    for (i = 0; i < 16; i++)
        EXPECT_RC(VipDestroyPtag(nic, tags[i]), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreatePtag(nic, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreatePtag(NULL, &t), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipDestroyPtag(nic, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipDestroyPtag(NULL, foreign), VIP_INVALID_PARAMETER);

    /* A tag used by a VI cannot be destroyed; the VI reports it back. */
    t = new_ptag(nic);
    u = new_ptag(nic);
    va = vi_attrs(t, VIP_SERVICE_RELIABLE_DELIVERY, 32768, 0, 0);
    vi = new_vi(nic, va, NULL, NULL);
    OK(VipQueryVi(vi, &st, &qa, &se, &re));
    CHECK(qa.Ptag == t);
    EXPECT_RC(VipDestroyPtag(nic, t), VIP_INVALID_STATE);
    /* Moving the VI to another tag frees the first. */
    va.Ptag = u;
    OK(VipSetViAttributes(vi, &va));
    OK(VipQueryVi(vi, &st, &qa, &se, &re));
    CHECK(qa.Ptag == u);
    EXPECT_RC(VipDestroyPtag(nic, u), VIP_INVALID_STATE);
    OK(VipDestroyPtag(nic, t));
    OK(VipDestroyVi(vi));
    OK(VipDestroyPtag(nic, u));

    /* A tag used by a region; VipSetMemAttributes moves the use. */
    t = new_ptag(nic);
    u = new_ptag(nic);
    mh = reg_with(nic, buf, sizeof buf, t);
    OK(VipQueryMem(nic, buf, mh, &ma));
    CHECK(ma.Ptag == t);
    EXPECT_RC(VipDestroyPtag(nic, t), VIP_INVALID_STATE);
    ma.Ptag = u;
    OK(VipSetMemAttributes(nic, buf, mh, &ma));
    OK(VipQueryMem(nic, buf, mh, &ma));
    CHECK(ma.Ptag == u);
    OK(VipDestroyPtag(nic, t));
    EXPECT_RC(VipDestroyPtag(nic, u), VIP_INVALID_STATE);
    OK(VipDeregisterMem(nic, buf, mh));
    OK(VipDestroyPtag(nic, u));

    /* Tags that are not tags of this NIC. */
    t = new_ptag(nic);
    va = vi_attrs(foreign, VIP_SERVICE_RELIABLE_DELIVERY, 32768, 0, 0);
    EXPECT_RC(VipCreateVi(nic, &va, NULL, NULL, &vi), VIP_INVALID_PTAG);
    va.Ptag = NULL;
    EXPECT_RC(VipCreateVi(nic, &va, NULL, NULL, &vi), VIP_INVALID_PTAG);
    va.Ptag = nic; /* a handle of another kind */
    EXPECT_RC(VipCreateVi(nic, &va, NULL, NULL, &vi), VIP_INVALID_PTAG);
    va.Ptag = tags[3]; /* destroyed */
    EXPECT_RC(VipCreateVi(nic, &va, NULL, NULL, &vi), VIP_INVALID_PTAG);
    ma.Ptag = foreign;
    ma.EnableRdmaWrite = ma.EnableRdmaRead = VIP_FALSE;
    EXPECT_RC(VipRegisterMem(nic, buf, sizeof buf, &ma, &mh), VIP_INVALID_PTAG);
    ma.Ptag = NULL;
    EXPECT_RC(VipRegisterMem(nic, buf, sizeof buf, &ma, &mh), VIP_INVALID_PTAG);
    EXPECT_RC(VipDestroyPtag(nic, foreign), VIP_INVALID_PARAMETER);
    vi = new_vi(nic, vi_attrs(t, VIP_SERVICE_UNRELIABLE, 32768, 0, 0), NULL, NULL);
    va = vi_attrs(foreign, VIP_SERVICE_UNRELIABLE, 32768, 0, 0);
    EXPECT_RC(VipSetViAttributes(vi, &va), VIP_INVALID_PTAG);
    mh = reg_with(nic, buf, sizeof buf, t);
    ma.Ptag = foreign;
    EXPECT_RC(VipSetMemAttributes(nic, buf, mh, &ma), VIP_INVALID_PTAG);
    /* The other NIC's tag still works there. */
    OK(VipDestroyPtag(other, foreign));
    OK(VipDeregisterMem(nic, buf, mh));
    OK(VipDestroyVi(vi));
    OK(VipDestroyPtag(nic, t));

    /* MaxPtags tags, then VIP_ERROR_RESOURCE. */
    n = na.MaxPtags;
    CHECK(n <= 1000000);
    many = calloc(n, sizeof *many);
    CHECK(many != NULL);
    for (i = 0; i < n; i++) {
        VIP_RETURN r = VipCreatePtag(nic, &many[i]);
        CHECK_MSG(r == VIP_SUCCESS, "tag %lu of MaxPtags %lu: %s", i, n, vip_str(r));
    }
    t = NULL;
    EXPECT_RC(VipCreatePtag(nic, &t), VIP_ERROR_RESOURCE);
    CHECK(t == NULL);
    for (i = 0; i < n; i++)
        OK(VipDestroyPtag(nic, many[i]));
    free(many);
    OK(VipCloseNic(other));
    OK(VipCloseNic(nic));
}

/* The sender (parent): one send whose data is in a region of another tag
 * completes with VIP_STATUS_PROTECTION_ERROR and delivers nothing; the
 * next, good, one is received. */
static int parent(void)
{
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE tag, other;
    VIP_VI_HANDLE vi;
    region r, bad;
    VIP_DESCRIPTOR *d;

    local_checks();
    nic = open_nic();
    tag = new_ptag(nic);
    other = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    bad = region_new(nic, other, 4096, 0, 0);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 32768, 0, 0), NULL, NULL);
    connect_to(nic, vi, disc("conn"));
    barrier(1); /* the child's receive is posted */

    /* A descriptor in a region of another tag is refused at post time. */
    d = desc_at(&bad, 0);
    desc_simple(d, bad.base + 1024, bad.mh, 100);
    EXPECT_RC(VipPostSend(vi, d, bad.mh), VIP_DESCRIPTOR_ERROR);

    d = desc_at(&r, 0);
    fill(bad.base + 1024, 100, 1);
    desc_simple(d, bad.base + 1024, bad.mh, 100);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND | VIP_STATUS_PROTECTION_ERROR);
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);

    fill(r.base + 4096, 200, 2);
    desc_simple(d, r.base + 4096, r.mh, 200);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    barrier(2);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    region_free(&bad);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE tag, other;
    VIP_VI_HANDLE vi;
    region r, bad;
    VIP_DESCRIPTOR *d, *e;

    local_checks();
    nic = open_nic();
    tag = new_ptag(nic);
    other = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    bad = region_new(nic, other, 4096, 0, 0);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 32768, 0, 0), NULL, NULL);
    /* A receive whose buffer has another tag completes at once. */
    e = desc_at(&r, 128);
    desc_simple(e, bad.base, bad.mh, 4096);
    OK(VipPostRecv(vi, e, r.mh));
    recv_wait(vi, e);
    CHECK_STATUS(e, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_PROTECTION_ERROR);

    d = desc_at(&r, 0);
    desc_simple(d, r.base + 8192, r.mh, 8192);
    OK(VipPostRecv(vi, d, r.mh));
    accept_on(nic, vi, disc("conn"));
    barrier(1);
    recv_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
    CHECK_EQ(d->CS.Length, 200);
    CHECK(check_fill(r.base + 8192, 200, 2) == -1);
    barrier(2);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    region_free(&bad);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("ptag", 120, parent, child); }
