/* ns.c: the name service: VipNSInit / VipNSGetHostByName /
 * VipNSGetHostByAddr / VipNSShutdown with this host's names and the
 * entries of a hosts file, unknown names and addresses, NameIndex,
 * buffers too small, and DiscriminatorLen left alone; in two processes. */
#include "common.h"

#include <unistd.h>

static const char hosts[] =
    "# name service test hosts\n"
    "alpha 0a0b0c0d0e0f\n"
    "beta 02:00:00:00:00:02\n"
    "gamma 00112233445566778899aabbccddeeff\n";

static int body(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_NIC_ATTRIBUTES na = nic_attrs(nic);
    unsigned char alpha[6] = {0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f};
    unsigned char beta[6] = {0x02, 0, 0, 0, 0, 0x02};
    VIP_NET_ADDRESS *a = calloc(1, sizeof *a + 64), *keep = calloc(1, sizeof *a + 64);
    char host[256], name[300], mine[16], theirs[16];
    VIP_ULONG len;

    CHECK(a != NULL && keep != NULL);
    CHECK(gethostname(host, sizeof host) == 0);
    host[sizeof host - 1] = 0;
    OK(VipNSInit(nic, NULL));
    OK(VipNSInit(nic, NULL)); /* again: harmless */

    /* This host, by its name and as localhost; DiscriminatorLen untouched. */
    a->DiscriminatorLen = 0x7777;
    OK(VipNSGetHostByName(nic, "localhost", a, 0));
    CHECK_EQ(a->HostAddressLen, na.NicAddressLen);
    CHECK(memcmp(a->HostAddress, na.LocalNicAddress, na.NicAddressLen) == 0);
    CHECK_EQ(a->DiscriminatorLen, 0x7777);
    memset(a, 0, sizeof *a + 64);
    OK(VipNSGetHostByName(nic, host, a, 0));
    CHECK_EQ(a->HostAddressLen, na.NicAddressLen);
    CHECK(memcmp(a->HostAddress, na.LocalNicAddress, na.NicAddressLen) == 0);
    CHECK_EQ(a->DiscriminatorLen, 0);

    /* The hosts file. */
    OK(VipNSGetHostByName(nic, "alpha", a, 0));
    CHECK_EQ(a->HostAddressLen, 6);
    CHECK(memcmp(a->HostAddress, alpha, 6) == 0);
    OK(VipNSGetHostByName(nic, "beta", a, 0));
    CHECK_EQ(a->HostAddressLen, 6);
    CHECK(memcmp(a->HostAddress, beta, 6) == 0);
    OK(VipNSGetHostByName(nic, "gamma", a, 0));
    CHECK_EQ(a->HostAddressLen, 16);
    CHECK_EQ(a->HostAddress[15], 0xff);

    /* Unknown names, other indices: the address is not touched. */
    memset(keep, 0x33, sizeof *keep + 64);
    memcpy(a, keep, sizeof *a + 64);
    EXPECT_RC(VipNSGetHostByName(nic, "no-such-host.invalid", a, 0), VIP_ERROR_NAMESERVICE);
    EXPECT_RC(VipNSGetHostByName(nic, "alpha", a, 1), VIP_ERROR_NAMESERVICE);
    EXPECT_RC(VipNSGetHostByName(nic, "localhost", a, 7), VIP_ERROR_NAMESERVICE);
    EXPECT_RC(VipNSGetHostByName(nic, "#", a, 0), VIP_ERROR_NAMESERVICE);
    CHECK(memcmp(a, keep, sizeof *a + 64) == 0);
    EXPECT_RC(VipNSGetHostByName(nic, NULL, a, 0), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipNSGetHostByName(nic, "alpha", NULL, 0), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipNSGetHostByName(NULL, "alpha", a, 0), VIP_INVALID_PARAMETER);

    /* Addresses to names. */
    a->HostAddressLen = na.NicAddressLen;
    a->DiscriminatorLen = 3;
    memcpy(a->HostAddress, na.LocalNicAddress, na.NicAddressLen);
    memcpy(a->HostAddress + na.NicAddressLen, "abc", 3);
    len = sizeof name;
    OK(VipNSGetHostByAddr(nic, a, name, &len));
    CHECK_MSG(strcmp(name, host) == 0, "this host's address is named \"%s\", expected \"%s\"", name, host);
    CHECK_EQ(len, strlen(host) + 1);
    a->HostAddressLen = 6;
    a->DiscriminatorLen = 0;
    memcpy(a->HostAddress, alpha, 6);
    len = sizeof name;
    OK(VipNSGetHostByAddr(nic, a, name, &len));
    CHECK(strcmp(name, "alpha") == 0);
    CHECK_EQ(len, 6);
    /* Exactly enough room, then one byte too little. */
    len = 6;
    OK(VipNSGetHostByAddr(nic, a, name, &len));
    strcpy(name, "untouched");
    len = 5;
    EXPECT_RC(VipNSGetHostByAddr(nic, a, name, &len), VIP_INVALID_PARAMETER);
    CHECK_EQ(len, 5);
    CHECK(strcmp(name, "untouched") == 0);
    /* Unknown address. */
    a->HostAddress[0] = 0xee;
    len = sizeof name;
    EXPECT_RC(VipNSGetHostByAddr(nic, a, name, &len), VIP_ERROR_NAMESERVICE);
    CHECK(strcmp(name, "untouched") == 0);
    EXPECT_RC(VipNSGetHostByAddr(nic, NULL, name, &len), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipNSGetHostByAddr(nic, a, NULL, &len), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipNSGetHostByAddr(nic, a, name, NULL), VIP_INVALID_PARAMETER);
    a->HostAddressLen = 17; /* longer than any host address */
    EXPECT_RC(VipNSGetHostByAddr(nic, a, name, &len), VIP_INVALID_PARAMETER);

    /* Shutdown; lookups keep working. */
    OK(VipNSShutdown(nic));
    OK(VipNSGetHostByName(nic, "alpha", a, 0));
    EXPECT_RC(VipNSShutdown(NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipNSInit(NULL, NULL), VIP_INVALID_PARAMETER);

    /* Both processes agree on this host's address. */
    memset(mine, 0, sizeof mine);
    OK(VipNSGetHostByName(nic, "localhost", a, 0));
    memcpy(mine, a->HostAddress, a->HostAddressLen);
    say(mine, sizeof mine);
    hear(theirs, sizeof theirs);
    CHECK(memcmp(mine, theirs, sizeof mine) == 0);

    free(a);
    free(keep);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void)
{
    use_hosts_file(hosts);
    return run_pair("ns", 120, body, body);
}
