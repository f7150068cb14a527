/*
 * vipl.h: the Virtual Interface Provider Library (VIPL 1.0) API of via-rs.
 *
 * A source-compatible replacement for the vipl.h of M-VIA on Linux:
 * legacy VIA applications compile unchanged against this header and
 * link with -lvipl. Hand-written; the Rust mirror of every structure is
 * via/src/ffi/types.rs and via/src/descriptor.rs, and tests/c/layout.c
 * pins every size, offset and constant (tools/check-header.sh).
 *
 * Usable from C89 and later and from C++98 and later. Layouts are the
 * natural ones of an LP64 Linux C compiler (no packing): VIP_ULONG and
 * pointers are 8 bytes, enumerations 4 bytes.
 *
 * Conventions shared by every call below:
 *  - Every function returns a VIP_RETURN. Each doc comment lists the
 *    codes the call can return and why.
 *  - NULL pointers and bad handles (NULL, stale, of another NIC, or of
 *    the wrong kind) give VIP_INVALID_PARAMETER; they are never
 *    dereferenced.
 *  - VIP_ERROR_RESOURCE means resource exhaustion, and is also the answer
 *    to an internal provider failure; every call can return it.
 *  - Output parameters are written only when the call returns
 *    VIP_SUCCESS.
 *  - Timeouts are in milliseconds; VIP_INFINITE (or any larger value)
 *    waits forever.
 *  - Threads: every call may be made from any thread. Notify handlers and
 *    the error callback run on a provider thread of the NIC, with no
 *    library lock held: they may call any function (re-arm, post, even
 *    VipCloseNic of their NIC); a handler that blocks delays the other
 *    handlers of its NIC.
 */
#ifndef VIPL_H
#define VIPL_H

/* Parameter direction markers of the VIPL specification; empty. */
#ifndef IN
#define IN
#endif
#ifndef OUT
#define OUT
#endif

/*
 * Fixed-width types. <stdint.h> exists in C99, C++11 and with GCC-like
 * compilers in every mode. Elsewhere a C89 fallback assumes LP64
 * (int 32 bits, long 64 bits) and refuses to compile if that is wrong.
 * Defining VIPL_NO_STDINT_H forces the fallback (used by the header test).
 */
#if !defined(VIPL_NO_STDINT_H) &&                                        \
    ((defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L) ||       \
     (defined(__cplusplus) && __cplusplus >= 201103L) || defined(__GNUC__))
#include <stdint.h>
typedef uint8_t VIP_UINT8;
typedef uint16_t VIP_UINT16;
typedef uint32_t VIP_UINT32;
typedef uint64_t VIP_UINT64;
#else
#include <limits.h>
#if !defined(UCHAR_MAX) || UCHAR_MAX != 255
#error "vipl.h: the C89 fallback needs an 8-bit unsigned char"
#endif
#if !defined(USHRT_MAX) || USHRT_MAX != 65535
#error "vipl.h: the C89 fallback needs a 16-bit unsigned short"
#endif
/* Shifts are split so that no shift count reaches 32 in any preprocessor. */
#if !defined(UINT_MAX) || (UINT_MAX >> 16 >> 15) != 1
#error "vipl.h: the C89 fallback needs a 32-bit unsigned int"
#endif
#if !defined(ULONG_MAX) || (ULONG_MAX >> 31 >> 31) != 3
#error "vipl.h: the C89 fallback needs a 64-bit unsigned long (LP64)"
#endif
typedef unsigned char VIP_UINT8;
typedef unsigned short VIP_UINT16;
typedef unsigned int VIP_UINT32;
typedef unsigned long VIP_UINT64;
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Basic types                                                         */
/* ------------------------------------------------------------------ */

typedef void *VIP_PVOID;
typedef int VIP_BOOLEAN;
typedef char VIP_CHAR;
typedef unsigned char VIP_UCHAR;
typedef unsigned short VIP_USHORT;
typedef unsigned long VIP_ULONG; /* 64 bits on LP64 Linux */

#define VIP_TRUE 1
#define VIP_FALSE 0

/* Opaque handles. */
typedef void *VIP_NIC_HANDLE;
typedef void *VIP_VI_HANDLE;
typedef void *VIP_CQ_HANDLE;
typedef void *VIP_PROTECTION_HANDLE;
typedef void *VIP_CONN_HANDLE;

/* Quality of service: not defined by VIA 1.0; ignored by this provider. */
typedef void *VIP_QOS;

/* A registered memory region, as named in descriptors and RDMA. */
typedef VIP_UINT32 VIP_MEM_HANDLE;

/* A 64-bit address field, whatever the pointer size (8 bytes). */
typedef union _VIP_PVOID64 {
    VIP_UINT64 AddressBits;
    VIP_PVOID Address;
} VIP_PVOID64;

/* Wait forever (Win32 INFINITE); timeouts are in milliseconds. */
#define VIP_INFINITE 0xFFFFFFFFUL

/* ------------------------------------------------------------------ */
/* Reliability levels (bit set)                                        */
/* ------------------------------------------------------------------ */

typedef VIP_USHORT VIP_RELIABILITY_LEVEL;

#define VIP_SERVICE_UNRELIABLE 0x01
#define VIP_SERVICE_RELIABLE_DELIVERY 0x02
#define VIP_SERVICE_RELIABLE_RECEPTION 0x04

/* ------------------------------------------------------------------ */
/* Return codes                                                        */
/* ------------------------------------------------------------------ */

/* Values 0..14 in this order; the order is the ABI. */
typedef enum _VIP_RETURN {
    VIP_SUCCESS,
    VIP_NOT_DONE,
    VIP_INVALID_PARAMETER,
    VIP_ERROR_RESOURCE,
    VIP_TIMEOUT,
    VIP_REJECT,
    VIP_INVALID_RELIABILITY_LEVEL,
    VIP_INVALID_MTU,
    VIP_INVALID_QOS,
    VIP_INVALID_PTAG,
    VIP_INVALID_RDMAREAD,
    VIP_DESCRIPTOR_ERROR,
    VIP_INVALID_STATE,
    VIP_ERROR_NAMESERVICE,
    VIP_NO_MATCH
} VIP_RETURN;

/* ------------------------------------------------------------------ */
/* Descriptors                                                         */
/* ------------------------------------------------------------------ */

/* Descriptors must start on a 64-byte boundary, in registered memory. */
#define VIP_DESCRIPTOR_ALIGNMENT 64

/* CS.Control: operation and flags, written by the application. */
#define VIP_CONTROL_OP_SENDRECV 0x0
#define VIP_CONTROL_OP_RDMAWRITE 0x1
#define VIP_CONTROL_OP_RDMAREAD 0x2
#define VIP_CONTROL_OP_RESERVED 0x3
#define VIP_CONTROL_OP_MASK 0x3
#define VIP_CONTROL_IMMEDIATE 0x4
#define VIP_CONTROL_QFENCE 0x8
#define VIP_CONTROL_RESERVED 0xFFF0

/* CS.Status: written by the provider when the descriptor completes. */
#define VIP_STATUS_DONE 0x1
#define VIP_STATUS_FORMAT_ERROR 0x2
#define VIP_STATUS_PROTECTION_ERROR 0x4
#define VIP_STATUS_LENGTH_ERROR 0x8
#define VIP_STATUS_PARTIAL_ERROR 0x10
#define VIP_STATUS_DESC_FLUSHED_ERROR 0x20
#define VIP_STATUS_TRANSPORT_ERROR 0x40
#define VIP_STATUS_RDMA_PROT_ERROR 0x80
#define VIP_STATUS_REMOTE_DESC_ERROR 0x100
#define VIP_STATUS_ERROR_MASK 0x1FE
#define VIP_STATUS_OP_SEND 0x0
#define VIP_STATUS_OP_RECEIVE 0x10000
#define VIP_STATUS_OP_RDMA_WRITE 0x20000
#define VIP_STATUS_OP_REMOTE_RDMA_WRITE 0x30000
#define VIP_STATUS_OP_RDMA_READ 0x40000
#define VIP_STATUS_OP_MASK 0x70000
#define VIP_STATUS_IMMEDIATE 0x80000
#define VIP_STATUS_RESERVED 0xFFF0FE00

/* The first 32 bytes of every descriptor. */
typedef struct _VIP_CONTROL_SEGMENT {
    VIP_PVOID64 Next;          /* link for the application's own use */
    VIP_MEM_HANDLE NextHandle; /* memory handle of Next */
    VIP_UINT16 SegCount;       /* segments that follow this one */
    VIP_UINT16 Control;        /* VIP_CONTROL_* */
    VIP_UINT32 Reserved;
    VIP_UINT32 ImmediateData; /* sent with VIP_CONTROL_IMMEDIATE; received */
    VIP_UINT32 Length;        /* total bytes on send; written on receive */
    VIP_UINT32 Status;        /* VIP_STATUS_*, written by the provider */
} VIP_CONTROL_SEGMENT;

/* A local buffer (16 bytes). */
typedef struct _VIP_DATA_SEGMENT {
    VIP_PVOID64 Data;
    VIP_MEM_HANDLE Handle;
    VIP_UINT32 Length;
} VIP_DATA_SEGMENT;

/* The remote buffer of an RDMA operation (16 bytes); DS[0] when present. */
typedef struct _VIP_ADDRESS_SEGMENT {
    VIP_PVOID64 Data;
    VIP_MEM_HANDLE Handle;
    VIP_UINT32 Reserved;
} VIP_ADDRESS_SEGMENT;

typedef union _VIP_DESCRIPTOR_SEGMENT {
    VIP_ADDRESS_SEGMENT Remote;
    VIP_DATA_SEGMENT Local;
} VIP_DESCRIPTOR_SEGMENT;

/*
 * A descriptor: the control segment followed by CS.SegCount segments.
 * The type fixes the first two (64 bytes); applications allocate longer
 * descriptors and index DS[i] past 1. The type carries no alignment
 * attribute: the application places descriptors on a
 * VIP_DESCRIPTOR_ALIGNMENT boundary itself (e.g. with memalign).
 */
typedef struct _VIP_DESCRIPTOR {
    VIP_CONTROL_SEGMENT CS;
    VIP_DESCRIPTOR_SEGMENT DS[2];
} VIP_DESCRIPTOR;

/* ------------------------------------------------------------------ */
/* Addresses, attributes, states                                       */
/* ------------------------------------------------------------------ */

/*
 * A network address: HostAddressLen bytes of host address, then
 * DiscriminatorLen bytes of discriminator, starting at HostAddress.
 * Allocate sizeof(VIP_NET_ADDRESS) + HostAddressLen + DiscriminatorLen.
 */
typedef struct _VIP_NET_ADDRESS {
    VIP_UINT16 HostAddressLen;
    VIP_UINT16 DiscriminatorLen;
    VIP_UINT8 HostAddress[1];
} VIP_NET_ADDRESS;

/* What VipQueryNic reports. */
typedef struct _VIP_NIC_ATTRIBUTES {
    VIP_CHAR Name[64];
    VIP_ULONG HardwareVersion;
    VIP_ULONG ProviderVersion;
    VIP_UINT16 NicAddressLen;
    const VIP_UINT8 *LocalNicAddress; /* NicAddressLen bytes, owned by the provider */
    VIP_BOOLEAN ThreadSafe;
    VIP_UINT16 MaxDiscriminatorLen;
    VIP_ULONG MaxRegisterBytes;
    VIP_ULONG MaxRegisterRegions;
    VIP_ULONG MaxRegisterBlockBytes;
    VIP_ULONG MaxVI;
    VIP_ULONG MaxDescriptorsPerQueue;
    VIP_ULONG MaxSegmentsPerDesc;
    VIP_ULONG MaxCQ;
    VIP_ULONG MaxCQEntries;
    VIP_ULONG MaxTransferSize;
    VIP_ULONG NativeMTU;
    VIP_ULONG MaxPtags;
    VIP_RELIABILITY_LEVEL ReliabilityLevelSupport;
    VIP_RELIABILITY_LEVEL RDMAReadSupport;
} VIP_NIC_ATTRIBUTES;

/* Attributes of a VI (VipCreateVi, VipQueryVi, connection calls). */
typedef struct _VIP_VI_ATTRIBUTES {
    VIP_RELIABILITY_LEVEL ReliabilityLevel;
    VIP_ULONG MaxTransferSize;
    VIP_QOS QoS;
    VIP_PROTECTION_HANDLE Ptag;
    VIP_BOOLEAN EnableRdmaWrite;
    VIP_BOOLEAN EnableRdmaRead;
} VIP_VI_ATTRIBUTES;

/* Attributes of a registered memory region. */
typedef struct _VIP_MEM_ATTRIBUTES {
    VIP_PROTECTION_HANDLE Ptag;
    VIP_BOOLEAN EnableRdmaWrite;
    VIP_BOOLEAN EnableRdmaRead;
} VIP_MEM_ATTRIBUTES;

typedef enum _VIP_VI_STATE {
    VIP_STATE_IDLE,
    VIP_STATE_CONNECTED,
    VIP_STATE_CONNECT_PENDING,
    VIP_STATE_ERROR
} VIP_VI_STATE;

/* ------------------------------------------------------------------ */
/* Asynchronous errors                                                 */
/* ------------------------------------------------------------------ */

/* Which kind of object an asynchronous error concerns. */
typedef enum _VIP_RESOURCE_CODE {
    VIP_RESOURCE_NIC,
    VIP_RESOURCE_VI,
    VIP_RESOURCE_CQ,
    VIP_RESOURCE_DESCRIPTOR
} VIP_RESOURCE_CODE;

/* What went wrong, reported to the error callback. */
typedef enum _VIP_ERROR_CODE {
    VIP_ERROR_POST_DESC,
    VIP_ERROR_CONN_LOST,
    VIP_ERROR_RECVQ_EMPTY,
    VIP_ERROR_VI_OVERRUN,
    VIP_ERROR_RDMAW_PROT,
    VIP_ERROR_RDMAW_DATA,
    VIP_ERROR_RDMAW_ABORT,
    VIP_ERROR_RDMAR_PROT,
    VIP_ERROR_COMP_PROT,
    VIP_ERROR_RDMA_TRANSPORT,
    VIP_ERROR_CATASTROPHIC
} VIP_ERROR_CODE;

/* Passed to the error callback; fields that do not apply are NULL. */
typedef struct _VIP_ERROR_DESCRIPTOR {
    VIP_NIC_HANDLE NicHandle;
    VIP_VI_HANDLE ViHandle;
    VIP_CQ_HANDLE CQHandle;
    VIP_DESCRIPTOR *DescriptorPtr;
    VIP_ULONG OpCode;
    VIP_RESOURCE_CODE ResourceCode;
    VIP_ERROR_CODE ErrorCode;
} VIP_ERROR_DESCRIPTOR;

/* ------------------------------------------------------------------ */
/* System management                                                   */
/* ------------------------------------------------------------------ */

/* InfoType of VipQuerySystemManagementInfo; Info is a VIP_AUTODISCOVERY_LIST. */
#define VIP_SMI_AUTODISCOVERY 1

typedef struct _VIP_AUTODISCOVERY_LIST {
    VIP_ULONG NumberOfHops;
    VIP_NET_ADDRESS **ADAddrArray;
    VIP_ULONG NumAdAddrs;
} VIP_AUTODISCOVERY_LIST;

/* ------------------------------------------------------------------ */
/* Callback types (names are via-rs additions; the shapes are VIPL's)  */
/* ------------------------------------------------------------------ */

/* Error callback of VipErrorCallback. */
typedef void (*VIP_ERROR_HANDLER)(VIP_PVOID Context,
                                  VIP_ERROR_DESCRIPTOR *ErrorDesc);

/* Work-queue handler of VipSendNotify and VipRecvNotify: runs once per
 * completed descriptor, which is already dequeued. */
typedef void (*VIP_NOTIFY_HANDLER)(VIP_PVOID Context, VIP_NIC_HANDLE NicHandle,
                                   VIP_VI_HANDLE ViHandle,
                                   VIP_DESCRIPTOR *Descriptor);

/* Completion-queue handler of VipCQNotify: names the VI and the queue. */
typedef void (*VIP_CQ_NOTIFY_HANDLER)(VIP_PVOID Context,
                                      VIP_NIC_HANDLE NicHandle,
                                      VIP_VI_HANDLE ViHandle,
                                      VIP_BOOLEAN RecvQueue);

/* ------------------------------------------------------------------ */
/* NIC                                                                 */
/* ------------------------------------------------------------------ */

/* Open the NIC named DeviceName (e.g. "/dev/via_lo", "via_lo",
 * "/dev/via_eth0" for an interface eth0 of this host); NULL or "" opens
 * the default NIC (via_lo). Each call opens a new instance.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: NULL NicHandle or no such device;
 * VIP_ERROR_RESOURCE: the NIC cannot be opened (e.g. viad not found). */
VIP_RETURN VipOpenNic(const VIP_CHAR *DeviceName, VIP_NIC_HANDLE *NicHandle);

/* Close a NIC handle.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle; VIP_ERROR_RESOURCE. */
VIP_RETURN VipCloseNic(VIP_NIC_HANDLE NicHandle);

/* Fill *Attrs with the NIC's attributes and limits.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle or NULL Attrs;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipQueryNic(VIP_NIC_HANDLE NicHandle, VIP_NIC_ATTRIBUTES *Attrs);

/* ------------------------------------------------------------------ */
/* Memory registration                                                 */
/* ------------------------------------------------------------------ */

/* Register (and pin) Length bytes at VirtualAddress; *MemHandle names it.
 * The contents are kept; other threads may go on writing the memory while
 * it registers (no write is lost). Registrations may overlap. A handle
 * names one registration: the same bytes, Ptag and RDMA enables. It is
 * dead once deregistered (peers get VIP_STATUS_RDMA_PROT_ERROR through
 * it), and comes back only when the program registers exactly the same
 * bytes with the same attributes again while the provider still keeps the
 * deregistered registration whole (the pin-down cache; VIA_REGCACHE=off
 * keeps none); any other registration gets a handle not seen within 2^32
 * registrations of the NIC.
 * Memory that the program unmaps, trims, discards (madvise) or moves
 * (mremap) while registered loses its translation: peers get
 * VIP_STATUS_RDMA_PROT_ERROR, and VipDeregisterMem still succeeds on it.
 * fork: the pages of live registrations are not in the child (as after
 * verbs' ibv_fork_init; a child that touches them faults); all other
 * memory, deregistered regions included, is the child's private copy.
 * Deregistered regions stay in a cache (VIA_REGCACHE, see the README);
 * new memory at a cached address is registered afresh, even when another
 * thread maps it the instant the old memory is unmapped (libc's munmap,
 * mremap and shmdt are hooked for this; a raw syscall(SYS_munmap) is not).
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle, NULL pointer or zero
 * Length, or memory that is not mapped readable; VIP_INVALID_PTAG:
 * Attrs->Ptag is not a ptag of this NIC; VIP_INVALID_RDMAREAD:
 * EnableRdmaRead but the NIC has no RDMA read; VIP_ERROR_RESOURCE: a
 * registration limit or the pin limit is reached. */
VIP_RETURN VipRegisterMem(VIP_NIC_HANDLE NicHandle, VIP_PVOID VirtualAddress,
                          VIP_ULONG Length, VIP_MEM_ATTRIBUTES *Attrs,
                          VIP_MEM_HANDLE *MemHandle);

/* Deregister the region MemHandle, which starts at VirtualAddress. When it
 * returns, no byte of the region is read or written by this process's NIC
 * or a peer's; a transfer it cut short completes at its initiator with an
 * error status (never VIP_STATUS_DONE).
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle or MemHandle, or
 * VirtualAddress is not the start of the region; VIP_ERROR_RESOURCE. */
VIP_RETURN VipDeregisterMem(VIP_NIC_HANDLE NicHandle, VIP_PVOID VirtualAddress,
                            VIP_MEM_HANDLE MemHandle);

/* Fill *Attrs with the attributes of region MemHandle.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle or MemHandle,
 * VirtualAddress outside the region, or NULL Attrs; VIP_ERROR_RESOURCE. */
VIP_RETURN VipQueryMem(VIP_NIC_HANDLE NicHandle, VIP_PVOID VirtualAddress,
                       VIP_MEM_HANDLE MemHandle, VIP_MEM_ATTRIBUTES *Attrs);

/* Change the attributes of region MemHandle.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle or MemHandle,
 * VirtualAddress outside the region, or NULL Attrs; VIP_INVALID_PTAG:
 * Attrs->Ptag is not a ptag of this NIC; VIP_INVALID_RDMAREAD:
 * EnableRdmaRead but the NIC has no RDMA read; VIP_ERROR_RESOURCE. */
VIP_RETURN VipSetMemAttributes(VIP_NIC_HANDLE NicHandle,
                               VIP_PVOID VirtualAddress,
                               VIP_MEM_HANDLE MemHandle,
                               VIP_MEM_ATTRIBUTES *Attrs);

/* ------------------------------------------------------------------ */
/* Errors and system management                                        */
/* ------------------------------------------------------------------ */

/* Install Handler for the asynchronous errors of NicHandle, replacing any
 * earlier one (NULL removes it: errors are then logged to stderr); it runs
 * on a provider thread with Context and an error descriptor valid during
 * the call.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle; VIP_ERROR_RESOURCE. */
VIP_RETURN VipErrorCallback(VIP_NIC_HANDLE NicHandle, VIP_PVOID Context,
                            VIP_ERROR_HANDLER Handler);

/* Query management information of type InfoType (VIP_SMI_AUTODISCOVERY).
 * Autodiscovery lists this NIC's host address, then, if NumberOfHops >= 1,
 * the hosts the name service knows. With ADAddrArray NULL, NumAdAddrs is
 * set to the number of addresses; otherwise ADAddrArray holds NumAdAddrs
 * pointers to addresses with room for NicAddressLen host bytes each, the
 * first NumAdAddrs addresses are written (DiscriminatorLen 0) and
 * NumAdAddrs is set to the number written.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle, unknown InfoType,
 * NULL Info or a NULL entry of ADAddrArray; VIP_ERROR_RESOURCE. */
VIP_RETURN VipQuerySystemManagementInfo(VIP_NIC_HANDLE NicHandle,
                                        VIP_ULONG InfoType, VIP_PVOID Info);

/* ------------------------------------------------------------------ */
/* Protection tags                                                     */
/* ------------------------------------------------------------------ */

/* Create a protection tag.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle or NULL ProtectionTag;
 * VIP_ERROR_RESOURCE: MaxPtags reached. */
VIP_RETURN VipCreatePtag(VIP_NIC_HANDLE NicHandle,
                         VIP_PROTECTION_HANDLE *ProtectionTag);

/* Destroy a protection tag.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle or ProtectionTag;
 * VIP_INVALID_STATE: a VI or a memory region still uses it;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipDestroyPtag(VIP_NIC_HANDLE NicHandle,
                          VIP_PROTECTION_HANDLE ProtectionTag);

/* ------------------------------------------------------------------ */
/* Virtual interfaces                                                  */
/* ------------------------------------------------------------------ */

/* Create an idle VI; SendCQHandle and RecvCQHandle may be NULL.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle or CQ handle, or
 * NULL pointer; VIP_INVALID_RELIABILITY_LEVEL: level not supported;
 * VIP_INVALID_MTU: MaxTransferSize above the NIC's; VIP_INVALID_PTAG:
 * Ptag is not a ptag of this NIC; VIP_INVALID_RDMAREAD: EnableRdmaRead
 * on a level without RDMA read; VIP_ERROR_RESOURCE: MaxVI reached. */
VIP_RETURN VipCreateVi(VIP_NIC_HANDLE NicHandle, VIP_VI_ATTRIBUTES *ViAttribs,
                       VIP_CQ_HANDLE SendCQHandle, VIP_CQ_HANDLE RecvCQHandle,
                       VIP_VI_HANDLE *ViHandle);

/* Destroy a VI.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad ViHandle; VIP_INVALID_STATE:
 * the VI is not idle or a work queue is not empty; VIP_ERROR_RESOURCE. */
VIP_RETURN VipDestroyVi(VIP_VI_HANDLE ViHandle);

/* Report the VI's state, attributes and whether its queues are empty.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad ViHandle or NULL pointer;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipQueryVi(VIP_VI_HANDLE ViHandle, VIP_VI_STATE *State,
                      VIP_VI_ATTRIBUTES *Attrs, VIP_BOOLEAN *SendQueueEmpty,
                      VIP_BOOLEAN *RecvQueueEmpty);

/* Change the VI's attributes.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad ViHandle or NULL Attrs;
 * VIP_INVALID_STATE: the VI is not idle; VIP_INVALID_RELIABILITY_LEVEL;
 * VIP_INVALID_MTU; VIP_INVALID_PTAG; VIP_INVALID_RDMAREAD (as for
 * VipCreateVi); VIP_ERROR_RESOURCE. */
VIP_RETURN VipSetViAttributes(VIP_VI_HANDLE ViHandle, VIP_VI_ATTRIBUTES *Attrs);

/* ------------------------------------------------------------------ */
/* Send queue                                                          */
/* ------------------------------------------------------------------ */

/* Post DescriptorPtr on the send queue; MemHandle is the registered region
 * that holds the descriptor itself. In VIP_STATE_ERROR the descriptor is
 * accepted and completes with VIP_STATUS_DESC_FLUSHED_ERROR.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad ViHandle or MemHandle, or NULL
 * DescriptorPtr; VIP_INVALID_STATE: the VI is idle or connect-pending;
 * VIP_DESCRIPTOR_ERROR: descriptor not 64-byte aligned, not inside the
 * region of MemHandle, SegCount above MaxSegmentsPerDesc, or a reserved
 * operation or Control bit; VIP_ERROR_RESOURCE: the queue is full. */
VIP_RETURN VipPostSend(VIP_VI_HANDLE ViHandle, VIP_DESCRIPTOR *DescriptorPtr,
                       VIP_MEM_HANDLE MemHandle);

/* Dequeue the oldest send descriptor if it has completed.
 * VIP_SUCCESS; VIP_NOT_DONE: it has not completed (or the queue is empty);
 * VIP_INVALID_PARAMETER: bad ViHandle or NULL DescriptorPtr;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipSendDone(VIP_VI_HANDLE ViHandle, VIP_DESCRIPTOR **DescriptorPtr);

/* Wait up to Timeout ms for the oldest send descriptor and dequeue it.
 * VIP_SUCCESS; VIP_TIMEOUT; VIP_INVALID_PARAMETER: bad ViHandle or NULL
 * DescriptorPtr; VIP_ERROR_RESOURCE. */
VIP_RETURN VipSendWait(VIP_VI_HANDLE ViHandle, VIP_ULONG Timeout,
                       VIP_DESCRIPTOR **DescriptorPtr);

/* Run Handler on a provider thread for each completed send descriptor.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad ViHandle or NULL Handler;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipSendNotify(VIP_VI_HANDLE ViHandle, VIP_PVOID Context,
                         VIP_NOTIFY_HANDLER Handler);

/* ------------------------------------------------------------------ */
/* Receive queue                                                       */
/* ------------------------------------------------------------------ */

/* Post DescriptorPtr on the receive queue, in any state (before the
 * connection exists too); MemHandle is the region that holds the
 * descriptor itself. In VIP_STATE_ERROR the descriptor completes at once
 * with VIP_STATUS_DESC_FLUSHED_ERROR.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad ViHandle or MemHandle, or NULL
 * DescriptorPtr; VIP_DESCRIPTOR_ERROR: as for VipPostSend;
 * VIP_ERROR_RESOURCE: the queue is full. */
VIP_RETURN VipPostRecv(VIP_VI_HANDLE ViHandle, VIP_DESCRIPTOR *DescriptorPtr,
                       VIP_MEM_HANDLE MemHandle);

/* Dequeue the oldest receive descriptor if it has completed.
 * VIP_SUCCESS; VIP_NOT_DONE; VIP_INVALID_PARAMETER: bad ViHandle or NULL
 * DescriptorPtr; VIP_ERROR_RESOURCE. */
VIP_RETURN VipRecvDone(VIP_VI_HANDLE ViHandle, VIP_DESCRIPTOR **DescriptorPtr);

/* Wait up to Timeout ms for the oldest receive descriptor and dequeue it.
 * VIP_SUCCESS; VIP_TIMEOUT; VIP_INVALID_PARAMETER: bad ViHandle or NULL
 * DescriptorPtr; VIP_ERROR_RESOURCE. */
VIP_RETURN VipRecvWait(VIP_VI_HANDLE ViHandle, VIP_ULONG Timeout,
                       VIP_DESCRIPTOR **DescriptorPtr);

/* Run Handler on a provider thread for each completed receive descriptor.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad ViHandle or NULL Handler;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipRecvNotify(VIP_VI_HANDLE ViHandle, VIP_PVOID Context,
                         VIP_NOTIFY_HANDLER Handler);

/* ------------------------------------------------------------------ */
/* Client/server connections                                           */
/* ------------------------------------------------------------------ */

/* Wait up to Timeout ms for a connection request to LocalAddr's
 * discriminator; on success *RemoteAddr (caller-allocated, with room for
 * NicAddressLen + MaxDiscriminatorLen bytes after the header),
 * *RemoteViAttribs (Ptag NULL) and *ConnHandle describe it, to be passed
 * to VipConnectAccept or VipConnectReject.
 * VIP_SUCCESS; VIP_TIMEOUT; VIP_INVALID_PARAMETER: bad NicHandle, NULL
 * pointer or discriminator longer than MaxDiscriminatorLen;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipConnectWait(VIP_NIC_HANDLE NicHandle, VIP_NET_ADDRESS *LocalAddr,
                          VIP_ULONG Timeout, VIP_NET_ADDRESS *RemoteAddr,
                          VIP_VI_ATTRIBUTES *RemoteViAttribs,
                          VIP_CONN_HANDLE *ConnHandle);

/* Accept the request ConnHandle on the idle VI ViHandle of the same NIC.
 * The connection's MaxTransferSize is the smaller of the two VIs'.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad or already used ConnHandle, or
 * bad ViHandle or one of another NIC (the request stays pending);
 * VIP_INVALID_STATE: the VI is not idle (the request stays pending);
 * VIP_INVALID_RELIABILITY_LEVEL: the two VIs' levels differ (the request
 * is refused with the same code); VIP_INVALID_MTU: no acceptable
 * MaxTransferSize; VIP_TIMEOUT: the requester gave up meanwhile;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipConnectAccept(VIP_CONN_HANDLE ConnHandle, VIP_VI_HANDLE ViHandle);

/* Reject the request ConnHandle; the requester gets VIP_REJECT.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad or already used ConnHandle;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipConnectReject(VIP_CONN_HANDLE ConnHandle);

/* Connect the idle VI ViHandle to RemoteAddr, waiting up to Timeout ms;
 * on success *RemoteViAttribs holds the peer VI's attributes (Ptag NULL).
 * VIP_SUCCESS; VIP_NO_MATCH: nobody listened on the discriminator until
 * the timeout (a request waits for a listener that long; with
 * VIP_INFINITE, forever), or RemoteAddr's host is not reachable;
 * VIP_TIMEOUT: a server took the request but did not accept or reject it
 * in time; VIP_REJECT: the server rejected;
 * VIP_INVALID_PARAMETER: bad ViHandle or NULL pointer;
 * VIP_INVALID_STATE: the VI is not idle; VIP_INVALID_RELIABILITY_LEVEL:
 * the levels differ; VIP_INVALID_MTU: no acceptable MaxTransferSize;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipConnectRequest(VIP_VI_HANDLE ViHandle, VIP_NET_ADDRESS *LocalAddr,
                             VIP_NET_ADDRESS *RemoteAddr, VIP_ULONG Timeout,
                             VIP_VI_ATTRIBUTES *RemoteViAttribs);

/* Break the VI's connection (or leave the error state); the VI becomes
 * idle and its outstanding descriptors complete as flushed.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad ViHandle; VIP_INVALID_STATE:
 * the VI is idle; VIP_ERROR_RESOURCE. */
VIP_RETURN VipDisconnect(VIP_VI_HANDLE ViHandle);

/* ------------------------------------------------------------------ */
/* Peer-to-peer connections                                            */
/* ------------------------------------------------------------------ */

/* Start a peer connection of the idle VI ViHandle to RemoteAddr: it is
 * matched with the peer request whose LocalAddr and RemoteAddr
 * discriminators are ours swapped, within Timeout ms; the outcome is seen
 * by VipConnectPeerDone/Wait.
 * VIP_SUCCESS: the request is pending; VIP_INVALID_PARAMETER: bad
 * ViHandle or NULL pointer; VIP_INVALID_STATE: the VI is not idle;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipConnectPeerRequest(VIP_VI_HANDLE ViHandle,
                                 VIP_NET_ADDRESS *LocalAddr,
                                 VIP_NET_ADDRESS *RemoteAddr,
                                 VIP_ULONG Timeout);

/* Poll the pending peer connection of ViHandle.
 * VIP_SUCCESS: connected, *RemoteViAttribs written; VIP_NOT_DONE: still
 * pending; VIP_TIMEOUT: the request's timeout expired;
 * VIP_INVALID_PARAMETER: bad ViHandle or NULL RemoteViAttribs;
 * VIP_INVALID_STATE: no peer request is pending on the VI;
 * VIP_INVALID_RELIABILITY_LEVEL; VIP_INVALID_MTU (as for
 * VipConnectRequest); VIP_ERROR_RESOURCE. */
VIP_RETURN VipConnectPeerDone(VIP_VI_HANDLE ViHandle,
                              VIP_VI_ATTRIBUTES *RemoteViAttribs);

/* Wait for the pending peer connection of ViHandle.
 * VIP_SUCCESS: connected, *RemoteViAttribs written; VIP_TIMEOUT: the
 * request's timeout expired; VIP_INVALID_PARAMETER: bad ViHandle or NULL
 * RemoteViAttribs; VIP_INVALID_STATE: no peer request is pending on the
 * VI; VIP_INVALID_RELIABILITY_LEVEL; VIP_INVALID_MTU;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipConnectPeerWait(VIP_VI_HANDLE ViHandle,
                              VIP_VI_ATTRIBUTES *RemoteViAttribs);

/* ------------------------------------------------------------------ */
/* Completion queues                                                   */
/* ------------------------------------------------------------------ */

/* Create a completion queue of EntryCount entries.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle, NULL CQHandle or
 * EntryCount 0; VIP_ERROR_RESOURCE: MaxCQ reached or EntryCount above
 * MaxCQEntries. */
VIP_RETURN VipCreateCQ(VIP_NIC_HANDLE NicHandle, VIP_ULONG EntryCount,
                       VIP_CQ_HANDLE *CQHandle);

/* Destroy a completion queue.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad CQHandle; VIP_INVALID_STATE:
 * a VI still uses it; VIP_ERROR_RESOURCE. */
VIP_RETURN VipDestroyCQ(VIP_CQ_HANDLE CQHandle);

/* Change the number of entries of a completion queue.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad CQHandle or EntryCount 0;
 * VIP_INVALID_STATE: the CQ holds more completions than EntryCount;
 * VIP_ERROR_RESOURCE: EntryCount above MaxCQEntries. */
VIP_RETURN VipResizeCQ(VIP_CQ_HANDLE CQHandle, VIP_ULONG EntryCount);

/* Take the oldest completion: the VI and whether it is its receive queue;
 * then dequeue the descriptor with VipSendDone or VipRecvDone.
 * VIP_SUCCESS; VIP_NOT_DONE: the CQ is empty; VIP_INVALID_PARAMETER: bad
 * CQHandle or NULL pointer; VIP_ERROR_RESOURCE. */
VIP_RETURN VipCQDone(VIP_CQ_HANDLE CQHandle, VIP_VI_HANDLE *ViHandle,
                     VIP_BOOLEAN *RecvQueue);

/* Wait up to Timeout ms for a completion, as VipCQDone.
 * VIP_SUCCESS; VIP_TIMEOUT; VIP_INVALID_PARAMETER: bad CQHandle or NULL
 * pointer; VIP_ERROR_RESOURCE. */
VIP_RETURN VipCQWait(VIP_CQ_HANDLE CQHandle, VIP_ULONG Timeout,
                     VIP_VI_HANDLE *ViHandle, VIP_BOOLEAN *RecvQueue);

/* Run Handler on a provider thread for each completion of the CQ.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad CQHandle or NULL Handler;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipCQNotify(VIP_CQ_HANDLE CQHandle, VIP_PVOID Context,
                       VIP_CQ_NOTIFY_HANDLER Handler);

/* ------------------------------------------------------------------ */
/* Name service                                                        */
/* ------------------------------------------------------------------ */

/* Initialise the name service; InitInfo is provider-specific (may be NULL).
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle;
 * VIP_ERROR_NAMESERVICE: the name service cannot be initialised;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipNSInit(VIP_NIC_HANDLE NicHandle, VIP_PVOID InitInfo);

/* Write the NameIndex-th host address of Name into *HostAddress:
 * HostAddressLen and the address bytes (the caller allocates room for
 * them); DiscriminatorLen is left unchanged. Each name has one address
 * (NameIndex 0). Works with or without VipNSInit.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle or NULL pointer;
 * VIP_ERROR_NAMESERVICE: unknown name or no address of that index;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipNSGetHostByName(VIP_NIC_HANDLE NicHandle, VIP_CHAR *Name,
                              VIP_NET_ADDRESS *HostAddress,
                              VIP_ULONG NameIndex);

/* Write the host name of *HostAddress, NUL-terminated, into Name, a
 * buffer of *NameLen bytes; *NameLen becomes the bytes written including
 * the NUL.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle, NULL pointer or the
 * name does not fit; VIP_ERROR_NAMESERVICE: unknown address;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipNSGetHostByAddr(VIP_NIC_HANDLE NicHandle,
                              VIP_NET_ADDRESS *HostAddress, VIP_CHAR *Name,
                              VIP_ULONG *NameLen);

/* Shut the name service down.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle;
 * VIP_ERROR_NAMESERVICE: the name service failed to shut down;
 * VIP_ERROR_RESOURCE. */
VIP_RETURN VipNSShutdown(VIP_NIC_HANDLE NicHandle);

/* ------------------------------------------------------------------ */
/* Extensions of via-rs: NOT VIPL 1.0                                  */
/* ------------------------------------------------------------------ */

/* Shared receive queues (SRQ). Receive descriptors are posted once to an
 * SRQ for every VI attached to it; a message to any of them takes the
 * oldest. Only the verbs kind of NIC (InfiniBand, RoCE) has them; on the
 * other kinds every call below returns VIP_INVALID_PARAMETER. VIPL 1.0
 * programs never see them. XRC (one connection per remote node shared by
 * its processes) is not offered: see docs/design.md section 8. */
typedef void *VIP_SRQ_HANDLE;

/* Create an SRQ of EntryCount descriptors of the protection tag Ptag.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad NicHandle, NULL SrqHandle,
 * EntryCount 0, or a kind of NIC without SRQs; VIP_INVALID_PTAG;
 * VIP_ERROR_RESOURCE: EntryCount above MaxDescriptorsPerQueue, or too
 * many SRQs. (Not VIPL 1.0.) */
VIP_RETURN VipCreateSrq(VIP_NIC_HANDLE NicHandle, VIP_PROTECTION_HANDLE Ptag,
                        VIP_ULONG EntryCount, VIP_SRQ_HANDLE *SrqHandle);

/* Destroy an SRQ; descriptors still posted complete with
 * VIP_STATUS_DESC_FLUSHED_ERROR written into them.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad SrqHandle; VIP_INVALID_STATE: a
 * VI is attached. (Not VIPL 1.0.) */
VIP_RETURN VipDestroySrq(VIP_SRQ_HANDLE SrqHandle);

/* Post a receive descriptor to an SRQ, as VipPostRecv does to a VI.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad SrqHandle or MemoryHandle, NULL
 * DescriptorPtr; VIP_DESCRIPTOR_ERROR: misaligned or malformed descriptor,
 * or one of another protection tag; VIP_ERROR_RESOURCE: the SRQ holds
 * EntryCount descriptors. (Not VIPL 1.0.) */
VIP_RETURN VipPostSrqRecv(VIP_SRQ_HANDLE SrqHandle, VIP_DESCRIPTOR *DescriptorPtr,
                          VIP_MEM_HANDLE MemoryHandle);

/* Take the oldest completed descriptor of an SRQ: *ViHandle is the VI
 * that received (NULL for a descriptor completed at post time), and
 * *DescriptorPtr the descriptor (status, length and immediate data are
 * in it, as for VipRecvDone).
 * VIP_SUCCESS; VIP_NOT_DONE; VIP_INVALID_PARAMETER: bad SrqHandle or NULL
 * pointer. (Not VIPL 1.0.) */
VIP_RETURN VipSrqDone(VIP_SRQ_HANDLE SrqHandle, VIP_VI_HANDLE *ViHandle,
                      VIP_DESCRIPTOR **DescriptorPtr);

/* Wait up to Timeout ms for a completed descriptor, as VipSrqDone.
 * VIP_SUCCESS; VIP_TIMEOUT; VIP_INVALID_PARAMETER: bad SrqHandle or NULL
 * pointer. (Not VIPL 1.0.) */
VIP_RETURN VipSrqWait(VIP_SRQ_HANDLE SrqHandle, VIP_ULONG Timeout,
                      VIP_VI_HANDLE *ViHandle, VIP_DESCRIPTOR **DescriptorPtr);

/* Attach an idle VI without posted receives to an SRQ (SrqHandle NULL:
 * back to its own receive queue). While attached, VipPostRecv on the VI
 * returns VIP_INVALID_STATE, and its receives complete through the SRQ
 * (VipSrqDone/VipSrqWait), not its receive queue or CQ.
 * VIP_SUCCESS; VIP_INVALID_PARAMETER: bad handle, an SRQ of another NIC,
 * or a kind of NIC without SRQs; VIP_INVALID_STATE: the VI is not idle or
 * has receives posted; VIP_INVALID_PTAG: the SRQ's tag is not the VI's;
 * VIP_INVALID_RELIABILITY_LEVEL: an Unreliable VI. (Not VIPL 1.0.) */
VIP_RETURN VipSetViSrq(VIP_VI_HANDLE ViHandle, VIP_SRQ_HANDLE SrqHandle);

#ifdef __cplusplus
}
#endif

#endif /* VIPL_H */
