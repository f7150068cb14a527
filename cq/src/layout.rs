//! Shared-memory layout of an [`EntryRing`](crate::EntryRing).
//!
//! ```text
//! offset   0  Ident     magic, version, capacity, limit     owner at init (limit: owner on resize)
//! offset  64  Producer  tail (+ CLOSED bit)                  producers (CAS); owner sets CLOSED
//! offset 128  Consumer  head                                 consumers (CAS), owner's threads only
//! offset 192  EventCount                                     consumers sleep, producers wake
//! offset 256  [Slot; capacity]                               see below
//! ```
//!
//! A [`Slot`] is two 64-bit words. Each word carries a 32-bit tag in its high
//! half and half of the entry in its low half, so that every write a producer
//! makes to a slot is a CAS guarded by a tag derived from its reserved
//! position. A producer that lost its slot (tombstoned by `repair` while it
//! was stalled) therefore cannot overwrite the slot after it was recycled for
//! a later lap: its CAS expects an older tag and fails.
//!
//! * `seq` = `stamp << 32 | entry >> 32`. The stamp is the Vyukov sequence:
//!   `(pos << 2 | state)` truncated to 32 bits, state one of [`FREE`],
//!   [`FULL`], [`TOMB`]. `FREE(pos)` means "writable by the producer that
//!   reserves `pos`"; `FULL(pos)`/`TOMB(pos)` mean "committed (or skipped) for
//!   the consumer at `pos`"; the consumer releases the slot as
//!   `FREE(pos + capacity)`.
//! * `lo` = `(pos as u32) << 32 | entry as u32`, written by the producer of
//!   `pos` before it commits `seq`.
//!
//! Everything here is plain integers (atomics of them), `#[repr(C)]`, with the
//! magic and version first, and every value read back from the mapping is
//! treated as untrusted by [`ring`](crate::ring).
#![forbid(unsafe_code)]

use crate::sync::{AtomicU32, AtomicU64};
use doorbell::EventCount;

/// `b"VIACQRNG"` read as a little-endian integer.
pub const MAGIC: u64 = u64::from_le_bytes(*b"VIACQRNG");
/// Layout version; bumped on any change to this file.
pub const VERSION: u32 = 1;
/// Largest capacity `init` accepts: keeps the distance between two laps of a
/// 32-bit stamp (`capacity << 2`) far below `i32::MAX`, so stamp comparisons
/// by wrapping difference are exact.
pub const MAX_CAPACITY: u32 = 1 << 24;
/// Bit of the tail word that marks the ring closed (see `EntryRing::close`).
pub const CLOSED: u64 = 1 << 63;
/// The position part of the tail word.
pub const POS_MASK: u64 = CLOSED - 1;

/// Slot state: writable by the producer that reserves this position.
pub const FREE: u32 = 0;
/// Slot state: holds a committed entry for the consumer at this position.
pub const FULL: u32 = 1;
/// Slot state: skipped; the producer of this position died or lost it.
pub const TOMB: u32 = 2;
const STATE_MASK: u32 = 3;

/// The Vyukov stamp of `pos` in `state`.
#[inline]
pub(crate) const fn stamp(pos: u64, state: u32) -> u32 {
    ((pos as u32) << 2) | state
}

/// The state bits of a stamp (3 is never written by a sane peer).
#[inline]
pub(crate) const fn state(stamp: u32) -> u32 {
    stamp & STATE_MASK
}

/// Signed distance, in positions, from `pos` to the position a stamp was
/// written for: 0 for this lap, negative for an older one, positive for a
/// newer one. Exact while the true distance is below 2^29 positions
/// (guaranteed by [`MAX_CAPACITY`]); garbage stamps give a garbage distance,
/// which callers treat like any other value.
#[inline]
pub(crate) const fn distance(stamp: u32, pos: u64) -> i32 {
    ((stamp & !STATE_MASK).wrapping_sub((pos as u32) << 2) as i32) >> 2
}

/// Packs a 32-bit tag (high half) and a 32-bit payload (low half).
#[inline]
pub(crate) const fn pack(tag: u32, payload: u32) -> u64 {
    ((tag as u64) << 32) | payload as u64
}

/// The tag (high half) of a slot word.
#[inline]
pub(crate) const fn tag(word: u64) -> u32 {
    (word >> 32) as u32
}

/// The payload (low half) of a slot word.
#[inline]
pub(crate) const fn payload(word: u64) -> u32 {
    word as u32
}

/// First cache line: identification, written once by the owner in `init`
/// (except `limit`).
#[repr(C, align(64))]
pub struct Ident {
    /// [`MAGIC`]. Written last by `init` (Release), checked by `attach`.
    pub magic: AtomicU64,
    /// [`VERSION`]. Owner, at init.
    pub version: AtomicU32,
    /// Number of slots, a power of two. Owner, at init. Each view copies it
    /// once (validated) and never reads it again.
    pub capacity: AtomicU32,
    /// Logical size: a push fails with `Overrun` once `len` would exceed it.
    /// Owner, at init and on `set_limit`; producers read it (clamped to the
    /// capacity, since a peer may have scribbled over it).
    pub limit: AtomicU32,
}

/// Second cache line: the producers' index.
#[repr(C, align(64))]
pub struct Producer {
    /// Next position to reserve, plus [`CLOSED`] in bit 63. Producers CAS it
    /// to reserve; the owner sets `CLOSED` with `fetch_or`.
    pub tail: AtomicU64,
}

/// Third cache line: the consumers' index.
#[repr(C, align(64))]
pub struct Consumer {
    /// Next position to consume. Consumer threads of the owner CAS it.
    pub head: AtomicU64,
}

/// The ring header, followed in memory by `capacity` [`Slot`]s.
#[repr(C)]
pub struct Header {
    /// Magic, version, capacity, limit.
    pub ident: Ident,
    /// The tail (producers).
    pub producer: Producer,
    /// The head (consumers).
    pub consumer: Consumer,
    /// Consumers sleep on it in `wait`; a producer wakes them after a commit.
    pub event: EventCount,
}

/// One ring slot: a 64-bit entry split over two tagged words (see the module doc).
#[repr(C)]
pub struct Slot {
    /// `(pos as u32) << 32 | entry as u32`: written by the producer of `pos`
    /// (CAS), read by the consumer of `pos`.
    pub lo: AtomicU64,
    /// `stamp << 32 | entry >> 32`: commit (producer), tombstone (owner),
    /// release (consumer), each by CAS or store as documented in `ring`.
    pub seq: AtomicU64,
}

/// Bytes of the header; the slot array starts at this offset. Spelled out
/// (and asserted below) because under loom the atomics have other sizes.
pub const HEADER_BYTES: usize = 256;
/// Bytes of one slot.
pub const SLOT_BYTES: usize = 16;
/// Alignment the mapping must have.
pub const ALIGN: usize = 64;

#[cfg(not(loom))]
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(offset_of!(Ident, magic) == 0);
    assert!(offset_of!(Ident, version) == 8);
    assert!(offset_of!(Ident, capacity) == 12);
    assert!(offset_of!(Ident, limit) == 16);
    assert!(size_of::<Ident>() == 64);
    assert!(size_of::<Producer>() == 64);
    assert!(size_of::<Consumer>() == 64);
    assert!(offset_of!(Header, producer) == 64);
    assert!(offset_of!(Header, consumer) == 128);
    assert!(offset_of!(Header, event) == 192);
    assert!(size_of::<Header>() == HEADER_BYTES && align_of::<Header>() == ALIGN);
    assert!(size_of::<Slot>() == SLOT_BYTES && align_of::<Slot>() == 8);
    assert!(offset_of!(Slot, lo) == 0 && offset_of!(Slot, seq) == 8);
    assert!(HEADER_BYTES % align_of::<Slot>() == 0);
    // The largest ring must still have a size that fits in usize arithmetic.
    assert!(HEADER_BYTES + MAX_CAPACITY as usize * SLOT_BYTES < isize::MAX as usize);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_order_by_lap() {
        let cap = 8u64;
        assert_eq!(distance(stamp(5, FREE), 5), 0);
        assert_eq!(distance(stamp(5, FULL), 5), 0);
        assert_eq!(distance(stamp(5, TOMB), 5), 0);
        assert_eq!(distance(stamp(5 + cap, FREE), 5), cap as i32);
        assert_eq!(distance(stamp(5, FULL), 5 + cap), -(cap as i32));
        assert_eq!(state(stamp(5, TOMB)), TOMB);
    }

    #[test]
    fn stamps_wrap_around_32_bits() {
        // The stamp keeps 30 bits of position: positions 2^30 apart collide,
        // positions near the wrap still compare by lap.
        let pos = (1u64 << 30) - 2;
        let cap = u64::from(MAX_CAPACITY);
        assert_eq!(distance(stamp(pos + 4, FREE), pos), 4);
        assert_eq!(distance(stamp(pos, FULL), pos + 4), -4);
        assert_eq!(distance(stamp(pos + cap, FREE), pos), cap as i32);
        assert_eq!(distance(stamp(u64::MAX, FULL), u64::MAX), 0);
        assert_eq!(distance(stamp(u64::MAX.wrapping_add(1), FREE), u64::MAX), 1);
    }

    #[test]
    fn words_pack_and_unpack() {
        let w = pack(0xdead_beef, 0x1234_5678);
        assert_eq!(tag(w), 0xdead_beef);
        assert_eq!(payload(w), 0x1234_5678);
    }

    #[cfg(not(loom))]
    #[test]
    fn header_is_four_cache_lines() {
        use core::mem::{align_of, size_of};
        assert_eq!(
            size_of::<Header>(),
            256,
            "EventCount is expected to be one line"
        );
        assert_eq!(align_of::<Header>(), 64);
        assert_eq!(size_of::<Slot>(), 16);
    }
}
