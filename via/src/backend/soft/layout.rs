//! Layout of the soft NIC's shared segment.
//!
//! One memfd per open NIC, mapped by its owner and by every process with a
//! VI connected to it. Everything here is `#[repr(C)]` atomics (so another
//! process writing concurrently is not a data race) and all-zero is the
//! initial state of every field. Readers in other processes treat every
//! value as untrusted: indices are range-checked by the accessors below and
//! lengths by the engine.
//!
//! | part | offset | written by | read by |
//! |---|---|---|---|
//! | [`NicHeader`] | 0 | owner, at creation | peers, at attach |
//! | provider `notify` word | in the header | owner waits | anyone notifies |
//! | async error ring | `errors_off` | remote engines, owner | owner's provider thread |
//! | [`ViShared`] × [`MAX_VI`] | `vi_off` | owner | peers' engines |
//! | [`CqShared`] × [`MAX_CQ`] | `cq_off` | owner | peers' engines |
//! | [`TptEntry`] × [`MAX_REGIONS`] | `tpt_off` | owner (seqlock) | peers' engines |
//! | handle slots: `AtomicU32` × [`MAX_REGIONS`] (the entry of each handle's low 16 bits) | after the table | owner | peers' engines |
//! | [`RecvSlot`] × [`RQ_SLOTS`] per VI | `rq_off` | owner posts; the connected peer's engine takes | both |
//!
//! The only `unsafe` of the soft NIC: the `Shared`/`Plain` impls that let
//! these types live in a mapping (each with its `SAFETY` argument), and
//! [`NicView::entry`], which views a table entry of a [`Segment`] checked
//! once, so that each access checks only its index.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use doorbell::EventCount;

use crate::shm::mapping::{Mapping, Shared};
use crate::translate::SendWr;

/// "VIANIC" + layout generation, first word of the segment.
pub const NIC_MAGIC: u64 = u64::from_le_bytes(*b"VIANIC\x00\x01");
/// Layout version; bumped on any change below, and on a change of the
/// protocols on it (5: the wake-up handshake of the event counts is
/// asymmetric, `doorbell::asymmetric`; a waiter of version 4 would fence
/// without the barrier the new notifiers rely on, and miss wake-ups).
pub const VERSION: u32 = 5;
/// VIs per NIC.
pub const MAX_VI: u32 = 1024;
/// Receive descriptors outstanding per VI (`MaxDescriptorsPerQueue`).
pub const RQ_SLOTS: u32 = 1024;
/// Data segments per descriptor (`MaxSegmentsPerDesc`).
pub const MAX_SEGS: usize = crate::descriptor::MAX_SEGMENTS;
/// Translation table entries; index 0 is never used, so no handle is 0.
pub const MAX_REGIONS: u32 = 65536;
/// Backing extents per region.
pub const MAX_EXTENTS: usize = 8;
/// Completion queues per NIC.
pub const MAX_CQ: u32 = 1024;
/// Capacity of the asynchronous error ring.
pub const ERROR_RING: u32 = 1024;
/// Largest payload a send may carry inside its doorbell entry.
pub const MAX_INLINE: usize = crate::config::MAX_INLINE;
/// Capacity of the central doorbell.
pub const DOORBELL_SLOTS: u32 = 4096;
/// Capacity of each per-VI doorbell.
pub const VI_DOORBELL_SLOTS: u32 = 1024;

// SAFETY: EventCount is #[repr(C, align(64))], made of atomics, and all-zero
// is its initial state (doorbell's documented contract).
unsafe impl Shared for EventCount {}

/// First page of the segment.
#[repr(C, align(64))]
pub struct NicHeader {
    /// [`NIC_MAGIC`].
    pub magic: AtomicU64,
    /// [`VERSION`].
    pub version: AtomicU32,
    /// Owner's process id (for cross-memory attach).
    pub pid: AtomicU32,
    /// Owner's viad session.
    pub session: AtomicU64,
    /// NIC id within the owner's session.
    pub nic_id: AtomicU32,
    /// Bumped whenever the owner retires an arena: peers then drop their
    /// translations of the owner's regions that changed, which releases
    /// their mappings of retired arenas.
    pub retired: AtomicU32,
    /// Offset of the error ring.
    pub errors_off: AtomicU64,
    /// Offset of the VI table.
    pub vi_off: AtomicU64,
    /// Offset of the CQ table.
    pub cq_off: AtomicU64,
    /// Offset of the translation table.
    pub tpt_off: AtomicU64,
    /// Offset of the receive rings.
    pub rq_off: AtomicU64,
    /// Total length of the segment.
    pub len: AtomicU64,
    _pad: [AtomicU64; 6],
    /// Wakes the owner's provider thread (Notify, async errors).
    pub notify: EventCount,
}

/// Bits of [`ViShared::flags`] and [`TptEntry::flags`].
pub use crate::nic::flags;

/// What a peer's engine needs to know about one of the owner's VIs.
#[repr(C, align(64))]
pub struct ViShared {
    /// Generation of the VI occupying this slot (0 = free).
    pub generation: AtomicU32,
    /// Reliability level bits.
    pub reliability: AtomicU32,
    /// [`flags`] of the VI (RDMA enables).
    pub flags: AtomicU32,
    /// Protection tag id.
    pub ptag: AtomicU32,
    /// Receive CQ index + 1 (0 = none).
    pub recv_cq: AtomicU32,
    /// Send CQ index + 1 (0 = none).
    pub send_cq: AtomicU32,
    /// `completion::interest` bits, read by completers after each completion.
    pub interest: AtomicU32,
    /// The generation of this slot's VI when the peer's engine found its
    /// reliable connection broken (0 = not): written before the failed
    /// receive status it then writes, so that the owner, seeing that
    /// status, finds the VI in ERROR (`Device::broken_by_peer`) and its
    /// engine runs no more requests of it (they are flushed) while the
    /// break itself is still on its way through the error ring. Cleared by
    /// the owner when the VI connects.
    pub broken: AtomicU32,
    _pad: [AtomicU32; 8],
    /// Access epoch: odd while the connected peer's engine is inside an
    /// operation that touches this process's memory for this VI (see
    /// `NicInner::quiesce_accessors`). Written by that engine only, at every
    /// operation, and read by the owner only when it deregisters: on a line
    /// of its own, so that the write (and the fence after it) is a cache hit
    /// rather than taking the line from the owner, who reads the fields
    /// above at each of its own completions.
    pub access: AccessEpoch,
    /// Sleepers in `VipRecvWait` on this VI.
    pub recv_wake: EventCount,
    /// Sleepers in `VipSendWait` on this VI.
    pub send_wake: EventCount,
}

/// [`ViShared::access`]: one counter alone on its cache line.
#[repr(C, align(64))]
pub struct AccessEpoch(pub AtomicU32);

impl std::ops::Deref for AccessEpoch {
    type Target = AtomicU32;
    fn deref(&self) -> &AtomicU32 {
        &self.0
    }
}

/// What a peer's engine needs to know about one of the owner's CQs.
#[repr(C, align(64))]
pub struct CqShared {
    /// Generation of the CQ ring file (changes on resize); 0 = no CQ.
    pub generation: AtomicU32,
    /// 0 = entry ring (CQ1), 1 = scan (CQ2, no ring: completers only wake).
    pub mode: AtomicU32,
    /// A Notify handler waits on this CQ.
    pub interest: AtomicU32,
    _pad: [AtomicU32; 13],
    /// Sleepers in `VipCQWait`.
    pub wake: EventCount,
}

/// One backing extent of a region: `len` bytes at virtual address `va` live
/// in `arena` at `arena_off` (`arena == CMA`: reached by cross-memory attach
/// at the owner's virtual address). Extents are whole pages, so the first
/// may start before the region.
#[repr(C)]
pub struct TptExtent {
    /// First virtual address.
    pub va: AtomicU64,
    /// Bytes.
    pub len: AtomicU64,
    /// Arena id, or `shm::arena::CMA`.
    pub arena: AtomicU32,
    _pad: AtomicU32,
    /// Offset in the arena file.
    pub arena_off: AtomicU64,
}

/// One translation and protection table entry (a registered region).
///
/// Written only by the owner under a seqlock: `seq` is odd while the entry
/// changes. Readers copy the fields and retry if `seq` changed.
#[repr(C, align(64))]
pub struct TptEntry {
    /// Seqlock counter.
    pub seq: AtomicU32,
    /// `VALID` (bit 31) while the entry holds a live region.
    pub check: AtomicU32,
    /// [`flags`] (RDMA enables) of the region.
    pub flags: AtomicU32,
    /// Protection tag id.
    pub ptag: AtomicU32,
    /// First virtual address of the region.
    pub va: AtomicU64,
    /// Length of the region.
    pub len: AtomicU64,
    /// Extents in use.
    pub n_extents: AtomicU32,
    /// The full memory handle of the region (its low 16 bits are this
    /// entry's index); a handle matches only its own registration.
    pub handle: AtomicU32,
    _pad: [AtomicU32; 6],
    /// Backing extents, in address order.
    pub extents: [TptExtent; MAX_EXTENTS],
}

/// One data segment of a pre-translated receive descriptor: `len` bytes at
/// `off` in the region of `handle`.
#[repr(C)]
pub struct RecvSeg {
    /// Offset in the region.
    pub off: AtomicU64,
    /// Bytes.
    pub len: AtomicU32,
    /// Memory handle of the region.
    pub handle: AtomicU32,
}

/// A posted receive descriptor, pre-translated by the owner at post time.
///
/// `seq` encodes `position * 4 + state` (see [`slot`]). The header and the
/// first segment share the first cache line, so a one-segment receive costs
/// the consumer one line.
#[repr(C, align(64))]
pub struct RecvSlot {
    /// Ring position and state.
    pub seq: AtomicU64,
    /// Offset of the user descriptor in the region of `desc_handle`.
    pub desc_off: AtomicU64,
    /// Memory handle covering the user descriptor.
    pub desc_handle: AtomicU32,
    /// Segments in use.
    pub seg_count: AtomicU32,
    /// Sum of the segment lengths.
    pub capacity: AtomicU32,
    _pad: AtomicU32,
    /// Segments.
    pub segs: [RecvSeg; MAX_SEGS],
}

/// A doorbell entry: a work request, and its payload when it is carried
/// inline (`VIA_INLINE`: copied at post time, so the engine never reads the
/// sender's buffer).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SendPd {
    /// The validated request.
    pub wr: SendWr,
    /// Bytes of payload carried in `inline` (0 = use the segments).
    pub inline_len: u32,
    _pad: u32,
    /// Inline payload.
    pub inline: [u8; MAX_INLINE],
}

// SAFETY: #[repr(C)] of integers and arrays of integers with no padding
// (`SendWr` is documented so): every bit pattern is a valid value and
// there are no pointers.
unsafe impl doorbell::Plain for SendPd {}

impl SendPd {
    /// The entry of `wr`, without payload.
    pub fn new(wr: &SendWr) -> SendPd {
        SendPd {
            wr: *wr,
            inline_len: 0,
            _pad: 0,
            inline: [0; MAX_INLINE],
        }
    }

    /// The inline payload.
    pub fn payload(&self) -> &[u8] {
        &self.inline[..(self.inline_len as usize).min(MAX_INLINE)]
    }
}

/// Receive slot states, the low two bits of [`RecvSlot::seq`].
pub mod slot {
    /// Filled by the owner; the peer may take it.
    pub const POSTED: u64 = 1;
    /// Taken by the peer's engine, which is moving data into it.
    pub const TAKEN: u64 = 2;
    /// Completed by the peer, or flushed by the owner.
    pub const DONE: u64 = 3;

    /// The `seq` value of `state` at ring position `pos`.
    pub const fn seq(pos: u64, state: u64) -> u64 {
        pos.wrapping_mul(4) | state
    }
}

// SAFETY: #[repr(C)], only atomics and Shared types, all-zero is the
// initial state, alignment 64.
unsafe impl Shared for NicHeader {}
// SAFETY: as above.
unsafe impl Shared for ViShared {}
// SAFETY: as above.
unsafe impl Shared for CqShared {}
// SAFETY: as above.
unsafe impl Shared for TptEntry {}
// SAFETY: as above.
unsafe impl Shared for RecvSlot {}

const _: () = {
    assert!(size_of::<NicHeader>() == 192);
    assert!(std::mem::offset_of!(NicHeader, notify) == 128);
    assert!(size_of::<ViShared>() == 256);
    // The access epoch alone on its line (the peer's engine writes it at
    // every operation; the fields the owner reads are on the line before).
    assert!(std::mem::offset_of!(ViShared, access) == 64);
    assert!(size_of::<AccessEpoch>() == 64);
    assert!(std::mem::offset_of!(ViShared, recv_wake) == 128);
    assert!(size_of::<CqShared>() == 128);
    assert!(size_of::<TptExtent>() == 32);
    assert!(size_of::<TptEntry>() == 320);
    assert!(std::mem::offset_of!(TptEntry, extents) == 64);
    assert!(size_of::<RecvSlot>() == 320);
    assert!(std::mem::offset_of!(RecvSlot, segs) == 32);
    // No padding anywhere (the `Plain` argument above).
    assert!(size_of::<crate::translate::WrSeg>() == 16);
    assert!(std::mem::offset_of!(SendWr, segs) == 56);
    assert!(size_of::<SendWr>() == 56 + 16 * MAX_SEGS);
    assert!(std::mem::offset_of!(SendPd, inline) == size_of::<SendWr>() + 8);
    assert!(size_of::<SendPd>() == size_of::<SendWr>() + 8 + MAX_INLINE);
};

/// Byte offsets of the parts of a NIC segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// Async error ring.
    pub errors: usize,
    /// VI table.
    pub vi: usize,
    /// CQ table.
    pub cq: usize,
    /// Translation table.
    pub tpt: usize,
    /// Handle slots: the table entry of each value of a handle's low 16
    /// bits.
    pub handle_slots: usize,
    /// Receive rings.
    pub rq: usize,
    /// Total length.
    pub len: usize,
}

const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// The layout of this version.
pub const OFFSETS: Offsets = {
    let page = 4096;
    let errors = page;
    let vi = round_up(errors + cq::EntryRing::bytes_for(ERROR_RING), page);
    let cqt = round_up(vi + MAX_VI as usize * size_of::<ViShared>(), page);
    let tpt = round_up(cqt + MAX_CQ as usize * size_of::<CqShared>(), page);
    let handle_slots = round_up(tpt + MAX_REGIONS as usize * size_of::<TptEntry>(), page);
    let rq = round_up(handle_slots + MAX_REGIONS as usize * 4, page);
    let len = rq + MAX_VI as usize * RQ_SLOTS as usize * size_of::<RecvSlot>();
    Offsets {
        errors,
        vi,
        cq: cqt,
        tpt,
        handle_slots,
        rq,
        len,
    }
};

/// Why a segment was refused at attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError(pub &'static str);

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad NIC segment: {}", self.0)
    }
}

impl std::error::Error for LayoutError {}

/// A mapping that holds a whole NIC segment: at least [`OFFSETS`]`.len`
/// bytes, 64-byte aligned. Checked once here, so that the views of its
/// tables check only the index (every access of the send path used to
/// repeat the bounds and alignment test of [`Mapping::view`]).
#[derive(Clone, Debug)]
pub struct Segment(Arc<Mapping>);

impl Segment {
    /// `map` as a segment, if it is long enough and aligned (a mapping of
    /// a memory file is page-aligned).
    pub fn new(map: Arc<Mapping>) -> Result<Segment, LayoutError> {
        if map.len() < OFFSETS.len {
            return Err(LayoutError("mapping too short"));
        }
        if map.addr() % 64 != 0 {
            return Err(LayoutError("mapping not 64-byte aligned"));
        }
        Ok(Segment(map))
    }

    /// The mapping.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.0
    }

    /// Typed access to the segment. Its contents are checked by
    /// [`NicView::attach`] (a peer's) or written by [`NicView::init`] (our
    /// own) before any other use; a later change by another process can
    /// only give wrong values, never an access outside the mapping.
    #[inline(always)]
    pub fn view(&self) -> NicView<'_> {
        NicView { map: &self.0 }
    }
}

/// Typed access to a NIC segment ([`Segment::view`]).
pub struct NicView<'a> {
    /// A [`Segment`]'s mapping: at least `OFFSETS.len` bytes, 64-byte
    /// aligned.
    map: &'a Mapping,
}

impl<'a> NicView<'a> {
    /// Formats a fresh (zero-filled) segment as the segment of `nic_id`.
    pub fn init(seg: &'a Segment, session: u64, nic_id: u32, pid: u32) -> NicView<'a> {
        let v = seg.view();
        let h = v.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.pid.store(pid, Ordering::Relaxed);
        h.session.store(session, Ordering::Relaxed);
        h.nic_id.store(nic_id, Ordering::Relaxed);
        h.errors_off.store(OFFSETS.errors as u64, Ordering::Relaxed);
        h.vi_off.store(OFFSETS.vi as u64, Ordering::Relaxed);
        h.cq_off.store(OFFSETS.cq as u64, Ordering::Relaxed);
        h.tpt_off.store(OFFSETS.tpt as u64, Ordering::Relaxed);
        h.rq_off.store(OFFSETS.rq as u64, Ordering::Relaxed);
        h.len.store(OFFSETS.len as u64, Ordering::Relaxed);
        // Release: publishes the fields above; pairs with the Acquire in `attach`.
        h.magic.store(NIC_MAGIC, Ordering::Release);
        v
    }

    /// Validates a segment mapped from a peer.
    pub fn attach(seg: &'a Segment) -> Result<NicView<'a>, LayoutError> {
        let v = seg.view();
        let h = v.header();
        // Acquire: pairs with the Release in `init`.
        if h.magic.load(Ordering::Acquire) != NIC_MAGIC {
            return Err(LayoutError("magic"));
        }
        if h.version.load(Ordering::Relaxed) != VERSION {
            return Err(LayoutError("version"));
        }
        let same = h.errors_off.load(Ordering::Relaxed) == OFFSETS.errors as u64
            && h.vi_off.load(Ordering::Relaxed) == OFFSETS.vi as u64
            && h.cq_off.load(Ordering::Relaxed) == OFFSETS.cq as u64
            && h.tpt_off.load(Ordering::Relaxed) == OFFSETS.tpt as u64
            && h.rq_off.load(Ordering::Relaxed) == OFFSETS.rq as u64
            && h.len.load(Ordering::Relaxed) == OFFSETS.len as u64;
        if !same {
            return Err(LayoutError("offsets"));
        }
        Ok(v)
    }

    /// Entry `i` of the table of `count` `T`s at `base`; `None` if `i` is
    /// out of range. Every caller passes one of the layout's tables, so the
    /// table checks below are constants and fold away: what is left is the
    /// index check.
    #[inline(always)]
    fn entry<T: Shared>(&self, base: usize, i: usize, count: usize) -> Option<&'a T> {
        let (size, align) = (size_of::<T>(), align_of::<T>());
        if align > 64
            || base % align != 0
            || size % align != 0
            || count
                .checked_mul(size)
                .is_none_or(|b| base + b > OFFSETS.len)
            || i >= count
        {
            return None;
        }
        // SAFETY: entry `i` lies in `base..base + count * size`, inside
        // `0..OFFSETS.len`, which the mapping covers (a `Segment`: checked
        // at its creation); its address is aligned for `T`: the mapping is
        // 64-byte aligned (idem), `align` divides 64, and `base` and `size`
        // are multiples of `align` (checked above).
        Some(unsafe { self.map.view_unchecked(base + i * size) })
    }

    /// The header.
    #[inline]
    pub fn header(&self) -> &'a NicHeader {
        self.entry(0, 0, 1).expect("the header is in every segment")
    }

    /// VI slot `i` (`None` if out of range).
    #[inline]
    pub fn vi(&self, i: u32) -> Option<&'a ViShared> {
        self.entry(OFFSETS.vi, i as usize, MAX_VI as usize)
    }

    /// CQ slot `i`.
    #[inline]
    pub fn cq(&self, i: u32) -> Option<&'a CqShared> {
        self.entry(OFFSETS.cq, i as usize, MAX_CQ as usize)
    }

    /// Translation table entry `i` (index 0 is never valid).
    #[inline]
    pub fn tpt(&self, i: u32) -> Option<&'a TptEntry> {
        if i == 0 {
            return None;
        }
        self.entry(OFFSETS.tpt, i as usize, MAX_REGIONS as usize)
    }

    /// The handle slot of handle bits `low` (a handle's low 16 bits): the
    /// table entry that handle lives in, 0 for none.
    #[inline]
    pub fn handle_slot(&self, low: u32) -> Option<&'a AtomicU32> {
        self.entry(OFFSETS.handle_slots, low as usize, MAX_REGIONS as usize)
    }

    /// Receive slot for ring position `pos` of VI `vi`.
    #[inline]
    pub fn rq_slot(&self, vi: u32, pos: u64) -> Option<&'a RecvSlot> {
        if vi >= MAX_VI {
            return None;
        }
        let idx = vi as usize * RQ_SLOTS as usize + (pos % RQ_SLOTS as u64) as usize;
        self.entry(OFFSETS.rq, idx, MAX_VI as usize * RQ_SLOTS as usize)
    }

    /// Byte range of the error ring.
    pub fn errors_range() -> (usize, usize) {
        (OFFSETS.errors, cq::EntryRing::bytes_for(ERROR_RING))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_aligned_and_ordered() {
        let o = OFFSETS;
        assert!(
            o.errors < o.vi
                && o.vi < o.cq
                && o.cq < o.tpt
                && o.tpt < o.handle_slots
                && o.handle_slots < o.rq
                && o.rq < o.len
        );
        for x in [o.errors, o.vi, o.cq, o.tpt, o.handle_slots, o.rq] {
            assert_eq!(x % 4096, 0);
        }
    }

    #[test]
    fn init_then_attach() {
        let (_fd, m) = Mapping::create("via-layout-test", OFFSETS.len).unwrap();
        let m = Segment::new(Arc::new(m)).unwrap();
        assert!(NicView::attach(&m).is_err(), "zero memory has no magic");
        let v = NicView::init(&m, 7, 3, 99);
        assert!(v.vi(MAX_VI).is_none());
        assert!(v.tpt(0).is_none());
        assert!(v.tpt(MAX_REGIONS - 1).is_some());
        assert!(v.rq_slot(MAX_VI - 1, u64::MAX).is_some());
        let a = NicView::attach(&m).unwrap();
        assert_eq!(a.header().session.load(Ordering::Relaxed), 7);
        a.header().version.store(9, Ordering::Relaxed);
        assert_eq!(NicView::attach(&m).err(), Some(LayoutError("version")));
    }

    #[test]
    fn a_segment_is_long_enough() {
        let short = Mapping::anonymous(OFFSETS.len - 4096).unwrap();
        assert_eq!(
            Segment::new(Arc::new(short)).err(),
            Some(LayoutError("mapping too short"))
        );
        let v = Segment::new(Arc::new(Mapping::anonymous(OFFSETS.len).unwrap())).unwrap();
        let v = v.view();
        assert!(v.cq(MAX_CQ).is_none() && v.cq(MAX_CQ - 1).is_some());
        assert!(v.handle_slot(MAX_REGIONS).is_none());
        assert!(v.handle_slot(MAX_REGIONS - 1).is_some());
        assert!(v.rq_slot(MAX_VI, 0).is_none());
    }
}
