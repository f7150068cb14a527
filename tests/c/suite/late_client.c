/* late_client.c: a legacy client whose server starts late (driven by
 * tests/tests/c_suite.rs, which starts the server; not a PASS program).
 *
 *   late_client retry <disc> <timeout_ms>
 *       VipConnectRequest with a short timeout, retried on VIP_NO_MATCH
 *       (as legacy code written for M-VIA does); prints "NOMATCH <n>"
 *       after each.
 *   late_client wait <disc>
 *       prints "WAITING", then one VipConnectRequest(VIP_INFINITE).
 *
 * Then "CONNECTED <rc>" (any other return code is printed and the exit
 * status is 1), disconnects and exits 0. */
#include "common.h"

#include <unistd.h>

int main(int argc, char **argv)
{
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE tag;
    VIP_VI_HANDLE vi;
    VIP_VI_ATTRIBUTES ra;
    VIP_NET_ADDRESS *local, *remote;
    VIP_RETURN rc;
    int n = 0;

    if (argc < 3 || (strcmp(argv[1], "retry") != 0 && strcmp(argv[1], "wait") != 0)) {
        fprintf(stderr, "usage: late_client retry <disc> <timeout_ms> | wait <disc>\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(120);
    suite_prog = "late_client";
    suite_role = argv[1];
    nic = open_nic();
    tag = new_ptag(nic);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    local = make_addr(nic, "late-client");
    remote = make_addr(nic, argv[2]);
    if (strcmp(argv[1], "retry") == 0) {
        VIP_ULONG t = argc > 3 ? strtoul(argv[3], NULL, 10) : 500;
        for (;;) {
            rc = VipConnectRequest(vi, local, remote, t, &ra);
            if (rc != VIP_NO_MATCH)
                break;
            printf("NOMATCH %d\n", ++n);
        }
    } else {
        printf("WAITING\n");
        rc = VipConnectRequest(vi, local, remote, VIP_INFINITE, &ra);
    }
    printf("CONNECTED %s\n", vip_str(rc));
    if (rc != VIP_SUCCESS)
        return 1;
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    OK(VipDestroyPtag(nic, tag));
    OK(VipCloseNic(nic));
    free(local);
    free(remote);
    return 0;
}
