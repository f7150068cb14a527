/* accept_disconnect.c (regression test): the server accepts and at once
 * disconnects. The client's VipConnectRequest succeeds, so its VI must
 * then learn of the disconnect: VIP_STATE_ERROR within a bounded time,
 * even when the disconnect arrives while the client is still completing
 * VipConnectRequest (VI in CONNECT_PENDING). */
#include "common.h"

#define ROUNDS 30

static int parent(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    int i;
    char d[32];
    for (i = 0; i < ROUNDS; i++) {
        snprintf(d, sizeof d, "ad%d", i);
        accept_on(nic, vi, disc(d));
        OK(VipDisconnect(vi));
        barrier(i);
    }
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    int i;
    char d[32];
    for (i = 0; i < ROUNDS; i++) {
        char mine[120];
        VIP_NET_ADDRESS *local, *remote;
        VIP_VI_ATTRIBUTES ra;
        VIP_VI_STATE st;
        snprintf(d, sizeof d, "ad%d", i);
        remote = remote_addr(nic, disc(d));
        snprintf(mine, sizeof mine, "%s-client", disc(d));
        local = make_addr(nic, mine);
        OK(VipConnectRequest(vi, local, remote, WAIT_MS, &ra));
        free(local);
        free(remote);
        /* Connected, or already broken if the disconnect overtook us. */
        st = vi_state(vi);
        CHECK_MSG(st == VIP_STATE_CONNECTED || st == VIP_STATE_ERROR, "round %d: state %d after connecting", i,
                  (int)st);
        CHECK_MSG(wait_state(vi, VIP_STATE_ERROR, BOUND_MS),
                  "round %d: the server disconnected right after accepting, but our VI is still %s after %lu ms", i,
                  vi_state(vi) == VIP_STATE_CONNECTED ? "CONNECTED" : "not in the error state", BOUND_MS);
        OK(VipDisconnect(vi));
        barrier(i);
    }
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("accept_disconnect", 120, parent, child); }
