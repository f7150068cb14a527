/*
 * layout.c: pins the LP64 ABI of include/vipl.h (C11).
 *
 * Compile-time: every size, alignment, offset and constant of
 * layout_table.h (_Static_assert), the exact C type behind every typedef
 * and field (_Generic), and the exact signature of every function
 * (a compatible redeclaration, which C checks). Runtime: every constant
 * again, and the field paths applications write.
 *
 * Built and run by tools/check-header.sh:
 *   cc -std=c11 -Wall -Wextra -Werror -pedantic -Iinclude tests/c/layout.c
 */
#include <vipl.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- compile time: the table ---- */

#define VIPL_CHECK_SIZE(type, n) \
    _Static_assert(sizeof(type) == (n), "sizeof(" #type ") == " #n);
#define VIPL_CHECK_ALIGN(type, n) \
    _Static_assert(_Alignof(type) == (n), "_Alignof(" #type ") == " #n);
#define VIPL_CHECK_OFFSET(type, member, n)       \
    _Static_assert(offsetof(type, member) == (n), \
                   "offsetof(" #type ", " #member ") == " #n);
#define VIPL_CHECK_CONST(name, value) \
    _Static_assert((name) == (value), #name " == " #value);
#include "layout_table.h"
#undef VIPL_CHECK_SIZE
#undef VIPL_CHECK_ALIGN
#undef VIPL_CHECK_OFFSET
#undef VIPL_CHECK_CONST

/* ---- compile time: exact types ---- */

/* _Generic does not evaluate its operand, so the null dereferences in
 * FIELD are never executed. Arrays decay, so char[64] is checked as char *. */
#define TYPE_IS(expr, T) _Generic((expr), T: 1, default: 0)
#define EXPECT_TYPE(expr, T) \
    _Static_assert(TYPE_IS(expr, T), #expr " has type " #T)
#define FIELD(S, f) (((S *)0)->f)

EXPECT_TYPE((VIP_UINT8)0, uint8_t);
EXPECT_TYPE((VIP_UINT16)0, uint16_t);
EXPECT_TYPE((VIP_UINT32)0, uint32_t);
EXPECT_TYPE((VIP_UINT64)0, uint64_t);
EXPECT_TYPE((VIP_PVOID)0, void *);
EXPECT_TYPE((VIP_BOOLEAN)0, int);
EXPECT_TYPE((VIP_CHAR)0, char);
EXPECT_TYPE((VIP_UCHAR)0, unsigned char);
EXPECT_TYPE((VIP_USHORT)0, unsigned short);
EXPECT_TYPE((VIP_ULONG)0, unsigned long);
EXPECT_TYPE((VIP_NIC_HANDLE)0, void *);
EXPECT_TYPE((VIP_VI_HANDLE)0, void *);
EXPECT_TYPE((VIP_CQ_HANDLE)0, void *);
EXPECT_TYPE((VIP_PROTECTION_HANDLE)0, void *);
EXPECT_TYPE((VIP_CONN_HANDLE)0, void *);
EXPECT_TYPE((VIP_QOS)0, void *);
EXPECT_TYPE((VIP_MEM_HANDLE)0, uint32_t);
EXPECT_TYPE((VIP_RELIABILITY_LEVEL)0, unsigned short);
EXPECT_TYPE((VIP_ERROR_HANDLER)0, void (*)(void *, VIP_ERROR_DESCRIPTOR *));
EXPECT_TYPE((VIP_NOTIFY_HANDLER)0,
            void (*)(void *, void *, void *, VIP_DESCRIPTOR *));
EXPECT_TYPE((VIP_CQ_NOTIFY_HANDLER)0, void (*)(void *, void *, void *, int));

EXPECT_TYPE(FIELD(VIP_PVOID64, AddressBits), uint64_t);
EXPECT_TYPE(FIELD(VIP_PVOID64, Address), void *);
EXPECT_TYPE(FIELD(VIP_CONTROL_SEGMENT, Next), VIP_PVOID64);
EXPECT_TYPE(FIELD(VIP_CONTROL_SEGMENT, NextHandle), uint32_t);
EXPECT_TYPE(FIELD(VIP_CONTROL_SEGMENT, SegCount), uint16_t);
EXPECT_TYPE(FIELD(VIP_CONTROL_SEGMENT, Control), uint16_t);
EXPECT_TYPE(FIELD(VIP_CONTROL_SEGMENT, Reserved), uint32_t);
EXPECT_TYPE(FIELD(VIP_CONTROL_SEGMENT, ImmediateData), uint32_t);
EXPECT_TYPE(FIELD(VIP_CONTROL_SEGMENT, Length), uint32_t);
EXPECT_TYPE(FIELD(VIP_CONTROL_SEGMENT, Status), uint32_t);
EXPECT_TYPE(FIELD(VIP_DATA_SEGMENT, Data), VIP_PVOID64);
EXPECT_TYPE(FIELD(VIP_DATA_SEGMENT, Handle), uint32_t);
EXPECT_TYPE(FIELD(VIP_DATA_SEGMENT, Length), uint32_t);
EXPECT_TYPE(FIELD(VIP_ADDRESS_SEGMENT, Data), VIP_PVOID64);
EXPECT_TYPE(FIELD(VIP_ADDRESS_SEGMENT, Handle), uint32_t);
EXPECT_TYPE(FIELD(VIP_ADDRESS_SEGMENT, Reserved), uint32_t);
EXPECT_TYPE(FIELD(VIP_DESCRIPTOR_SEGMENT, Remote), VIP_ADDRESS_SEGMENT);
EXPECT_TYPE(FIELD(VIP_DESCRIPTOR_SEGMENT, Local), VIP_DATA_SEGMENT);
EXPECT_TYPE(FIELD(VIP_DESCRIPTOR, CS), VIP_CONTROL_SEGMENT);
EXPECT_TYPE(FIELD(VIP_DESCRIPTOR, DS), VIP_DESCRIPTOR_SEGMENT *);
EXPECT_TYPE(FIELD(VIP_NET_ADDRESS, HostAddressLen), uint16_t);
EXPECT_TYPE(FIELD(VIP_NET_ADDRESS, DiscriminatorLen), uint16_t);
EXPECT_TYPE(FIELD(VIP_NET_ADDRESS, HostAddress), uint8_t *);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, Name), char *);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, HardwareVersion), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, ProviderVersion), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, NicAddressLen), uint16_t);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, LocalNicAddress), const uint8_t *);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, ThreadSafe), int);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxDiscriminatorLen), uint16_t);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxRegisterBytes), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxRegisterRegions), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxRegisterBlockBytes), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxVI), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxDescriptorsPerQueue), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxSegmentsPerDesc), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxCQ), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxCQEntries), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxTransferSize), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, NativeMTU), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, MaxPtags), unsigned long);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, ReliabilityLevelSupport), unsigned short);
EXPECT_TYPE(FIELD(VIP_NIC_ATTRIBUTES, RDMAReadSupport), unsigned short);
EXPECT_TYPE(FIELD(VIP_VI_ATTRIBUTES, ReliabilityLevel), unsigned short);
EXPECT_TYPE(FIELD(VIP_VI_ATTRIBUTES, MaxTransferSize), unsigned long);
EXPECT_TYPE(FIELD(VIP_VI_ATTRIBUTES, QoS), void *);
EXPECT_TYPE(FIELD(VIP_VI_ATTRIBUTES, Ptag), void *);
EXPECT_TYPE(FIELD(VIP_VI_ATTRIBUTES, EnableRdmaWrite), int);
EXPECT_TYPE(FIELD(VIP_VI_ATTRIBUTES, EnableRdmaRead), int);
EXPECT_TYPE(FIELD(VIP_MEM_ATTRIBUTES, Ptag), void *);
EXPECT_TYPE(FIELD(VIP_MEM_ATTRIBUTES, EnableRdmaWrite), int);
EXPECT_TYPE(FIELD(VIP_MEM_ATTRIBUTES, EnableRdmaRead), int);
EXPECT_TYPE(FIELD(VIP_ERROR_DESCRIPTOR, NicHandle), void *);
EXPECT_TYPE(FIELD(VIP_ERROR_DESCRIPTOR, ViHandle), void *);
EXPECT_TYPE(FIELD(VIP_ERROR_DESCRIPTOR, CQHandle), void *);
EXPECT_TYPE(FIELD(VIP_ERROR_DESCRIPTOR, DescriptorPtr), VIP_DESCRIPTOR *);
EXPECT_TYPE(FIELD(VIP_ERROR_DESCRIPTOR, OpCode), unsigned long);
EXPECT_TYPE(FIELD(VIP_ERROR_DESCRIPTOR, ResourceCode), VIP_RESOURCE_CODE);
EXPECT_TYPE(FIELD(VIP_ERROR_DESCRIPTOR, ErrorCode), VIP_ERROR_CODE);
EXPECT_TYPE(FIELD(VIP_AUTODISCOVERY_LIST, NumberOfHops), unsigned long);
EXPECT_TYPE(FIELD(VIP_AUTODISCOVERY_LIST, ADAddrArray), VIP_NET_ADDRESS **);
EXPECT_TYPE(FIELD(VIP_AUTODISCOVERY_LIST, NumAdAddrs), unsigned long);

/* GCC and Clang make an enum with no negative value compatible with
 * unsigned int, which is what the Rust side declares (u32). */
EXPECT_TYPE((VIP_RETURN)0, unsigned int);
EXPECT_TYPE((VIP_VI_STATE)0, unsigned int);
EXPECT_TYPE((VIP_RESOURCE_CODE)0, unsigned int);
EXPECT_TYPE((VIP_ERROR_CODE)0, unsigned int);
EXPECT_TYPE(VIP_INFINITE, unsigned long);

/* ---- compile time: exact signatures ---- */

/* Redeclaring a function with an incompatible type is a constraint
 * violation, so each line below fails to compile if the header's
 * prototype changes. Written with the underlying C types on purpose. */
VIP_RETURN VipOpenNic(const char *, void **);
VIP_RETURN VipCloseNic(void *);
VIP_RETURN VipQueryNic(void *, VIP_NIC_ATTRIBUTES *);
VIP_RETURN VipRegisterMem(void *, void *, unsigned long, VIP_MEM_ATTRIBUTES *,
                          uint32_t *);
VIP_RETURN VipDeregisterMem(void *, void *, uint32_t);
VIP_RETURN VipQueryMem(void *, void *, uint32_t, VIP_MEM_ATTRIBUTES *);
VIP_RETURN VipSetMemAttributes(void *, void *, uint32_t, VIP_MEM_ATTRIBUTES *);
VIP_RETURN VipErrorCallback(void *, void *,
                            void (*)(void *, VIP_ERROR_DESCRIPTOR *));
VIP_RETURN VipQuerySystemManagementInfo(void *, unsigned long, void *);
VIP_RETURN VipCreatePtag(void *, void **);
VIP_RETURN VipDestroyPtag(void *, void *);
VIP_RETURN VipCreateVi(void *, VIP_VI_ATTRIBUTES *, void *, void *, void **);
VIP_RETURN VipDestroyVi(void *);
VIP_RETURN VipQueryVi(void *, VIP_VI_STATE *, VIP_VI_ATTRIBUTES *, int *, int *);
VIP_RETURN VipSetViAttributes(void *, VIP_VI_ATTRIBUTES *);
VIP_RETURN VipPostSend(void *, VIP_DESCRIPTOR *, uint32_t);
VIP_RETURN VipSendDone(void *, VIP_DESCRIPTOR **);
VIP_RETURN VipSendWait(void *, unsigned long, VIP_DESCRIPTOR **);
VIP_RETURN VipSendNotify(void *, void *,
                         void (*)(void *, void *, void *, VIP_DESCRIPTOR *));
VIP_RETURN VipPostRecv(void *, VIP_DESCRIPTOR *, uint32_t);
VIP_RETURN VipRecvDone(void *, VIP_DESCRIPTOR **);
VIP_RETURN VipRecvWait(void *, unsigned long, VIP_DESCRIPTOR **);
VIP_RETURN VipRecvNotify(void *, void *,
                         void (*)(void *, void *, void *, VIP_DESCRIPTOR *));
VIP_RETURN VipConnectWait(void *, VIP_NET_ADDRESS *, unsigned long,
                          VIP_NET_ADDRESS *, VIP_VI_ATTRIBUTES *, void **);
VIP_RETURN VipConnectAccept(void *, void *);
VIP_RETURN VipConnectReject(void *);
VIP_RETURN VipConnectRequest(void *, VIP_NET_ADDRESS *, VIP_NET_ADDRESS *,
                             unsigned long, VIP_VI_ATTRIBUTES *);
VIP_RETURN VipDisconnect(void *);
VIP_RETURN VipConnectPeerRequest(void *, VIP_NET_ADDRESS *, VIP_NET_ADDRESS *,
                                 unsigned long);
VIP_RETURN VipConnectPeerDone(void *, VIP_VI_ATTRIBUTES *);
VIP_RETURN VipConnectPeerWait(void *, VIP_VI_ATTRIBUTES *);
VIP_RETURN VipCreateCQ(void *, unsigned long, void **);
VIP_RETURN VipDestroyCQ(void *);
VIP_RETURN VipResizeCQ(void *, unsigned long);
VIP_RETURN VipCQDone(void *, void **, int *);
VIP_RETURN VipCQWait(void *, unsigned long, void **, int *);
VIP_RETURN VipCQNotify(void *, void *, void (*)(void *, void *, void *, int));
VIP_RETURN VipNSInit(void *, void *);
VIP_RETURN VipNSGetHostByName(void *, char *, VIP_NET_ADDRESS *, unsigned long);
VIP_RETURN VipNSGetHostByAddr(void *, VIP_NET_ADDRESS *, char *,
                              unsigned long *);
VIP_RETURN VipNSShutdown(void *);

/* ---- runtime ---- */

static int failures;
static int checks;

static void check(int ok, const char *what)
{
    checks++;
    if (!ok) {
        failures++;
        fprintf(stderr, "layout: FAIL %s\n", what);
    }
}

/* The table once more, as runtime checks. */
static void check_table(void)
{
#define VIPL_CHECK_SIZE(type, n) \
    check(sizeof(type) == (n), "sizeof(" #type ") == " #n);
#define VIPL_CHECK_ALIGN(type, n) \
    check(_Alignof(type) == (n), "_Alignof(" #type ") == " #n);
#define VIPL_CHECK_OFFSET(type, member, n)  \
    check(offsetof(type, member) == (n), \
          "offsetof(" #type ", " #member ") == " #n);
#define VIPL_CHECK_CONST(name, value) \
    check((name) == (value), #name " == " #value);
#include "layout_table.h"
#undef VIPL_CHECK_SIZE
#undef VIPL_CHECK_ALIGN
#undef VIPL_CHECK_OFFSET
#undef VIPL_CHECK_CONST
}

/* The field paths legacy applications write, through the byte offsets the
 * provider uses. */
static void check_paths(void)
{
    static unsigned char buf[16];
    _Alignas(VIP_DESCRIPTOR_ALIGNMENT) unsigned char storage[64 + 2 * 16];
    VIP_DESCRIPTOR *desc = (VIP_DESCRIPTOR *)storage;
    unsigned char addr_storage[sizeof(VIP_NET_ADDRESS) + 4 + 2];
    VIP_NET_ADDRESS *addr = (VIP_NET_ADDRESS *)addr_storage;
    VIP_NIC_ATTRIBUTES nicAttrs;
    VIP_VI_ATTRIBUTES attrs;
    uint32_t u32;
    uint64_t u64;

    memset(storage, 0, sizeof storage);
    desc->CS.Control = VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE;
    desc->CS.SegCount = 3;
    desc->CS.Length = 4096;
    desc->CS.ImmediateData = 0xA5A5A5A5u;
    desc->CS.Next.Address = desc;
    desc->DS[0].Local.Data.Address = buf;
    desc->DS[0].Local.Handle = 7;
    desc->DS[0].Local.Length = 16;
    desc->DS[2].Local.Length = 99; /* past DS[1]: a longer descriptor */

    /* The provider writes Status at byte 28 of the descriptor. */
    u32 = VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE;
    memcpy(storage + 28, &u32, 4);
    check(desc->CS.Status == (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE),
          "CS.Status at byte 28");
    check((desc->CS.Status & VIP_STATUS_ERROR_MASK) == 0, "no error bits");
    memcpy(&u64, storage + 32, 8);
    check(u64 == (uint64_t)(uintptr_t)buf, "DS[0].Local.Data at byte 32");
    check(desc->DS[0].Local.Data.AddressBits == (uint64_t)(uintptr_t)buf,
          "AddressBits aliases Address");
    memcpy(&u32, storage + 40, 4);
    check(u32 == 7, "DS[0].Local.Handle at byte 40");
    check(desc->DS[0].Remote.Handle == 7, "Remote.Handle aliases Local.Handle");
    memcpy(&u32, storage + 32 + 2 * 16 + 12, 4);
    check(u32 == 99, "DS[2].Local.Length at byte 76");
    memcpy(&u32, storage + 20, 4);
    check(u32 == 0xA5A5A5A5u, "CS.ImmediateData at byte 20");

    addr->HostAddressLen = 4;
    addr->DiscriminatorLen = 2;
    memcpy(addr->HostAddress, "\x7f\0\0\x01\x12\x34", 6);
    check(addr_storage[4 + 4] == 0x12, "discriminator follows the host address");

    memset(&nicAttrs, 0, sizeof nicAttrs);
    nicAttrs.ReliabilityLevelSupport = VIP_SERVICE_RELIABLE_RECEPTION;
    check(nicAttrs.ReliabilityLevelSupport >= VIP_SERVICE_RELIABLE_RECEPTION,
          "ReliabilityLevelSupport comparison");
    check(nicAttrs.Name[0] == '\0' && nicAttrs.LocalNicAddress == NULL,
          "nicAttrs.Name, nicAttrs.LocalNicAddress");

    memset(&attrs, 0, sizeof attrs);
    attrs.ReliabilityLevel = VIP_SERVICE_RELIABLE_DELIVERY;
    attrs.MaxTransferSize = 65536;
    attrs.EnableRdmaWrite = VIP_TRUE;
    check(attrs.ReliabilityLevel == 2 && attrs.Ptag == NULL,
          "attrs.ReliabilityLevel");
}

int main(void)
{
    check_table();
    check_paths();
    if (failures != 0) {
        fprintf(stderr, "layout: %d of %d checks failed\n", failures, checks);
        return 1;
    }
    printf("layout: %d runtime checks passed\n", checks);
    return 0;
}
