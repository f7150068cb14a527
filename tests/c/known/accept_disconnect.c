/* accept_disconnect.c (known core bug): the server accepts and at once
 * disconnects. The client's VipConnectRequest succeeds, so its VI must
 * then learn of the disconnect: VIP_STATE_ERROR within a bounded time.
 * The core loses the peer's disconnect when it arrives while the client
 * is still completing VipConnectRequest (VI in CONNECT_PENDING): the
 * client's VI stays CONNECTED to a peer that is gone. */
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
        snprintf(d, sizeof d, "ad%d", i);
        connect_to(nic, vi, disc(d));
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
