//! VIPL 1.0 types, structures and constants, as `include/vipl.h` declares them.
//!
//! Every `#[repr(C)]` item here mirrors a declaration of the committed
//! header with VIPL spellings. The descriptor (`VIP_DESCRIPTOR` and its
//! segments) lives in [`crate::descriptor`] and is aliased here. The layouts
//! are those of an LP64 Linux C compiler: the `const` block at the end pins
//! every size, alignment and field offset to the numbers that
//! `tests/c/layout_table.h` pins on the C side (`tools/check-header.sh`).
//!
//! C enumerations (`VIP_RETURN`, `VIP_VI_STATE`, `VIP_RESOURCE_CODE`,
//! `VIP_ERROR_CODE`) are `u32` aliases plus constants, never Rust `enum`s:
//! a C caller can hand back any bit pattern, and a Rust `enum` holding an
//! undeclared value is undefined behaviour. `u32` is ABI-identical to these
//! C enums on the Linux targets we build for: GCC and Clang give an
//! enumeration whose constants are all non-negative and fit in 32 bits the
//! underlying type `unsigned int` (`tests/c/layout.c` checks this with
//! `_Generic`). That is 4 bytes, 4-aligned, and returned and passed in a
//! general-purpose register like any 32-bit integer.
#![forbid(unsafe_code)]

use core::ffi::{c_char, c_int, c_uchar, c_ulong, c_ushort, c_void};
use core::mem::{align_of, offset_of, size_of};

use crate::descriptor;

// ---------------------------------------------------------------------------
// Basic types
// ---------------------------------------------------------------------------

/// `VIP_PVOID`: an untyped pointer.
pub type VIP_PVOID = *mut c_void;
/// `VIP_BOOLEAN`: a C `int`, [`VIP_TRUE`] or [`VIP_FALSE`]. Read any
/// non-zero value as true.
pub type VIP_BOOLEAN = c_int;
/// `VIP_CHAR`.
pub type VIP_CHAR = c_char;
/// `VIP_UCHAR`.
pub type VIP_UCHAR = c_uchar;
/// `VIP_USHORT`.
pub type VIP_USHORT = c_ushort;
/// `VIP_ULONG`: C `unsigned long`, 64 bits on LP64 Linux.
pub type VIP_ULONG = c_ulong;
/// `VIP_UINT8`.
pub type VIP_UINT8 = u8;
/// `VIP_UINT16`.
pub type VIP_UINT16 = u16;
/// `VIP_UINT32`.
pub type VIP_UINT32 = u32;
/// `VIP_UINT64`.
pub type VIP_UINT64 = u64;

/// `VIP_TRUE`.
pub const VIP_TRUE: VIP_BOOLEAN = 1;
/// `VIP_FALSE`.
pub const VIP_FALSE: VIP_BOOLEAN = 0;

/// `VIP_NIC_HANDLE`: opaque to C; see the handle encoding in `ffi`.
pub type VIP_NIC_HANDLE = *mut c_void;
/// `VIP_VI_HANDLE`.
pub type VIP_VI_HANDLE = *mut c_void;
/// `VIP_CQ_HANDLE`.
pub type VIP_CQ_HANDLE = *mut c_void;
/// `VIP_SRQ_HANDLE`: a shared receive queue (an extension, not VIPL 1.0).
pub type VIP_SRQ_HANDLE = *mut c_void;
/// `VIP_PROTECTION_HANDLE` (a ptag).
pub type VIP_PROTECTION_HANDLE = *mut c_void;
/// `VIP_CONN_HANDLE`: a pending connection request from `VipConnectWait`.
pub type VIP_CONN_HANDLE = *mut c_void;
/// `VIP_QOS`: undefined by VIA 1.0; the provider ignores it.
pub type VIP_QOS = *mut c_void;
/// `VIP_MEM_HANDLE`: names a registered region in descriptors and RDMA.
pub type VIP_MEM_HANDLE = VIP_UINT32;

/// `VIP_PVOID64`: a 64-bit address field, as a pointer or as its bits.
///
/// Same size and alignment as [`descriptor::Addr64`], which the descriptor
/// types use for the same field.
#[repr(C)]
#[derive(Clone, Copy)]
pub union VIP_PVOID64 {
    /// The address as an integer.
    pub AddressBits: VIP_UINT64,
    /// The address as a pointer.
    pub Address: VIP_PVOID,
}

/// `VIP_INFINITE`: wait forever (Win32 `INFINITE`). Timeouts are
/// milliseconds; this exact value, not `ULONG_MAX`, means no timeout.
pub const VIP_INFINITE: VIP_ULONG = 0xFFFF_FFFF;

// ---------------------------------------------------------------------------
// Reliability levels
// ---------------------------------------------------------------------------

/// `VIP_RELIABILITY_LEVEL`: one `VIP_SERVICE_*` value, or a set of them in
/// `VIP_NIC_ATTRIBUTES`.
pub type VIP_RELIABILITY_LEVEL = VIP_USHORT;
/// Unreliable delivery.
pub const VIP_SERVICE_UNRELIABLE: VIP_RELIABILITY_LEVEL = 0x01;
/// Reliable delivery.
pub const VIP_SERVICE_RELIABLE_DELIVERY: VIP_RELIABILITY_LEVEL = 0x02;
/// Reliable reception.
pub const VIP_SERVICE_RELIABLE_RECEPTION: VIP_RELIABILITY_LEVEL = 0x04;

// ---------------------------------------------------------------------------
// Return codes
// ---------------------------------------------------------------------------

/// `VIP_RETURN`: the C enum, as `u32` (see the module doc).
pub type VIP_RETURN = u32;
/// The call succeeded.
pub const VIP_SUCCESS: VIP_RETURN = 0;
/// Nothing has completed yet (`*Done` calls, `VipConnectPeerDone`).
pub const VIP_NOT_DONE: VIP_RETURN = 1;
/// A NULL pointer, a bad handle or an invalid argument.
pub const VIP_INVALID_PARAMETER: VIP_RETURN = 2;
/// Resource exhaustion, or an internal provider failure.
pub const VIP_ERROR_RESOURCE: VIP_RETURN = 3;
/// The timeout expired.
pub const VIP_TIMEOUT: VIP_RETURN = 4;
/// The remote side rejected the connection.
pub const VIP_REJECT: VIP_RETURN = 5;
/// Reliability level unsupported, or different from the peer's.
pub const VIP_INVALID_RELIABILITY_LEVEL: VIP_RETURN = 6;
/// `MaxTransferSize` unsupported, or not agreed with the peer.
pub const VIP_INVALID_MTU: VIP_RETURN = 7;
/// Invalid QoS (never returned: QoS is undefined and ignored).
pub const VIP_INVALID_QOS: VIP_RETURN = 8;
/// The protection tag is not one of this NIC.
pub const VIP_INVALID_PTAG: VIP_RETURN = 9;
/// RDMA read requested where it is not supported.
pub const VIP_INVALID_RDMAREAD: VIP_RETURN = 10;
/// A malformed descriptor was posted.
pub const VIP_DESCRIPTOR_ERROR: VIP_RETURN = 11;
/// The VI (or CQ, or ptag) is in the wrong state for the call.
pub const VIP_INVALID_STATE: VIP_RETURN = 12;
/// The name service failed or does not know the name or address.
pub const VIP_ERROR_NAMESERVICE: VIP_RETURN = 13;
/// No listener matched the connection request.
pub const VIP_NO_MATCH: VIP_RETURN = 14;

// ---------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------

/// `VIP_DESCRIPTOR_ALIGNMENT`.
pub const VIP_DESCRIPTOR_ALIGNMENT: usize = descriptor::ALIGNMENT;

/// `VIP_CONTROL_SEGMENT`.
pub type VIP_CONTROL_SEGMENT = descriptor::ControlSegment;
/// `VIP_DATA_SEGMENT`.
pub type VIP_DATA_SEGMENT = descriptor::DataSegment;
/// `VIP_ADDRESS_SEGMENT`.
pub type VIP_ADDRESS_SEGMENT = descriptor::AddressSegment;
/// `VIP_DESCRIPTOR`.
///
/// The Rust type is 64-aligned for the descriptors Rust allocates itself;
/// the C type is only 8-aligned, so a `*mut VIP_DESCRIPTOR` received from C
/// must be checked for [`VIP_DESCRIPTOR_ALIGNMENT`] before it is
/// dereferenced. Both are 64 bytes.
pub type VIP_DESCRIPTOR = descriptor::Descriptor;

/// `VIP_DESCRIPTOR_SEGMENT`: a segment seen as remote (RDMA address) or
/// local (data). `descriptor::Descriptor` stores segments as
/// `DataSegment`; both views have the same layout.
#[repr(C)]
#[derive(Clone, Copy)]
pub union VIP_DESCRIPTOR_SEGMENT {
    /// The remote buffer of an RDMA operation (first segment).
    pub Remote: VIP_ADDRESS_SEGMENT,
    /// A local buffer.
    pub Local: VIP_DATA_SEGMENT,
}

/// `VIP_CONTROL_OP_SENDRECV`.
pub const VIP_CONTROL_OP_SENDRECV: VIP_UINT16 = descriptor::control::OP_SENDRECV;
/// `VIP_CONTROL_OP_RDMAWRITE`.
pub const VIP_CONTROL_OP_RDMAWRITE: VIP_UINT16 = descriptor::control::OP_RDMAWRITE;
/// `VIP_CONTROL_OP_RDMAREAD`.
pub const VIP_CONTROL_OP_RDMAREAD: VIP_UINT16 = descriptor::control::OP_RDMAREAD;
/// `VIP_CONTROL_OP_RESERVED`.
pub const VIP_CONTROL_OP_RESERVED: VIP_UINT16 = descriptor::control::OP_RESERVED;
/// `VIP_CONTROL_OP_MASK`.
pub const VIP_CONTROL_OP_MASK: VIP_UINT16 = descriptor::control::OP_MASK;
/// `VIP_CONTROL_IMMEDIATE`.
pub const VIP_CONTROL_IMMEDIATE: VIP_UINT16 = descriptor::control::IMMEDIATE;
/// `VIP_CONTROL_QFENCE`.
pub const VIP_CONTROL_QFENCE: VIP_UINT16 = descriptor::control::QFENCE;
/// `VIP_CONTROL_RESERVED`.
pub const VIP_CONTROL_RESERVED: VIP_UINT16 = descriptor::control::RESERVED;

/// `VIP_STATUS_DONE`.
pub const VIP_STATUS_DONE: VIP_UINT32 = descriptor::status::DONE;
/// `VIP_STATUS_FORMAT_ERROR`.
pub const VIP_STATUS_FORMAT_ERROR: VIP_UINT32 = descriptor::status::FORMAT_ERROR;
/// `VIP_STATUS_PROTECTION_ERROR`.
pub const VIP_STATUS_PROTECTION_ERROR: VIP_UINT32 = descriptor::status::PROTECTION_ERROR;
/// `VIP_STATUS_LENGTH_ERROR`.
pub const VIP_STATUS_LENGTH_ERROR: VIP_UINT32 = descriptor::status::LENGTH_ERROR;
/// `VIP_STATUS_PARTIAL_ERROR`.
pub const VIP_STATUS_PARTIAL_ERROR: VIP_UINT32 = descriptor::status::PARTIAL_ERROR;
/// `VIP_STATUS_DESC_FLUSHED_ERROR`.
pub const VIP_STATUS_DESC_FLUSHED_ERROR: VIP_UINT32 = descriptor::status::DESC_FLUSHED_ERROR;
/// `VIP_STATUS_TRANSPORT_ERROR`.
pub const VIP_STATUS_TRANSPORT_ERROR: VIP_UINT32 = descriptor::status::TRANSPORT_ERROR;
/// `VIP_STATUS_RDMA_PROT_ERROR`.
pub const VIP_STATUS_RDMA_PROT_ERROR: VIP_UINT32 = descriptor::status::RDMA_PROT_ERROR;
/// `VIP_STATUS_REMOTE_DESC_ERROR`.
pub const VIP_STATUS_REMOTE_DESC_ERROR: VIP_UINT32 = descriptor::status::REMOTE_DESC_ERROR;
/// `VIP_STATUS_ERROR_MASK`.
pub const VIP_STATUS_ERROR_MASK: VIP_UINT32 = descriptor::status::ERROR_MASK;
/// `VIP_STATUS_OP_SEND`.
pub const VIP_STATUS_OP_SEND: VIP_UINT32 = descriptor::status::OP_SEND;
/// `VIP_STATUS_OP_RECEIVE`.
pub const VIP_STATUS_OP_RECEIVE: VIP_UINT32 = descriptor::status::OP_RECEIVE;
/// `VIP_STATUS_OP_RDMA_WRITE`.
pub const VIP_STATUS_OP_RDMA_WRITE: VIP_UINT32 = descriptor::status::OP_RDMA_WRITE;
/// `VIP_STATUS_OP_REMOTE_RDMA_WRITE`.
pub const VIP_STATUS_OP_REMOTE_RDMA_WRITE: VIP_UINT32 = descriptor::status::OP_REMOTE_RDMA_WRITE;
/// `VIP_STATUS_OP_RDMA_READ`.
pub const VIP_STATUS_OP_RDMA_READ: VIP_UINT32 = descriptor::status::OP_RDMA_READ;
/// `VIP_STATUS_OP_MASK`.
pub const VIP_STATUS_OP_MASK: VIP_UINT32 = descriptor::status::OP_MASK;
/// `VIP_STATUS_IMMEDIATE`.
pub const VIP_STATUS_IMMEDIATE: VIP_UINT32 = descriptor::status::IMMEDIATE;
/// `VIP_STATUS_RESERVED`.
pub const VIP_STATUS_RESERVED: VIP_UINT32 = descriptor::status::RESERVED;

// ---------------------------------------------------------------------------
// Addresses, attributes, states
// ---------------------------------------------------------------------------

/// `VIP_NET_ADDRESS`: the 4-byte header of a network address.
///
/// `HostAddressLen` bytes of host address follow from `HostAddress`, then
/// `DiscriminatorLen` bytes of discriminator; the application allocates
/// `size_of::<VIP_NET_ADDRESS>() + HostAddressLen + DiscriminatorLen`.
/// Read the bytes through the pointer to the whole allocation, never
/// through the one-element array.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VIP_NET_ADDRESS {
    /// Bytes of host address (written by the application or the name service).
    pub HostAddressLen: VIP_UINT16,
    /// Bytes of discriminator after the host address.
    pub DiscriminatorLen: VIP_UINT16,
    /// First byte of the host address.
    pub HostAddress: [VIP_UINT8; 1],
}

/// `VIP_NIC_ATTRIBUTES`: written by `VipQueryNic`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VIP_NIC_ATTRIBUTES {
    /// NUL-terminated NIC name.
    pub Name: [VIP_CHAR; 64],
    /// Hardware version.
    pub HardwareVersion: VIP_ULONG,
    /// Provider version.
    pub ProviderVersion: VIP_ULONG,
    /// Bytes at `LocalNicAddress`.
    pub NicAddressLen: VIP_UINT16,
    /// The NIC's host address; owned by the provider, valid while the NIC is open.
    pub LocalNicAddress: *const VIP_UINT8,
    /// Whether the provider is thread safe.
    pub ThreadSafe: VIP_BOOLEAN,
    /// Longest discriminator accepted by the connection calls.
    pub MaxDiscriminatorLen: VIP_UINT16,
    /// Most bytes registered at once.
    pub MaxRegisterBytes: VIP_ULONG,
    /// Most regions registered at once.
    pub MaxRegisterRegions: VIP_ULONG,
    /// Largest single region.
    pub MaxRegisterBlockBytes: VIP_ULONG,
    /// Most VIs.
    pub MaxVI: VIP_ULONG,
    /// Most outstanding descriptors per work queue.
    pub MaxDescriptorsPerQueue: VIP_ULONG,
    /// Most segments per descriptor.
    pub MaxSegmentsPerDesc: VIP_ULONG,
    /// Most CQs.
    pub MaxCQ: VIP_ULONG,
    /// Most entries per CQ.
    pub MaxCQEntries: VIP_ULONG,
    /// Largest `MaxTransferSize` of a VI.
    pub MaxTransferSize: VIP_ULONG,
    /// Native MTU of the transport.
    pub NativeMTU: VIP_ULONG,
    /// Most protection tags.
    pub MaxPtags: VIP_ULONG,
    /// Supported reliability levels (bit set).
    pub ReliabilityLevelSupport: VIP_RELIABILITY_LEVEL,
    /// Reliability levels on which RDMA read is supported (bit set).
    pub RDMAReadSupport: VIP_RELIABILITY_LEVEL,
}

/// `VIP_VI_ATTRIBUTES`: requested at creation, reported by queries and
/// by the connection calls for the remote VI.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VIP_VI_ATTRIBUTES {
    /// One `VIP_SERVICE_*` value.
    pub ReliabilityLevel: VIP_RELIABILITY_LEVEL,
    /// Most bytes per descriptor.
    pub MaxTransferSize: VIP_ULONG,
    /// Ignored.
    pub QoS: VIP_QOS,
    /// Protection tag of the VI.
    pub Ptag: VIP_PROTECTION_HANDLE,
    /// Accept incoming RDMA writes.
    pub EnableRdmaWrite: VIP_BOOLEAN,
    /// Accept incoming RDMA reads.
    pub EnableRdmaRead: VIP_BOOLEAN,
}

/// `VIP_MEM_ATTRIBUTES`: attributes of a registered region.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VIP_MEM_ATTRIBUTES {
    /// Protection tag of the region.
    pub Ptag: VIP_PROTECTION_HANDLE,
    /// Remote VIs may RDMA-write into the region.
    pub EnableRdmaWrite: VIP_BOOLEAN,
    /// Remote VIs may RDMA-read from the region.
    pub EnableRdmaRead: VIP_BOOLEAN,
}

/// `VIP_VI_STATE`: the C enum, as `u32` (see the module doc).
pub type VIP_VI_STATE = u32;
/// Not connected.
pub const VIP_STATE_IDLE: VIP_VI_STATE = 0;
/// Connected.
pub const VIP_STATE_CONNECTED: VIP_VI_STATE = 1;
/// A peer connection request is pending.
pub const VIP_STATE_CONNECT_PENDING: VIP_VI_STATE = 2;
/// The connection broke; `VipDisconnect` returns the VI to idle.
pub const VIP_STATE_ERROR: VIP_VI_STATE = 3;

// ---------------------------------------------------------------------------
// Asynchronous errors
// ---------------------------------------------------------------------------

/// `VIP_RESOURCE_CODE`: the C enum, as `u32`.
pub type VIP_RESOURCE_CODE = u32;
/// The error concerns the NIC.
pub const VIP_RESOURCE_NIC: VIP_RESOURCE_CODE = 0;
/// The error concerns a VI.
pub const VIP_RESOURCE_VI: VIP_RESOURCE_CODE = 1;
/// The error concerns a CQ.
pub const VIP_RESOURCE_CQ: VIP_RESOURCE_CODE = 2;
/// The error concerns a descriptor.
pub const VIP_RESOURCE_DESCRIPTOR: VIP_RESOURCE_CODE = 3;

/// `VIP_ERROR_CODE`: the C enum, as `u32`.
pub type VIP_ERROR_CODE = u32;
/// A posted descriptor was invalid.
pub const VIP_ERROR_POST_DESC: VIP_ERROR_CODE = 0;
/// The connection was lost.
pub const VIP_ERROR_CONN_LOST: VIP_ERROR_CODE = 1;
/// A message found no posted receive descriptor.
pub const VIP_ERROR_RECVQ_EMPTY: VIP_ERROR_CODE = 2;
/// A VI overran.
pub const VIP_ERROR_VI_OVERRUN: VIP_ERROR_CODE = 3;
/// RDMA write protection violation.
pub const VIP_ERROR_RDMAW_PROT: VIP_ERROR_CODE = 4;
/// RDMA write data error.
pub const VIP_ERROR_RDMAW_DATA: VIP_ERROR_CODE = 5;
/// RDMA write aborted.
pub const VIP_ERROR_RDMAW_ABORT: VIP_ERROR_CODE = 6;
/// RDMA read protection violation.
pub const VIP_ERROR_RDMAR_PROT: VIP_ERROR_CODE = 7;
/// Completion protection violation.
pub const VIP_ERROR_COMP_PROT: VIP_ERROR_CODE = 8;
/// RDMA transport error.
pub const VIP_ERROR_RDMA_TRANSPORT: VIP_ERROR_CODE = 9;
/// Catastrophic NIC error.
pub const VIP_ERROR_CATASTROPHIC: VIP_ERROR_CODE = 10;

/// `VIP_ERROR_DESCRIPTOR`: built by the provider and passed to the error
/// callback; fields that do not apply are NULL.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VIP_ERROR_DESCRIPTOR {
    /// The NIC.
    pub NicHandle: VIP_NIC_HANDLE,
    /// The VI, if the error concerns one.
    pub ViHandle: VIP_VI_HANDLE,
    /// The CQ, if the error concerns one.
    pub CQHandle: VIP_CQ_HANDLE,
    /// The descriptor, if the error concerns one (the application's pointer).
    pub DescriptorPtr: *mut VIP_DESCRIPTOR,
    /// The operation of the descriptor (`VIP_CONTROL_OP_*`).
    pub OpCode: VIP_ULONG,
    /// Which kind of object the error concerns.
    pub ResourceCode: VIP_RESOURCE_CODE,
    /// What went wrong.
    pub ErrorCode: VIP_ERROR_CODE,
}

// ---------------------------------------------------------------------------
// System management
// ---------------------------------------------------------------------------

/// `VIP_SMI_AUTODISCOVERY`: `InfoType` of `VipQuerySystemManagementInfo`.
pub const VIP_SMI_AUTODISCOVERY: VIP_ULONG = 1;

/// `VIP_AUTODISCOVERY_LIST`: the `Info` of [`VIP_SMI_AUTODISCOVERY`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VIP_AUTODISCOVERY_LIST {
    /// Hops to search (set by the application).
    pub NumberOfHops: VIP_ULONG,
    /// Array of address pointers supplied by the application.
    pub ADAddrArray: *mut *mut VIP_NET_ADDRESS,
    /// Entries in `ADAddrArray`.
    pub NumAdAddrs: VIP_ULONG,
}

// ---------------------------------------------------------------------------
// Callbacks
// ---------------------------------------------------------------------------

/// `VIP_ERROR_HANDLER`: the handler of `VipErrorCallback`.
pub type VIP_ERROR_HANDLER =
    Option<unsafe extern "C" fn(Context: VIP_PVOID, ErrorDesc: *mut VIP_ERROR_DESCRIPTOR)>;

/// `VIP_NOTIFY_HANDLER`: the handler of `VipSendNotify` and `VipRecvNotify`,
/// run once per completed (and already dequeued) descriptor.
pub type VIP_NOTIFY_HANDLER = Option<
    unsafe extern "C" fn(
        Context: VIP_PVOID,
        NicHandle: VIP_NIC_HANDLE,
        ViHandle: VIP_VI_HANDLE,
        Descriptor: *mut VIP_DESCRIPTOR,
    ),
>;

/// `VIP_CQ_NOTIFY_HANDLER`: the handler of `VipCQNotify`, run once per
/// completion with the VI and whether it is its receive queue.
pub type VIP_CQ_NOTIFY_HANDLER = Option<
    unsafe extern "C" fn(
        Context: VIP_PVOID,
        NicHandle: VIP_NIC_HANDLE,
        ViHandle: VIP_VI_HANDLE,
        RecvQueue: VIP_BOOLEAN,
    ),
>;

// ---------------------------------------------------------------------------
// Layout: the numbers of tests/c/layout_table.h (LP64 Linux)
// ---------------------------------------------------------------------------

/// Pins the type of each listed field: a mismatch is a type error. Sizes and
/// offsets alone miss a field whose new type still fits in the padding after
/// it (e.g. `NicAddressLen` widened to 8 bytes), and reading such a field
/// would pick up the padding bytes C leaves undefined. (The descriptor types
/// have no padding, so their size and offset asserts suffice.)
macro_rules! field_types {
    ($s:ty { $($f:ident: $t:ty),* $(,)? }) => {
        $(const _: fn(&$s) -> &$t = |s| &s.$f;)*
    };
}

field_types!(VIP_NET_ADDRESS {
    HostAddressLen: VIP_UINT16,
    DiscriminatorLen: VIP_UINT16,
    HostAddress: [VIP_UINT8; 1],
});
field_types!(VIP_NIC_ATTRIBUTES {
    Name: [VIP_CHAR; 64],
    HardwareVersion: VIP_ULONG,
    ProviderVersion: VIP_ULONG,
    NicAddressLen: VIP_UINT16,
    LocalNicAddress: *const VIP_UINT8,
    ThreadSafe: VIP_BOOLEAN,
    MaxDiscriminatorLen: VIP_UINT16,
    MaxRegisterBytes: VIP_ULONG,
    MaxRegisterRegions: VIP_ULONG,
    MaxRegisterBlockBytes: VIP_ULONG,
    MaxVI: VIP_ULONG,
    MaxDescriptorsPerQueue: VIP_ULONG,
    MaxSegmentsPerDesc: VIP_ULONG,
    MaxCQ: VIP_ULONG,
    MaxCQEntries: VIP_ULONG,
    MaxTransferSize: VIP_ULONG,
    NativeMTU: VIP_ULONG,
    MaxPtags: VIP_ULONG,
    ReliabilityLevelSupport: VIP_RELIABILITY_LEVEL,
    RDMAReadSupport: VIP_RELIABILITY_LEVEL,
});
field_types!(VIP_VI_ATTRIBUTES {
    ReliabilityLevel: VIP_RELIABILITY_LEVEL,
    MaxTransferSize: VIP_ULONG,
    QoS: VIP_QOS,
    Ptag: VIP_PROTECTION_HANDLE,
    EnableRdmaWrite: VIP_BOOLEAN,
    EnableRdmaRead: VIP_BOOLEAN,
});
field_types!(VIP_MEM_ATTRIBUTES {
    Ptag: VIP_PROTECTION_HANDLE,
    EnableRdmaWrite: VIP_BOOLEAN,
    EnableRdmaRead: VIP_BOOLEAN,
});
field_types!(VIP_ERROR_DESCRIPTOR {
    NicHandle: VIP_NIC_HANDLE,
    ViHandle: VIP_VI_HANDLE,
    CQHandle: VIP_CQ_HANDLE,
    DescriptorPtr: *mut VIP_DESCRIPTOR,
    OpCode: VIP_ULONG,
    ResourceCode: VIP_RESOURCE_CODE,
    ErrorCode: VIP_ERROR_CODE,
});
field_types!(VIP_AUTODISCOVERY_LIST {
    NumberOfHops: VIP_ULONG,
    ADAddrArray: *mut *mut VIP_NET_ADDRESS,
    NumAdAddrs: VIP_ULONG,
});

const _: () = {
    // The whole ABI assumes LP64; fail loudly anywhere else.
    assert!(size_of::<VIP_ULONG>() == 8, "vipl.h layouts assume LP64");
    assert!(size_of::<VIP_PVOID>() == 8, "vipl.h layouts assume LP64");

    assert!(size_of::<VIP_BOOLEAN>() == 4);
    assert!(size_of::<VIP_USHORT>() == 2);
    assert!(size_of::<VIP_MEM_HANDLE>() == 4);
    assert!(size_of::<VIP_RELIABILITY_LEVEL>() == 2);
    assert!(size_of::<VIP_RETURN>() == 4);
    assert!(size_of::<VIP_VI_STATE>() == 4);
    assert!(size_of::<VIP_RESOURCE_CODE>() == 4);
    assert!(size_of::<VIP_ERROR_CODE>() == 4);
    // A nullable function pointer is one pointer.
    assert!(size_of::<VIP_ERROR_HANDLER>() == 8);
    assert!(size_of::<VIP_NOTIFY_HANDLER>() == 8);
    assert!(size_of::<VIP_CQ_NOTIFY_HANDLER>() == 8);

    assert!(size_of::<VIP_PVOID64>() == 8);
    assert!(align_of::<VIP_PVOID64>() == 8);
    assert!(offset_of!(VIP_PVOID64, AddressBits) == 0);
    assert!(offset_of!(VIP_PVOID64, Address) == 0);
    assert!(size_of::<VIP_PVOID64>() == size_of::<descriptor::Addr64>());
    assert!(align_of::<VIP_PVOID64>() == align_of::<descriptor::Addr64>());

    // The aliased descriptor types (fields pinned in descriptor.rs).
    assert!(size_of::<VIP_CONTROL_SEGMENT>() == 32);
    assert!(align_of::<VIP_CONTROL_SEGMENT>() == 8);
    assert!(size_of::<VIP_DATA_SEGMENT>() == 16);
    assert!(align_of::<VIP_DATA_SEGMENT>() == 8);
    assert!(size_of::<VIP_ADDRESS_SEGMENT>() == 16);
    assert!(align_of::<VIP_ADDRESS_SEGMENT>() == 8);
    assert!(offset_of!(VIP_ADDRESS_SEGMENT, data) == 0);
    assert!(offset_of!(VIP_DATA_SEGMENT, data) == 0);
    assert!(size_of::<VIP_DESCRIPTOR>() == 64);
    assert!(offset_of!(VIP_DESCRIPTOR, cs) == 0);
    assert!(offset_of!(VIP_DESCRIPTOR, ds) == 32);

    assert!(size_of::<VIP_DESCRIPTOR_SEGMENT>() == 16);
    assert!(align_of::<VIP_DESCRIPTOR_SEGMENT>() == 8);
    assert!(offset_of!(VIP_DESCRIPTOR_SEGMENT, Remote) == 0);
    assert!(offset_of!(VIP_DESCRIPTOR_SEGMENT, Local) == 0);
    assert!(size_of::<VIP_DESCRIPTOR_SEGMENT>() == descriptor::SEGMENT_SIZE);

    assert!(size_of::<VIP_NET_ADDRESS>() == 6);
    assert!(align_of::<VIP_NET_ADDRESS>() == 2);
    assert!(offset_of!(VIP_NET_ADDRESS, HostAddressLen) == 0);
    assert!(offset_of!(VIP_NET_ADDRESS, DiscriminatorLen) == 2);
    assert!(offset_of!(VIP_NET_ADDRESS, HostAddress) == 4);

    assert!(size_of::<VIP_NIC_ATTRIBUTES>() == 200);
    assert!(align_of::<VIP_NIC_ATTRIBUTES>() == 8);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, Name) == 0);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, HardwareVersion) == 64);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, ProviderVersion) == 72);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, NicAddressLen) == 80);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, LocalNicAddress) == 88);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, ThreadSafe) == 96);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxDiscriminatorLen) == 100);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxRegisterBytes) == 104);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxRegisterRegions) == 112);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxRegisterBlockBytes) == 120);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxVI) == 128);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxDescriptorsPerQueue) == 136);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxSegmentsPerDesc) == 144);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxCQ) == 152);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxCQEntries) == 160);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxTransferSize) == 168);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, NativeMTU) == 176);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, MaxPtags) == 184);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, ReliabilityLevelSupport) == 192);
    assert!(offset_of!(VIP_NIC_ATTRIBUTES, RDMAReadSupport) == 194);

    assert!(size_of::<VIP_VI_ATTRIBUTES>() == 40);
    assert!(align_of::<VIP_VI_ATTRIBUTES>() == 8);
    assert!(offset_of!(VIP_VI_ATTRIBUTES, ReliabilityLevel) == 0);
    assert!(offset_of!(VIP_VI_ATTRIBUTES, MaxTransferSize) == 8);
    assert!(offset_of!(VIP_VI_ATTRIBUTES, QoS) == 16);
    assert!(offset_of!(VIP_VI_ATTRIBUTES, Ptag) == 24);
    assert!(offset_of!(VIP_VI_ATTRIBUTES, EnableRdmaWrite) == 32);
    assert!(offset_of!(VIP_VI_ATTRIBUTES, EnableRdmaRead) == 36);

    assert!(size_of::<VIP_MEM_ATTRIBUTES>() == 16);
    assert!(align_of::<VIP_MEM_ATTRIBUTES>() == 8);
    assert!(offset_of!(VIP_MEM_ATTRIBUTES, Ptag) == 0);
    assert!(offset_of!(VIP_MEM_ATTRIBUTES, EnableRdmaWrite) == 8);
    assert!(offset_of!(VIP_MEM_ATTRIBUTES, EnableRdmaRead) == 12);

    assert!(size_of::<VIP_ERROR_DESCRIPTOR>() == 48);
    assert!(align_of::<VIP_ERROR_DESCRIPTOR>() == 8);
    assert!(offset_of!(VIP_ERROR_DESCRIPTOR, NicHandle) == 0);
    assert!(offset_of!(VIP_ERROR_DESCRIPTOR, ViHandle) == 8);
    assert!(offset_of!(VIP_ERROR_DESCRIPTOR, CQHandle) == 16);
    assert!(offset_of!(VIP_ERROR_DESCRIPTOR, DescriptorPtr) == 24);
    assert!(offset_of!(VIP_ERROR_DESCRIPTOR, OpCode) == 32);
    assert!(offset_of!(VIP_ERROR_DESCRIPTOR, ResourceCode) == 40);
    assert!(offset_of!(VIP_ERROR_DESCRIPTOR, ErrorCode) == 44);

    assert!(size_of::<VIP_AUTODISCOVERY_LIST>() == 24);
    assert!(align_of::<VIP_AUTODISCOVERY_LIST>() == 8);
    assert!(offset_of!(VIP_AUTODISCOVERY_LIST, NumberOfHops) == 0);
    assert!(offset_of!(VIP_AUTODISCOVERY_LIST, ADAddrArray) == 8);
    assert!(offset_of!(VIP_AUTODISCOVERY_LIST, NumAdAddrs) == 16);

    // Constants whose value is the ABI, where they are not literals above.
    assert!(VIP_DESCRIPTOR_ALIGNMENT == 64);
    assert!(VIP_STATUS_ERROR_MASK == 0x1FE);
    assert!(VIP_STATUS_RESERVED == 0xFFF0_FE00);
    assert!(VIP_CONTROL_RESERVED == 0xFFF0);
};
