/* timeout.c: every wait honours its timeout: VipRecvWait, VipSendWait,
 * VipCQWait, VipConnectWait, VipConnectRequest, VipConnectPeerWait return
 * VIP_TIMEOUT no earlier than asked and within a bound; 0 returns at once;
 * the Done calls return VIP_NOT_DONE; VIP_INFINITE (and larger values)
 * waits until the completion arrives. Two VIs: `qvi` completes its
 * receives into a CQ (waited on with VipCQWait), `vi` has no CQ (waited
 * on with VipRecvWait). */
#include "common.h"

#include <limits.h>
#include <time.h>

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;

#define T 250UL

static void check_elapsed(double t0, unsigned long want, const char *what)
{
    double dt = now_ms() - t0;
    CHECK_MSG(dt >= (double)want - 5 && dt < (double)want + BOUND_MS, "%s(%lu ms) returned after %.1f ms", what,
              want, dt);
}

static int parent(void)
{
    region r;
    VIP_VI_HANDLE vi, qvi, pv, cvi;
    VIP_CQ_HANDLE cq;
    VIP_DESCRIPTOR *d = NULL, *rd, *qd, *keep = (VIP_DESCRIPTOR *)&keep;
    VIP_BOOLEAN rq;
    VIP_NET_ADDRESS *a, *b, *room;
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn;
    double t0;

    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    OK(VipCreateCQ(nic, 64, &cq));
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    qvi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, cq);
    rd = desc_at(&r, 0);
    desc_simple(rd, r.base + 4096, r.mh, 4096);
    OK(VipPostRecv(vi, rd, r.mh));
    qd = desc_at(&r, 128);
    desc_simple(qd, r.base + 12288, r.mh, 4096);
    OK(VipPostRecv(qvi, qd, r.mh));
    accept_on(nic, vi, disc("t"));
    accept_on(nic, qvi, disc("tq"));

    /* Nothing arrives. */
    d = keep;
    EXPECT_RC(VipRecvDone(vi, &d), VIP_NOT_DONE);
    EXPECT_RC(VipSendDone(vi, &d), VIP_NOT_DONE);
    t0 = now_ms();
    EXPECT_RC(VipRecvWait(vi, T, &d), VIP_TIMEOUT);
    check_elapsed(t0, T, "VipRecvWait");
    t0 = now_ms();
    EXPECT_RC(VipSendWait(vi, T, &d), VIP_TIMEOUT);
    check_elapsed(t0, T, "VipSendWait (empty queue)");
    t0 = now_ms();
    EXPECT_RC(VipRecvWait(vi, 0, &d), VIP_TIMEOUT);
    check_elapsed(t0, 0, "VipRecvWait");
    t0 = now_ms();
    EXPECT_RC(VipCQWait(cq, T, &cvi, &rq), VIP_TIMEOUT);
    check_elapsed(t0, T, "VipCQWait");
    t0 = now_ms();
    EXPECT_RC(VipCQWait(cq, 0, &cvi, &rq), VIP_TIMEOUT);
    check_elapsed(t0, 0, "VipCQWait");
    CHECK(d == keep);

    /* Connection waits. */
    a = make_addr(nic, disc("t-a"));
    b = make_addr(nic, disc("t-b"));
    room = addr_room(nic);
    t0 = now_ms();
    EXPECT_RC(VipConnectWait(nic, a, T, room, &ra, &conn), VIP_TIMEOUT);
    check_elapsed(t0, T, "VipConnectWait");
    t0 = now_ms();
    EXPECT_RC(VipConnectWait(nic, a, 0, room, &ra, &conn), VIP_TIMEOUT);
    check_elapsed(t0, 0, "VipConnectWait");
    pv = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    t0 = now_ms();
    /* Nobody listens on b: NO_MATCH, after the timeout. */
    EXPECT_RC(VipConnectRequest(pv, a, b, T, &ra), VIP_NO_MATCH);
    check_elapsed(t0, T, "VipConnectRequest");
    t0 = now_ms();
    OK(VipConnectPeerRequest(pv, a, b, T));
    EXPECT_RC(VipConnectPeerWait(pv, &ra), VIP_TIMEOUT);
    check_elapsed(t0, T, "VipConnectPeerRequest+Wait");
    OK(VipDestroyVi(pv));
    free(a);
    free(b);
    free(room);

    /* VIP_INFINITE: the child sends after a delay. */
    barrier(1);
    t0 = now_ms();
    OK(VipRecvWait(vi, VIP_INFINITE, &d));
    CHECK(d == rd);
    CHECK_MSG(now_ms() - t0 >= 250, "VipRecvWait(VIP_INFINITE) returned early");
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
    barrier(2);
    t0 = now_ms();
    OK(VipCQWait(cq, VIP_INFINITE, &cvi, &rq));
    CHECK_MSG(now_ms() - t0 >= 250, "VipCQWait(VIP_INFINITE) returned early");
    CHECK(cvi == qvi && rq == VIP_TRUE);
    OK(VipRecvDone(qvi, &d));
    CHECK(d == qd);
    /* A timeout above VIP_INFINITE waits forever too. */
    desc_simple(rd, r.base + 4096, r.mh, 4096);
    OK(VipPostRecv(vi, rd, r.mh));
    desc_simple(qd, r.base + 12288, r.mh, 4096);
    OK(VipPostRecv(qvi, qd, r.mh));
    barrier(3);
    OK(VipRecvWait(vi, ULONG_MAX, &d));
    CHECK(d == rd);
    OK(VipCQWait(cq, ULONG_MAX, &cvi, &rq));
    CHECK(cvi == qvi && rq == VIP_TRUE);
    OK(VipRecvDone(qvi, &d));
    CHECK(d == qd);
    /* A send completion with a wait. */
    d = desc_at(&r, 64);
    desc_simple(d, r.base + 8192, r.mh, 10);
    barrier(4);
    OK(VipPostSend(vi, d, r.mh));
    OK(VipSendWait(vi, VIP_INFINITE, &d));
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    barrier(5);

    OK(VipDisconnect(vi));
    OK(VipDisconnect(qvi));
    OK(VipDestroyVi(vi));
    OK(VipDestroyVi(qvi));
    OK(VipDestroyCQ(cq));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static void delayed_send(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *d, region *r)
{
    struct timespec delay = {0, 300000000};
    nanosleep(&delay, NULL); /* the point of the test: the parent waits meanwhile */
    desc_simple(d, r->base + 4096, r->mh, 100);
    OK(VipPostSend(vi, d, r->mh));
    send_wait(vi, d);
}

static int child(void)
{
    region r;
    VIP_VI_HANDLE vi, qvi;
    VIP_DESCRIPTOR *d;

    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    qvi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    connect_to(nic, vi, disc("t"));
    connect_to(nic, qvi, disc("tq"));
    d = desc_at(&r, 0);
    barrier(1);
    delayed_send(vi, d, &r);
    barrier(2);
    delayed_send(qvi, d, &r);
    barrier(3);
    delayed_send(vi, d, &r);
    delayed_send(qvi, d, &r);
    d = desc_at(&r, 64);
    desc_simple(d, r.base + 8192, r.mh, 100);
    OK(VipPostRecv(vi, d, r.mh));
    barrier(4);
    recv_wait(vi, d);
    barrier(5);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    CHECK(wait_state(qvi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDisconnect(qvi));
    OK(VipDestroyVi(vi));
    OK(VipDestroyVi(qvi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("timeout", 120, parent, child); }
