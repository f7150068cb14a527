//! Ring: a bounded lock-free MPMC queue of plain entries over (shared) memory.
//!
//! The algorithm is Dmitry Vyukov's bounded queue with one sequence stamp per slot, as in
//! crossbeam's `ArrayQueue`, with 64-bit positions that never wrap in practice.
//!
//! * **Producers** (any thread of any process that maps the region) own the `tail` index:
//!   they reserve position `pos` by CAS `tail: pos -> pos + 1`, fill slot `pos & mask`, and
//!   commit by storing the slot stamp `pos + 1` (Release).
//! * **Consumers** own the `head` index: they take position `pos` by CAS
//!   `head: pos -> pos + 1` once the stamp reads `pos + 1` (Acquire), copy the entry out, and
//!   free the slot for the next lap by storing the stamp `pos + capacity` (Release).
//! * The indices only arbitrate between producers (resp. consumers); the stamps carry all the
//!   data ordering. So both CASes are `Relaxed`, and every stamp load is `Acquire`, paired
//!   with the Release stamp store of the other side.
//! * In the doorbell the central ring has many producers (the posting threads) and one
//!   consumer (the engine); a per-VI ring has one of each. Both use this same type.
//!
//! Untrusted memory: the geometry is validated once on attach and kept in the view; every
//! slot index is masked with the view's own mask; every loop is bounded
//! ([`RETRY_LIMIT`]); arithmetic on positions read from memory wraps. A corrupted region can
//! make `push` report [`Full`] and `pop` report `None` (or return garbage entries, which are
//! still valid values because `T: Plain`), never undefined behaviour, a panic or a hang.
//!
//! A producer that stops between reserve and commit (e.g. a dying process) blocks consumers
//! at its slot: entries committed after it stay invisible. Design §4 has the doorbell rings
//! written by their owner process only, so this does not cross a trust boundary.

use core::fmt;
use core::mem::{MaybeUninit, size_of};
use core::ptr::NonNull;
use std::sync::Arc;

use crate::heap::HeapRegion;
use crate::layout::{RingHeader, SLOTS_OFFSET, Slot, valid_capacity};
use crate::sync::{AtomicU64, Ordering, spin_loop};
#[cfg(not(loom))]
use crate::{
    LayoutError,
    layout::{CACHE_LINE, LAYOUT_VERSION, RING_MAGIC},
};
use crate::{Plain, sync::UnsafeCell};

/// Upper bound on the retries of one `push`/`pop`. Each retry means another thread made
/// progress (or the memory is corrupt), so reaching it under real contention is practically
/// impossible; it only turns a corrupted region into an error instead of a hang.
pub(crate) const RETRY_LIMIT: u32 = 1 << 20;

/// A push succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// Every earlier entry had already been taken when this one was committed: the ring went
    /// from empty to non-empty. Read with a plain load of the consumers' index just after the
    /// commit, so it is exact without concurrent consumers and a hint otherwise.
    pub was_empty: bool,
}

/// The ring was full; the entry is handed back.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Full<T>(pub T);

impl<T> Full<T> {
    /// Returns the entry that did not fit.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> fmt::Debug for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Full(..)")
    }
}

impl<T> fmt::Display for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ring is full")
    }
}

impl<T> std::error::Error for Full<T> {}

/// A bounded lock-free MPMC ring of `T` entries with per-slot sequence stamps (Vyukov).
///
/// A `Ring` is a *view*: cloning it makes another view of the same memory, and views in
/// other processes that [`attach`](Ring::attach) to the same shared memory see the same
/// entries. The capacity is a power of two.
///
/// ```
/// use doorbell::Ring;
///
/// let ring = Ring::<u64>::new_in_heap(4);
/// assert!(ring.push(1).unwrap().was_empty);
/// assert!(!ring.push(2).unwrap().was_empty);
/// assert_eq!(ring.len(), 2);
/// assert_eq!(ring.pop(), Some(1));
/// assert_eq!(ring.pop(), Some(2));
/// assert_eq!(ring.pop(), None);
/// ```
pub struct Ring<T: Plain> {
    /// Header of the region (metadata, tail, head).
    header: NonNull<RingHeader>,
    /// Slot 0; `capacity` slots follow.
    slots: NonNull<Slot<T>>,
    /// `capacity - 1`, validated when the view was made; never re-read from memory.
    mask: u64,
    /// Number of slots, validated when the view was made.
    capacity: u32,
    /// Keeps a heap region alive; `None` for caller-provided memory.
    owner: Option<Arc<HeapRegion>>,
}

// SAFETY: a view only holds pointers into memory that is accessed through atomics and the
// stamp protocol, which gives each slot's value to one thread at a time; the memory outlives
// the view (init/attach contract, or the owner Arc). `T: Plain` is `Send + Sync`.
unsafe impl<T: Plain> Send for Ring<T> {}
// SAFETY: as above; every method takes `&self` and is safe to call concurrently.
unsafe impl<T: Plain> Sync for Ring<T> {}

impl<T: Plain> Clone for Ring<T> {
    fn clone(&self) -> Self {
        Self {
            header: self.header,
            slots: self.slots,
            mask: self.mask,
            capacity: self.capacity,
            owner: self.owner.clone(),
        }
    }
}

impl<T: Plain> fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish()
    }
}

impl<T: Plain> Ring<T> {
    /// Post-monomorphisation check that `T` fits the layout.
    const LAYOUT_OK: () = {
        assert!(
            core::mem::align_of::<Slot<T>>() <= 64,
            "Plain types must be aligned to at most 64 bytes"
        );
        assert!(
            size_of::<Slot<T>>() <= u32::MAX as usize,
            "entry type too large"
        );
    };

    /// Bytes of shared memory a ring of `capacity` entries needs: header plus slots, rounded
    /// up to a cache line.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is not a power of two in `2..=`[`MAX_CAPACITY`](crate::MAX_CAPACITY).
    ///
    /// ```
    /// assert_eq!(doorbell::Ring::<u64>::bytes_for(4), 192 + 4 * 16);
    /// ```
    pub const fn bytes_for(capacity: u32) -> usize {
        let () = Self::LAYOUT_OK;
        assert!(
            valid_capacity(capacity),
            "ring capacity must be a power of two in 2..=MAX_CAPACITY"
        );
        crate::layout::ring_bytes(capacity as usize, size_of::<Slot<T>>())
    }

    /// Formats `mem` as an empty ring of `capacity` entries and returns a view of it.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Misaligned`] if `mem` is not 64-byte aligned,
    /// [`LayoutError::BadCapacity`] if `capacity` is not a power of two in
    /// `2..=MAX_CAPACITY`, [`LayoutError::TooShort`] if `len < Self::bytes_for(capacity)`.
    ///
    /// # Safety
    ///
    /// `mem` must be valid for reads and writes of `len` bytes and stay mapped while any view
    /// of the ring lives (in any process). While `init` runs, nothing else may access the
    /// memory; afterwards it must only be accessed through this ring protocol (views made by
    /// `init` or [`attach`](Ring::attach)).
    #[cfg(not(loom))]
    pub unsafe fn init(mem: NonNull<u8>, len: usize, capacity: u32) -> Result<Self, LayoutError> {
        check_aligned(mem)?;
        if !valid_capacity(capacity) {
            return Err(LayoutError::BadCapacity { capacity });
        }
        let needed = Self::bytes_for(capacity);
        if len < needed {
            return Err(LayoutError::TooShort { needed, len });
        }
        // SAFETY: checked above: aligned, `needed` bytes available, valid capacity; the caller
        // guarantees exclusive access during init and that the memory outlives the views.
        Ok(unsafe { Self::format(mem, capacity, None) })
    }

    /// Returns a view of a ring that [`init`](Ring::init) formatted, possibly in another
    /// process or through another mapping of the same memory.
    ///
    /// Validates the magic, the version, the capacity, the entry and slot sizes and that `len`
    /// covers every slot. The validated geometry is kept in the view.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Misaligned`], [`LayoutError::TooShort`] (shorter than the header, or than
    /// the capacity found there needs), [`LayoutError::BadMagic`],
    /// [`LayoutError::BadVersion`], [`LayoutError::BadCapacity`], [`LayoutError::EntrySize`]
    /// (formatted for another `T`), [`LayoutError::Field`] (slot size or offset differ).
    ///
    /// # Safety
    ///
    /// `mem` must be valid for reads and writes of `len` bytes and stay mapped while the view
    /// lives, and must only be accessed through this ring protocol. Its content may be
    /// anything: garbage is reported as an error, not trusted.
    #[cfg(not(loom))]
    pub unsafe fn attach(mem: NonNull<u8>, len: usize) -> Result<Self, LayoutError> {
        check_aligned(mem)?;
        if len < SLOTS_OFFSET {
            return Err(LayoutError::TooShort {
                needed: SLOTS_OFFSET,
                len,
            });
        }
        // SAFETY: `mem` is aligned and valid for `len >= size_of::<RingHeader>()` bytes (caller
        // and check above); the header holds only atomics, for which every bit pattern is valid.
        let header = unsafe { mem.cast::<RingHeader>().as_ref() };
        let meta = &header.meta;
        // Acquire: pairs with the Release store of the magic at the end of `format`, so the
        // fields below are the ones init wrote (when init ran in this process or was ordered
        // before us some other way, e.g. by passing the fd).
        let magic = meta.magic.load(Ordering::Acquire);
        if magic != RING_MAGIC {
            return Err(LayoutError::BadMagic {
                expected: RING_MAGIC,
                found: magic,
            });
        }
        let version = meta.version.load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            return Err(LayoutError::BadVersion { found: version });
        }
        let capacity = meta.capacity.load(Ordering::Relaxed);
        if !valid_capacity(capacity) {
            return Err(LayoutError::BadCapacity { capacity });
        }
        let entry_size = meta.entry_size.load(Ordering::Relaxed);
        if entry_size as usize != size_of::<T>() {
            return Err(LayoutError::EntrySize {
                expected: size_of::<T>() as u32,
                found: entry_size,
            });
        }
        check_field(
            "slot_size",
            size_of::<Slot<T>>(),
            meta.slot_size.load(Ordering::Relaxed),
        )?;
        check_field(
            "slots_offset",
            SLOTS_OFFSET,
            meta.slots_offset.load(Ordering::Relaxed),
        )?;
        let needed = Self::bytes_for(capacity);
        if len < needed {
            return Err(LayoutError::TooShort { needed, len });
        }
        // SAFETY: aligned, `needed` bytes available for the validated capacity and slot size;
        // the caller guarantees the memory outlives the view.
        Ok(unsafe { Self::view(mem, capacity, None) })
    }

    /// Creates an empty ring of `capacity` entries in a heap allocation owned by its views.
    ///
    /// For tests, loom models and single-process use; works under `cfg(loom)`.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is not a power of two in `2..=`[`MAX_CAPACITY`](crate::MAX_CAPACITY).
    ///
    /// ```
    /// let ring = doorbell::Ring::<[u32; 4]>::new_in_heap(8);
    /// assert_eq!(ring.capacity(), 8);
    /// assert!(ring.is_empty());
    /// ```
    pub fn new_in_heap(capacity: u32) -> Self {
        let bytes = Self::bytes_for(capacity);
        // SAFETY: formatted right below, before the region can be dropped.
        let region = Arc::new(unsafe { HeapRegion::alloc(bytes, capacity, drop_ring::<T>) });
        // SAFETY: a fresh, zeroed, 64-byte aligned allocation of `bytes_for(capacity)` bytes,
        // exclusively ours, kept alive by the Arc every view holds.
        unsafe { Self::format(region.base(), capacity, Some(region.clone())) }
    }

    /// Writes an empty ring into `mem` and returns a view.
    ///
    /// # Safety
    ///
    /// `mem` is 64-byte aligned, valid for `bytes_for(capacity)` bytes, not accessed by anyone
    /// else during the call, and outlives the view (or is owned by `owner`); `capacity` is valid.
    pub(crate) unsafe fn format(
        mem: NonNull<u8>,
        capacity: u32,
        owner: Option<Arc<HeapRegion>>,
    ) -> Self {
        let bytes = Self::bytes_for(capacity);
        // SAFETY: the caller gives exclusive access to `bytes` bytes at `mem`. Zeroing first
        // makes every slot value initialised, so a pop can never read uninitialised bytes even
        // if a peer corrupts a stamp.
        unsafe { mem.as_ptr().write_bytes(0, bytes) };
        let header = RingHeader {
            meta: crate::layout::RingMeta {
                magic: crate::sync::AtomicU32::new(0),
                version: crate::sync::AtomicU32::new(crate::layout::LAYOUT_VERSION),
                capacity: crate::sync::AtomicU32::new(capacity),
                entry_size: crate::sync::AtomicU32::new(size_of::<T>() as u32),
                slot_size: crate::sync::AtomicU32::new(size_of::<Slot<T>>() as u32),
                slots_offset: crate::sync::AtomicU32::new(SLOTS_OFFSET as u32),
            },
            tail: crate::layout::CacheLine(AtomicU64::new(0)),
            head: crate::layout::CacheLine(AtomicU64::new(0)),
        };
        // SAFETY: `mem` is aligned for RingHeader (64) and has room for it (bytes >= header).
        unsafe { mem.cast::<RingHeader>().write(header) };
        // SAFETY: the slots start at SLOTS_OFFSET (a multiple of 64, so aligned for Slot<T>,
        // whose alignment is at most 64 by LAYOUT_OK) and `capacity` of them fit in `bytes`.
        let slots = unsafe { mem.add(SLOTS_OFFSET).cast::<Slot<T>>() };
        for i in 0..capacity as usize {
            let slot = Slot {
                // Slot i is free for the producer of position i.
                stamp: AtomicU64::new(i as u64),
                value: UnsafeCell::new(MaybeUninit::zeroed()),
            };
            // SAFETY: i < capacity, so the slot is inside the region (see above).
            unsafe { slots.add(i).write(slot) };
        }
        // SAFETY: the caller's contract, and the region is now formatted.
        let ring = unsafe { Self::view(mem, capacity, owner) };
        // Release: publishes the header and slots written above; pairs with the Acquire load
        // of the magic in `attach`.
        ring.header()
            .meta
            .magic
            .store(crate::layout::RING_MAGIC, Ordering::Release);
        ring
    }

    /// Makes a view of a formatted ring.
    ///
    /// # Safety
    ///
    /// `mem` holds a formatted ring of `capacity` (valid) slots of `Slot<T>`, 64-byte aligned,
    /// that outlives the view or is owned by `owner`.
    pub(crate) unsafe fn view(
        mem: NonNull<u8>,
        capacity: u32,
        owner: Option<Arc<HeapRegion>>,
    ) -> Self {
        debug_assert!(valid_capacity(capacity));
        Self {
            header: mem.cast(),
            // SAFETY: SLOTS_OFFSET is inside the region (the header precedes the slots).
            slots: unsafe { mem.add(SLOTS_OFFSET).cast() },
            mask: u64::from(capacity) - 1,
            capacity,
            owner,
        }
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: `header` points to a formatted header that stays mapped while this view
        // lives (init/attach contract or the owner Arc); it holds only atomics.
        unsafe { self.header.as_ref() }
    }

    fn slot(&self, pos: u64) -> &Slot<T> {
        // Masked with the view's own mask, never with a value read from shared memory.
        let index = (pos & self.mask) as usize;
        // SAFETY: index < capacity and `slots` points to `capacity` formatted slots that live
        // as long as the view (see `header`).
        unsafe { &*self.slots.as_ptr().add(index) }
    }

    /// Appends `v` at the tail.
    ///
    /// Lock-free: a retry only happens when another producer reserved the position first.
    ///
    /// # Errors
    ///
    /// [`Full`] with `v` when every slot holds an entry not yet taken (also when the slot at
    /// the tail is still being read by a consumer, or the region is corrupt).
    ///
    /// ```
    /// let ring = doorbell::Ring::<u32>::new_in_heap(2);
    /// ring.push(1).unwrap();
    /// ring.push(2).unwrap();
    /// assert_eq!(ring.push(3).unwrap_err().into_inner(), 3);
    /// ```
    pub fn push(&self, v: T) -> Result<Pushed, Full<T>> {
        let header = self.header();
        // Relaxed: only where to start looking; the slot stamp decides.
        let mut tail = header.tail.0.load(Ordering::Relaxed);
        for _ in 0..RETRY_LIMIT {
            let slot = self.slot(tail);
            // Acquire: pairs with the Release stamp store in `pop` that freed this slot on the
            // previous lap, so that consumer's copy of the old entry happens before our write.
            let stamp = slot.stamp.load(Ordering::Acquire);
            let diff = stamp.wrapping_sub(tail) as i64;
            if diff == 0 {
                // The slot is free for position `tail`: try to reserve it.
                // Relaxed: the CAS only decides which producer owns `tail`; the entry is
                // published by the stamp store below.
                match header.tail.0.compare_exchange_weak(
                    tail,
                    tail.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        slot.value.with_mut(|p| {
                            // SAFETY: winning the CAS for `tail` while the stamp said "free for
                            // tail" makes this thread the only one to touch the value until
                            // the stamp below hands it to a consumer.
                            unsafe { p.write(MaybeUninit::new(v)) }
                        });
                        // Release: publishes the entry written above; pairs with the Acquire
                        // stamp loads in `pop` and `can_pop`.
                        slot.stamp.store(tail.wrapping_add(1), Ordering::Release);
                        // Relaxed: `was_empty` is a snapshot (see `Pushed`).
                        let head = header.head.0.load(Ordering::Relaxed);
                        return Ok(Pushed {
                            was_empty: head.wrapping_sub(tail) as i64 >= 0,
                        });
                    }
                    Err(current) => tail = current,
                }
            } else if diff < 0 {
                // The slot still holds the entry of the previous lap (or a consumer is still
                // copying it out): the ring is full.
                return Err(Full(v));
            } else {
                // A later stamp: another producer filled `tail` after we read the index.
                // Its CAS happens before its stamp store, which our Acquire load saw, so a
                // reload must show a newer tail; an unchanged one means corrupt memory.
                let current = header.tail.0.load(Ordering::Relaxed);
                if current == tail {
                    log::warn!("ring: slot stamp {stamp} ahead of tail {tail}; region corrupt");
                    return Err(Full(v));
                }
                tail = current;
            }
            spin_loop();
        }
        log::warn!("ring: push gave up after {RETRY_LIMIT} retries");
        Err(Full(v))
    }

    /// Takes the entry at the head, or `None` if the entry there is not committed yet
    /// (the ring is empty, or its oldest producer is between reserve and commit).
    ///
    /// ```
    /// let ring = doorbell::Ring::<u8>::new_in_heap(2);
    /// assert_eq!(ring.pop(), None);
    /// ring.push(7).unwrap();
    /// assert_eq!(ring.pop(), Some(7));
    /// ```
    pub fn pop(&self) -> Option<T> {
        let header = self.header();
        // Relaxed: only where to start looking; the slot stamp decides.
        let mut head = header.head.0.load(Ordering::Relaxed);
        for _ in 0..RETRY_LIMIT {
            let slot = self.slot(head);
            // Acquire: pairs with the Release stamp store in `push`, making its entry visible.
            let stamp = slot.stamp.load(Ordering::Acquire);
            let next = head.wrapping_add(1);
            let diff = stamp.wrapping_sub(next) as i64;
            if diff == 0 {
                // Relaxed: the CAS only decides which consumer owns `head`.
                match header.head.0.compare_exchange_weak(
                    head,
                    next,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let v = slot.value.with(|p| {
                            // SAFETY: winning the CAS for `head` while the stamp said "filled
                            // for head" gives this thread the value until the stamp below.
                            // The bytes are initialised (zeroed by format, then written by
                            // producers) and any bit pattern is a valid `T: Plain`.
                            unsafe { p.read().assume_init() }
                        });
                        // Release: our copy above happens before the next lap's producer
                        // writes; pairs with the Acquire stamp load in `push`.
                        slot.stamp.store(
                            head.wrapping_add(u64::from(self.capacity)),
                            Ordering::Release,
                        );
                        return Some(v);
                    }
                    Err(current) => head = current,
                }
            } else if diff < 0 {
                // Not committed for `head` yet: empty, or a producer is still filling it.
                return None;
            } else {
                // A later stamp: another consumer took `head` after we read the index; as in
                // `push`, an unchanged reload means corrupt memory.
                let current = header.head.0.load(Ordering::Relaxed);
                if current == head {
                    log::warn!("ring: slot stamp {stamp} ahead of head {head}; region corrupt");
                    return None;
                }
                head = current;
            }
            spin_loop();
        }
        log::warn!("ring: pop gave up after {RETRY_LIMIT} retries");
        None
    }

    /// Whether a [`pop`](Ring::pop) would find a committed entry now.
    ///
    /// This is the condition a sleeping consumer waits for. Unlike `!is_empty()` it is false
    /// while the oldest reserved entry is uncommitted, so a consumer does not spin on it.
    ///
    /// ```
    /// let ring = doorbell::Ring::<u16>::new_in_heap(4);
    /// assert!(!ring.can_pop());
    /// ring.push(1).unwrap();
    /// assert!(ring.can_pop());
    /// ```
    pub fn can_pop(&self) -> bool {
        let header = self.header();
        // Relaxed: the stamp decides; a stale head is caught below.
        let mut head = header.head.0.load(Ordering::Relaxed);
        for _ in 0..RETRY_LIMIT {
            // Acquire: pairs with the Release stamp stores in `push` (the entry is committed)
            // and `pop` (a later-lap stamp implies the reload below shows a newer head).
            let stamp = self.slot(head).stamp.load(Ordering::Acquire);
            let diff = stamp.wrapping_sub(head.wrapping_add(1)) as i64;
            if diff == 0 {
                return true;
            }
            if diff < 0 {
                return false;
            }
            let current = header.head.0.load(Ordering::Relaxed);
            if current == head {
                return false;
            }
            head = current;
            spin_loop();
        }
        false
    }

    /// Number of entries reserved and not yet taken, clamped to `0..=capacity`.
    ///
    /// A snapshot: under concurrency it may be stale by the time it returns. It counts entries
    /// whose producer has reserved but not yet committed them.
    pub fn len(&self) -> usize {
        let header = self.header();
        // Relaxed: a snapshot of two indices, nothing is read through them.
        let head = header.head.0.load(Ordering::Relaxed);
        let tail = header.tail.0.load(Ordering::Relaxed);
        let n = tail.wrapping_sub(head) as i64;
        n.clamp(0, i64::from(self.capacity)) as usize
    }

    /// Whether [`len`](Ring::len) is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }
}

/// `DropContents` of a heap ring: drops the header and slot objects `format` wrote.
///
/// # Safety
///
/// `mem` holds a ring formatted for `capacity` slots of `T` that nobody uses any more.
pub(crate) unsafe fn drop_ring<T: Plain>(mem: NonNull<u8>, capacity: u32) {
    if !core::mem::needs_drop::<RingHeader>() && !core::mem::needs_drop::<Slot<T>>() {
        return;
    }
    // SAFETY: the caller guarantees a formatted, unused ring: the header and `capacity` slots
    // were written by `format` at these offsets and are dropped exactly once, here.
    unsafe {
        core::ptr::drop_in_place(mem.cast::<RingHeader>().as_ptr());
        let slots = mem.add(SLOTS_OFFSET).cast::<Slot<T>>().as_ptr();
        core::ptr::drop_in_place(core::ptr::slice_from_raw_parts_mut(
            slots,
            capacity as usize,
        ));
    }
}

/// Checks that a caller-provided region starts on a cache line.
#[cfg(not(loom))]
pub(crate) fn check_aligned(mem: NonNull<u8>) -> Result<(), LayoutError> {
    let addr = mem.as_ptr() as usize;
    if addr % CACHE_LINE != 0 {
        return Err(LayoutError::Misaligned { addr });
    }
    Ok(())
}

#[cfg(not(loom))]
fn check_field(name: &'static str, expected: usize, found: u32) -> Result<(), LayoutError> {
    if found as usize != expected {
        return Err(LayoutError::Field {
            name,
            expected: expected as u32,
            found,
        });
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sys::testing::{Mapping, Memfd};

    fn header<T: Plain>(ring: &Ring<T>) -> &RingHeader {
        ring.header()
    }

    #[test]
    fn bytes_for_counts_header_and_slots() {
        assert_eq!(Ring::<u64>::bytes_for(2), 192 + 64);
        assert_eq!(Ring::<u64>::bytes_for(16), 192 + 256);
        assert_eq!(Ring::<[u64; 7]>::bytes_for(4), 192 + 256);
        assert_eq!(Ring::<u8>::bytes_for(1024), 192 + 16 * 1024);
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn new_in_heap_rejects_bad_capacity() {
        let _ = Ring::<u64>::new_in_heap(3);
    }

    #[test]
    fn fifo_and_full_at_capacity() {
        let ring = Ring::<u64>::new_in_heap(8);
        for i in 0..8 {
            ring.push(i).unwrap();
        }
        assert_eq!(ring.len(), 8);
        assert_eq!(ring.push(99), Err(Full(99)));
        assert_eq!(ring.pop(), Some(0));
        ring.push(8).unwrap();
        assert_eq!(ring.push(100), Err(Full(100)));
        for i in 1..=8 {
            assert_eq!(ring.pop(), Some(i));
        }
        assert_eq!(ring.pop(), None);
        assert!(ring.is_empty());
    }

    #[test]
    fn slot_index_wraps_many_times() {
        let ring = Ring::<u32>::new_in_heap(4);
        let mut next_in = 0u32;
        let mut next_out = 0u32;
        // Vary the fill level so every slot is written at every phase; over 10_000 laps
        // (fewer under Miri, which is slow).
        let rounds = if cfg!(miri) { 500 } else { 50_000u32 };
        for round in 0..rounds {
            let burst = round % 5;
            for _ in 0..burst {
                if ring.push(next_in).is_ok() {
                    next_in += 1;
                }
            }
            for _ in 0..(round % 3 + 1) {
                if let Some(v) = ring.pop() {
                    assert_eq!(v, next_out);
                    next_out += 1;
                }
            }
            assert!(ring.len() <= 4);
        }
        while let Some(v) = ring.pop() {
            assert_eq!(v, next_out);
            next_out += 1;
        }
        assert_eq!(next_in, next_out);
        assert!(
            next_out > rounds * 4 / 5,
            "only {next_out} entries went through"
        );
        let tail = header(&ring).tail.0.load(Ordering::Relaxed);
        assert_eq!(tail, u64::from(next_in));
    }

    #[test]
    fn was_empty_marks_the_empty_to_non_empty_transition() {
        let ring = Ring::<u64>::new_in_heap(4);
        assert!(ring.push(1).unwrap().was_empty);
        assert!(!ring.push(2).unwrap().was_empty);
        ring.pop();
        assert!(!ring.push(3).unwrap().was_empty);
        ring.pop();
        ring.pop();
        assert!(ring.push(4).unwrap().was_empty);
    }

    #[test]
    fn uncommitted_head_is_not_poppable() {
        let ring = Ring::<u64>::new_in_heap(4);
        // Simulate a producer that reserved position 0 and has not committed.
        header(&ring).tail.0.store(1, Ordering::Relaxed);
        ring.push(2).unwrap();
        assert_eq!(ring.len(), 2);
        assert!(!ring.can_pop());
        assert_eq!(ring.pop(), None);
        // Commit position 0 (what the producer's stamp store does).
        ring.slot(0).stamp.store(1, Ordering::Release);
        assert!(ring.can_pop());
        assert_eq!(ring.pop(), Some(0));
        assert_eq!(ring.pop(), Some(2));
    }

    #[test]
    fn clones_share_entries() {
        let a = Ring::<u64>::new_in_heap(4);
        let b = a.clone();
        a.push(5).unwrap();
        drop(a);
        assert_eq!(b.pop(), Some(5));
    }

    /// `len` bytes of `map` starting `offset` bytes in.
    fn region(map: &Mapping, offset: usize, len: usize) -> NonNull<u8> {
        assert!(offset + len <= map.len());
        NonNull::new(map.ptr().as_ptr().wrapping_add(offset)).unwrap()
    }

    /// `Ring::init` on part of a test mapping.
    fn init_at<T: Plain>(
        map: &Mapping,
        offset: usize,
        len: usize,
        capacity: u32,
    ) -> Result<Ring<T>, LayoutError> {
        // SAFETY: the region lies inside `map` (checked by `region`); the tests drop their
        // views before the mapping and touch the memory only through rings and their atomics.
        unsafe { Ring::init(region(map, offset, len), len, capacity) }
    }

    /// `Ring::attach` on the start of a test mapping.
    fn attach_at<T: Plain>(map: &Mapping, len: usize) -> Result<Ring<T>, LayoutError> {
        // SAFETY: as in `init_at`.
        unsafe { Ring::attach(region(map, 0, len), len) }
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn init_rejects_bad_arguments() {
        let fd = Memfd::new(4096);
        let map = fd.map();
        let len = map.len();
        for bad in [0, 1, 3, 12, crate::MAX_CAPACITY * 2] {
            let e = init_at::<u64>(&map, 0, len, bad).unwrap_err();
            assert_eq!(e, LayoutError::BadCapacity { capacity: bad });
        }
        let e = init_at::<u64>(&map, 0, len, 1024).unwrap_err();
        assert_eq!(
            e,
            LayoutError::TooShort {
                needed: Ring::<u64>::bytes_for(1024),
                len
            }
        );
        let e = init_at::<u64>(&map, 8, len - 8, 4).unwrap_err();
        assert!(matches!(e, LayoutError::Misaligned { .. }), "{e:?}");
        let ring = init_at::<u64>(&map, 64, len - 64, 4).unwrap();
        assert_eq!(ring.capacity(), 4);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn attach_validates_the_header() {
        let fd = Memfd::new(4096);
        let map = fd.map();
        let len = map.len();
        let ring = init_at::<u64>(&map, 0, len, 16).unwrap();
        let meta = &header(&ring).meta;

        // Bad magic.
        meta.magic.store(0xdead_beef, Ordering::Relaxed);
        let e = attach_at::<u64>(&map, len).unwrap_err();
        assert_eq!(
            e,
            LayoutError::BadMagic {
                expected: crate::RING_MAGIC,
                found: 0xdead_beef
            }
        );
        meta.magic.store(crate::RING_MAGIC, Ordering::Relaxed);

        // Bad version.
        meta.version.store(7, Ordering::Relaxed);
        let e = attach_at::<u64>(&map, len).unwrap_err();
        assert_eq!(e, LayoutError::BadVersion { found: 7 });
        meta.version.store(crate::LAYOUT_VERSION, Ordering::Relaxed);

        // Bad capacity: zero, not a power of two, absurdly large.
        for bad in [0, 1, 12, crate::MAX_CAPACITY * 2, u32::MAX] {
            meta.capacity.store(bad, Ordering::Relaxed);
            let e = attach_at::<u64>(&map, len).unwrap_err();
            assert_eq!(e, LayoutError::BadCapacity { capacity: bad });
        }
        // A valid capacity the region is too short for.
        meta.capacity.store(1024, Ordering::Relaxed);
        let e = attach_at::<u64>(&map, len).unwrap_err();
        assert_eq!(
            e,
            LayoutError::TooShort {
                needed: Ring::<u64>::bytes_for(1024),
                len
            }
        );
        meta.capacity.store(16, Ordering::Relaxed);

        // Short length: shorter than the slots, shorter than the header.
        let short = Ring::<u64>::bytes_for(16) - 1;
        let e = attach_at::<u64>(&map, short).unwrap_err();
        assert_eq!(
            e,
            LayoutError::TooShort {
                needed: short + 1,
                len: short
            }
        );
        let e = attach_at::<u64>(&map, 100).unwrap_err();
        assert_eq!(
            e,
            LayoutError::TooShort {
                needed: 192,
                len: 100
            }
        );

        // Entry size mismatch.
        let e = attach_at::<u32>(&map, len).unwrap_err();
        assert_eq!(
            e,
            LayoutError::EntrySize {
                expected: 4,
                found: 8
            }
        );
        // Slot stride and slot offset disagreeing with this build.
        meta.slot_size.store(24, Ordering::Relaxed);
        let e = attach_at::<u64>(&map, len).unwrap_err();
        assert_eq!(
            e,
            LayoutError::Field {
                name: "slot_size",
                expected: 16,
                found: 24
            }
        );
        meta.slot_size.store(16, Ordering::Relaxed);
        meta.slots_offset.store(64, Ordering::Relaxed);
        let e = attach_at::<u64>(&map, len).unwrap_err();
        assert!(
            matches!(
                e,
                LayoutError::Field {
                    name: "slots_offset",
                    ..
                }
            ),
            "{e:?}"
        );
        meta.slots_offset.store(192, Ordering::Relaxed);

        // Everything restored: attach works.
        assert_eq!(attach_at::<u64>(&map, len).unwrap().capacity(), 16);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn attach_in_another_mapping_sees_the_same_entries() {
        let fd = Memfd::new(4096);
        let (map_a, map_b) = (fd.map(), fd.map());
        assert_ne!(map_a.ptr(), map_b.ptr());
        let a = init_at::<[u64; 2]>(&map_a, 0, map_a.len(), 8).unwrap();
        for i in 0..5u64 {
            a.push([i, !i]).unwrap();
        }
        let b = attach_at::<[u64; 2]>(&map_b, map_b.len()).unwrap();
        assert_eq!(b.capacity(), 8);
        assert_eq!(b.len(), 5);
        assert_eq!(b.pop(), Some([0, !0]));
        b.push([9, 9]).unwrap();
        for i in 1..5u64 {
            assert_eq!(a.pop(), Some([i, !i]));
        }
        assert_eq!(a.pop(), Some([9, 9]));
        assert!(b.is_empty());
    }

    #[test]
    fn corrupt_indices_and_stamps_give_errors_not_hangs() {
        let ring = Ring::<u64>::new_in_heap(4);
        let h = header(&ring);
        // Indices far apart and near the wrap of u64.
        h.tail.0.store(u64::MAX - 1, Ordering::Relaxed);
        h.head.0.store(12345, Ordering::Relaxed);
        assert!(ring.len() <= 4);
        assert!(ring.push(1).is_err());
        assert_eq!(ring.pop(), None);
        assert!(!ring.can_pop());

        // A stamp ahead of the tail that nobody will ever move: push must not spin.
        h.tail.0.store(0, Ordering::Relaxed);
        h.head.0.store(0, Ordering::Relaxed);
        ring.slot(0).stamp.store(5, Ordering::Relaxed);
        assert_eq!(ring.push(1), Err(Full(1)));
        // Same on the consumer side: a stamp ahead of head + 1.
        ring.slot(0).stamp.store(7, Ordering::Relaxed);
        assert_eq!(ring.pop(), None);
        assert!(!ring.can_pop());

        // Garbage stamps in every slot: bounded, no panic.
        for i in 0..4 {
            ring.slot(i).stamp.store(
                0x5555_5555_5555_5555u64.wrapping_mul(i + 1),
                Ordering::Relaxed,
            );
        }
        for _ in 0..10 {
            let _ = ring.push(3);
            let _ = ring.pop();
        }
    }
}
