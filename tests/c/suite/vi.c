/* vi.c: VipCreateVi / VipQueryVi / VipSetViAttributes / VipDestroyVi,
 * attribute errors, and the state errors of a VI through its life:
 * idle, connect-pending, connected, error (two processes). */
#include "common.h"

static void query(VIP_VI_HANDLE vi, VIP_VI_STATE *st, VIP_VI_ATTRIBUTES *a, VIP_BOOLEAN *se, VIP_BOOLEAN *re)
{
    OK(VipQueryVi(vi, st, a, se, re));
}

static void same_attrs(const VIP_VI_ATTRIBUTES *a, const VIP_VI_ATTRIBUTES *b)
{
    CHECK_EQ(a->ReliabilityLevel, b->ReliabilityLevel);
    CHECK_EQ(a->MaxTransferSize, b->MaxTransferSize);
    CHECK(a->QoS == b->QoS);
    CHECK(a->Ptag == b->Ptag);
    CHECK_EQ(a->EnableRdmaWrite, b->EnableRdmaWrite);
    CHECK_EQ(a->EnableRdmaRead, b->EnableRdmaRead);
}

static void idle_checks(VIP_NIC_HANDLE nic, VIP_PROTECTION_HANDLE tag)
{
    VIP_NIC_ATTRIBUTES na = nic_attrs(nic);
    VIP_NIC_HANDLE other = open_nic();
    VIP_CQ_HANDLE ocq, cq, dead;
    VIP_VI_ATTRIBUTES a, q;
    VIP_VI_HANDLE vi, vis[64], keep;
    VIP_VI_STATE st;
    VIP_BOOLEAN se, re;
    VIP_RELIABILITY_LEVEL levels[3] = {VIP_SERVICE_UNRELIABLE, VIP_SERVICE_RELIABLE_DELIVERY,
                                       VIP_SERVICE_RELIABLE_RECEPTION};
    VIP_RELIABILITY_LEVEL bad_levels[5] = {0, 3, 6, 8, 0x80};
    region r = region_new(nic, tag, 8192, 0, 0);
    VIP_DESCRIPTOR *d;
    int i;

    /* Every level; attributes come back as given, queues empty. */
    for (i = 0; i < 3; i++) {
        a = vi_attrs(tag, levels[i], 8192 + (unsigned long)i, 1, levels[i] != VIP_SERVICE_UNRELIABLE);
        a.QoS = (VIP_QOS)(uintptr_t)(0x1000 + i);
        vi = new_vi(nic, a, NULL, NULL);
        memset(&q, 0, sizeof q);
        se = re = 7;
        query(vi, &st, &q, &se, &re);
        CHECK_EQ(st, VIP_STATE_IDLE);
        same_attrs(&q, &a);
        CHECK_EQ(se, VIP_TRUE);
        CHECK_EQ(re, VIP_TRUE);
        OK(VipDestroyVi(vi));
        EXPECT_RC(VipQueryVi(vi, &st, &q, &se, &re), VIP_INVALID_PARAMETER);
        EXPECT_RC(VipDestroyVi(vi), VIP_INVALID_PARAMETER);
    }

    /* Attribute errors at creation. */
    for (i = 0; i < 5; i++) {
        a = vi_attrs(tag, bad_levels[i], 8192, 0, 0);
        vi = NULL;
        EXPECT_RC(VipCreateVi(nic, &a, NULL, NULL, &vi), VIP_INVALID_RELIABILITY_LEVEL);
        CHECK(vi == NULL);
    }
    a = vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 0, 0, 0);
    EXPECT_RC(VipCreateVi(nic, &a, NULL, NULL, &vi), VIP_INVALID_MTU);
    a.MaxTransferSize = na.MaxTransferSize + 1;
    EXPECT_RC(VipCreateVi(nic, &a, NULL, NULL, &vi), VIP_INVALID_MTU);
    a.MaxTransferSize = (VIP_ULONG)-1;
    EXPECT_RC(VipCreateVi(nic, &a, NULL, NULL, &vi), VIP_INVALID_MTU);
    a.MaxTransferSize = na.MaxTransferSize;
    vi = new_vi(nic, a, NULL, NULL);
    OK(VipDestroyVi(vi));
    a = vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 8192, 0, 1);
    EXPECT_RC(VipCreateVi(nic, &a, NULL, NULL, &vi), VIP_INVALID_RDMAREAD);
    a = vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 8192, 1, 0);
    EXPECT_RC(VipCreateVi(nic, NULL, NULL, NULL, &vi), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreateVi(nic, &a, NULL, NULL, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreateVi(NULL, &a, NULL, NULL, &vi), VIP_INVALID_PARAMETER);

    /* CQ handles: another NIC's, destroyed, wrong kind. */
    OK(VipCreateCQ(other, 16, &ocq));
    OK(VipCreateCQ(nic, 16, &dead));
    OK(VipDestroyCQ(dead));
    EXPECT_RC(VipCreateVi(nic, &a, ocq, NULL, &vi), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreateVi(nic, &a, NULL, ocq, &vi), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreateVi(nic, &a, dead, NULL, &vi), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreateVi(nic, &a, NULL, (VIP_CQ_HANDLE)nic, &vi), VIP_INVALID_PARAMETER);
    OK(VipCreateCQ(nic, 16, &cq));
    vi = new_vi(nic, a, cq, cq);
    EXPECT_RC(VipDestroyCQ(cq), VIP_INVALID_STATE);
    OK(VipDestroyVi(vi));
    OK(VipDestroyCQ(cq));
    OK(VipDestroyCQ(ocq));

    /* Set attributes while idle. */
    a = vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 4096, 0, 0);
    vi = new_vi(nic, a, NULL, NULL);
    a = vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 65536, 1, 1);
    a.QoS = (VIP_QOS)(uintptr_t)0x77;
    OK(VipSetViAttributes(vi, &a));
    query(vi, &st, &q, &se, &re);
    same_attrs(&q, &a);
    q = a;
    q.ReliabilityLevel = 3;
    EXPECT_RC(VipSetViAttributes(vi, &q), VIP_INVALID_RELIABILITY_LEVEL);
    q = a;
    q.MaxTransferSize = 0;
    EXPECT_RC(VipSetViAttributes(vi, &q), VIP_INVALID_MTU);
    q = a;
    q.Ptag = NULL;
    EXPECT_RC(VipSetViAttributes(vi, &q), VIP_INVALID_PTAG);
    q = a;
    q.ReliabilityLevel = VIP_SERVICE_UNRELIABLE;
    EXPECT_RC(VipSetViAttributes(vi, &q), VIP_INVALID_RDMAREAD);
    EXPECT_RC(VipSetViAttributes(vi, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipSetViAttributes(NULL, &a), VIP_INVALID_PARAMETER);
    query(vi, &st, &q, &se, &re);
    same_attrs(&q, &a);

    /* State errors of an idle VI. */
    d = desc_at(&r, 0);
    desc_simple(d, r.base + 4096, r.mh, 100);
    EXPECT_RC(VipPostSend(vi, d, r.mh), VIP_INVALID_STATE);
    EXPECT_RC(VipDisconnect(vi), VIP_INVALID_STATE);
    EXPECT_RC(VipConnectPeerDone(vi, &q), VIP_INVALID_STATE);
    EXPECT_RC(VipConnectPeerWait(vi, &q), VIP_INVALID_STATE);
    /* A posted receive keeps the VI from being destroyed. */
    OK(VipPostRecv(vi, d, r.mh));
    query(vi, &st, &q, &se, &re);
    CHECK_EQ(se, VIP_TRUE);
    CHECK_EQ(re, VIP_FALSE);
    EXPECT_RC(VipDestroyVi(vi), VIP_INVALID_STATE);
    keep = vi;

    /* Many VIs at once, all distinct. */
    for (i = 0; i < 64; i++) {
        int j;
        vis[i] = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
        for (j = 0; j < i; j++)
            CHECK(vis[i] != vis[j]);
        CHECK(vis[i] != keep);
    }
    for (i = 0; i < 64; i++)
        OK(VipDestroyVi(vis[i]));
    query(keep, &st, &q, &se, &re);
    CHECK_EQ(re, VIP_FALSE);
    region_free(&r);
    OK(VipCloseNic(other));
}

/* The parent is the server. */
static int parent(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_ATTRIBUTES a, q;
    VIP_VI_HANDLE vi, pending;
    VIP_VI_STATE st;
    VIP_BOOLEAN se, re;
    VIP_NET_ADDRESS *me, *nobody;
    region r;
    VIP_DESCRIPTOR *d;

    idle_checks(nic, tag);
    r = region_new(nic, tag, 8192, 0, 0);

    /* CONNECT_PENDING: a peer request nobody answers. */
    pending = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    me = make_addr(nic, disc("pending-me"));
    nobody = make_addr(nic, disc("pending-nobody"));
    OK(VipConnectPeerRequest(pending, me, nobody, 500));
    query(pending, &st, &q, &se, &re);
    CHECK_EQ(st, VIP_STATE_CONNECT_PENDING);
    d = desc_at(&r, 0);
    desc_simple(d, r.base + 4096, r.mh, 10);
    EXPECT_RC(VipPostSend(pending, d, r.mh), VIP_INVALID_STATE);
    EXPECT_RC(VipDestroyVi(pending), VIP_INVALID_STATE);
    EXPECT_RC(VipSetViAttributes(pending, &q), VIP_INVALID_STATE);
    EXPECT_RC(VipDisconnect(pending), VIP_INVALID_STATE);
    EXPECT_RC(VipConnectPeerRequest(pending, me, nobody, 500), VIP_INVALID_STATE);
    EXPECT_RC(VipConnectPeerWait(pending, &q), VIP_TIMEOUT);
    CHECK_EQ(vi_state(pending), VIP_STATE_IDLE);
    OK(VipDestroyVi(pending));

    /* CONNECTED. */
    a = vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0);
    vi = new_vi(nic, a, NULL, NULL);
    accept_on(nic, vi, disc("conn"));
    barrier(10); /* the child's VipConnectRequest returned too */
    query(vi, &st, &q, &se, &re);
    CHECK_EQ(st, VIP_STATE_CONNECTED);
    same_attrs(&q, &a);
    EXPECT_RC(VipSetViAttributes(vi, &a), VIP_INVALID_STATE);
    EXPECT_RC(VipDestroyVi(vi), VIP_INVALID_STATE);
    EXPECT_RC(VipConnectRequest(vi, me, nobody, 100, &q), VIP_INVALID_STATE);
    EXPECT_RC(VipConnectPeerRequest(vi, me, nobody, 100), VIP_INVALID_STATE);
    /* A local disconnect: idle again, the posted receive flushed. */
    d = desc_at(&r, 64);
    desc_simple(d, r.base + 4096, r.mh, 100);
    OK(VipPostRecv(vi, d, r.mh));
    OK(VipDisconnect(vi));
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    EXPECT_RC(VipDestroyVi(vi), VIP_INVALID_STATE); /* the flushed descriptor is still queued */
    recv_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_DESC_FLUSHED_ERROR);
    EXPECT_RC(VipDisconnect(vi), VIP_INVALID_STATE);
    OK(VipDestroyVi(vi));
    EXPECT_RC(VipQueryVi(vi, &st, &q, &se, &re), VIP_INVALID_PARAMETER);
    barrier(1);

    /* ERROR: the peer disconnects. */
    vi = new_vi(nic, a, NULL, NULL);
    accept_on(nic, vi, disc("conn2"));
    barrier(20); /* checked CONNECTED before the peer may disconnect */
    barrier(2);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    EXPECT_RC(VipDestroyVi(vi), VIP_INVALID_STATE);
    EXPECT_RC(VipSetViAttributes(vi, &a), VIP_INVALID_STATE);
    desc_simple(d, r.base + 4096, r.mh, 10);
    OK(VipDisconnect(vi));
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    OK(VipSetViAttributes(vi, &a));
    OK(VipDestroyVi(vi));

    free(me);
    free(nobody);
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_ATTRIBUTES a = vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0);
    VIP_VI_HANDLE vi;

    idle_checks(nic, tag);
    vi = new_vi(nic, a, NULL, NULL);
    connect_to(nic, vi, disc("conn"));
    barrier(10);
    barrier(1);
    /* The parent disconnected: our VI is in the error state. */
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));

    vi = new_vi(nic, a, NULL, NULL);
    connect_to(nic, vi, disc("conn2"));
    barrier(20);
    OK(VipDisconnect(vi));
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    barrier(2);
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("vi", 120, parent, child); }
