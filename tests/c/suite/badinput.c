/* badinput.c: bad input through the C interface: NULL, garbage,
 * wrong-kind, stale (destroyed, closed) and foreign (another NIC's)
 * handles for every function; NULL pointers; misaligned descriptors,
 * SegCount beyond the limit, descriptors outside or not in registered
 * memory, reserved control bits; output parameters untouched on failure.
 * The parent is connected to the child for the send-side checks. */
#include "common.h"

#define IP VIP_INVALID_PARAMETER

static void dummy_notify(VIP_PVOID c, VIP_NIC_HANDLE n, VIP_VI_HANDLE v, VIP_DESCRIPTOR *d)
{
    (void)c;
    (void)n;
    (void)v;
    (void)d;
}

static void dummy_cq(VIP_PVOID c, VIP_NIC_HANDLE n, VIP_VI_HANDLE v, VIP_BOOLEAN r)
{
    (void)c;
    (void)n;
    (void)v;
    (void)r;
}

static void dummy_error(VIP_PVOID c, VIP_ERROR_DESCRIPTOR *e)
{
    (void)c;
    (void)e;
}

/* Every NIC-handle function refuses `nic`. */
static void bad_nic(VIP_NIC_HANDLE nic, const char *what)
{
    VIP_NIC_ATTRIBUTES na;
    VIP_MEM_ATTRIBUTES ma;
    VIP_MEM_HANDLE mh = 77;
    VIP_PROTECTION_HANDLE p = (VIP_PROTECTION_HANDLE)&p;
    VIP_VI_ATTRIBUTES va;
    VIP_VI_HANDLE vi = (VIP_VI_HANDLE)&vi;
    VIP_CQ_HANDLE cq = (VIP_CQ_HANDLE)&cq;
    VIP_CONN_HANDLE conn = (VIP_CONN_HANDLE)&conn;
    VIP_NET_ADDRESS *addr = calloc(1, sizeof *addr + 128);
    VIP_AUTODISCOVERY_LIST l;
    VIP_ULONG len = 100;
    char name[100];
    static char buf[4096];

    CHECK(addr != NULL);
    memset(&na, 0, sizeof na);
    memset(&ma, 0, sizeof ma);
    memset(&va, 0, sizeof va);
    memset(&l, 0, sizeof l);
    addr->DiscriminatorLen = 4;
    memcpy(addr->HostAddress, "disc", 4);
#define NIC_IP(call) CHECK_MSG((call) == IP, "%s: %s did not return VIP_INVALID_PARAMETER", what, #call)
    NIC_IP(VipCloseNic(nic));
    NIC_IP(VipQueryNic(nic, &na));
    NIC_IP(VipRegisterMem(nic, buf, sizeof buf, &ma, &mh));
    NIC_IP(VipDeregisterMem(nic, buf, 1));
    NIC_IP(VipQueryMem(nic, buf, 1, &ma));
    NIC_IP(VipSetMemAttributes(nic, buf, 1, &ma));
    NIC_IP(VipErrorCallback(nic, NULL, dummy_error));
    NIC_IP(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, &l));
    NIC_IP(VipCreatePtag(nic, &p));
    NIC_IP(VipDestroyPtag(nic, p));
    NIC_IP(VipCreateVi(nic, &va, NULL, NULL, &vi));
    NIC_IP(VipCreateCQ(nic, 16, &cq));
    NIC_IP(VipConnectWait(nic, addr, 0, addr, &va, &conn));
    NIC_IP(VipNSInit(nic, NULL));
    NIC_IP(VipNSGetHostByName(nic, "localhost", addr, 0));
    NIC_IP(VipNSGetHostByAddr(nic, addr, name, &len));
    NIC_IP(VipNSShutdown(nic));
#undef NIC_IP
    CHECK(mh == 77 && p == (VIP_PROTECTION_HANDLE)&p && vi == (VIP_VI_HANDLE)&vi && cq == (VIP_CQ_HANDLE)&cq &&
          conn == (VIP_CONN_HANDLE)&conn && len == 100);
    free(addr);
}

/* Every VI-handle function refuses `vi`. */
static void bad_vi(VIP_VI_HANDLE vi, const char *what)
{
    VIP_VI_STATE st = (VIP_VI_STATE)77;
    VIP_VI_ATTRIBUTES va;
    VIP_BOOLEAN se = 77, re = 77;
    VIP_DESCRIPTOR *d = (VIP_DESCRIPTOR *)&d;
    VIP_NET_ADDRESS *addr = calloc(1, sizeof *addr + 128);
    static VIP_DESCRIPTOR desc;
    CHECK(addr != NULL);
    memset(&va, 0x5a, sizeof va);
#define VI_IP(call) CHECK_MSG((call) == IP, "%s: %s did not return VIP_INVALID_PARAMETER", what, #call)
    VI_IP(VipDestroyVi(vi));
    VI_IP(VipQueryVi(vi, &st, &va, &se, &re));
    VI_IP(VipSetViAttributes(vi, &va));
    VI_IP(VipPostSend(vi, &desc, 1));
    VI_IP(VipSendDone(vi, &d));
    VI_IP(VipSendWait(vi, 0, &d));
    VI_IP(VipSendNotify(vi, NULL, dummy_notify));
    VI_IP(VipPostRecv(vi, &desc, 1));
    VI_IP(VipRecvDone(vi, &d));
    VI_IP(VipRecvWait(vi, 0, &d));
    VI_IP(VipRecvNotify(vi, NULL, dummy_notify));
    VI_IP(VipConnectRequest(vi, addr, addr, 0, &va));
    VI_IP(VipDisconnect(vi));
    VI_IP(VipConnectPeerRequest(vi, addr, addr, 0));
    VI_IP(VipConnectPeerDone(vi, &va));
    VI_IP(VipConnectPeerWait(vi, &va));
#undef VI_IP
    CHECK(st == (VIP_VI_STATE)77 && se == 77 && re == 77 && d == (VIP_DESCRIPTOR *)&d);
    free(addr);
}

/* Every CQ-handle function refuses `cq`. */
static void bad_cq(VIP_CQ_HANDLE cq, const char *what)
{
    VIP_VI_HANDLE vi = (VIP_VI_HANDLE)&vi;
    VIP_BOOLEAN rq = 77;
#define CQ_IP(call) CHECK_MSG((call) == IP, "%s: %s did not return VIP_INVALID_PARAMETER", what, #call)
    CQ_IP(VipDestroyCQ(cq));
    CQ_IP(VipResizeCQ(cq, 32));
    CQ_IP(VipCQDone(cq, &vi, &rq));
    CQ_IP(VipCQWait(cq, 0, &vi, &rq));
    CQ_IP(VipCQNotify(cq, NULL, dummy_cq));
#undef CQ_IP
    CHECK(vi == (VIP_VI_HANDLE)&vi && rq == 77);
}

static void bad_conn(VIP_CONN_HANDLE conn, VIP_VI_HANDLE vi, const char *what)
{
    CHECK_MSG(VipConnectAccept(conn, vi) == IP, "%s: VipConnectAccept", what);
    CHECK_MSG(VipConnectReject(conn) == IP, "%s: VipConnectReject", what);
}

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;

static void handle_checks(void)
{
    VIP_NIC_HANDLE other = open_nic(), closed = open_nic();
    VIP_PROTECTION_HANDLE otag = new_ptag(other), ctag = new_ptag(closed);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    VIP_VI_HANDLE dead_vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    VIP_VI_HANDLE cvi = new_vi(closed, vi_attrs(ctag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    VIP_CQ_HANDLE cq, dead_cq, ccq, ocq;
    VIP_VI_ATTRIBUTES va;
    void *garbage[] = {(void *)1, (void *)0xdeadbeefUL, (void *)(uintptr_t)-1, (void *)(uintptr_t)0x1000000000000000ULL,
                       (void *)(uintptr_t)0x2fff00010000ffffULL};
    unsigned i;

    OK(VipCreateCQ(nic, 16, &cq));
    OK(VipCreateCQ(nic, 16, &dead_cq));
    OK(VipCreateCQ(closed, 16, &ccq));
    OK(VipCreateCQ(other, 16, &ocq));
    OK(VipDestroyVi(dead_vi));
    OK(VipDestroyCQ(dead_cq));
    OK(VipCloseNic(closed));

    /* NULL and garbage handles. */
    bad_nic(NULL, "NULL NIC");
    bad_vi(NULL, "NULL VI");
    bad_cq(NULL, "NULL CQ");
    bad_conn(NULL, vi, "NULL conn");
    for (i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        bad_nic(garbage[i], "garbage NIC");
        bad_vi(garbage[i], "garbage VI");
        bad_cq(garbage[i], "garbage CQ");
        bad_conn(garbage[i], vi, "garbage conn");
    }
    /* Handles of the wrong kind. */
    bad_nic(vi, "VI as NIC");
    bad_nic(cq, "CQ as NIC");
    bad_nic(tag, "ptag as NIC");
    bad_vi(nic, "NIC as VI");
    bad_vi(cq, "CQ as VI");
    bad_vi(tag, "ptag as VI");
    bad_cq(vi, "VI as CQ");
    bad_cq(nic, "NIC as CQ");
    bad_conn(vi, vi, "VI as conn");
    bad_conn(cq, vi, "CQ as conn");
    /* Stale: destroyed objects, a closed NIC and everything of it. */
    bad_vi(dead_vi, "destroyed VI");
    bad_cq(dead_cq, "destroyed CQ");
    bad_nic(closed, "closed NIC");
    bad_vi(cvi, "VI of a closed NIC");
    bad_cq(ccq, "CQ of a closed NIC");
    CHECK(VipDestroyPtag(nic, ctag) == IP);
    /* Foreign: objects of another NIC where this NIC's are required. */
    va = vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0);
    EXPECT_RC(VipCreateVi(nic, &va, ocq, NULL, &vi), IP);
    EXPECT_RC(VipCreateVi(nic, &va, NULL, ocq, &vi), IP);
    EXPECT_RC(VipDestroyPtag(nic, otag), IP);
    va.Ptag = otag;
    EXPECT_RC(VipCreateVi(nic, &va, NULL, NULL, &vi), VIP_INVALID_PTAG);
    va.Ptag = ctag;
    EXPECT_RC(VipCreateVi(nic, &va, NULL, NULL, &vi), VIP_INVALID_PTAG);
    /* The foreign objects still work on their own NIC. */
    OK(VipDestroyCQ(ocq));
    OK(VipDestroyPtag(other, otag));
    /* The live ones are unharmed. */
    OK(VipDestroyCQ(cq));
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(other));
}

/* Descriptors checked at post time; `vi` is connected. */
static void descriptor_checks(VIP_VI_HANDLE vi)
{
    VIP_NIC_HANDLE other = open_nic();
    VIP_PROTECTION_HANDLE otag = new_ptag(other);
    region r = region_new(nic, tag, 16384, 0, 0);
    region o = region_new(other, otag, 4096, 0, 0);
    unsigned long max_segs = nic_attrs(nic).MaxSegmentsPerDesc;
    static unsigned char unreg[8192];
    VIP_DESCRIPTOR *d = desc_at(&r, 0), *u;
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES va;
    VIP_BOOLEAN se, re;
    int send;

    for (send = 0; send < 2; send++) {
        VIP_RETURN (*post)(VIP_VI_HANDLE, VIP_DESCRIPTOR *, VIP_MEM_HANDLE) = send ? VipPostSend : VipPostRecv;
        const char *which = send ? "VipPostSend" : "VipPostRecv";
        size_t off;
#define POST_RC(desc, mh, want)                                                                  \
    do {                                                                                         \
        VIP_RETURN rc_ = post(vi, desc, mh);                                                     \
        CHECK_MSG(rc_ == (want), "%s(%s, %s) returned %s, expected %s", which, #desc, #mh, vip_str(rc_), \
                  vip_str(want));                                                                \
    } while (0)
        POST_RC(NULL, r.mh, IP);
        /* Misaligned, at every 8-byte step inside the first 64 bytes. */
        for (off = 8; off < 64; off += 8) {
            VIP_DESCRIPTOR *m = (VIP_DESCRIPTOR *)(void *)(r.base + 4096 + off);
            desc_simple(m, r.base + 8192, r.mh, 16);
            POST_RC(m, r.mh, VIP_DESCRIPTOR_ERROR);
        }
        /* SegCount beyond the limit. */
        desc_simple(d, r.base + 8192, r.mh, 16);
        d->CS.SegCount = (VIP_UINT16)(max_segs + 1);
        POST_RC(d, r.mh, VIP_DESCRIPTOR_ERROR);
        d->CS.SegCount = 0xffff;
        POST_RC(d, r.mh, VIP_DESCRIPTOR_ERROR);
        /* Reserved control bits and operation. */
        desc_simple(d, r.base + 8192, r.mh, 16);
        d->CS.Control = 0x10;
        POST_RC(d, r.mh, VIP_DESCRIPTOR_ERROR);
        d->CS.Control = VIP_CONTROL_OP_RESERVED;
        POST_RC(d, r.mh, VIP_DESCRIPTOR_ERROR);
        d->CS.Control = 0x8000 | VIP_CONTROL_OP_SENDRECV;
        POST_RC(d, r.mh, VIP_DESCRIPTOR_ERROR);
        /* Descriptor memory: not registered at all; registered but not
         * under this handle; straddling the end of its region; the
         * handle of another NIC; a bogus handle. */
        u = (VIP_DESCRIPTOR *)(void *)(((uintptr_t)unreg + 63) & ~(uintptr_t)63);
        desc_simple(u, r.base + 8192, r.mh, 16);
        POST_RC(u, 0x7777, IP);
        POST_RC(u, r.mh, VIP_DESCRIPTOR_ERROR);
        d = desc_at(&r, r.len - 64);
        desc_simple(d, r.base + 8192, r.mh, 16);
        d->CS.SegCount = 3; /* segments run past the region */
        POST_RC(d, r.mh, VIP_DESCRIPTOR_ERROR);
        d = desc_at(&r, 0);
        desc_simple(d, r.base + 8192, r.mh, 16);
        POST_RC(d, o.mh, IP);
        POST_RC((VIP_DESCRIPTOR *)(void *)o.base, o.mh, IP);
#undef POST_RC
    }
    /* Nothing was queued by the refused posts; the VI is still connected. */
    OK(VipQueryVi(vi, &st, &va, &se, &re));
    CHECK_EQ(st, VIP_STATE_CONNECTED);
    CHECK_EQ(se, VIP_TRUE);
    CHECK_EQ(re, VIP_TRUE);
    /* NULL output pointers. */
    EXPECT_RC(VipSendDone(vi, NULL), IP);
    EXPECT_RC(VipRecvDone(vi, NULL), IP);
    EXPECT_RC(VipSendWait(vi, 0, NULL), IP);
    EXPECT_RC(VipRecvWait(vi, 0, NULL), IP);
    EXPECT_RC(VipQueryVi(vi, NULL, &va, &se, &re), IP);
    EXPECT_RC(VipQueryVi(vi, &st, NULL, &se, &re), IP);
    EXPECT_RC(VipQueryVi(vi, &st, &va, NULL, &re), IP);
    EXPECT_RC(VipQueryVi(vi, &st, &va, &se, NULL), IP);
    /* A segment outside its region: the receive completes at once with
     * PROTECTION_ERROR (a NIC-found error, not a refused post). */
    desc_simple(d, r.base + 16000, r.mh, 1000);
    OK(VipPostRecv(vi, d, r.mh));
    recv_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_PROTECTION_ERROR);
    desc_simple(d, r.base + 100, o.mh, 10); /* another NIC's handle in a segment */
    OK(VipPostRecv(vi, d, r.mh));
    recv_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_PROTECTION_ERROR);
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    region_free(&r);
    region_free(&o);
    OK(VipCloseNic(other));
}

static int parent(void)
{
    VIP_VI_HANDLE vi;
    nic = open_nic();
    tag = new_ptag(nic);
    handle_checks();
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    accept_on(nic, vi, disc("b"));
    descriptor_checks(vi);
    barrier(1);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    /* Everything of the closed NIC is refused. */
    bad_nic(nic, "NIC closed at the end");
    bad_vi(vi, "destroyed VI at the end");
    return 0;
}

static int child(void)
{
    VIP_VI_HANDLE vi;
    nic = open_nic();
    tag = new_ptag(nic);
    handle_checks();
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    connect_to(nic, vi, disc("b"));
    barrier(1);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("badinput", 120, parent, child); }
