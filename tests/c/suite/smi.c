/* smi.c: VipQuerySystemManagementInfo(VIP_SMI_AUTODISCOVERY): this NIC's
 * address first, then (NumberOfHops >= 1) the hosts the name service
 * knows, without duplicates and without addresses longer than the NIC's;
 * the sizing call; truncation; bad arguments. In two processes. */
#include "common.h"

static const char hosts[] =
    "alpha 0a0b0c0d0e0f\n"
    "beta 020000000002\n"
    "alpha-again 0a0b0c0d0e0f\n"
    "long 00112233445566778899aabbccddeeff\n";

static int has(VIP_NET_ADDRESS **v, unsigned long n, const unsigned char *addr, unsigned len)
{
    unsigned long i;
    int found = 0;
    for (i = 0; i < n; i++)
        if (v[i]->HostAddressLen == len && memcmp(v[i]->HostAddress, addr, len) == 0)
            found++;
    return found;
}

static int body(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_NIC_ATTRIBUTES na = nic_attrs(nic);
    unsigned char alpha[6] = {0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f};
    unsigned char beta[6] = {0x02, 0, 0, 0, 0, 0x02};
    VIP_AUTODISCOVERY_LIST l, keep;
    VIP_NET_ADDRESS *v[8];
    unsigned long i, mine, theirs;

    CHECK_EQ(na.NicAddressLen, 6);
    for (i = 0; i < 8; i++) {
        v[i] = calloc(1, sizeof *v[i] + na.NicAddressLen);
        CHECK(v[i] != NULL);
        v[i]->DiscriminatorLen = 99;
    }

    /* Sizing calls. */
    memset(&l, 0, sizeof l);
    l.NumberOfHops = 0;
    l.ADAddrArray = NULL;
    l.NumAdAddrs = 1234;
    OK(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, &l));
    CHECK_EQ(l.NumAdAddrs, 1);
    l.NumberOfHops = 1;
    OK(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, &l));
    CHECK_EQ(l.NumAdAddrs, 3); /* this host, alpha, beta */

    /* The list. */
    l.ADAddrArray = v;
    l.NumAdAddrs = 8;
    OK(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, &l));
    CHECK_EQ(l.NumAdAddrs, 3);
    CHECK_EQ(v[0]->HostAddressLen, na.NicAddressLen);
    CHECK(memcmp(v[0]->HostAddress, na.LocalNicAddress, na.NicAddressLen) == 0);
    CHECK_EQ(has(v, 3, alpha, 6), 1);
    CHECK_EQ(has(v, 3, beta, 6), 1);
    for (i = 0; i < 3; i++)
        CHECK_EQ(v[i]->DiscriminatorLen, 0);
    CHECK_EQ(v[3]->DiscriminatorLen, 99); /* not written */

    /* No hops: this NIC only. Truncated to the room given. */
    l.NumberOfHops = 0;
    l.NumAdAddrs = 8;
    OK(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, &l));
    CHECK_EQ(l.NumAdAddrs, 1);
    l.NumberOfHops = 5;
    l.NumAdAddrs = 2;
    OK(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, &l));
    CHECK_EQ(l.NumAdAddrs, 2);
    CHECK(memcmp(v[0]->HostAddress, na.LocalNicAddress, na.NicAddressLen) == 0);

    /* Bad arguments: nothing written. */
    l.NumAdAddrs = 8;
    v[1] = NULL;
    keep = l;
    EXPECT_RC(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, &l), VIP_INVALID_PARAMETER);
    CHECK_EQ(l.NumAdAddrs, keep.NumAdAddrs);
    v[1] = calloc(1, sizeof *v[1] + na.NicAddressLen);
    EXPECT_RC(VipQuerySystemManagementInfo(nic, 0, &l), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipQuerySystemManagementInfo(nic, 2, &l), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipQuerySystemManagementInfo(NULL, VIP_SMI_AUTODISCOVERY, &l), VIP_INVALID_PARAMETER);
    CHECK_EQ(l.NumAdAddrs, keep.NumAdAddrs);

    /* Both processes discover the same number of hosts. */
    l.NumberOfHops = 1;
    l.ADAddrArray = NULL;
    OK(VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, &l));
    mine = l.NumAdAddrs;
    say(&mine, sizeof mine);
    hear(&theirs, sizeof theirs);
    CHECK_EQ(mine, theirs);

    for (i = 0; i < 8; i++)
        free(v[i]);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void)
{
    use_hosts_file(hosts);
    return run_pair("smi", 120, body, body);
}
