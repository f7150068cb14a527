/* peer.c: peer-to-peer connections: VipConnectPeerRequest /
 * VipConnectPeerDone / VipConnectPeerWait, pending state, timeouts,
 * reliability mismatch, state and argument errors. */
#include "common.h"

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;

static VIP_RETURN peer_request(VIP_VI_HANDLE vi, const char *mine, const char *theirs, unsigned long ms)
{
    VIP_NET_ADDRESS *l = make_addr(nic, mine), *r = remote_addr(nic, theirs);
    VIP_RETURN rc = VipConnectPeerRequest(vi, l, r, ms);
    free(l);
    free(r);
    return rc;
}

static void exchange(VIP_VI_HANDLE vi, int sender, uint32_t seed)
{
    region r = region_new(nic, tag, 8192, 0, 0);
    exchange_message(vi, desc_at(&r, 0), r.base + 4096, r.mh, 4096, sender, 3000, seed);
    region_free(&r);
}

static int parent(void)
{
    VIP_VI_ATTRIBUTES ra, keep, a;
    VIP_VI_HANDLE vi;
    VIP_NET_ADDRESS *addr;
    double t0, dt;
    int polls = 0;
    VIP_RETURN r;

    nic = open_nic();
    tag = new_ptag(nic);
    a = vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 16384, 1, 1);
    vi = new_vi(nic, a, NULL, NULL);

    /* 1. We ask first: pending (NOT_DONE) until the child asks. */
    OK(peer_request(vi, disc("p"), disc("c"), WAIT_MS));
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECT_PENDING);
    memset(&keep, 0x5a, sizeof keep);
    ra = keep;
    EXPECT_RC(VipConnectPeerDone(vi, &ra), VIP_NOT_DONE);
    CHECK(memcmp(&ra, &keep, sizeof ra) == 0);
    EXPECT_RC(VipConnectPeerDone(vi, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(peer_request(vi, disc("p"), disc("c"), WAIT_MS), VIP_INVALID_STATE);
    barrier(1);
    t0 = now_ms();
    while ((r = VipConnectPeerDone(vi, &ra)) == VIP_NOT_DONE) {
        CHECK_MSG(now_ms() - t0 < WAIT_MS, "VipConnectPeerDone still NOT_DONE after %lu ms", WAIT_MS);
        polls++;
    }
    CHECK_MSG(r == VIP_SUCCESS, "VipConnectPeerDone returned %s", vip_str(r));
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    CHECK_EQ(ra.ReliabilityLevel, VIP_SERVICE_RELIABLE_RECEPTION);
    CHECK_EQ(ra.MaxTransferSize, 8192);
    CHECK_EQ(ra.EnableRdmaWrite, VIP_FALSE);
    CHECK_EQ(ra.EnableRdmaRead, VIP_TRUE);
    CHECK(ra.Ptag == NULL);
    /* Nothing pending any more. */
    EXPECT_RC(VipConnectPeerDone(vi, &ra), VIP_INVALID_STATE);
    EXPECT_RC(VipConnectPeerWait(vi, &ra), VIP_INVALID_STATE);
    EXPECT_RC(peer_request(vi, disc("p"), disc("c"), WAIT_MS), VIP_INVALID_STATE);
    exchange(vi, 1, 1);
    exchange(vi, 0, 2);
    barrier(2);
    OK(VipDisconnect(vi));

    /* 2. The child asks first and waits; we use VipConnectPeerWait. */
    barrier(3);
    OK(peer_request(vi, disc("p2"), disc("c2"), WAIT_MS));
    OK(VipConnectPeerWait(vi, &ra));
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    exchange(vi, 0, 3);
    barrier(4);
    OK(VipDisconnect(vi));

    /* 3. Nobody answers: VIP_TIMEOUT after the request's timeout, idle again. */
    OK(peer_request(vi, disc("p3"), disc("nobody"), 300));
    t0 = now_ms();
    EXPECT_RC(VipConnectPeerWait(vi, &ra), VIP_TIMEOUT);
    dt = now_ms() - t0;
    CHECK_MSG(dt >= 200 && dt < BOUND_MS, "VipConnectPeerWait (300 ms request) took %.0f ms", dt);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    OK(peer_request(vi, disc("p4"), disc("nobody"), 200));
    t0 = now_ms();
    while ((r = VipConnectPeerDone(vi, &ra)) == VIP_NOT_DONE)
        CHECK(now_ms() - t0 < BOUND_MS);
    EXPECT_RC(r, VIP_TIMEOUT);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);

    /* 4. Reliability mismatch. */
    barrier(5);
    OK(peer_request(vi, disc("p5"), disc("c5"), WAIT_MS));
    EXPECT_RC(VipConnectPeerWait(vi, &ra), VIP_INVALID_RELIABILITY_LEVEL);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    barrier(6);

    /* 5. Bad arguments. */
    addr = make_addr(nic, disc("bad"));
    EXPECT_RC(VipConnectPeerRequest(NULL, addr, addr, 10), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectPeerRequest(vi, NULL, addr, 10), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectPeerRequest(vi, addr, NULL, 10), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectPeerDone(NULL, &ra), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectPeerWait(NULL, &ra), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectPeerWait((VIP_VI_HANDLE)nic, &ra), VIP_INVALID_PARAMETER);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    free(addr);
    (void)polls;

    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_VI_ATTRIBUTES ra;
    VIP_VI_HANDLE vi;

    nic = open_nic();
    tag = new_ptag(nic);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 8192, 0, 1), NULL, NULL);

    /* 1. */
    barrier(1);
    OK(peer_request(vi, disc("c"), disc("p"), WAIT_MS));
    OK(VipConnectPeerWait(vi, &ra));
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    CHECK_EQ(ra.ReliabilityLevel, VIP_SERVICE_RELIABLE_RECEPTION);
    CHECK_EQ(ra.MaxTransferSize, 16384);
    CHECK_EQ(ra.EnableRdmaWrite, VIP_TRUE);
    CHECK_EQ(ra.EnableRdmaRead, VIP_TRUE);
    exchange(vi, 0, 1);
    exchange(vi, 1, 2);
    barrier(2);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));

    /* 2. */
    OK(peer_request(vi, disc("c2"), disc("p2"), WAIT_MS));
    barrier(3);
    OK(VipConnectPeerWait(vi, &ra));
    exchange(vi, 1, 3);
    barrier(4);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));

    /* 4. */
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 8192, 0, 0), NULL, NULL);
    OK(peer_request(vi, disc("c5"), disc("p5"), WAIT_MS));
    barrier(5);
    EXPECT_RC(VipConnectPeerWait(vi, &ra), VIP_INVALID_RELIABILITY_LEVEL);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    barrier(6);
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("peer", 120, parent, child); }
