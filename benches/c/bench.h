/*
 * bench.h: what the C benchmarks (benches/c) share: a check that exits
 * on any VIPL error, and a peer address on this NIC.
 */
#ifndef VIA_BENCH_H
#define VIA_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vipl.h>

#define OK(call)                                                              \
    do {                                                                      \
        VIP_RETURN r_ = (call);                                               \
        if (r_ != VIP_SUCCESS) {                                              \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__,    \
                    #call, (int)r_);                                          \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

/* The address of discriminator `d` on the NIC of `a` (malloc'd). */
static inline VIP_NET_ADDRESS *addr(VIP_NIC_ATTRIBUTES *a, const char *d)
{
    size_t dl = strlen(d);
    VIP_NET_ADDRESS *x = malloc(sizeof *x + a->NicAddressLen + dl);
    if (!x)
        exit(1);
    x->HostAddressLen = a->NicAddressLen;
    x->DiscriminatorLen = (VIP_UINT16)dl;
    memcpy(x->HostAddress, a->LocalNicAddress, a->NicAddressLen);
    memcpy(x->HostAddress + a->NicAddressLen, d, dl);
    return x;
}

/* Opens the default NIC with a protection tag, and the attributes every
 * benchmark uses: a reliable-delivery VI of that tag (64 KiB transfers)
 * and memory of that tag without RDMA. */
static inline void open_default(VIP_NIC_HANDLE *nic, VIP_NIC_ATTRIBUTES *na,
                                VIP_VI_ATTRIBUTES *at, VIP_MEM_ATTRIBUTES *mat)
{
    VIP_PROTECTION_HANDLE tag;
    OK(VipOpenNic(NULL, nic));
    OK(VipQueryNic(*nic, na));
    OK(VipCreatePtag(*nic, &tag));
    memset(at, 0, sizeof *at);
    at->ReliabilityLevel = VIP_SERVICE_RELIABLE_DELIVERY;
    at->Ptag = tag;
    at->MaxTransferSize = 65536;
    memset(mat, 0, sizeof *mat);
    mat->Ptag = tag;
    mat->EnableRdmaWrite = VIP_FALSE;
    mat->EnableRdmaRead = VIP_FALSE;
}

#endif
