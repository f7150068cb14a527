/* connect.c: client/server connections: accept (addresses and
 * attributes reported both ways), reject, timeouts, reliability
 * mismatch, MaxTransferSize negotiation, accept errors that keep the
 * request, several clients on one discriminator, bad arguments. */
#include "common.h"

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;

static VIP_CONN_HANDLE wait_request(const char *d, VIP_NET_ADDRESS *remote, VIP_VI_ATTRIBUTES *ra)
{
    VIP_NET_ADDRESS *local = make_addr(nic, d);
    VIP_CONN_HANDLE conn = NULL;
    OK(VipConnectWait(nic, local, WAIT_MS, remote, ra, &conn));
    CHECK(conn != NULL);
    free(local);
    return conn;
}

static VIP_RETURN request(VIP_VI_HANDLE vi, const char *mine, const char *d, unsigned long ms, VIP_VI_ATTRIBUTES *ra)
{
    VIP_NET_ADDRESS *local = make_addr(nic, mine), *remote = remote_addr(nic, d);
    VIP_RETURN r = VipConnectRequest(vi, local, remote, ms, ra);
    free(local);
    free(remote);
    return r;
}

static void exchange(VIP_VI_HANDLE vi, int sender, uint32_t seed)
{
    region r = region_new(nic, tag, 8192, 0, 0);
    exchange_message(vi, desc_at(&r, 0), r.base + 4096, r.mh, 4096, sender, 1000, seed);
    region_free(&r);
}

static void finish(VIP_VI_HANDLE vi)
{
    if (vi_state(vi) != VIP_STATE_IDLE)
        OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
}

/* The parent is the server. */
static int parent(void)
{
    VIP_NET_ADDRESS *remote, *local;
    VIP_VI_ATTRIBUTES ra, a, keep;
    VIP_NIC_ATTRIBUTES na;
    VIP_VI_HANDLE vi, vi2, busy;
    VIP_CONN_HANDLE conn, c2;
    VIP_NIC_HANDLE other;
    VIP_PROTECTION_HANDLE otag;
    const char *cd;
    char *longd;
    double t0, dt;
    region r;
    VIP_DESCRIPTOR *d;

    nic = open_nic();
    tag = new_ptag(nic);
    na = nic_attrs(nic);
    remote = addr_room(nic);

    /* 1. Accept: the request carries the client's address and attributes. */
    a = vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 65536, 1, 0);
    vi = new_vi(nic, a, NULL, NULL);
    memset(&ra, 0x5a, sizeof ra);
    conn = wait_request(disc("accept"), remote, &ra);
    cd = disc("accept-client");
    CHECK_EQ(remote->HostAddressLen, na.NicAddressLen);
    {
        /* The client's host: this one, or the other (SUITE_REMOTE_HOST). */
        VIP_NET_ADDRESS *client = remote_addr(nic, cd);
        CHECK(memcmp(remote->HostAddress, client->HostAddress, na.NicAddressLen) == 0);
        free(client);
    }
    CHECK_EQ(remote->DiscriminatorLen, strlen(cd));
    CHECK(memcmp(remote->HostAddress + remote->HostAddressLen, cd, strlen(cd)) == 0);
    CHECK_EQ(ra.ReliabilityLevel, VIP_SERVICE_RELIABLE_DELIVERY);
    CHECK_EQ(ra.MaxTransferSize, 32768);
    CHECK_EQ(ra.EnableRdmaWrite, VIP_FALSE);
    CHECK_EQ(ra.EnableRdmaRead, VIP_TRUE);
    CHECK(ra.Ptag == NULL);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    OK(VipConnectAccept(conn, vi));
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    EXPECT_RC(VipConnectAccept(conn, vi), VIP_INVALID_PARAMETER); /* used up */
    EXPECT_RC(VipConnectReject(conn), VIP_INVALID_PARAMETER);
    exchange(vi, 0, 1);
    exchange(vi, 1, 2);
    barrier(1);
    finish(vi);

    /* 2. Reject. */
    conn = wait_request(disc("reject"), remote, &ra);
    OK(VipConnectReject(conn));
    EXPECT_RC(VipConnectReject(conn), VIP_INVALID_PARAMETER);
    vi = new_vi(nic, a, NULL, NULL);
    EXPECT_RC(VipConnectAccept(conn, vi), VIP_INVALID_PARAMETER);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    barrier(2);

    /* 3. Timeouts: nobody requests. */
    local = make_addr(nic, disc("nobody-requests"));
    conn = (VIP_CONN_HANDLE)&conn;
    t0 = now_ms();
    EXPECT_RC(VipConnectWait(nic, local, 300, remote, &ra, &conn), VIP_TIMEOUT);
    dt = now_ms() - t0;
    CHECK_MSG(dt >= 290 && dt < BOUND_MS, "VipConnectWait(300 ms) took %.0f ms", dt);
    CHECK(conn == (VIP_CONN_HANDLE)&conn);
    free(local);
    barrier(3);

    /* 4. Reliability mismatch: refused on both sides. */
    vi2 = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 65536, 0, 0), NULL, NULL);
    conn = wait_request(disc("mismatch"), remote, &ra);
    CHECK_EQ(ra.ReliabilityLevel, VIP_SERVICE_RELIABLE_RECEPTION);
    EXPECT_RC(VipConnectAccept(conn, vi2), VIP_INVALID_RELIABILITY_LEVEL);
    CHECK_EQ(vi_state(vi2), VIP_STATE_IDLE);
    EXPECT_RC(VipConnectAccept(conn, vi), VIP_INVALID_PARAMETER); /* refused, so used up */
    barrier(4);
    OK(VipDestroyVi(vi2));

    /* 5. Accept errors that keep the request: a busy VI, another NIC's VI. */
    other = open_nic();
    otag = new_ptag(other);
    vi2 = new_vi(other, vi_attrs(otag, VIP_SERVICE_RELIABLE_DELIVERY, 65536, 0, 0), NULL, NULL);
    busy = new_vi(nic, a, NULL, NULL);
    conn = wait_request(disc("busy1"), remote, &ra);
    OK(VipConnectAccept(conn, busy));
    c2 = wait_request(disc("busy2"), remote, &ra);
    EXPECT_RC(VipConnectAccept(c2, busy), VIP_INVALID_STATE);
    EXPECT_RC(VipConnectAccept(c2, vi2), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectAccept(c2, NULL), VIP_INVALID_PARAMETER);
    OK(VipConnectAccept(c2, vi));
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    exchange(busy, 1, 3);
    exchange(vi, 1, 4);
    barrier(5);
    finish(busy);
    finish(vi);
    OK(VipDestroyVi(vi2));
    OK(VipCloseNic(other));

    /* 6. MaxTransferSize: the smaller of the two applies. */
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 65536, 0, 0), NULL, NULL);
    conn = wait_request(disc("mtu"), remote, &ra);
    CHECK_EQ(ra.MaxTransferSize, 4096);
    OK(VipConnectAccept(conn, vi));
    barrier(6); /* the client posted receives */
    r = region_new(nic, tag, 65536, 0, 0);
    d = desc_at(&r, 0);
    desc_simple(d, r.base + 4096, r.mh, 8192);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND | VIP_STATUS_LENGTH_ERROR);
    fill(r.base + 4096, 4096, 5);
    desc_simple(d, r.base + 4096, r.mh, 4096);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    barrier(7);
    finish(vi);
    region_free(&r);

    /* 7. Two clients, one discriminator, one after the other. */
    vi = new_vi(nic, a, NULL, NULL);
    vi2 = new_vi(nic, a, NULL, NULL);
    conn = wait_request(disc("two"), remote, &ra);
    OK(VipConnectAccept(conn, vi));
    conn = wait_request(disc("two"), remote, &ra);
    OK(VipConnectAccept(conn, vi2));
    exchange(vi, 1, 6);
    exchange(vi2, 1, 7);
    barrier(8);
    finish(vi);
    finish(vi2);

    /* 8. Bad arguments. */
    local = make_addr(nic, disc("bad"));
    EXPECT_RC(VipConnectWait(NULL, local, 10, remote, &ra, &conn), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectWait(nic, NULL, 10, remote, &ra, &conn), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectWait(nic, local, 10, NULL, &ra, &conn), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectWait(nic, local, 10, remote, NULL, &conn), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectWait(nic, local, 10, remote, &ra, NULL), VIP_INVALID_PARAMETER);
    free(local);
    longd = malloc((size_t)na.MaxDiscriminatorLen + 2);
    CHECK(longd != NULL);
    memset(longd, 'x', (size_t)na.MaxDiscriminatorLen + 1);
    longd[na.MaxDiscriminatorLen + 1] = 0;
    local = make_addr(nic, longd);
    EXPECT_RC(VipConnectWait(nic, local, 10, remote, &ra, &conn), VIP_INVALID_PARAMETER);
    vi = new_vi(nic, a, NULL, NULL);
    keep = ra;
    EXPECT_RC(VipConnectRequest(vi, local, local, 10, &ra), VIP_INVALID_PARAMETER);
    CHECK(memcmp(&keep, &ra, sizeof ra) == 0);
    free(local);
    free(longd);
    local = make_addr(nic, disc("bad"));
    EXPECT_RC(VipConnectRequest(vi, NULL, local, 10, &ra), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectRequest(vi, local, NULL, 10, &ra), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectRequest(vi, local, local, 10, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectRequest(NULL, local, local, 10, &ra), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectAccept(NULL, vi), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectAccept((VIP_CONN_HANDLE)vi, vi), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectReject(NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipConnectReject((VIP_CONN_HANDLE)nic), VIP_INVALID_PARAMETER);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    free(local);
    OK(VipDestroyVi(vi));

    free(remote);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_VI_ATTRIBUTES ra, a;
    VIP_VI_HANDLE vi, vi2;
    double t0, dt;
    region r;
    VIP_DESCRIPTOR *d;

    nic = open_nic();
    tag = new_ptag(nic);

    /* 1. */
    a = vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 32768, 0, 1);
    vi = new_vi(nic, a, NULL, NULL);
    memset(&ra, 0, sizeof ra);
    OK(request(vi, disc("accept-client"), disc("accept"), WAIT_MS, &ra));
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    CHECK_EQ(ra.ReliabilityLevel, VIP_SERVICE_RELIABLE_DELIVERY);
    CHECK_EQ(ra.MaxTransferSize, 65536);
    CHECK_EQ(ra.EnableRdmaWrite, VIP_TRUE);
    CHECK_EQ(ra.EnableRdmaRead, VIP_FALSE);
    CHECK(ra.Ptag == NULL);
    exchange(vi, 1, 1);
    exchange(vi, 0, 2);
    barrier(1);
    finish(vi);

    /* 2. */
    vi = new_vi(nic, a, NULL, NULL);
    EXPECT_RC(request(vi, disc("reject-client"), disc("reject"), WAIT_MS, &ra), VIP_REJECT);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    barrier(2);

    /* 3. Nobody listens: the request waits for a listener until its
     * timeout, then VIP_NO_MATCH (as M-VIA; legacy programs retry on it). */
    t0 = now_ms();
    EXPECT_RC(request(vi, disc("x"), disc("nobody-listens"), 300, &ra), VIP_NO_MATCH);
    dt = now_ms() - t0;
    CHECK_MSG(dt >= 290 && dt < BOUND_MS, "VipConnectRequest(300 ms) took %.0f ms", dt);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    barrier(3);
    OK(VipDestroyVi(vi));

    /* 4. */
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 32768, 0, 0), NULL, NULL);
    EXPECT_RC(request(vi, disc("y"), disc("mismatch"), WAIT_MS, &ra), VIP_INVALID_RELIABILITY_LEVEL);
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    barrier(4);
    OK(VipDestroyVi(vi));

    /* 5. */
    vi = new_vi(nic, a, NULL, NULL);
    vi2 = new_vi(nic, a, NULL, NULL);
    OK(request(vi, disc("b1"), disc("busy1"), WAIT_MS, &ra));
    OK(request(vi2, disc("b2"), disc("busy2"), WAIT_MS, &ra));
    exchange(vi, 0, 3);
    exchange(vi2, 0, 4);
    barrier(5);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    CHECK(wait_state(vi2, VIP_STATE_ERROR, BOUND_MS));
    finish(vi);
    finish(vi2);

    /* 6. */
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 4096, 0, 0), NULL, NULL);
    r = region_new(nic, tag, 16384, 0, 0);
    d = desc_at(&r, 0);
    desc_simple(d, r.base + 4096, r.mh, 8192);
    OK(VipPostRecv(vi, d, r.mh));
    OK(request(vi, disc("m"), disc("mtu"), WAIT_MS, &ra));
    CHECK_EQ(ra.MaxTransferSize, 65536);
    barrier(6);
    recv_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
    CHECK_EQ(d->CS.Length, 4096);
    CHECK(check_fill(r.base + 4096, 4096, 5) == -1);
    barrier(7);
    finish(vi);
    region_free(&r);

    /* 7. */
    vi = new_vi(nic, a, NULL, NULL);
    vi2 = new_vi(nic, a, NULL, NULL);
    OK(request(vi, disc("t1"), disc("two"), WAIT_MS, &ra));
    OK(request(vi2, disc("t2"), disc("two"), WAIT_MS, &ra));
    exchange(vi, 0, 6);
    exchange(vi2, 0, 7);
    barrier(8);
    finish(vi);
    finish(vi2);

    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("connect", 120, parent, child); }
