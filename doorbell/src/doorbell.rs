//! Doorbell: a ring of posted descriptors plus the event count its consumer sleeps on.
//!
//! * **Producers** (posting threads) [`ring`](Doorbell::ring): push (reserve, fill, commit
//!   with Release, see [`crate::Ring`]), then [`EventCount::notify_all`]. The notify happens
//!   whenever a consumer is registered as a waiter, not only on the empty→non-empty
//!   transition: a consumer may have gone to sleep on an older entry whose producer had
//!   reserved but not committed, while a later producer saw a non-empty ring.
//! * **The consumer** (the engine) [`poll`](Doorbell::poll)s and, when nothing can be taken,
//!   [`wait`](Doorbell::wait)s: `prepare_wait`, re-check "the head slot is committed"
//!   ([`Ring::can_pop`]), futex wait. The SeqCst fences of the event count order the commit
//!   against the re-check (see [`EventCount`]), so a commit is either seen by the re-check or
//!   followed by a wake.
//! * [`push_quiet`](Doorbell::push_quiet) skips the notify, for an inline engine where the
//!   poster drains the ring itself; it must only be used when no consumer can be asleep.

use core::fmt;
use core::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::heap::HeapRegion;
use crate::layout::{DOORBELL_RING_OFFSET, DoorbellHeader, DoorbellMeta};
use crate::ring::{Full, Pushed, Ring, drop_ring};
use crate::sync::{AtomicU32, Ordering};
use crate::{EventCount, Plain, wait_until};
#[cfg(not(loom))]
use crate::{
    LayoutError,
    layout::{DOORBELL_MAGIC, LAYOUT_VERSION, valid_capacity},
};

/// A doorbell ring succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rang {
    /// The ring went from empty to non-empty with this entry: the doorbell proper, the cue
    /// to kick an idle engine. A snapshot, see [`Pushed::was_empty`].
    pub was_empty: bool,
}

/// A [`Ring<T>`] plus an [`EventCount`] in the same shared region: the engine's doorbell.
///
/// Like `Ring`, a `Doorbell` is a view: clones and views attached in other processes share
/// the entries and the sleeping consumer.
///
/// ```
/// use std::time::Duration;
/// use doorbell::Doorbell;
///
/// let db = Doorbell::<u64>::new_in_heap(64);
/// let engine = db.clone();
/// let t = std::thread::spawn(move || {
///     let mut got = Vec::new();
///     while got.len() < 3 {
///         match engine.poll() {
///             Some(v) => got.push(v),
///             None => assert!(engine.wait(Some(Duration::from_secs(10)))),
///         }
///     }
///     got
/// });
/// for v in [1, 2, 3] {
///     db.ring(v).unwrap();
/// }
/// assert_eq!(t.join().unwrap(), [1, 2, 3]);
/// ```
pub struct Doorbell<T: Plain> {
    /// The ring; it also keeps a heap region alive.
    ring: Ring<T>,
    /// The consumer's event count, in the region's header.
    event: NonNull<EventCount>,
}

// SAFETY: `event` points into the same region as the ring, which outlives the view; the
// event count is only used through its atomics (and a loom mutex under loom).
unsafe impl<T: Plain> Send for Doorbell<T> {}
// SAFETY: as above; every method takes `&self` and is safe to call concurrently.
unsafe impl<T: Plain> Sync for Doorbell<T> {}

impl<T: Plain> Clone for Doorbell<T> {
    fn clone(&self) -> Self {
        Self {
            ring: self.ring.clone(),
            event: self.event,
        }
    }
}

impl<T: Plain> fmt::Debug for Doorbell<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Doorbell")
            .field("ring", &self.ring)
            .field("event", self.event_count())
            .finish()
    }
}

impl<T: Plain> Doorbell<T> {
    /// Bytes of shared memory a doorbell of `capacity` entries needs.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is not a power of two in `2..=`[`MAX_CAPACITY`](crate::MAX_CAPACITY).
    ///
    /// ```
    /// use doorbell::{Doorbell, Ring};
    /// assert_eq!(Doorbell::<u64>::bytes_for(8), 128 + Ring::<u64>::bytes_for(8));
    /// ```
    pub const fn bytes_for(capacity: u32) -> usize {
        DOORBELL_RING_OFFSET + Ring::<T>::bytes_for(capacity)
    }

    /// Formats `mem` as an empty doorbell of `capacity` entries and returns a view.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Misaligned`], [`LayoutError::BadCapacity`], [`LayoutError::TooShort`],
    /// as [`Ring::init`].
    ///
    /// # Safety
    ///
    /// As [`Ring::init`]: `mem` valid for reads and writes of `len` bytes, not accessed by
    /// anyone else during the call, mapped while any view lives, and afterwards only accessed
    /// through this protocol.
    #[cfg(not(loom))]
    pub unsafe fn init(mem: NonNull<u8>, len: usize, capacity: u32) -> Result<Self, LayoutError> {
        crate::ring::check_aligned(mem)?;
        if !valid_capacity(capacity) {
            return Err(LayoutError::BadCapacity { capacity });
        }
        let needed = Self::bytes_for(capacity);
        if len < needed {
            return Err(LayoutError::TooShort { needed, len });
        }
        // SAFETY: checked above; exclusivity and lifetime are the caller's contract.
        Ok(unsafe { Self::format(mem, capacity, None) })
    }

    /// Returns a view of a doorbell that [`init`](Doorbell::init) formatted, possibly in
    /// another process or through another mapping.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Misaligned`], [`LayoutError::TooShort`], [`LayoutError::BadMagic`],
    /// [`LayoutError::BadVersion`], [`LayoutError::Field`] (ring offset) for the doorbell
    /// header, then every error of [`Ring::attach`] for the ring inside (with `TooShort`
    /// counted from the start of the doorbell).
    ///
    /// # Safety
    ///
    /// As [`Ring::attach`]: `mem` valid for reads and writes of `len` bytes, mapped while the
    /// view lives, only accessed through this protocol; its content may be anything.
    #[cfg(not(loom))]
    pub unsafe fn attach(mem: NonNull<u8>, len: usize) -> Result<Self, LayoutError> {
        crate::ring::check_aligned(mem)?;
        if len < DOORBELL_RING_OFFSET {
            return Err(LayoutError::TooShort {
                needed: DOORBELL_RING_OFFSET,
                len,
            });
        }
        // SAFETY: aligned and at least a header long (checked); atomics only, so any bytes
        // are a valid header.
        let meta = unsafe { &mem.cast::<DoorbellHeader>().as_ref().meta };
        // Acquire: pairs with the Release store of the magic at the end of `format`.
        let magic = meta.magic.load(Ordering::Acquire);
        if magic != DOORBELL_MAGIC {
            return Err(LayoutError::BadMagic {
                expected: DOORBELL_MAGIC,
                found: magic,
            });
        }
        let version = meta.version.load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            return Err(LayoutError::BadVersion { found: version });
        }
        let ring_offset = meta.ring_offset.load(Ordering::Relaxed);
        if ring_offset as usize != DOORBELL_RING_OFFSET {
            return Err(LayoutError::Field {
                name: "ring_offset",
                expected: DOORBELL_RING_OFFSET as u32,
                found: ring_offset,
            });
        }
        // SAFETY: the ring region starts DOORBELL_RING_OFFSET (< len) bytes in and is valid
        // for the rest; the caller's contract covers it.
        let ring_mem = unsafe { mem.add(DOORBELL_RING_OFFSET) };
        // SAFETY: as above.
        let ring =
            unsafe { Ring::attach(ring_mem, len - DOORBELL_RING_OFFSET) }.map_err(|e| match e {
                LayoutError::TooShort { needed, len } => LayoutError::TooShort {
                    needed: needed + DOORBELL_RING_OFFSET,
                    len: len + DOORBELL_RING_OFFSET,
                },
                e => e,
            })?;
        Ok(Self {
            ring,
            event: event_of(mem),
        })
    }

    /// Creates an empty doorbell of `capacity` entries in a heap allocation owned by its
    /// views. Works under `cfg(loom)`.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is not a power of two in `2..=`[`MAX_CAPACITY`](crate::MAX_CAPACITY).
    pub fn new_in_heap(capacity: u32) -> Self {
        let bytes = Self::bytes_for(capacity);
        // SAFETY: formatted right below, before the region can be dropped.
        let region = Arc::new(unsafe { HeapRegion::alloc(bytes, capacity, drop_doorbell::<T>) });
        // SAFETY: a fresh, zeroed, aligned allocation of `bytes_for(capacity)` bytes, owned by
        // the Arc the ring view keeps.
        unsafe { Self::format(region.base(), capacity, Some(region.clone())) }
    }

    /// Writes an empty doorbell into `mem` and returns a view.
    ///
    /// # Safety
    ///
    /// As [`Ring::format`]: aligned, `bytes_for(capacity)` bytes, exclusive during the call,
    /// outlives the view or is owned by `owner`; `capacity` valid.
    unsafe fn format(mem: NonNull<u8>, capacity: u32, owner: Option<Arc<HeapRegion>>) -> Self {
        let header = DoorbellHeader {
            meta: DoorbellMeta {
                magic: AtomicU32::new(0),
                version: AtomicU32::new(crate::layout::LAYOUT_VERSION),
                ring_offset: AtomicU32::new(DOORBELL_RING_OFFSET as u32),
            },
            event: EventCount::new(),
        };
        // SAFETY: aligned for DoorbellHeader (64) and inside the region; exclusive access.
        unsafe { mem.cast::<DoorbellHeader>().write(header) };
        // SAFETY: the ring region follows the header inside the caller's region, 64-byte
        // aligned, `Ring::bytes_for(capacity)` bytes; same exclusivity and lifetime.
        let ring = unsafe { Ring::format(mem.add(DOORBELL_RING_OFFSET), capacity, owner) };
        let db = Self {
            ring,
            event: event_of(mem),
        };
        // SAFETY: the header was written above and lives as long as the region.
        let meta = unsafe { &mem.cast::<DoorbellHeader>().as_ref().meta };
        // Release: publishes the header and ring written above; pairs with the Acquire load of
        // the magic in `attach`.
        meta.magic
            .store(crate::layout::DOORBELL_MAGIC, Ordering::Release);
        db
    }

    /// Pushes `v`, then wakes the consumer if it sleeps (or is about to).
    ///
    /// # Errors
    ///
    /// [`Full`] with `v` when the ring is full; nobody is notified.
    ///
    /// ```
    /// let db = doorbell::Doorbell::<u32>::new_in_heap(2);
    /// assert!(db.ring(1).unwrap().was_empty);
    /// assert!(!db.ring(2).unwrap().was_empty);
    /// assert!(db.ring(3).is_err());
    /// ```
    pub fn ring(&self, v: T) -> Result<Rang, Full<T>> {
        let Pushed { was_empty } = self.ring.push(v)?;
        // Not only on `was_empty`: a consumer may sleep on an older, uncommitted slot
        // (module doc). `notify_all` is one load when nobody sleeps.
        self.event_count().notify_all();
        Ok(Rang { was_empty })
    }

    /// Pushes `v` without waking anyone: for an inline engine whose poster drains the ring
    /// itself, where no consumer can be asleep.
    ///
    /// # Errors
    ///
    /// [`Full`] with `v` when the ring is full.
    ///
    /// ```
    /// let db = doorbell::Doorbell::<u32>::new_in_heap(4);
    /// db.push_quiet(5).unwrap();
    /// assert_eq!(db.poll(), Some(5));
    /// ```
    pub fn push_quiet(&self, v: T) -> Result<Pushed, Full<T>> {
        self.ring.push(v)
    }

    /// Takes the oldest committed entry, if any ([`Ring::pop`]).
    pub fn poll(&self) -> Option<T> {
        self.ring.pop()
    }

    /// Blocks the consumer until an entry can be taken or `timeout` expires (`None`: no
    /// limit). Returns whether an entry can be taken.
    ///
    /// ```
    /// use std::time::Duration;
    /// let db = doorbell::Doorbell::<u32>::new_in_heap(4);
    /// assert!(!db.wait(Some(Duration::from_millis(1))));
    /// db.ring(1).unwrap();
    /// assert!(db.wait(None));
    /// ```
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        // A timeout too far away for Instant to represent means no deadline.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        wait_until(self.event_count(), Duration::ZERO, deadline, || {
            self.ring.can_pop()
        })
    }

    /// The ring inside the doorbell.
    pub fn ring_view(&self) -> &Ring<T> {
        &self.ring
    }

    /// The event count the consumer sleeps on.
    pub fn event_count(&self) -> &EventCount {
        // SAFETY: `event` points to the formatted header of the region, which lives as long
        // as the view (attach contract, or the heap region kept by `self.ring`); it is only
        // used through atomics.
        unsafe { self.event.as_ref() }
    }
}

/// The event count inside the doorbell header at `mem`.
fn event_of(mem: NonNull<u8>) -> NonNull<EventCount> {
    let offset = core::mem::offset_of!(DoorbellHeader, event);
    // Address arithmetic only (nothing is read); the field lies inside the header.
    let event = mem.as_ptr().wrapping_add(offset).cast::<EventCount>();
    NonNull::new(event).expect("field of a non-null header")
}

/// `DropContents` of a heap doorbell: drops the header and the ring objects.
///
/// # Safety
///
/// `mem` holds a doorbell formatted for `capacity` slots of `T` that nobody uses any more.
unsafe fn drop_doorbell<T: Plain>(mem: NonNull<u8>, capacity: u32) {
    // SAFETY: the caller guarantees a formatted, unused doorbell; each object is dropped once.
    unsafe {
        core::ptr::drop_in_place(mem.cast::<DoorbellHeader>().as_ptr());
        drop_ring::<T>(mem.add(DOORBELL_RING_OFFSET), capacity);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sys::testing::{Mapping, Memfd, thread_id, wait_blocked_in_futex};

    #[test]
    fn ring_notifies_only_when_somebody_waits() {
        let db = Doorbell::<u64>::new_in_heap(8);
        let ec = db.event_count();
        assert!(db.ring(1).unwrap().was_empty);
        assert_eq!(ec.seq.load(Ordering::Relaxed), 0, "no waiter, no bump");
        let key = ec.prepare_wait();
        assert!(!db.ring(2).unwrap().was_empty);
        assert_eq!(
            ec.seq.load(Ordering::Relaxed),
            1,
            "a waiter: bump even if not was_empty"
        );
        ec.cancel_wait(key);
        let key = ec.prepare_wait();
        db.push_quiet(3).unwrap();
        assert_eq!(
            ec.seq.load(Ordering::Relaxed),
            1,
            "push_quiet never notifies"
        );
        ec.cancel_wait(key);
        assert_eq!(db.poll(), Some(1));
        assert_eq!(db.poll(), Some(2));
        assert_eq!(db.poll(), Some(3));
        assert_eq!(db.poll(), None);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn wait_times_out_on_an_empty_ring() {
        let db = Doorbell::<u64>::new_in_heap(2);
        let start = Instant::now();
        assert!(!db.wait(Some(Duration::from_millis(20))));
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert!(!db.event_count().has_waiters());
        db.ring(9).unwrap();
        assert!(db.wait(Some(Duration::ZERO)));
        assert!(db.wait(Some(Duration::MAX)));
    }

    /// `len` bytes of `map` starting `offset` bytes in.
    fn region(map: &Mapping, offset: usize, len: usize) -> NonNull<u8> {
        assert!(offset + len <= map.len());
        NonNull::new(map.ptr().as_ptr().wrapping_add(offset)).unwrap()
    }

    /// `Doorbell::init` on the start of a test mapping.
    fn init_at<T: Plain>(map: &Mapping, capacity: u32) -> Result<Doorbell<T>, LayoutError> {
        // SAFETY: the mapping is valid for its length; the tests drop their views before the
        // mapping and touch the memory only through doorbells and their atomics.
        unsafe { Doorbell::init(map.ptr(), map.len(), capacity) }
    }

    /// `Doorbell::attach` on part of a test mapping.
    fn attach_at<T: Plain>(
        map: &Mapping,
        offset: usize,
        len: usize,
    ) -> Result<Doorbell<T>, LayoutError> {
        // SAFETY: the region lies inside `map` (checked by `region`); as in `init_at`.
        unsafe { Doorbell::attach(region(map, offset, len), len) }
    }

    /// The header's metadata line of a doorbell formatted at the start of `map`.
    fn meta(map: &Mapping) -> &DoorbellMeta {
        // SAFETY: `init_at` formatted a header there; it holds only atomics and lives as long
        // as the mapping borrowed here.
        unsafe { &map.ptr().cast::<DoorbellHeader>().as_ref().meta }
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn attach_validates_the_doorbell_header() {
        let fd = Memfd::new(4096);
        let map = fd.map();
        let len = map.len();
        let db = init_at::<u64>(&map, 8).unwrap();
        let meta = meta(&map);

        meta.magic.store(crate::RING_MAGIC, Ordering::Relaxed);
        let e = attach_at::<u64>(&map, 0, len).unwrap_err();
        assert_eq!(
            e,
            LayoutError::BadMagic {
                expected: DOORBELL_MAGIC,
                found: crate::RING_MAGIC
            }
        );
        meta.magic.store(DOORBELL_MAGIC, Ordering::Relaxed);

        meta.version.store(0, Ordering::Relaxed);
        let e = attach_at::<u64>(&map, 0, len).unwrap_err();
        assert_eq!(e, LayoutError::BadVersion { found: 0 });
        meta.version.store(LAYOUT_VERSION, Ordering::Relaxed);

        meta.ring_offset.store(64, Ordering::Relaxed);
        let e = attach_at::<u64>(&map, 0, len).unwrap_err();
        assert!(
            matches!(
                e,
                LayoutError::Field {
                    name: "ring_offset",
                    ..
                }
            ),
            "{e:?}"
        );
        meta.ring_offset
            .store(DOORBELL_RING_OFFSET as u32, Ordering::Relaxed);

        let e = attach_at::<u64>(&map, 0, 64).unwrap_err();
        assert_eq!(
            e,
            LayoutError::TooShort {
                needed: 128,
                len: 64
            }
        );
        let need = Doorbell::<u64>::bytes_for(8);
        let e = attach_at::<u64>(&map, 0, need - 1).unwrap_err();
        assert_eq!(
            e,
            LayoutError::TooShort {
                needed: need,
                len: need - 1
            }
        );
        let e = attach_at::<u16>(&map, 0, len).unwrap_err();
        assert_eq!(
            e,
            LayoutError::EntrySize {
                expected: 2,
                found: 8
            }
        );
        // The ring region alone is not a doorbell.
        let e = attach_at::<u64>(&map, 128, len - 128).unwrap_err();
        assert!(matches!(e, LayoutError::BadMagic { .. }), "{e:?}");
        let e = attach_at::<u64>(&map, 32, len - 32).unwrap_err();
        assert!(matches!(e, LayoutError::Misaligned { .. }), "{e:?}");

        db.ring(4).unwrap();
        let other = attach_at::<u64>(&map, 0, len).unwrap();
        assert_eq!(other.poll(), Some(4));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn init_rejects_bad_arguments() {
        let fd = Memfd::new(4096);
        let map = fd.map();
        assert_eq!(
            init_at::<u64>(&map, 6).unwrap_err(),
            LayoutError::BadCapacity { capacity: 6 }
        );
        assert!(matches!(
            init_at::<u64>(&map, 1024).unwrap_err(),
            LayoutError::TooShort { .. }
        ));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn wake_crosses_mappings_of_the_same_memfd() {
        // Two mappings of one memfd have different addresses: only the shared futex (keyed by
        // the page, not the address) lets a ring through one wake a waiter on the other.
        let fd = Memfd::new(8192);
        let (map_a, map_b) = (fd.map(), fd.map());
        let consumer = init_at::<u64>(&map_a, 16).unwrap();
        let producer = attach_at::<u64>(&map_b, 0, map_b.len()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let t = s.spawn(|| {
                tx.send(thread_id()).unwrap();
                let ok = consumer.wait(Some(Duration::from_secs(10)));
                (ok, consumer.poll())
            });
            let tid = rx.recv().unwrap();
            let blocked = wait_blocked_in_futex(tid, Instant::now() + Duration::from_secs(5));
            assert!(blocked, "the consumer never slept in the futex");
            let rang = Instant::now();
            producer.ring(42).unwrap();
            let (ok, v) = t.join().unwrap();
            // After a timeout `wait` still reports the entry, so check that the wake returned
            // it: far sooner than the 10 s timeout.
            assert!(
                rang.elapsed() < Duration::from_secs(5),
                "woken by the timeout, not the ring"
            );
            assert!(ok);
            assert_eq!(v, Some(42));
        });
    }
}
