//! The VIA descriptor as it lies in application memory.
//!
//! A descriptor is a 32-byte control segment followed by `SegCount` 16-byte
//! segments; for RDMA the first segment is the remote address segment.
//! These layouts are binary-visible to C programs (`VIP_DESCRIPTOR` in
//! `include/vipl.h`), so they are pinned by `const` assertions here and by
//! `_Static_assert`s in the C layout test.
#![forbid(unsafe_code)]

use core::mem::{align_of, offset_of, size_of};

/// Descriptors must start on this boundary (`VIP_DESCRIPTOR_ALIGNMENT`).
pub const ALIGNMENT: usize = 64;

/// A 64-bit address field (`VIP_PVOID64`): the union of a pointer and its bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Addr64 {
    /// The address as an integer (`AddressBits`).
    pub bits: u64,
}

/// `VIP_CONTROL_SEGMENT`: the first 32 bytes of every descriptor.
///
/// The application writes `next`..`length` before posting; the provider
/// writes `length` (receives), `immediate_data` (receives) and `status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ControlSegment {
    /// Link to the next descriptor (application use only).
    pub next: Addr64,
    /// Memory handle of `next` (application use only).
    pub next_handle: u32,
    /// Number of segments that follow the control segment.
    pub seg_count: u16,
    /// Operation and flags, see [`control`].
    pub control: u16,
    /// Reserved, ignored.
    pub reserved: u32,
    /// Immediate data: sent from a send descriptor, received into a receive one.
    pub immediate_data: u32,
    /// Total bytes on send; bytes received, written by the provider, on receive.
    pub length: u32,
    /// Completion status, written last by the provider, see [`status`].
    pub status: u32,
}

/// `VIP_DATA_SEGMENT`: a local buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DataSegment {
    /// Virtual address of the buffer.
    pub data: Addr64,
    /// Memory handle of the region that holds the buffer.
    pub handle: u32,
    /// Bytes in this segment.
    pub length: u32,
}

/// `VIP_ADDRESS_SEGMENT`: the remote buffer of an RDMA operation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AddressSegment {
    /// Virtual address in the remote process.
    pub data: Addr64,
    /// Memory handle of the remote region.
    pub handle: u32,
    /// Reserved, ignored.
    pub reserved: u32,
}

/// `VIP_DESCRIPTOR`: control segment plus the first two segments. Real
/// descriptors carry `seg_count` segments; the type only fixes the prefix.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Descriptor {
    /// The control segment.
    pub cs: ControlSegment,
    /// The first two segments (either `DataSegment` or `AddressSegment`, same size).
    pub ds: [DataSegment; 2],
}

/// Byte offsets of the fields the provider writes, used by the engine when it
/// writes through a mapping of another process's memory.
pub mod offsets {
    use super::*;
    /// `CS.SegCount` (a `u16`; `CS.Control` is the `u16` after it, so one
    /// 32-bit load at this offset reads both, count in the low half on a
    /// little-endian machine).
    pub const SEG_COUNT: usize = offset_of!(ControlSegment, seg_count);
    /// `CS.Control`.
    pub const CONTROL: usize = offset_of!(ControlSegment, control);
    /// `CS.ImmediateData`.
    pub const IMMEDIATE_DATA: usize = offset_of!(ControlSegment, immediate_data);
    /// `CS.Length`.
    pub const LENGTH: usize = offset_of!(ControlSegment, length);
    /// `CS.Status`.
    pub const STATUS: usize = offset_of!(ControlSegment, status);
    /// First segment.
    pub const SEGMENTS: usize = size_of::<ControlSegment>();
}

/// Most segments one descriptor may have (`MaxSegmentsPerDesc`).
pub const MAX_SEGMENTS: usize = 16;

/// Size of one segment (data or address).
pub const SEGMENT_SIZE: usize = size_of::<DataSegment>();

/// `CS.Control` bits.
pub mod control {
    /// Send/receive.
    pub const OP_SENDRECV: u16 = 0x0;
    /// RDMA write.
    pub const OP_RDMAWRITE: u16 = 0x1;
    /// RDMA read.
    pub const OP_RDMAREAD: u16 = 0x2;
    /// Reserved operation code.
    pub const OP_RESERVED: u16 = 0x3;
    /// Operation mask.
    pub const OP_MASK: u16 = 0x3;
    /// Immediate data present.
    pub const IMMEDIATE: u16 = 0x4;
    /// Queue fence: wait for earlier RDMA reads.
    pub const QFENCE: u16 = 0x8;
    /// Reserved bits; must be zero.
    pub const RESERVED: u16 = 0xFFF0;
}

/// `CS.Status` bits.
pub mod status {
    /// The descriptor has completed (successfully or not).
    pub const DONE: u32 = 0x1;
    /// Malformed descriptor.
    pub const FORMAT_ERROR: u32 = 0x2;
    /// Local protection violation.
    pub const PROTECTION_ERROR: u32 = 0x4;
    /// Length violation.
    pub const LENGTH_ERROR: u32 = 0x8;
    /// Partial transfer.
    pub const PARTIAL_ERROR: u32 = 0x10;
    /// Flushed: the VI left the connected state before the descriptor ran.
    pub const DESC_FLUSHED_ERROR: u32 = 0x20;
    /// Transport error.
    pub const TRANSPORT_ERROR: u32 = 0x40;
    /// Remote RDMA protection violation.
    pub const RDMA_PROT_ERROR: u32 = 0x80;
    /// The remote side had no usable descriptor.
    pub const REMOTE_DESC_ERROR: u32 = 0x100;
    /// All error bits.
    pub const ERROR_MASK: u32 = 0x1FE;
    /// Operation: send.
    pub const OP_SEND: u32 = 0x0;
    /// Operation: receive.
    pub const OP_RECEIVE: u32 = 0x10000;
    /// Operation: RDMA write (initiator).
    pub const OP_RDMA_WRITE: u32 = 0x20000;
    /// Operation: RDMA write with immediate data, seen by the target's receive.
    pub const OP_REMOTE_RDMA_WRITE: u32 = 0x30000;
    /// Operation: RDMA read.
    pub const OP_RDMA_READ: u32 = 0x40000;
    /// Operation mask.
    pub const OP_MASK: u32 = 0x70000;
    /// Immediate data was delivered.
    pub const IMMEDIATE: u32 = 0x80000;
    /// Reserved bits.
    pub const RESERVED: u32 = 0xFFF0FE00;
}

const _: () = {
    assert!(size_of::<Addr64>() == 8);
    assert!(size_of::<ControlSegment>() == 32);
    assert!(offset_of!(ControlSegment, next) == 0);
    assert!(offset_of!(ControlSegment, next_handle) == 8);
    assert!(offset_of!(ControlSegment, seg_count) == 12);
    assert!(offset_of!(ControlSegment, control) == 14);
    assert!(offset_of!(ControlSegment, reserved) == 16);
    assert!(offset_of!(ControlSegment, immediate_data) == 20);
    assert!(offset_of!(ControlSegment, length) == 24);
    assert!(offset_of!(ControlSegment, status) == 28);
    assert!(size_of::<DataSegment>() == 16);
    assert!(offset_of!(DataSegment, data) == 0);
    assert!(offset_of!(DataSegment, handle) == 8);
    assert!(offset_of!(DataSegment, length) == 12);
    assert!(size_of::<AddressSegment>() == 16);
    assert!(offset_of!(AddressSegment, handle) == 8);
    assert!(offset_of!(AddressSegment, reserved) == 12);
    assert!(size_of::<Descriptor>() == 64);
    assert!(align_of::<Descriptor>() == ALIGNMENT);
};
