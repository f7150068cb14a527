//! `EntryRing`: the CQ1 completion ring, a bounded MPMC ring of 64-bit
//! entries in shared memory (Vyukov stamps, tombstones, close, logical limit).
//!
//! # Who does what
//!
//! * **Producers** are the engines of any process that maps the ring: the
//!   sender's engine pushes the receiver's completion. They are untrusted and
//!   may die at any instruction. They own `tail`: a producer *reserves*
//!   position `pos` by CAS `tail: pos → pos + 1`, *fills* the slot's `lo` word
//!   by CAS (guarded by a tag derived from `pos`), then *commits* by CAS
//!   `seq: FREE(pos) → FULL(pos)`, and wakes sleepers.
//! * **Consumers** are threads of the owning process (`pop`, `wait`,
//!   `drain_closed`). They own `head`: a consumer *claims* `pos` by CAS
//!   `head: pos → pos + 1` once the slot is `FULL(pos)` or `TOMB(pos)`, reads
//!   the entry, and *releases* the slot by storing `FREE(pos + capacity)`.
//! * **The owner** (control path, same process as the consumers) creates the
//!   ring (`init`), sets the logical size (`set_limit`), closes it (`close`:
//!   sets `CLOSED` in the tail word) and tombstones slots whose producer died
//!   (`repair`, `drain_closed`: CAS `seq: FREE(pos) → TOMB(pos)`).
//!
//! # Ordering contract
//!
//! 1. *Commit.* The producer's commit CAS on `seq` is `Release`; the
//!    consumer's load of `seq` in `pop` is `Acquire`. So both halves of the
//!    entry (`lo`, written before the commit, and the high half inside `seq`)
//!    are visible to the consumer that sees `FULL(pos)`.
//! 2. *Release of a slot.* The consumer's store of `FREE(pos + capacity)` is
//!    `Release`; the producer's load of `seq` in `reserve` is `Acquire`. So the
//!    consumer's reads of lap `n` happen before the writes of lap `n + 1`.
//! 3. *Indices.* The tail CAS and the head CAS are `Release`; producers
//!    (and `repair`) load both with `Acquire`. No entry travels through them
//!    (entries move only through the stamps, 1 and 2); they carry
//!    happens-before from the consumer that released a slot to every producer
//!    that sees an index moved past it. That is what lets `reserve` tell a
//!    corrupt header from a stale view: read head-then-tail, a sane ring has
//!    `head <= tail`, and a stamp older than the previous lap cannot be seen.
//!    Consumers load the head `Relaxed` (coherence is all `pop` needs).
//! 4. *Sleep/wake.* `wait` re-checks `pop` inside `doorbell::wait_until`
//!    (prepare → check → sleep); a producer calls `EventCount::notify_all`
//!    after its commit. The `SeqCst` of that handshake lives in `doorbell`.
//! 5. *Close.* `close` is a `fetch_or` of `CLOSED` on the tail word. RMWs on
//!    one word are totally ordered, so every reservation CAS either comes
//!    before it (and is inside the final tail) or fails and sees `CLOSED`.
//! 6. *Tombstone.* The owner CASes `seq` from the exact value the producer's
//!    commit expects (`FREE(pos)` and the stale high half). Exactly one of the
//!    two CAS succeeds. A producer whose commit loses retries with a new
//!    reservation, so its entry is neither lost nor duplicated. The tombstone
//!    CAS is `Release` (paired with the `Acquire` stamp loads of `reserve`
//!    and `pop`): it publishes no entry, but the tail the owner read, so that
//!    whoever sees a stamp newer than its view of an index also sees a newer
//!    index (the same holds for commit and release, 1 and 2).
//! 7. *Magic.* `init` stores the magic last (`Release`); `attach` loads it
//!    (`Acquire`) before reading the rest of the header.
//!
//! No `SeqCst` is used in this module.
//!
//! # Why every slot write is a guarded CAS
//!
//! A producer stalled between its reservation and its commit can be
//! tombstoned by `repair`; the slot is then skipped, released and reused by a
//! later lap. If the stalled producer then wrote the entry with a plain store
//! it would overwrite the later lap's entry. Instead it writes `lo` by CAS
//! from a value whose tag is older than its position (fails once a later lap
//! wrote), and commits by CAS from `FREE(pos)` (fails once tombstoned).
//!
//! # Untrusted memory
//!
//! The capacity is read once and kept in the view; every index is masked with
//! it. Loops are bounded by the local capacity and a fixed retry budget,
//! never by values read from the mapping. A corrupted header or stamp yields
//! an error, `None`, or lost entries.
//!
//! # Limits
//!
//! Stamps keep 30 bits of position and `lo` tags 32. A producer that stalls
//! between reservation and commit while more than 2^31 later positions are
//! pushed (about two billion completions) could pass both guards and
//! overwrite a live entry; anything shorter is detected.

use core::fmt;
use core::ptr::NonNull;
use core::time::Duration;

use doorbell::EventCount;

use crate::error::{LayoutError, LimitError, PushError};
#[cfg(not(loom))]
use crate::layout::{ALIGN, MAGIC, VERSION};
use crate::layout::{
    CLOSED, FREE, FULL, HEADER_BYTES, Header, MAX_CAPACITY, POS_MASK, SLOT_BYTES, Slot, TOMB,
    distance, pack, payload, stamp, state, tag,
};
use crate::sync::{Arc, Backoff, Ordering};

/// Attempts one `reserve` makes before giving up with `PushError::Stuck`.
const RESERVE_STEPS: u32 = 1 << 16;
/// Reservations one `push` makes (each lost to a tombstone) before giving up.
const PUSH_ATTEMPTS: u32 = 64;
/// CAS attempts on a slot's `lo` word before the producer abandons the slot.
const FILL_ATTEMPTS: u32 = 8;
/// Retries (lost head CAS, stale head) one `pop` makes beyond the tombstones
/// it may skip.
const POP_STEPS: u32 = 1 << 10;

/// A multi-producer multi-consumer ring of 64-bit completion entries in
/// shared memory: the CQ1 design, one entry per completion.
///
/// The value is a *view*: cloning it gives another view of the same ring.
/// Producers may live in other processes that map the same memory; see the
/// [module documentation](self) for the protocol.
///
/// ```
/// use cq::EntryRing;
///
/// let ring = EntryRing::new_in_heap(4);
/// ring.push(7).unwrap();
/// ring.push(8).unwrap();
/// assert_eq!(ring.len(), 2);
/// assert_eq!(ring.pop(), Some(7));
/// assert_eq!(ring.pop(), Some(8));
/// assert_eq!(ring.pop(), None);
/// ```
#[derive(Clone)]
pub struct EntryRing {
    /// Start of the header (and of the mapping).
    header: NonNull<Header>,
    /// First of `capacity` slots, right after the header.
    slots: NonNull<Slot>,
    /// Validated copy of the capacity (a power of two); never re-read.
    capacity: u32,
    /// Keeps a heap-backed ring alive; `None` for caller-owned mappings.
    #[allow(dead_code, reason = "held only for its Drop")]
    keep: Option<Arc<Block>>,
}

// SAFETY: the view only hands out shared references to atomics (and to the
// `EventCount`, which is made for sharing across threads and processes), and
// the memory it points to outlives every view (`init`/`attach` contract, or
// `keep` for heap rings). Nothing in it is tied to the creating thread.
unsafe impl Send for EntryRing {}
// SAFETY: as for `Send`: all access through `&self` goes through atomics.
unsafe impl Sync for EntryRing {}

/// A reserved, not yet committed position.
#[derive(Clone, Copy, Debug)]
struct Reservation {
    /// The position won by the tail CAS.
    pos: u64,
    /// The `seq` word seen free before the tail CAS; the commit and any
    /// tombstone CAS from exactly this value.
    seq: u64,
}

/// The producer's commit lost to a tombstone (or the slot was unusable).
#[derive(Debug)]
struct Lost;

impl EntryRing {
    /// Bytes of shared memory a ring of `capacity` slots needs.
    ///
    /// ```
    /// assert_eq!(cq::EntryRing::bytes_for(1024), 256 + 1024 * 16);
    /// ```
    pub const fn bytes_for(capacity: u32) -> usize {
        HEADER_BYTES.saturating_add((capacity as usize).saturating_mul(SLOT_BYTES))
    }

    /// Builds a view from a pointer to an initialised ring.
    ///
    /// # Safety
    ///
    /// `capacity` must be a power of two. `mem` must point to at least
    /// `bytes_for(capacity)` bytes, aligned to 64, that stay mapped while any
    /// view of the ring exists and that this process accesses only through
    /// ring views (atomics); any bit pattern is a valid header and slot.
    #[cfg(not(loom))]
    unsafe fn from_raw(mem: NonNull<u8>, capacity: u32) -> Self {
        // SAFETY: `HEADER_BYTES < bytes_for(capacity)` bytes are inside the
        // mapping (caller's contract), so the offset stays in bounds.
        let slots = unsafe { mem.add(HEADER_BYTES) };
        Self {
            header: mem.cast(),
            slots: slots.cast(),
            capacity,
            keep: None,
        }
    }

    /// Initialises a ring of `capacity` slots at `mem` and returns a view.
    ///
    /// All slots start free, the limit equals the capacity, the ring is open.
    ///
    /// # Errors
    ///
    /// [`LayoutError::BadCapacity`] unless `capacity` is a power of two in
    /// `1..=MAX_CAPACITY`; [`LayoutError::Misaligned`] unless `mem` is 64-byte
    /// aligned; [`LayoutError::TooSmall`] if `len < bytes_for(capacity)`.
    ///
    /// # Safety
    ///
    /// `mem..mem + len` must be writable memory that stays mapped while any
    /// view of this ring exists, and nobody else may access it until `init`
    /// returns (publish the mapping to producers afterwards).
    ///
    /// ```
    /// use std::alloc::{Layout, alloc_zeroed, dealloc};
    /// use std::ptr::NonNull;
    ///
    /// let len = cq::EntryRing::bytes_for(8);
    /// let layout = Layout::from_size_align(len, 64).unwrap();
    /// // SAFETY: the layout has a non-zero size.
    /// let mem = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
    /// // SAFETY: `mem` is `len` fresh bytes, freed only after the last view.
    /// let ring = unsafe { cq::EntryRing::init(mem, len, 8) }.unwrap();
    /// ring.push(1).unwrap();
    /// // SAFETY: as for init; `attach` validates what `init` wrote.
    /// let peer = unsafe { cq::EntryRing::attach(mem, len) }.unwrap();
    /// assert_eq!(peer.pop(), Some(1));
    /// drop((ring, peer));
    /// // SAFETY: no view is left.
    /// unsafe { dealloc(mem.as_ptr(), layout) };
    /// ```
    #[cfg(not(loom))]
    pub unsafe fn init(mem: NonNull<u8>, len: usize, capacity: u32) -> Result<Self, LayoutError> {
        check_capacity(capacity)?;
        let need = Self::bytes_for(capacity);
        check_region(mem, len, need)?;
        // SAFETY: `need <= len` bytes at `mem` are writable and nobody else
        // touches them during `init` (caller's contract).
        unsafe { core::ptr::write_bytes(mem.as_ptr(), 0, need) };
        // SAFETY: the region is large enough and aligned (checked above), all
        // zero bytes are valid atomics and a valid `EventCount`, and it
        // outlives the view (caller's contract).
        let ring = unsafe { Self::from_raw(mem, capacity) };
        let header = ring.header();
        header.ident.version.store(VERSION, Ordering::Relaxed);
        header.ident.capacity.store(capacity, Ordering::Relaxed);
        header.ident.limit.store(capacity, Ordering::Relaxed);
        for pos in 0..u64::from(capacity) {
            ring.reset_slot(pos);
        }
        // Release: publishes the fields above; pairs with the Acquire load
        // of the magic in `attach`.
        header.ident.magic.store(MAGIC, Ordering::Release);
        Ok(ring)
    }

    /// Attaches to a ring that `init` built, possibly in another process.
    ///
    /// The magic, version and capacity are validated and the capacity is
    /// copied into the view; nothing read later from the mapping is trusted.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Misaligned`], [`LayoutError::TooSmall`] (for the header
    /// or for the slots of the recorded capacity), [`LayoutError::BadMagic`],
    /// [`LayoutError::BadVersion`], [`LayoutError::BadCapacity`].
    ///
    /// # Safety
    ///
    /// `mem..mem + len` must be readable and writable memory that stays
    /// mapped while any view exists, and that this process accesses only
    /// through ring views. Its contents may be anything, and other processes
    /// may change them at any time: nothing but the validated capacity is
    /// trusted afterwards.
    #[cfg(not(loom))]
    pub unsafe fn attach(mem: NonNull<u8>, len: usize) -> Result<Self, LayoutError> {
        check_region(mem, len, HEADER_BYTES)?;
        // SAFETY: `HEADER_BYTES <= len` aligned bytes are mapped (checked
        // above, caller's contract); a `Header` is atomics only, valid for
        // any bit pattern, so a shared reference to it is sound.
        let header = unsafe { mem.cast::<Header>().as_ref() };
        // Acquire: pairs with the Release store of the magic in `init`.
        let magic = header.ident.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(LayoutError::BadMagic(magic));
        }
        let version = header.ident.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(LayoutError::BadVersion(version));
        }
        let capacity = header.ident.capacity.load(Ordering::Relaxed);
        check_capacity(capacity)?;
        check_region(mem, len, Self::bytes_for(capacity))?;
        // SAFETY: `bytes_for(capacity) <= len` aligned bytes are mapped and
        // stay mapped (checked above, caller's contract); any bit pattern is
        // a valid slot.
        Ok(unsafe { Self::from_raw(mem, capacity) })
    }

    /// Creates a ring of `capacity` slots in this process's heap (tests,
    /// benches, rings no other process maps).
    ///
    /// # Panics
    ///
    /// If `capacity` is not a power of two in `1..=MAX_CAPACITY`, or if the
    /// allocation fails.
    ///
    /// ```
    /// let ring = cq::EntryRing::new_in_heap(16);
    /// assert_eq!(ring.capacity(), 16);
    /// assert_eq!(ring.limit(), 16);
    /// ```
    pub fn new_in_heap(capacity: u32) -> Self {
        if let Err(e) = check_capacity(capacity) {
            panic!("EntryRing::new_in_heap: {e}");
        }
        Block::ring(capacity)
    }

    /// The header.
    #[inline]
    fn header(&self) -> &Header {
        // SAFETY: `header` points to an initialised `Header` that outlives
        // `self` (`init`/`attach` contract, or `keep`). It holds only atomics
        // and an `EventCount`, so shared references are sound even while
        // other processes write it.
        unsafe { self.header.as_ref() }
    }

    /// The slot of position `pos` (masked).
    #[inline]
    fn slot(&self, pos: u64) -> &Slot {
        let index = (pos & u64::from(self.capacity - 1)) as usize;
        // SAFETY: `index < capacity`, masked with the validated local
        // capacity (a power of two), and `capacity` slots follow the header
        // (checked against the mapping length by `init`/`attach`, or
        // allocated so by `Block`). A `Slot` is atomics only.
        unsafe { self.slots.add(index).as_ref() }
    }

    /// Writes the initial state of the slot that position `pos` uses first.
    fn reset_slot(&self, pos: u64) {
        let slot = self.slot(pos);
        // The tag of `lo` must read as "an older lap" for the first producer.
        let older = (pos as u32).wrapping_sub(self.capacity);
        slot.lo.store(pack(older, 0), Ordering::Relaxed);
        slot.seq.store(pack(stamp(pos, FREE), 0), Ordering::Relaxed);
    }

    /// The sleep/wake word of the ring: producers notify it after every
    /// commit, `wait` sleeps on it.
    pub fn event(&self) -> &EventCount {
        &self.header().event
    }

    /// Physical number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// The logical size: `push` fails with [`PushError::Overrun`] once the
    /// ring holds this many entries.
    pub fn limit(&self) -> usize {
        self.header()
            .ident
            .limit
            .load(Ordering::Relaxed)
            .min(self.capacity) as usize
    }

    /// Sets the logical size (`VipCreateCQ` entries, `VipResizeCQ` within the
    /// physical capacity).
    ///
    /// A push racing with a shrinking `set_limit` may still be admitted by the
    /// old limit.
    ///
    /// # Errors
    ///
    /// [`LimitError::AboveCapacity`] if `n > capacity()`,
    /// [`LimitError::BelowLen`] if the ring holds more than `n` entries.
    ///
    /// ```
    /// let ring = cq::EntryRing::new_in_heap(8);
    /// ring.set_limit(2).unwrap();
    /// ring.push(1).unwrap();
    /// ring.push(2).unwrap();
    /// assert_eq!(ring.push(3), Err(cq::PushError::Overrun));
    /// assert!(ring.set_limit(1).is_err());
    /// assert!(ring.set_limit(9).is_err());
    /// ```
    pub fn set_limit(&self, n: usize) -> Result<(), LimitError> {
        let capacity = self.capacity();
        if n > capacity {
            return Err(LimitError::AboveCapacity { limit: n, capacity });
        }
        let len = self.len();
        if n < len {
            return Err(LimitError::BelowLen { limit: n, len });
        }
        // `n <= capacity <= MAX_CAPACITY` fits in u32.
        self.header().ident.limit.store(n as u32, Ordering::Relaxed);
        Ok(())
    }

    /// Number of positions between head and tail: committed entries plus
    /// reservations not yet committed and tombstones not yet skipped. A
    /// snapshot; clamped to the capacity if the header is corrupt.
    pub fn len(&self) -> usize {
        let header = self.header();
        // Head first: the tail only grows, so a sane header gives head <= tail.
        let head = header.consumer.head.load(Ordering::Relaxed);
        let tail = header.producer.tail.load(Ordering::Relaxed) & POS_MASK;
        tail.wrapping_sub(head).min(u64::from(self.capacity)) as usize
    }

    /// Whether [`len`](Self::len) is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.header().producer.tail.load(Ordering::Relaxed) & CLOSED != 0
    }

    /// Closes the ring: once this returns, every new reservation fails and
    /// `push` returns [`PushError::Closed`]. Sleeping consumers are woken.
    ///
    /// Used by `VipResizeCQ` (close, [`drain_closed`](Self::drain_closed),
    /// build a bigger ring, publish it) and by `VipDestroyCQ`.
    ///
    /// ```
    /// let ring = cq::EntryRing::new_in_heap(4);
    /// ring.push(1).unwrap();
    /// ring.close();
    /// assert_eq!(ring.push(2), Err(cq::PushError::Closed));
    /// assert_eq!(ring.drain_closed(std::time::Duration::ZERO), vec![1]);
    /// ```
    pub fn close(&self) {
        // Relaxed: the RMW is ordered against every reservation CAS by the
        // modification order of the tail word alone (contract point 5).
        self.header()
            .producer
            .tail
            .fetch_or(CLOSED, Ordering::Relaxed);
        self.event().notify_all();
    }

    /// Appends `entry` and wakes sleeping consumers.
    ///
    /// # Errors
    ///
    /// [`PushError::Overrun`] if the ring holds `limit()` entries;
    /// [`PushError::Closed`] after `close`; [`PushError::Corrupt`] or
    /// [`PushError::Stuck`] if the shared header or slots were damaged.
    ///
    /// ```
    /// let ring = cq::EntryRing::new_in_heap(1);
    /// assert_eq!(ring.push(u64::MAX), Ok(()));
    /// assert_eq!(ring.push(0), Err(cq::PushError::Overrun));
    /// assert_eq!(ring.pop(), Some(u64::MAX));
    /// ```
    pub fn push(&self, entry: u64) -> Result<(), PushError> {
        self.push_with(entry, |_| {})
    }

    /// `push`, calling `between(pos)` after each reservation and before its
    /// commit (tests use it to stall a producer there).
    #[inline]
    fn push_with(&self, entry: u64, mut between: impl FnMut(u64)) -> Result<(), PushError> {
        for _ in 0..PUSH_ATTEMPTS {
            let reservation = self.reserve()?;
            between(reservation.pos);
            match self.commit(reservation, entry) {
                Ok(()) => {
                    self.event().notify_all();
                    return Ok(());
                }
                Err(Lost) => {
                    log::debug!(
                        "cq: slot {} was tombstoned before its commit; retrying",
                        reservation.pos
                    );
                }
            }
        }
        log::warn!("cq: push lost {PUSH_ATTEMPTS} reservations in a row");
        Err(PushError::Stuck)
    }

    /// Reserves the next position (tail CAS).
    ///
    /// Tells a damaged header from a stale view by the index chain of
    /// contract point 3: a sane ring read head-then-tail gives
    /// `head <= tail`, and once the same pair is read twice,
    /// `tail - head <= capacity`; a stamp older than the previous lap, or one
    /// newer than `pos` while the tail does not move, is impossible.
    fn reserve(&self) -> Result<Reservation, PushError> {
        let header = self.header();
        let capacity = u64::from(self.capacity);
        let mut backoff = Backoff::default();
        let mut previous = None;
        for _ in 0..RESERVE_STEPS {
            // Acquire (both): pairs with the Release head CAS in `pop` and
            // the Release tail CAS below (contract point 3).
            let head = header.consumer.head.load(Ordering::Acquire);
            let tail = header.producer.tail.load(Ordering::Acquire);
            if tail & CLOSED != 0 {
                return Err(PushError::Closed);
            }
            let pos = tail & POS_MASK;
            let len = pos.wrapping_sub(head);
            if len > capacity {
                // `head > tail`, or the same pair twice, cannot be stale.
                if head > pos || previous == Some((head, tail)) {
                    log::warn!("cq: ring header corrupt (tail {pos}, head {head})");
                    return Err(PushError::Corrupt);
                }
                // Our head is older than our tail: read both again.
                previous = Some((head, tail));
                continue;
            }
            let limit = u64::from(header.ident.limit.load(Ordering::Relaxed)).min(capacity);
            if len >= limit {
                return Err(PushError::Overrun);
            }
            // Acquire: pairs with the Release store that released this slot
            // in `pop` (contract point 2), so our writes come after the last
            // lap's reads; and with the Release commit and tombstone CAS, so
            // that a stamp newer than `pos` implies a tail newer than `tail`.
            let seq = self.slot(pos).seq.load(Ordering::Acquire);
            let s = tag(seq);
            let d = distance(s, pos);
            if d == 0 && state(s) == FREE {
                // Release: carries what we saw (the slot released by the
                // consumer of the previous lap, hence its head CAS) to the
                // producers that read this tail; pairs with their Acquire
                // load above. Acquire on failure: the next round starts
                // from a tail at least as new.
                match header.producer.tail.compare_exchange_weak(
                    tail,
                    tail + 1,
                    Ordering::Release,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Ok(Reservation { pos, seq }),
                    Err(_) => {
                        backoff.spin();
                        continue;
                    }
                }
            }
            if d == -(self.capacity as i32) && matches!(state(s), FULL | TOMB) {
                // The previous lap's consumer moved the head past this slot
                // but has not released it yet: wait for it.
                backoff.snooze();
                continue;
            }
            // Someone else reserved `pos` (the stamp is ahead of it), so the
            // tail has moved; if it has not, the stamp is garbage.
            // Acquire: as above.
            if header.producer.tail.load(Ordering::Acquire) == tail {
                log::warn!("cq: slot stamp {s:#x} inconsistent with tail {pos}");
                return Err(PushError::Corrupt);
            }
        }
        log::warn!("cq: no slot could be reserved in {RESERVE_STEPS} steps");
        Err(PushError::Stuck)
    }

    /// Fills and commits a reservation. On `Err(Lost)` the entry was not
    /// published and the reservation is gone (tombstoned).
    fn commit(&self, r: Reservation, entry: u64) -> Result<(), Lost> {
        let slot = self.slot(r.pos);
        let mine = r.pos as u32;
        let mut lo = slot.lo.load(Ordering::Relaxed);
        let mut filled = false;
        for _ in 0..FILL_ATTEMPTS {
            if (mine.wrapping_sub(tag(lo)) as i32) <= 0 {
                // A later lap (or garbage) is in `lo`: this slot was
                // tombstoned and reused while we were stalled.
                break;
            }
            // Relaxed: the commit below (Release) publishes this write.
            match slot.lo.compare_exchange(
                lo,
                pack(mine, entry as u32),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    filled = true;
                    break;
                }
                Err(current) => lo = current,
            }
        }
        if !filled {
            self.abandon(r);
            return Err(Lost);
        }
        let full = pack(stamp(r.pos, FULL), (entry >> 32) as u32);
        // Release: publishes `lo` (above) and the high half in `seq`; pairs
        // with the Acquire load of `seq` in `pop` (contract point 1).
        // Failure: a tombstone won (point 6); nothing was published.
        slot.seq
            .compare_exchange(r.seq, full, Ordering::Release, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| Lost)
    }

    /// Tombstones our own reservation after we could not fill it, so that
    /// consumers skip it. Losing this CAS means someone tombstoned it first.
    fn abandon(&self, r: Reservation) {
        let tomb = pack(stamp(r.pos, TOMB), payload(r.seq));
        // Release: publishes no entry (consumers never read the entry words
        // of a tombstone) but our tail CAS, for `reserve`'s check that a
        // newer stamp means a newer tail; pairs with its Acquire load.
        let _ = self.slot(r.pos).seq.compare_exchange(
            r.seq,
            tomb,
            Ordering::Release,
            Ordering::Relaxed,
        );
    }

    /// Takes the oldest committed entry, skipping tombstones.
    ///
    /// Returns `None` if the ring is empty, or if the oldest position is
    /// reserved but not committed yet (entries behind it wait for its
    /// producer, or for [`repair`](Self::repair) if the producer died).
    ///
    /// ```
    /// let ring = cq::EntryRing::new_in_heap(2);
    /// assert_eq!(ring.pop(), None);
    /// ring.push(42).unwrap();
    /// assert_eq!(ring.pop(), Some(42));
    /// ```
    pub fn pop(&self) -> Option<u64> {
        let header = self.header();
        let capacity = u64::from(self.capacity);
        let mut backoff = Backoff::default();
        let mut head = header.consumer.head.load(Ordering::Relaxed);
        for _ in 0..self.capacity + POP_STEPS {
            let slot = self.slot(head);
            // Acquire: pairs with the Release commit CAS in `commit`
            // (contract point 1).
            let seq = slot.seq.load(Ordering::Acquire);
            let s = tag(seq);
            match distance(s, head) {
                0 if matches!(state(s), FULL | TOMB) => {
                    // Release: carries the commit (or tombstone) we just
                    // acquired to producers that read the new head; pairs
                    // with the Acquire head load in `reserve` (point 3).
                    if let Err(current) = header.consumer.head.compare_exchange_weak(
                        head,
                        head.wrapping_add(1),
                        Ordering::Release,
                        Ordering::Relaxed,
                    ) {
                        head = current;
                        backoff.spin();
                        continue;
                    }
                    let entry = if state(s) == FULL {
                        let lo = slot.lo.load(Ordering::Relaxed);
                        if tag(lo) == head as u32 {
                            Some(u64::from(payload(seq)) << 32 | u64::from(payload(lo)))
                        } else {
                            log::warn!("cq: slot {head} committed with a foreign tag; entry lost");
                            None
                        }
                    } else {
                        None
                    };
                    let free = pack(stamp(head.wrapping_add(capacity), FREE), 0);
                    // Release: our reads of this lap happen before the next
                    // lap's writes; pairs with the Acquire load in `reserve`
                    // (contract point 2).
                    slot.seq.store(free, Ordering::Release);
                    if entry.is_some() {
                        return entry;
                    }
                    head = head.wrapping_add(1);
                }
                d if d <= 0 => {
                    // FREE(head): empty, or reserved and not committed yet.
                    // Older: the previous lap is being released; nothing at
                    // `head` can be committed yet. State 3 is garbage that
                    // `repair` clears.
                    return None;
                }
                _ => {
                    // Another consumer took `head` (the Acquire above makes
                    // its head CAS visible to the reload); if the head did not
                    // move, the stamp is garbage.
                    let current = header.consumer.head.load(Ordering::Relaxed);
                    if current == head {
                        log::debug!("cq: slot stamp {s:#x} inconsistent with head {head}");
                        return None;
                    }
                    head = current;
                }
            }
        }
        None
    }

    /// Takes the oldest entry, spinning for `spin` and then sleeping on the
    /// ring's [`EventCount`] until an entry arrives, the ring is closed, or
    /// `timeout` (`None`: no timeout) expires.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let ring = cq::EntryRing::new_in_heap(4);
    /// let producer = ring.clone();
    /// let t = std::thread::spawn(move || producer.push(5).unwrap());
    /// assert_eq!(ring.wait(Duration::from_micros(10), Some(Duration::from_secs(10))), Some(5));
    /// t.join().unwrap();
    /// assert_eq!(ring.wait(Duration::ZERO, Some(Duration::from_millis(1))), None);
    /// ```
    #[cfg(not(loom))]
    pub fn wait(&self, spin: Duration, timeout: Option<Duration>) -> Option<u64> {
        if let Some(entry) = self.pop() {
            return Some(entry);
        }
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        let mut got = None;
        doorbell::wait_until(self.event(), spin, deadline, || {
            got = self.pop();
            got.is_some() || self.is_closed()
        });
        got
    }

    /// After [`close`](Self::close) (called here if it was not): waits up to
    /// `grace` for reserved-but-uncommitted slots, tombstones the ones still
    /// uncommitted, and returns every committed entry in order.
    ///
    /// Call it with no other consumer active. Producers whose reservation was
    /// tombstoned retry and get [`PushError::Closed`], so they re-push into
    /// the ring that replaces this one.
    pub fn drain_closed(&self, grace: Duration) -> Vec<u64> {
        if !self.is_closed() {
            self.close();
        }
        let tombstoned = self.settle(grace);
        if tombstoned > 0 {
            log::info!("cq: drain tombstoned {tombstoned} uncommitted slots");
        }
        let mut out = Vec::with_capacity(self.len());
        // At most `capacity` entries can be left; the bound also guards
        // against a header a peer keeps rewriting.
        for _ in 0..self.capacity {
            match self.pop() {
                Some(entry) => out.push(entry),
                None => break,
            }
        }
        out
    }

    /// After the owner learns that a producer process died: tombstones the
    /// slots that were reserved but still uncommitted `grace` after this call
    /// started, so that consumers skip them. Returns how many it tombstoned.
    ///
    /// A live producer that commits within `grace` is not affected; one that
    /// is slower loses its slot and retries with a new reservation, so its
    /// entry still arrives exactly once. Slots with garbage stamps between
    /// head and tail are tombstoned too.
    ///
    /// ```
    /// let ring = cq::EntryRing::new_in_heap(4);
    /// ring.push(1).unwrap();
    /// assert_eq!(ring.repair(std::time::Duration::ZERO), 0);
    /// assert_eq!(ring.pop(), Some(1));
    /// ```
    pub fn repair(&self, grace: Duration) -> usize {
        let n = self.settle(grace);
        if n > 0 {
            log::info!("cq: repair tombstoned {n} slots of dead producers");
        }
        n
    }

    /// The common part of `repair` and `drain_closed`.
    fn settle(&self, grace: Duration) -> usize {
        let header = self.header();
        let capacity = u64::from(self.capacity);
        // Acquire (both): as in `reserve`, so that a sane ring gives
        // `head <= tail` and every position still uncommitted is at least
        // `tail - capacity`.
        let head = header.consumer.head.load(Ordering::Acquire);
        let tail = header.producer.tail.load(Ordering::Acquire) & POS_MASK;
        let (start, span) = match tail.checked_sub(head) {
            Some(span) if span <= capacity => (head, span),
            Some(_) => (tail - capacity, capacity), // our head is stale
            None => {
                log::warn!("cq: ring header corrupt (tail {tail}, head {head}); repairing one lap");
                (tail.wrapping_sub(capacity), capacity)
            }
        };
        let mut pending: Vec<u64> = (0..span)
            .map(|i| start.wrapping_add(i))
            .filter(|&pos| self.is_pending(pos))
            .collect();
        if pending.is_empty() {
            return 0;
        }
        self.await_commits(grace, &mut pending);
        let tombstoned = pending.iter().filter(|&&pos| self.tombstone(pos)).count();
        if tombstoned > 0 {
            // Consumers blocked behind these slots can move on now.
            self.event().notify_all();
        }
        tombstoned
    }

    /// Waits until every position in `pending` is committed or `grace` has
    /// passed; leaves the still-pending ones in `pending`.
    #[cfg(not(loom))]
    fn await_commits(&self, grace: Duration, pending: &mut Vec<u64>) {
        if grace.is_zero() {
            return;
        }
        let deadline = std::time::Instant::now().checked_add(grace);
        // Producers notify the event after every commit.
        doorbell::wait_until(self.event(), Duration::ZERO, deadline, || {
            pending.retain(|&pos| self.is_pending(pos));
            pending.is_empty()
        });
    }

    /// Under loom nothing may block: the grace period is treated as expired.
    #[cfg(loom)]
    fn await_commits(&self, _grace: Duration, _pending: &mut Vec<u64>) {}

    /// Whether position `pos` (between head and tail) is reserved and not
    /// committed, or holds a garbage stamp.
    fn is_pending(&self, pos: u64) -> bool {
        let seq = self.slot(pos).seq.load(Ordering::Relaxed);
        pending_stamp(tag(seq), pos)
    }

    /// Tombstones `pos` if it is still pending; true if this call did it.
    fn tombstone(&self, pos: u64) -> bool {
        let slot = self.slot(pos);
        let seq = slot.seq.load(Ordering::Relaxed);
        if !pending_stamp(tag(seq), pos) {
            return false;
        }
        let tomb = pack(stamp(pos, TOMB), payload(seq));
        // The CAS from the exact value the producer's commit expects makes
        // exactly one of the two win (contract point 6). Release: publishes
        // no entry, but the tail this thread read in `settle` (past `pos`),
        // for `reserve`'s check that a newer stamp means a newer tail; pairs
        // with its Acquire load of `seq`.
        slot.seq
            .compare_exchange(seq, tomb, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Test hook: reserves a slot and never commits it, as a producer that
    /// died between its reservation and its commit.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn reserve_and_die(&self) -> Result<u64, PushError> {
        self.reserve().map(|r| r.pos)
    }

    /// Test hook: `push` that calls `between(pos)` between reservation and
    /// commit.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn push_stalled(
        &self,
        entry: u64,
        between: impl FnMut(u64),
    ) -> Result<(), PushError> {
        self.push_with(entry, between)
    }
}

/// Whether a stamp read at position `pos` (between head and tail) means
/// "reserved, not committed" or garbage: anything but this lap's FULL or
/// TOMB, or a newer lap (already consumed).
fn pending_stamp(s: u32, pos: u64) -> bool {
    match distance(s, pos) {
        0 => !matches!(state(s), FULL | TOMB),
        d => d < 0,
    }
}

impl fmt::Debug for EntryRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntryRing")
            .field("capacity", &self.capacity)
            .field("limit", &self.limit())
            .field("len", &self.len())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Checks a capacity from the caller or from the mapping.
fn check_capacity(capacity: u32) -> Result<(), LayoutError> {
    if capacity.is_power_of_two() && capacity <= MAX_CAPACITY {
        Ok(())
    } else {
        Err(LayoutError::BadCapacity(capacity))
    }
}

/// Checks the alignment and length of a mapping.
#[cfg(not(loom))]
fn check_region(mem: NonNull<u8>, len: usize, need: usize) -> Result<(), LayoutError> {
    if mem.as_ptr().align_offset(ALIGN) != 0 {
        return Err(LayoutError::Misaligned);
    }
    if len < need {
        return Err(LayoutError::TooSmall { need, have: len });
    }
    Ok(())
}

/// Heap storage of a ring made by `new_in_heap`.
#[cfg(not(loom))]
struct Block {
    mem: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the block is plain memory only accessed through atomics by the
// ring views; freeing it (Drop) needs no particular thread.
#[cfg(not(loom))]
unsafe impl Send for Block {}
// SAFETY: `Block` itself has no `&self` methods touching the memory.
#[cfg(not(loom))]
unsafe impl Sync for Block {}

#[cfg(not(loom))]
impl Block {
    /// Allocates and initialises a heap ring (capacity already checked).
    fn ring(capacity: u32) -> EntryRing {
        let len = EntryRing::bytes_for(capacity);
        let layout = std::alloc::Layout::from_size_align(len, ALIGN)
            .unwrap_or_else(|e| panic!("EntryRing::new_in_heap: {e}"));
        // SAFETY: `layout` has a non-zero size (the header alone is 256 bytes).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(mem) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        let block = Arc::new(Block { mem, layout });
        // SAFETY: `len` fresh, 64-aligned bytes that only this function sees
        // yet; `block` (kept in the view) frees them after the last view.
        let mut ring = unsafe { EntryRing::init(mem, len, capacity) }
            .unwrap_or_else(|e| panic!("EntryRing::new_in_heap: {e}"));
        ring.keep = Some(block);
        ring
    }
}

#[cfg(not(loom))]
impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: `mem` came from `alloc_zeroed(layout)` and the last view
        // holding this block is gone.
        unsafe { std::alloc::dealloc(self.mem.as_ptr(), self.layout) };
    }
}

/// Heap storage of a ring under loom: loom atomics are not plain memory, so
/// the header and slots are built as values.
#[cfg(loom)]
struct Block {
    header: Box<Header>,
    slots: Box<[Slot]>,
}

#[cfg(loom)]
impl Block {
    /// Builds a heap ring out of loom atomics (capacity already checked).
    fn ring(capacity: u32) -> EntryRing {
        use crate::layout::{Consumer, Ident, Producer};
        use crate::sync::{AtomicU32, AtomicU64};
        let header = Box::new(Header {
            ident: Ident {
                magic: AtomicU64::new(0),
                version: AtomicU32::new(0),
                capacity: AtomicU32::new(capacity),
                limit: AtomicU32::new(capacity),
            },
            producer: Producer {
                tail: AtomicU64::new(0),
            },
            consumer: Consumer {
                head: AtomicU64::new(0),
            },
            event: EventCount::new(),
        });
        let slots = (0..u64::from(capacity))
            .map(|_| Slot {
                lo: AtomicU64::new(0),
                seq: AtomicU64::new(0),
            })
            .collect();
        let block = Arc::new(Block { header, slots });
        let header = NonNull::from(&*block.header);
        // From the whole slice, so the pointer may reach every slot.
        let slots = NonNull::from(&*block.slots).cast::<Slot>();
        let ring = EntryRing {
            header,
            slots,
            capacity,
            keep: Some(block),
        };
        for pos in 0..u64::from(capacity) {
            ring.reset_slot(pos);
        }
        ring
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
