/* nic.c: VipOpenNic / VipQueryNic / VipCloseNic with the M-VIA device
 * names, in two processes at once. */
#include "common.h"

#include <dirent.h>

static void check_attrs(VIP_NIC_HANDLE nic, const char *name)
{
    VIP_NIC_ATTRIBUTES a = nic_attrs(nic);
    CHECK_MSG(strcmp(a.Name, name) == 0, "Name is \"%s\", expected \"%s\"", a.Name, name);
    CHECK(a.NicAddressLen > 0 && a.NicAddressLen <= 16);
    CHECK(a.LocalNicAddress != NULL);
    CHECK_EQ(a.ThreadSafe, VIP_TRUE);
    CHECK(a.MaxDiscriminatorLen >= 16);
    CHECK(a.MaxRegisterBytes > 0);
    CHECK(a.MaxRegisterRegions > 0);
    CHECK(a.MaxRegisterBlockBytes > 0);
    CHECK(a.MaxVI > 0);
    CHECK(a.MaxDescriptorsPerQueue > 0);
    CHECK(a.MaxSegmentsPerDesc >= 2);
    CHECK(a.MaxCQ > 0);
    CHECK(a.MaxCQEntries > 0);
    CHECK(a.MaxTransferSize >= 32768);
    CHECK(a.NativeMTU > 0);
    CHECK(a.MaxPtags > 0);
    /* The way legacy programs test for reliable reception support. */
    CHECK(a.ReliabilityLevelSupport >= VIP_SERVICE_RELIABLE_RECEPTION);
    CHECK_EQ(a.ReliabilityLevelSupport & ~(VIP_SERVICE_UNRELIABLE | VIP_SERVICE_RELIABLE_DELIVERY |
                                           VIP_SERVICE_RELIABLE_RECEPTION), 0);
    CHECK_EQ(a.RDMAReadSupport & ~a.ReliabilityLevelSupport, 0);
    CHECK(a.RDMAReadSupport & VIP_SERVICE_RELIABLE_DELIVERY);
}

static void open_close(const char *dev, const char *name)
{
    VIP_NIC_HANDLE nic = NULL;
    OK(VipOpenNic(dev, &nic));
    CHECK(nic != NULL);
    check_attrs(nic, name);
    OK(VipCloseNic(nic));
    EXPECT_RC(VipCloseNic(nic), VIP_INVALID_PARAMETER);
}

static void bogus(const char *dev)
{
    VIP_NIC_HANDLE nic = (VIP_NIC_HANDLE)&nic;
    VIP_RETURN r = VipOpenNic(dev, &nic);
    CHECK_MSG(r == VIP_INVALID_PARAMETER, "VipOpenNic(\"%s\") returned %s", dev, vip_str(r));
    CHECK_MSG(nic == (VIP_NIC_HANDLE)&nic, "VipOpenNic(\"%s\") wrote its handle on failure", dev);
}

static int body(void)
{
    VIP_NIC_HANDLE a = NULL, b = NULL, stale;
    VIP_NIC_ATTRIBUTES at, bt;
    DIR *dir;
    struct dirent *e;
    int i, n_if = 0;
    unsigned char mine[16], theirs[16];

    /* The M-VIA names, and the default NIC. */
    open_close("/dev/via_lo", "via_lo");
    open_close("via_lo", "via_lo");
    open_close(NULL, "via_lo");
    open_close("", "via_lo");
    /* via_<if> for every network interface of this host. */
    dir = opendir("/sys/class/net");
    CHECK(dir != NULL);
    while ((e = readdir(dir)) != NULL) {
        char dev[300], name[300];
        if (e->d_name[0] == '.')
            continue;
        snprintf(dev, sizeof dev, "/dev/via_%s", e->d_name);
        snprintf(name, sizeof name, "via_%s", e->d_name);
        open_close(dev, name);
        open_close(name, name);
        n_if++;
    }
    closedir(dir);
    CHECK(n_if >= 1);

    /* Names that are not devices. */
    bogus("/dev/via_nonexistent0");
    bogus("via_nonexistent0");
    bogus("via_");
    bogus("/dev/via_");
    bogus("eth0");
    bogus("lo");
    bogus("/dev/null");
    bogus("/dev/via_lo/x");
    bogus("/dev/via_../lo");
    bogus("dev/via_lo");
    EXPECT_RC(VipOpenNic("/dev/via_lo", NULL), VIP_INVALID_PARAMETER);

    /* Two instances are independent; a closed one is refused. */
    OK(VipOpenNic("/dev/via_lo", &a));
    OK(VipOpenNic("/dev/via_lo", &b));
    CHECK(a != b);
    at = nic_attrs(a);
    bt = nic_attrs(b);
    CHECK_EQ(at.NicAddressLen, bt.NicAddressLen);
    CHECK(memcmp(at.LocalNicAddress, bt.LocalNicAddress, at.NicAddressLen) == 0);
    OK(VipCloseNic(a));
    EXPECT_RC(VipQueryNic(a, &at), VIP_INVALID_PARAMETER);
    check_attrs(b, "via_lo");
    EXPECT_RC(VipQueryNic(b, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipQueryNic(NULL, &bt), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCloseNic(NULL), VIP_INVALID_PARAMETER);

    /* Reopening reuses table slots; old handles stay stale. */
    stale = a;
    for (i = 0; i < 20; i++) {
        VIP_NIC_HANDLE n = NULL;
        OK(VipOpenNic("via_lo", &n));
        CHECK(n != stale);
        EXPECT_RC(VipQueryNic(stale, &at), VIP_INVALID_PARAMETER);
        OK(VipCloseNic(n));
        EXPECT_RC(VipQueryNic(n, &at), VIP_INVALID_PARAMETER);
    }

    /* Both processes see the same host address. */
    bt = nic_attrs(b);
    memset(mine, 0, sizeof mine);
    memcpy(mine, bt.LocalNicAddress, bt.NicAddressLen);
    say(mine, sizeof mine);
    hear(theirs, sizeof theirs);
    CHECK(memcmp(mine, theirs, sizeof mine) == 0);
    OK(VipCloseNic(b));
    return 0;
}

int main(void) { return run_pair("nic", 120, body, body); }
