//! Shared-memory layouts of the ring, the event count and the doorbell.
//!
//! Everything here may live in a memfd mapped `MAP_SHARED` by several processes, so every
//! struct is `#[repr(C)]`, holds plain integers only (atomics of `u32`/`u64`, which have the
//! size and alignment of the integer), starts with a magic and version word, and has its size
//! and alignment pinned by `const` asserts. A region is described by offsets, never pointers.
//!
//! ```text
//! Ring<T> region (Ring::bytes_for)          Doorbell<T> region (Doorbell::bytes_for)
//! +0    RingMeta     magic version cap ...  +0    DoorbellMeta magic version ring_offset
//! +64   tail         producers' index       +64   EventCount   seq waiters
//! +128  head         consumers' index       +128  Ring<T> region (as on the left)
//! +192  Slot<T> x capacity (stamp, value)
//! ```
//!
//! The layout is only read and written through atomics, so memory a peer has corrupted is a
//! wrong value, never undefined behaviour. Under `cfg(loom)` the atomics are loom's (bigger)
//! types: sizes differ and the size asserts are compiled out; only heap-backed rings exist.

use core::mem::MaybeUninit;

use crate::sync::{AtomicU32, AtomicU64, UnsafeCell, WaitQueue};

/// A type that can travel through shared memory by plain copy.
///
/// # Safety
///
/// Implementors promise that every bit pattern of `size_of::<Self>()` bytes is a valid value
/// (entries read from shared memory a peer may have scribbled on are used as they are), that
/// the type holds no pointers, references or handles that only make sense in one process, and
/// that its alignment is at most 64. Types should have no padding bytes: padding would carry
/// uninitialised bytes into memory other processes read.
pub unsafe trait Plain: Copy + Send + Sync + 'static {}

macro_rules! plain {
    ($($t:ty),*) => {
        $(
            // SAFETY: a fixed-size integer: every bit pattern is valid, no pointers, align <= 16.
            unsafe impl Plain for $t {}
        )*
    };
}
plain!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);

// SAFETY: an array of `Plain` elements has no padding between elements and every bit pattern
// of each element is valid, so every bit pattern of the array is; alignment is the element's.
unsafe impl<T: Plain, const N: usize> Plain for [T; N] {}

/// Magic word of a [`crate::Ring`] region: `"VRNG"` little-endian.
pub const RING_MAGIC: u32 = u32::from_le_bytes(*b"VRNG");
/// Magic word of a [`crate::Doorbell`] region: `"VDBL"` little-endian.
pub const DOORBELL_MAGIC: u32 = u32::from_le_bytes(*b"VDBL");
/// Layout version of both regions; bumped on any incompatible change (2: the event count's
/// armed mode, `eventcount`).
pub const LAYOUT_VERSION: u32 = 2;
/// Largest ring capacity accepted by `init`, `attach` and `new_in_heap`.
pub const MAX_CAPACITY: u32 = 1 << 24;
/// Size of a cache line, the unit of separation between indices written by different sides.
pub const CACHE_LINE: usize = 64;

/// Byte offset of the first slot in a ring region.
pub(crate) const SLOTS_OFFSET: usize = core::mem::size_of::<RingHeader>();
/// Byte offset of the ring region inside a doorbell region.
pub(crate) const DOORBELL_RING_OFFSET: usize = core::mem::size_of::<DoorbellHeader>();

/// Whether `capacity` is a valid ring capacity: a power of two in `2..=MAX_CAPACITY`.
///
/// Capacity 1 is refused: with one slot the stamp of a full slot (`pos + 1`) equals the stamp
/// the next producer waits for, so full and empty could not be told apart.
pub(crate) const fn valid_capacity(capacity: u32) -> bool {
    capacity >= 2 && capacity <= MAX_CAPACITY && capacity.is_power_of_two()
}

/// Bytes of a ring region with `capacity` slots of `slot_size` bytes, rounded up to a cache
/// line so that regions can be laid out back to back.
///
/// # Panics
///
/// Panics if the size overflows `usize` (only possible on 32-bit targets).
pub(crate) const fn ring_bytes(capacity: usize, slot_size: usize) -> usize {
    let Some(slots) = capacity.checked_mul(slot_size) else {
        panic!("ring size overflows usize");
    };
    let Some(total) = slots.checked_add(SLOTS_OFFSET + CACHE_LINE - 1) else {
        panic!("ring size overflows usize");
    };
    total / CACHE_LINE * CACHE_LINE
}

/// One value alone on its own cache line, so that the two sides do not false-share.
#[repr(C, align(64))]
pub(crate) struct CacheLine<T>(pub(crate) T);

/// First cache line of a ring region: identification and geometry, written once by `init`.
///
/// `attach` validates every field and then works from its own copies, so a peer rewriting
/// this line later cannot change the geometry a view uses.
#[repr(C, align(64))]
pub(crate) struct RingMeta {
    /// [`RING_MAGIC`]; stored last by `init` (Release) so a reader that sees it sees the rest.
    pub(crate) magic: AtomicU32,
    /// [`LAYOUT_VERSION`]. Written by `init`.
    pub(crate) version: AtomicU32,
    /// Number of slots, a power of two. Written by `init`.
    pub(crate) capacity: AtomicU32,
    /// `size_of::<T>()` of the entry type. Written by `init`.
    pub(crate) entry_size: AtomicU32,
    /// `size_of::<Slot<T>>()`, the slot stride. Written by `init`.
    pub(crate) slot_size: AtomicU32,
    /// Byte offset of slot 0 from the start of the region ([`SLOTS_OFFSET`]). Written by `init`.
    pub(crate) slots_offset: AtomicU32,
}

/// Header of a ring region: metadata, then the producers' and the consumers' index, each on
/// its own cache line.
#[repr(C, align(64))]
pub(crate) struct RingHeader {
    /// Identification and geometry (line 0).
    pub(crate) meta: RingMeta,
    /// Next position to reserve. Owned by producers (CAS); consumers only read it for `len`.
    pub(crate) tail: CacheLine<AtomicU64>,
    /// Next position to take. Owned by consumers (CAS); producers only read it for
    /// `was_empty` and `len`.
    pub(crate) head: CacheLine<AtomicU64>,
}

/// One ring slot: a sequence stamp and the entry (Vyukov's bounded queue).
///
/// For the slot at position `pos` (index `pos & mask`): `stamp == pos` means free for the
/// producer of `pos`; `stamp == pos + 1` means filled, ready for the consumer of `pos`; the
/// consumer then stores `pos + capacity`, which frees it for the producer of the next lap.
#[repr(C)]
pub(crate) struct Slot<T> {
    /// Sequence stamp. Written by the producer that fills the slot (Release) and the consumer
    /// that empties it (Release).
    pub(crate) stamp: AtomicU64,
    /// The entry. Written only by the producer holding the reservation and read only by the
    /// consumer holding it; zero-filled by `init`, so its bytes are always initialised.
    pub(crate) value: UnsafeCell<MaybeUninit<T>>,
}

/// EventCount: a futex-backed sleep/wake handshake for one condition in shared memory.
///
/// A waiter calls [`prepare_wait`](EventCount::prepare_wait), re-checks its condition, then
/// [`wait`](EventCount::wait)s (or [`cancel_wait`](EventCount::cancel_wait)s); whoever makes
/// the condition true publishes it and then calls [`notify_all`](EventCount::notify_all).
/// A fence on each side (after registering, before reading the waiter count) makes sure that
/// either the notifier sees the waiter or the waiter's re-check sees the condition, so no
/// wake-up is lost; the notifier's is a light one while nobody sleeps here (module doc of
/// `eventcount`). [`wait_until`](crate::wait_until) packages the waiter side.
///
/// The futex is the shared (non-private) one, so waiters and notifiers may be in different
/// processes. Lives in zero-filled shared memory: all-zero bytes are the valid initial state
/// (no waiters, sequence 0). It fills a cache line of its own so notifiers do not slow the
/// ring indices down.
#[repr(C, align(64))]
pub struct EventCount {
    /// Notification sequence and futex word. Incremented by `notify_all` (any process) when
    /// somebody waits; waiters sleep while it equals the value they read in `prepare_wait`.
    pub(crate) seq: AtomicU32,
    /// Number of registered waiters (low 30 bits), and the armed-mode bits `SLEEPY` and
    /// `ARMED` (`eventcount`). The count is incremented by `prepare_wait`, decremented by
    /// `cancel_wait` and `wait`; notifiers only read the word.
    pub(crate) waiters: AtomicU32,
    /// Waits that ended without sleeping since the last sleep, while armed: after
    /// `QUIET_WAITS` of them the event count disarms. Written only while armed.
    pub(crate) quiet: AtomicU32,
    /// The wait queue: the kernel's futex queue (zero-sized) or, under loom, a model of it.
    pub(crate) queue: WaitQueue,
}

/// First cache line of a doorbell region. Written once by `Doorbell::init`.
#[repr(C, align(64))]
pub(crate) struct DoorbellMeta {
    /// [`DOORBELL_MAGIC`]; stored last by `init` (Release).
    pub(crate) magic: AtomicU32,
    /// [`LAYOUT_VERSION`].
    pub(crate) version: AtomicU32,
    /// Byte offset of the ring region ([`DOORBELL_RING_OFFSET`]).
    pub(crate) ring_offset: AtomicU32,
}

/// Header of a doorbell region: metadata, then the consumer's event count on its own line.
/// The ring region follows at [`DOORBELL_RING_OFFSET`].
#[repr(C, align(64))]
pub(crate) struct DoorbellHeader {
    /// Identification (line 0).
    pub(crate) meta: DoorbellMeta,
    /// The consumer sleeps here; producers notify it in `Doorbell::ring` (line 1).
    pub(crate) event: EventCount,
}

#[cfg(not(loom))]
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<AtomicU32>() == 4 && align_of::<AtomicU32>() == 4);
    assert!(size_of::<AtomicU64>() == 8 && align_of::<AtomicU64>() == 8);

    assert!(size_of::<RingMeta>() == 64 && align_of::<RingMeta>() == 64);
    assert!(offset_of!(RingMeta, magic) == 0);
    assert!(offset_of!(RingMeta, version) == 4);
    assert!(offset_of!(RingMeta, capacity) == 8);
    assert!(offset_of!(RingMeta, entry_size) == 12);
    assert!(offset_of!(RingMeta, slot_size) == 16);
    assert!(offset_of!(RingMeta, slots_offset) == 20);

    assert!(size_of::<RingHeader>() == 192 && align_of::<RingHeader>() == 64);
    assert!(offset_of!(RingHeader, meta) == 0);
    assert!(offset_of!(RingHeader, tail) == 64);
    assert!(offset_of!(RingHeader, head) == 128);
    assert!(SLOTS_OFFSET == 192);

    assert!(offset_of!(Slot<u64>, stamp) == 0);
    assert!(offset_of!(Slot<u64>, value) == 8);
    assert!(size_of::<Slot<u64>>() == 16);
    assert!(size_of::<Slot<[u64; 7]>>() == 64);

    assert!(size_of::<EventCount>() == 64 && align_of::<EventCount>() == 64);
    assert!(offset_of!(EventCount, seq) == 0);
    assert!(offset_of!(EventCount, waiters) == 4);
    assert!(offset_of!(EventCount, quiet) == 8);

    assert!(size_of::<DoorbellMeta>() == 64);
    assert!(offset_of!(DoorbellMeta, magic) == 0);
    assert!(offset_of!(DoorbellMeta, version) == 4);
    assert!(offset_of!(DoorbellMeta, ring_offset) == 8);
    assert!(size_of::<DoorbellHeader>() == 128 && align_of::<DoorbellHeader>() == 64);
    assert!(offset_of!(DoorbellHeader, event) == 64);
    assert!(DOORBELL_RING_OFFSET == 128);
};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn capacity_rules() {
        for bad in [
            0,
            1,
            3,
            6,
            1000,
            MAX_CAPACITY + 1,
            MAX_CAPACITY * 2,
            u32::MAX,
        ] {
            assert!(!valid_capacity(bad), "{bad}");
        }
        for good in [2, 4, 64, 1024, MAX_CAPACITY] {
            assert!(valid_capacity(good), "{good}");
        }
    }

    #[test]
    fn ring_bytes_is_header_plus_slots_rounded_to_a_line() {
        assert_eq!(ring_bytes(4, 16), 192 + 64);
        assert_eq!(ring_bytes(2, 16), 192 + 64);
        assert_eq!(ring_bytes(8, 16), 192 + 128);
        assert_eq!(ring_bytes(1024, 64), 192 + 65536);
        assert_eq!(ring_bytes(2, 24) % CACHE_LINE, 0);
    }

    #[test]
    fn magics_spell_their_names() {
        assert_eq!(&RING_MAGIC.to_le_bytes(), b"VRNG");
        assert_eq!(&DOORBELL_MAGIC.to_le_bytes(), b"VDBL");
        assert_ne!(RING_MAGIC, DOORBELL_MAGIC);
    }

    #[test]
    fn zeroed_event_count_is_the_initial_state() {
        // SAFETY: EventCount holds three AtomicU32 and a zero-sized queue; all-zero bytes are a
        // valid value of each (this is the property the shared layout relies on).
        let ec: EventCount = unsafe { core::mem::zeroed() };
        assert_eq!(ec.seq.into_inner(), 0);
        assert_eq!(ec.waiters.into_inner(), 0);
    }
}
