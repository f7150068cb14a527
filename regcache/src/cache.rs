//! The pin-down cache: [`RegCache`], the [`Lease`]s it hands out, its [`Config`] and [`Stats`].
//!
//! One mutex guards all of the cache's state ([`Inner`]); the [`Pinner`] is never called with it
//! held. A miss therefore runs in three steps:
//! 1. under the lock: look up, and on a miss record a [`Pending`] pin of the range;
//! 2. without the lock: `pin` the pages;
//! 3. under the lock: take the pending record back, then look up again. If another thread
//!    cached a cover meanwhile, use it and unpin ours; if an `invalidate` overlapped the range
//!    while we pinned, hand the pages to the caller but do not cache them; else cache them.
//!
//! Step 3 is what keeps an invalidated range from coming back: `invalidate` marks every
//! overlapping pending pin, because what it pinned may be the mapping the invalidation is about.
//! Unpinning, too, happens after the lock is dropped, so the backend may pin pages that an
//! entry being evicted still holds: every pin is an independent handle.
#![forbid(unsafe_code)]

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::Pinner;
use crate::interval::IntervalTree;
use crate::range::{self, RangeError};

/// Hashes page extents (two page-aligned addresses) with a multiply: keys are not chosen by an
/// adversary who could benefit from collisions, and SipHash would cost as much as the tree walk
/// it saves.
#[derive(Default)]
struct ExtentHasher(u64);

impl Hasher for ExtentHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ *b as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = (self.0.rotate_left(5) ^ v as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

type BuildExtentHasher = BuildHasherDefault<ExtentHasher>;

/// A merged entry is at most this many times the request (see `Inner::merged`).
pub const MERGE_LIMIT: usize = 4;

/// Tuning of a [`RegCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Pinned bytes kept cached after their last lease is released; beyond it, the least
    /// recently released entries are unpinned. 0 disables caching: an entry is unpinned as soon
    /// as its last lease is released (it is still shared while leases are live).
    pub capacity_bytes: usize,
    /// Entries kept cached without a lease; beyond it, the least recently released are
    /// unpinned. `usize::MAX`: no bound but the bytes.
    pub capacity_regions: usize,
    /// A miss whose bytes overlap leased entries pins the union of them and the request (up to
    /// [`MERGE_LIMIT`] times the request), and the entries it covers leave the cache: one entry
    /// instead of several overlapping ones (as UCX's rcache merges). Off: every miss pins just
    /// its own range.
    pub merge: bool,
    /// Check every hit with [`Pinner::is_current`] before handing it out: for backends that
    /// are not told when memory is unmapped, so that a hit never returns a translation of
    /// memory that has gone away.
    pub validate_hits: bool,
}

impl Default for Config {
    /// 64 MiB and 4096 entries, no merging, no validation.
    fn default() -> Config {
        Config {
            capacity_bytes: 64 << 20,
            capacity_regions: 4096,
            merge: false,
            validate_hits: false,
        }
    }
}

/// Counters and gauges of a [`RegCache`], read with [`RegCache::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Acquires served by an entry already in the cache.
    pub hits: u64,
    /// Acquires that pinned a new entry.
    pub misses: u64,
    /// Unreferenced entries unpinned to stay within [`Config::capacity_bytes`].
    pub evictions: u64,
    /// Entries dropped by [`RegCache::invalidate`].
    pub invalidations: u64,
    /// Bytes of all entries not yet unpinned, including invalidated entries that still have
    /// leases.
    pub pinned_bytes: usize,
    /// Bytes of cached entries that have no lease: what [`Config::capacity_bytes`] bounds.
    pub cached_unreferenced_bytes: usize,
    /// Entries a later acquire can hit, referenced or not.
    pub entries: usize,
    /// Cached entries without a lease: what [`Config::capacity_regions`] bounds.
    pub idle_entries: usize,
    /// Misses that pinned the union of the request and cached neighbours.
    pub merges: u64,
    /// Hits that [`Pinner::is_current`] refused (then served as misses).
    pub stale_hits: u64,
}

/// Why [`RegCache::acquire`] failed.
#[derive(Debug)]
pub enum Error<E> {
    /// The region has no page range (see [`page_range`](crate::page_range)).
    Range(RangeError),
    /// The backend could not pin the pages; the cache is unchanged.
    Pin(E),
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Range(e) => write!(f, "bad region: {e}"),
            Self::Pin(e) => write!(f, "pinning failed: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Range(e) => Some(e),
            Self::Pin(e) => Some(e),
        }
    }
}

/// A reference to a pinned page range, handed out by [`RegCache::acquire`].
///
/// Give it back with [`RegCache::release`]. Dropping it instead keeps its entry referenced, so
/// pinned, until the cache is dropped.
#[must_use = "a lease must be given back with RegCache::release"]
pub struct Lease<T> {
    /// Slot of the entry in [`Inner::slots`].
    id: usize,
    pages: Range<usize>,
    /// Shared with the entry; [`RegCache::release`] also uses it to tell its own leases apart.
    pinned: Arc<T>,
}

impl<T> Lease<T> {
    /// The entry's page range: it covers the range that was asked for, and may be larger.
    pub fn pages(&self) -> Range<usize> {
        self.pages.clone()
    }

    /// What the backend returned when it pinned [`Lease::pages`].
    pub fn pinned(&self) -> &T {
        &self.pinned
    }
}

impl<T: fmt::Debug> fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field(
                "pages",
                &format_args!("{:#x}..{:#x}", self.pages.start, self.pages.end),
            )
            .field("pinned", &self.pinned)
            .finish()
    }
}

/// Pin-down registration cache: hands out leases on pinned page ranges and keeps ranges pinned
/// after their last lease, up to [`Config::capacity_bytes`], so that buffers used again are not
/// pinned again.
///
/// * A request is a **hit** if one cached entry's pages cover all of its pages. Entries are
///   never merged: a request that overlaps entries without one of them covering it is a miss and
///   pins its own range, so entries may overlap.
/// * An entry with no lease is kept in LRU order, by time of last release, and the oldest are
///   unpinned while the unreferenced bytes exceed the capacity. Zero-length entries are never
///   kept: they are unpinned on their last release.
/// * [`RegCache::invalidate`] drops entries at once; those still leased are unpinned on their
///   last release. A dropped entry is never returned again.
///
/// All methods take `&self`; one internal mutex guards the state and is never held while the
/// [`Pinner`] runs. A miss pins without the lock and then looks again: if another thread cached
/// a cover meanwhile, that entry is shared and the duplicate unpinned; if an overlapping
/// invalidation ran meanwhile, the new pin is leased to the caller but not cached. Dropping the
/// cache unpins every entry left.
///
/// ```
/// # use std::ops::Range;
/// # struct Toy;
/// # impl regcache::Pinner for Toy {
/// #     type Pinned = ();
/// #     type Error = std::convert::Infallible;
/// #     fn pin(&self, _: Range<usize>) -> Result<(), Self::Error> { Ok(()) }
/// #     fn unpin(&self, _: Range<usize>, _: ()) {}
/// # }
/// use regcache::{Config, RegCache, page_size};
///
/// let ps = page_size();
/// let cache = RegCache::new(Toy, Config { capacity_bytes: 16 * ps, ..Config::default() });
/// let a = cache.acquire(0x100 * ps, 2 * ps).unwrap();
/// // Overlaps `a` without being inside it: a miss with its own, overlapping entry.
/// let b = cache.acquire(0x101 * ps, 2 * ps).unwrap();
/// assert_eq!(b.pages(), 0x101 * ps..0x103 * ps);
/// // Inside `b`: a hit.
/// let c = cache.acquire(0x102 * ps + 8, 8).unwrap();
/// assert_eq!(c.pages(), b.pages());
/// assert_eq!((cache.stats().misses, cache.stats().hits, cache.stats().entries), (2, 1, 2));
/// for lease in [a, b, c] {
///     cache.release(lease);
/// }
/// ```
pub struct RegCache<P: Pinner> {
    pinner: P,
    config: Config,
    inner: Mutex<Inner<P::Pinned>>,
}

/// State of a [`RegCache`], guarded by its mutex.
struct Inner<T> {
    /// Extents of the entries a lookup may return ([`State::Leased`] and [`State::Idle`]), by
    /// slot.
    tree: IntervalTree,
    /// The same entries by exact extent: most requests repeat one exactly, and a hash probe
    /// costs less than a walk down the tree.
    exact: HashMap<(usize, usize), usize, BuildExtentHasher>,
    /// Every entry not yet unpinned, by slot: an entry's slot is its id while it lives.
    slots: Vec<Option<Entry<T>>>,
    /// Empty slots, reused first.
    free: Vec<usize>,
    /// [`State::Idle`] entries, least recently released first.
    lru: Lru,
    /// Pins running outside the lock. At most one per acquiring thread, so a `Vec` will do.
    pending: Vec<Pending>,
    next_ticket: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    invalidations: u64,
    merges: u64,
    stale_hits: u64,
    pinned_bytes: usize,
    cached_unreferenced_bytes: usize,
    idle_entries: usize,
}

/// A pinned page range, what its pin returned, and its leases.
struct Entry<T> {
    pages: Range<usize>,
    /// The bytes the pin was asked for (inside `pages`): merges pin the union of these.
    bytes: Range<usize>,
    pinned: Arc<T>,
    /// Live leases.
    refs: usize,
    state: State,
    /// Neighbours in [`Inner::lru`] (towards the oldest, towards the newest), while idle.
    older: Option<usize>,
    newer: Option<usize>,
}

/// Where an [`Entry`] is: which structures hold it follows from this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the tree, with leases.
    Leased,
    /// In the tree and in the LRU list, without leases: what the capacity bounds.
    Idle,
    /// Out of the tree after an invalidation (or pinned while one ran), with leases: unpinned
    /// on its last release.
    Invalidated,
}

/// Ends of the doubly linked LRU list threaded through [`Entry::older`] and [`Entry::newer`].
#[derive(Default)]
struct Lru {
    oldest: Option<usize>,
    newest: Option<usize>,
}

/// A pin in progress outside the lock.
struct Pending {
    ticket: u64,
    extent: Range<usize>,
    /// Set by an overlapping [`RegCache::invalidate`]: the result must not be cached.
    invalidated: bool,
}

/// Page ranges and their pins, taken out of the cache to be unpinned once the lock is dropped.
type Unpins<T> = Vec<(Range<usize>, T)>;

impl<P: Pinner> RegCache<P> {
    /// Creates an empty cache that pins through `pinner`.
    pub fn new(pinner: P, config: Config) -> Self {
        Self {
            pinner,
            config,
            inner: Mutex::new(Inner {
                tree: IntervalTree::new(),
                exact: HashMap::default(),
                slots: Vec::new(),
                free: Vec::new(),
                lru: Lru::default(),
                pending: Vec::new(),
                next_ticket: 0,
                hits: 0,
                misses: 0,
                evictions: 0,
                invalidations: 0,
                merges: 0,
                stale_hits: 0,
                pinned_bytes: 0,
                cached_unreferenced_bytes: 0,
                idle_entries: 0,
            }),
        }
    }

    /// Leases pinned pages that cover `len` bytes at `addr`.
    ///
    /// On a hit the covering entry gains a lease; on a miss the page range is pinned and, unless
    /// an overlapping [`invalidate`](Self::invalidate) ran meanwhile, cached. `len == 0` is legal
    /// and leases the empty range at the page of `addr`.
    ///
    /// # Errors
    ///
    /// [`Error::Range`] if the region wraps past the end of the address space, [`Error::Pin`] if
    /// the backend fails. Either way the cache and its stats are unchanged.
    pub fn acquire(&self, addr: usize, len: usize) -> Result<Lease<P::Pinned>, Error<P::Error>> {
        self.acquire_with(addr, len, self.config.validate_hits)
    }

    /// [`acquire`](Self::acquire) with its hit checked by
    /// [`Pinner::is_current`] whatever [`Config::validate_hits`] says: for a
    /// caller that cannot tell, this once, whether memory events are up to
    /// date.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    pub fn acquire_checked(
        &self,
        addr: usize,
        len: usize,
    ) -> Result<Lease<P::Pinned>, Error<P::Error>> {
        self.acquire_with(addr, len, true)
    }

    fn acquire_with(
        &self,
        addr: usize,
        len: usize,
        validate: bool,
    ) -> Result<Lease<P::Pinned>, Error<P::Error>> {
        let pages = range::page_range(addr, len).map_err(Error::Range)?;
        let want = range::extent(&pages);
        let (ticket, pages, bytes) = loop {
            let mut inner = self.lock();
            if let Some(lease) = inner.hit(&want) {
                if !validate {
                    return Ok(lease);
                }
                drop(inner);
                if self.pinner.is_current(lease.pages(), lease.pinned()) {
                    return Ok(lease);
                }
                // The memory under the entry changed: drop it and pin afresh.
                let stale = lease.pages();
                log::debug!("cached {stale:#x?} is stale; pinning again");
                let mut inner = self.lock();
                inner.hits -= 1;
                inner.stale_hits += 1;
                drop(inner);
                self.invalidate_pages(&range::extent(&stale));
                self.release(lease);
                continue;
            }
            let (pages, bytes) = if self.config.merge && len > 0 {
                inner.merged(pages.clone(), addr..addr + len)
            } else {
                (pages.clone(), addr..addr + len)
            };
            break (inner.begin_pin(range::extent(&pages)), pages, bytes);
        };
        // If `pin` panics, the ticket stays in `pending`: harmless, it only marks nothing.
        let pinned = self.pinner.pin_bytes(pages.clone(), bytes.clone());
        let mut inner = self.lock();
        let invalidated = inner.end_pin(ticket);
        let pinned = match pinned {
            Ok(pinned) => pinned,
            Err(e) => {
                drop(inner);
                log::debug!("pin of {pages:#x?} failed: {e}");
                return Err(Error::Pin(e));
            }
        };
        if let Some(lease) = inner.hit(&want) {
            // Another thread cached a cover while we pinned: share it, drop ours.
            drop(inner);
            log::debug!("pin of {pages:#x?} raced with another; unpinning the duplicate");
            self.pinner.unpin(pages, pinned);
            return Ok(lease);
        }
        if invalidated {
            log::debug!("{pages:#x?} invalidated while pinning; leasing it uncached");
        }
        let mut unpins = Vec::new();
        let lease = inner.insert(
            pages,
            bytes,
            pinned,
            !invalidated,
            self.config.merge,
            &mut unpins,
        );
        drop(inner);
        self.unpin_all(unpins);
        Ok(lease)
    }

    /// Gives back a lease from [`acquire`](Self::acquire).
    ///
    /// When an entry's last lease comes back it joins the LRU list, and the oldest unreferenced
    /// entries are unpinned while their bytes exceed [`Config::capacity_bytes`]. An invalidated
    /// or zero-length entry, or any entry with capacity 0, is unpinned at once.
    ///
    /// # Panics
    ///
    /// If `lease` was handed out by another cache.
    pub fn release(&self, lease: Lease<P::Pinned>) {
        let Lease { id, pages, pinned } = lease;
        let mut unpins = Vec::new();
        {
            let mut inner = self.lock();
            let ours = inner.slots.get(id).and_then(Option::as_ref);
            if !ours.is_some_and(|e| Arc::ptr_eq(&e.pinned, &pinned)) {
                drop(inner);
                panic!("lease of {pages:#x?} does not come from this cache");
            }
            // The entry must hold the last reference once its last lease is gone.
            drop(pinned);
            inner.release(id, &self.config, &mut unpins);
        }
        self.unpin_all(unpins);
    }

    /// Drops every entry that overlaps `len` bytes at `addr` (rounded out to pages) from the
    /// cache, and returns how many.
    ///
    /// Entries without a lease are unpinned at once, leased ones on their last release. No later
    /// acquire returns any of them, nor caches a pin that was running while this ran. A
    /// zero-length region or entry counts as the first byte of its page; a region past the end
    /// of the address space is clamped to it.
    ///
    /// ```
    /// # use std::ops::Range;
    /// # struct Toy;
    /// # impl regcache::Pinner for Toy {
    /// #     type Pinned = ();
    /// #     type Error = std::convert::Infallible;
    /// #     fn pin(&self, _: Range<usize>) -> Result<(), Self::Error> { Ok(()) }
    /// #     fn unpin(&self, _: Range<usize>, _: ()) {}
    /// # }
    /// use regcache::{Config, RegCache, page_size};
    ///
    /// let ps = page_size();
    /// let cache = RegCache::new(Toy, Config { capacity_bytes: 16 * ps, ..Config::default() });
    /// let leased = cache.acquire(0x100 * ps, ps).unwrap();
    /// cache.release(cache.acquire(0x104 * ps, ps).unwrap());
    /// assert_eq!(cache.invalidate(0x100 * ps, 8 * ps), 2);
    /// // The unreferenced entry is gone; the leased one stays pinned until its release.
    /// assert_eq!(cache.stats().entries, 0);
    /// assert_eq!(cache.stats().pinned_bytes, ps);
    /// cache.release(leased);
    /// assert_eq!(cache.stats().pinned_bytes, 0);
    /// ```
    pub fn invalidate(&self, addr: usize, len: usize) -> usize {
        let range = range::round_out_saturating(addr, len, range::page_size());
        self.invalidate_pages(&range::extent(&range))
    }

    fn invalidate_pages(&self, extent: &Range<usize>) -> usize {
        let mut unpins = Vec::new();
        let dropped = self.lock().invalidate(extent, &mut unpins);
        if dropped > 0 {
            log::debug!("invalidated {dropped} entries in {extent:#x?}");
        }
        self.unpin_all(unpins);
        dropped
    }

    /// Unpins every cached entry that has no lease (leased entries stay); returns how many.
    pub fn flush(&self) -> usize {
        let mut unpins = Vec::new();
        {
            let mut inner = self.lock();
            while let Some(victim) = inner.lru.oldest {
                unpins.extend(inner.unlink(victim));
                inner.evictions += 1;
            }
        }
        let n = unpins.len();
        self.unpin_all(unpins);
        n
    }

    /// A snapshot of the counters and gauges.
    pub fn stats(&self) -> Stats {
        let inner = self.lock();
        Stats {
            hits: inner.hits,
            misses: inner.misses,
            evictions: inner.evictions,
            invalidations: inner.invalidations,
            pinned_bytes: inner.pinned_bytes,
            cached_unreferenced_bytes: inner.cached_unreferenced_bytes,
            entries: inner.tree.len(),
            idle_entries: inner.idle_entries,
            merges: inner.merges,
            stale_hits: inner.stale_hits,
        }
    }

    /// The configuration.
    pub fn config(&self) -> Config {
        self.config
    }

    /// The backend this cache pins through.
    pub fn pinner(&self) -> &P {
        &self.pinner
    }

    fn lock(&self) -> MutexGuard<'_, Inner<P::Pinned>> {
        // The backend never runs under the lock, and our own updates under it do not panic
        // halfway (the panics there are invariant checks), so a poisoned lock still guards
        // consistent state.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn unpin_all(&self, unpins: Unpins<P::Pinned>) {
        for (pages, pinned) in unpins {
            self.pinner.unpin(pages, pinned);
        }
    }
}

impl<T> Inner<T> {
    /// Adds entry `id` with `extent` to the lookup structures.
    fn index_insert(&mut self, extent: Range<usize>, id: usize) {
        self.exact.insert((extent.start, extent.end), id);
        self.tree.insert(extent, id);
    }

    /// Takes entry `id`, of page range `pages`, out of the lookup structures.
    fn index_remove(&mut self, pages: &Range<usize>, id: usize) -> bool {
        let extent = range::extent(pages);
        if self.exact.get(&(extent.start, extent.end)) == Some(&id) {
            self.exact.remove(&(extent.start, extent.end));
        }
        self.tree.remove(pages.start, id)
    }

    fn entry(&mut self, id: usize) -> &mut Entry<T> {
        self.slots[id].as_mut().expect("id of a live entry")
    }

    /// Leases the cached entry that covers `want`, if there is one.
    fn hit(&mut self, want: &Range<usize>) -> Option<Lease<T>> {
        let id = match self.exact.get(&(want.start, want.end)) {
            Some(&id) => id,
            None => self.tree.find_covering(want)?,
        };
        if self.entry(id).state == State::Idle {
            self.lru_remove(id);
            let entry = self.entry(id);
            entry.state = State::Leased;
            let len = entry.pages.len();
            self.cached_unreferenced_bytes -= len;
            self.idle_entries -= 1;
        }
        self.hits += 1;
        let entry = self.entry(id);
        entry.refs += 1;
        Some(Lease {
            id,
            pages: entry.pages.clone(),
            pinned: Arc::clone(&entry.pinned),
        })
    }

    /// Records a pin of `extent` about to run outside the lock; returns its ticket.
    fn begin_pin(&mut self, extent: Range<usize>) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.pending.push(Pending {
            ticket,
            extent,
            invalidated: false,
        });
        ticket
    }

    /// Forgets the pending pin `ticket`; returns whether an invalidation overlapped it.
    fn end_pin(&mut self, ticket: u64) -> bool {
        let at = self
            .pending
            .iter()
            .position(|p| p.ticket == ticket)
            .expect("pin is pending");
        self.pending.swap_remove(at).invalidated
    }

    /// The union of the request with every leased entry whose bytes overlap the requested
    /// bytes, as (pages, bytes). Only live registrations merge, and only when their bytes
    /// overlap: the union then holds nothing but bytes the application registered (an idle
    /// entry's memory may since have been freed and reused), and a row of adjacent buffers
    /// stays a row of entries. A union larger than [`MERGE_LIMIT`] times the request is not
    /// pinned (a chain of overlapping registrations would otherwise grow without bound and
    /// each miss would cost the whole chain).
    fn merged(&mut self, pages: Range<usize>, bytes: Range<usize>) -> (Range<usize>, Range<usize>) {
        let (mut up, mut ub) = (pages.clone(), bytes.clone());
        loop {
            let mut ids = Vec::new();
            self.tree.overlapping(&range::extent(&up), &mut ids);
            let before = ub.clone();
            for id in ids {
                let e = self.entry(id);
                if e.refs > 0 && e.bytes.start < ub.end && ub.start < e.bytes.end {
                    ub = ub.start.min(e.bytes.start)..ub.end.max(e.bytes.end);
                    up = up.start.min(e.pages.start)..up.end.max(e.pages.end);
                }
            }
            if ub == before {
                break;
            }
        }
        if up.len() > MERGE_LIMIT * pages.len().max(range::page_size()) {
            return (pages, bytes);
        }
        (up, ub)
    }

    /// Adds a freshly pinned entry with one lease; `cached` says whether lookups may find it.
    /// With `merge`, cached entries inside the new one leave the cache (unpinned now if idle, on their
    /// last release otherwise).
    fn insert(
        &mut self,
        pages: Range<usize>,
        bytes: Range<usize>,
        pinned: T,
        cached: bool,
        merge: bool,
        unpins: &mut Unpins<T>,
    ) -> Lease<T> {
        if cached && merge {
            let mut ids = Vec::new();
            self.tree.overlapping(&range::extent(&pages), &mut ids);
            let mut covered = 0u64;
            for id in ids {
                let e = self.entry(id);
                if e.pages.start >= pages.start && e.pages.end <= pages.end && !e.pages.is_empty() {
                    covered += 1;
                    if e.refs == 0 {
                        unpins.extend(self.unlink(id));
                    } else {
                        e.state = State::Invalidated;
                        let pages = e.pages.clone();
                        let removed = self.index_remove(&pages, id);
                        debug_assert!(removed);
                    }
                }
            }
            if covered > 0 {
                self.merges += 1;
            }
        }
        let pinned = Arc::new(pinned);
        let entry = Entry {
            pages: pages.clone(),
            bytes,
            pinned: Arc::clone(&pinned),
            refs: 1,
            state: if cached {
                State::Leased
            } else {
                State::Invalidated
            },
            older: None,
            newer: None,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id] = Some(entry);
                id
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        };
        if cached {
            self.index_insert(range::extent(&pages), id);
        }
        self.misses += 1;
        self.pinned_bytes += pages.len();
        Lease { id, pages, pinned }
    }

    /// Drops one lease of entry `id`, then keeps, or unpins, or evicts as [`RegCache::release`]
    /// says. The lease's `Arc` must be dropped already.
    fn release(&mut self, id: usize, config: &Config, unpins: &mut Unpins<T>) {
        let entry = self.entry(id);
        entry.refs -= 1;
        if entry.refs > 0 {
            return;
        }
        if entry.state == State::Invalidated
            || config.capacity_bytes == 0
            || config.capacity_regions == 0
            || entry.pages.is_empty()
        {
            unpins.extend(self.unlink(id));
            return;
        }
        entry.state = State::Idle;
        let len = entry.pages.len();
        self.lru_push_newest(id);
        self.cached_unreferenced_bytes += len;
        self.idle_entries += 1;
        while self.cached_unreferenced_bytes > config.capacity_bytes
            || self.idle_entries > config.capacity_regions
        {
            let victim = self
                .lru
                .oldest
                .expect("unreferenced bytes are in the LRU list");
            log::trace!("evicting {:#x?}", self.entry(victim).pages);
            unpins.extend(self.unlink(victim));
            self.evictions += 1;
        }
    }

    /// Drops every cached entry that overlaps `extent`; returns how many.
    fn invalidate(&mut self, extent: &Range<usize>, unpins: &mut Unpins<T>) -> usize {
        for pending in &mut self.pending {
            if pending.extent.start < extent.end && extent.start < pending.extent.end {
                pending.invalidated = true;
            }
        }
        let mut ids = Vec::new();
        self.tree.overlapping(extent, &mut ids);
        for &id in &ids {
            let entry = self.entry(id);
            if entry.refs == 0 {
                unpins.extend(self.unlink(id));
            } else {
                entry.state = State::Invalidated;
                let pages = entry.pages.clone();
                let removed = self.index_remove(&pages, id);
                debug_assert!(removed);
            }
        }
        self.invalidations += ids.len() as u64;
        ids.len()
    }

    /// Takes entry `id` out of every structure and returns what to unpin, or `None` if a lease
    /// still shares the pin (only when the cache is dropped under live leases).
    fn unlink(&mut self, id: usize) -> Option<(Range<usize>, T)> {
        if self.entry(id).state == State::Idle {
            self.lru_remove(id);
        }
        let entry = self.slots[id].take().expect("id of a live entry");
        self.free.push(id);
        if entry.state != State::Invalidated {
            let removed = self.index_remove(&entry.pages, id);
            debug_assert!(removed);
        }
        if entry.state == State::Idle {
            self.cached_unreferenced_bytes -= entry.pages.len();
            self.idle_entries -= 1;
        }
        self.pinned_bytes -= entry.pages.len();
        match Arc::try_unwrap(entry.pinned) {
            Ok(pinned) => Some((entry.pages, pinned)),
            Err(_) => {
                log::warn!("{:#x?} still leased; leaving it pinned", entry.pages);
                None
            }
        }
    }

    /// Appends entry `id` to the LRU list as its newest member.
    fn lru_push_newest(&mut self, id: usize) {
        let older = self.lru.newest;
        let entry = self.entry(id);
        entry.older = older;
        entry.newer = None;
        match older {
            Some(o) => self.entry(o).newer = Some(id),
            None => self.lru.oldest = Some(id),
        }
        self.lru.newest = Some(id);
    }

    /// Takes entry `id` out of the LRU list.
    fn lru_remove(&mut self, id: usize) {
        let entry = self.entry(id);
        let (older, newer) = (entry.older.take(), entry.newer.take());
        match older {
            Some(o) => self.entry(o).newer = newer,
            None => self.lru.oldest = newer,
        }
        match newer {
            Some(n) => self.entry(n).older = older,
            None => self.lru.newest = older,
        }
    }
}

impl<P: Pinner> Drop for RegCache<P> {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(PoisonError::into_inner);
        let mut unpins = Vec::new();
        for id in 0..inner.slots.len() {
            let Some(entry) = &inner.slots[id] else {
                continue;
            };
            if entry.refs > 0 {
                log::warn!(
                    "dropping the cache with {} unreleased leases on {:#x?}",
                    entry.refs,
                    entry.pages
                );
            }
            unpins.extend(inner.unlink(id));
        }
        self.unpin_all(unpins);
    }
}

impl<P: Pinner> fmt::Debug for RegCache<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegCache")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, Weak};

    use super::*;
    use crate::page_size;

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Event {
        Pin(Range<usize>),
        Unpin(Range<usize>),
    }

    #[derive(Debug, PartialEq, Eq)]
    struct Refused;
    impl fmt::Display for Refused {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("refused")
        }
    }
    impl std::error::Error for Refused {}

    type Hook = Box<dyn FnOnce() + Send>;

    /// Records every call; refuses ranges that contain `refuse`; runs `hook` once from `pin`.
    #[derive(Default)]
    struct Recorder {
        events: Arc<Mutex<Vec<Event>>>,
        refuse: Mutex<Option<usize>>,
        hook: Mutex<Option<Hook>>,
    }

    impl Recorder {
        fn events(&self) -> Vec<Event> {
            self.events.lock().unwrap().clone()
        }
        fn unpins(&self) -> Vec<Range<usize>> {
            let events = self.events();
            events
                .into_iter()
                .filter_map(|e| {
                    if let Event::Unpin(r) = e {
                        Some(r)
                    } else {
                        None
                    }
                })
                .collect()
        }
        fn pins(&self) -> usize {
            self.events()
                .iter()
                .filter(|e| matches!(e, Event::Pin(_)))
                .count()
        }
    }

    impl Pinner for Recorder {
        /// The pinned range again, so `unpin` can check it gets back what `pin` made.
        type Pinned = Range<usize>;
        type Error = Refused;

        fn pin(&self, pages: Range<usize>) -> Result<Range<usize>, Refused> {
            if self
                .refuse
                .lock()
                .unwrap()
                .is_some_and(|a| pages.contains(&a))
            {
                return Err(Refused);
            }
            self.events.lock().unwrap().push(Event::Pin(pages.clone()));
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook();
            }
            Ok(pages)
        }

        fn unpin(&self, pages: Range<usize>, pinned: Range<usize>) {
            assert_eq!(pages, pinned);
            self.events.lock().unwrap().push(Event::Unpin(pages));
        }
    }

    fn cache(capacity_pages: usize) -> RegCache<Recorder> {
        RegCache::new(
            Recorder::default(),
            Config {
                capacity_bytes: capacity_pages * page_size(),
                ..Config::default()
            },
        )
    }

    /// Page `n` of a made-up address space; nothing is dereferenced.
    fn pg(n: usize) -> usize {
        (0x1000 + n) * page_size()
    }

    /// Pages `a..b` of the made-up address space.
    fn span(a: usize, b: usize) -> Range<usize> {
        pg(a)..pg(b)
    }

    #[test]
    fn miss_then_hit() {
        let c = cache(16);
        let a = c.acquire(pg(1) + 10, 100).unwrap();
        assert_eq!(a.pages(), pg(1)..pg(2));
        let b = c.acquire(pg(1), page_size()).unwrap();
        assert_eq!(b.pages(), pg(1)..pg(2));
        assert_eq!(*b.pinned(), pg(1)..pg(2));
        let s = c.stats();
        assert_eq!(
            (s.misses, s.hits, s.entries, s.pinned_bytes),
            (1, 1, 1, page_size())
        );
        assert_eq!(c.pinner().pins(), 1);
        c.release(a);
        c.release(b);
    }

    #[test]
    fn larger_entry_covers_smaller_requests() {
        let c = cache(64);
        let big = c.acquire(pg(0), 8 * page_size()).unwrap();
        let small = c.acquire(pg(2), page_size()).unwrap();
        // A short entry between the cover's start and the request must not hide the cover.
        let tail = c.acquire(pg(8), 2 * page_size()).unwrap();
        let inner = c.acquire(pg(5) + 1, 2 * page_size()).unwrap();
        assert_eq!(small.pages(), pg(0)..pg(8));
        assert_eq!(inner.pages(), pg(0)..pg(8));
        // Overlapping without being covered: a miss that pins its own range, not a merge.
        let straddle = c.acquire(pg(7), 2 * page_size()).unwrap();
        assert_eq!(straddle.pages(), pg(7)..pg(9));
        let s = c.stats();
        assert_eq!((s.misses, s.hits, s.entries), (3, 2, 3));
        assert_eq!(s.pinned_bytes, 12 * page_size());
        for lease in [big, small, tail, inner, straddle] {
            c.release(lease);
        }
    }

    #[test]
    fn entry_stays_referenced_until_last_release() {
        let c = cache(16);
        let a = c.acquire(pg(0), 1).unwrap();
        let b = c.acquire(pg(0), 1).unwrap();
        c.release(a);
        assert_eq!(c.stats().cached_unreferenced_bytes, 0);
        c.release(b);
        assert_eq!(c.stats().cached_unreferenced_bytes, page_size());
        assert!(c.pinner().unpins().is_empty());
        // A hit on an unreferenced entry takes it off the LRU list again.
        let d = c.acquire(pg(0), 1).unwrap();
        assert_eq!(c.stats().cached_unreferenced_bytes, 0);
        c.release(d);
        assert_eq!(c.stats().entries, 1);
    }

    #[test]
    fn evicts_least_recently_released_within_capacity() {
        let c = cache(2);
        let a = c.acquire(pg(0), 1).unwrap();
        let b = c.acquire(pg(2), 1).unwrap();
        let d = c.acquire(pg(4), 1).unwrap();
        c.release(a);
        c.release(b);
        assert_eq!(c.stats().cached_unreferenced_bytes, 2 * page_size());
        assert_eq!(c.stats().evictions, 0);
        c.release(d);
        // Three unreferenced pages over a capacity of two: the oldest, `a`, goes.
        assert_eq!(c.pinner().unpins(), [span(0, 1)]);
        // Using `b` again makes `d` the oldest.
        let b = c.acquire(pg(2), 1).unwrap();
        c.release(b);
        let e = c.acquire(pg(6), 1).unwrap();
        c.release(e);
        assert_eq!(c.pinner().unpins(), [span(0, 1), span(4, 5)]);
        let s = c.stats();
        assert_eq!((s.evictions, s.entries), (2, 2));
        assert_eq!(s.cached_unreferenced_bytes, 2 * page_size());
        assert_eq!(s.pinned_bytes, 2 * page_size());
        // An entry bigger than the capacity cannot stay once released.
        let big = c.acquire(pg(10), 3 * page_size()).unwrap();
        c.release(big);
        let s = c.stats();
        assert_eq!(
            (s.evictions, s.entries, s.cached_unreferenced_bytes),
            (5, 0, 0)
        );
    }

    #[test]
    fn capacity_zero_unpins_on_last_release() {
        let c = cache(0);
        let a = c.acquire(pg(0), 1).unwrap();
        let b = c.acquire(pg(0), 1).unwrap();
        assert_eq!(c.stats().hits, 1, "still shared while referenced");
        c.release(a);
        assert!(c.pinner().unpins().is_empty());
        c.release(b);
        assert_eq!(c.pinner().unpins(), [span(0, 1)]);
        let s = c.stats();
        assert_eq!((s.entries, s.pinned_bytes, s.evictions), (0, 0, 0));
        let a = c.acquire(pg(0), 1).unwrap();
        assert_eq!(c.stats().misses, 2);
        c.release(a);
    }

    #[test]
    fn invalidate_unreferenced_unpins_at_once() {
        let c = cache(16);
        let a = c.acquire(pg(0), 2 * page_size()).unwrap();
        let b = c.acquire(pg(2), 1).unwrap();
        c.release(a);
        c.release(b);
        // Touches the second page of `a` only; `b` starts right after the range.
        assert_eq!(c.invalidate(pg(1) + 5, 1), 1);
        assert_eq!(c.pinner().unpins(), [span(0, 2)]);
        let s = c.stats();
        assert_eq!((s.invalidations, s.entries), (1, 1));
        assert_eq!(s.cached_unreferenced_bytes, page_size());
        assert_eq!(c.invalidate(pg(5), 100), 0);
        let a = c.acquire(pg(0), 1).unwrap();
        assert_eq!(c.stats().misses, 3);
        c.release(a);
    }

    #[test]
    fn invalidate_referenced_unpins_on_last_release() {
        let c = cache(16);
        let a = c.acquire(pg(0), 1).unwrap();
        let b = c.acquire(pg(0), 1).unwrap();
        assert_eq!(c.invalidate(pg(0), 1), 1);
        assert_eq!(c.stats().entries, 0);
        assert_eq!(c.stats().pinned_bytes, page_size());
        // Never returned again: the same range is a miss with a fresh pin.
        let fresh = c.acquire(pg(0), 1).unwrap();
        assert_eq!(c.stats().misses, 2);
        assert_eq!(c.invalidate(pg(0), 1), 1);
        c.release(a);
        assert!(c.pinner().unpins().is_empty());
        c.release(b);
        c.release(fresh);
        assert_eq!(c.pinner().unpins(), [span(0, 1), span(0, 1)]);
        let s = c.stats();
        assert_eq!(
            (s.invalidations, s.pinned_bytes, s.cached_unreferenced_bytes),
            (2, 0, 0)
        );
    }

    #[test]
    fn pin_error_leaves_cache_unchanged() {
        let c = cache(16);
        let a = c.acquire(pg(0), 1).unwrap();
        let before = c.stats();
        *c.pinner().refuse.lock().unwrap() = Some(pg(3));
        match c.acquire(pg(2), 2 * page_size()) {
            Err(Error::Pin(Refused)) => {}
            other => panic!("expected a pin error, got {other:?}"),
        }
        assert_eq!(c.stats(), before);
        *c.pinner().refuse.lock().unwrap() = None;
        let b = c.acquire(pg(2), 2 * page_size()).unwrap();
        c.release(a);
        c.release(b);
    }

    #[test]
    fn range_error_leaves_cache_unchanged() {
        let c = cache(16);
        let err = c.acquire(usize::MAX - 10, 20).unwrap_err();
        assert!(matches!(err, Error::Range(RangeError::Overflow { .. })));
        assert!(err.to_string().contains("wraps"));
        assert_eq!(c.stats(), Stats::default());
        // An invalidation past the top is clamped rather than refused.
        assert_eq!(c.invalidate(usize::MAX - 10, 20), 0);
    }

    #[test]
    fn zero_length_regions() {
        let c = cache(16);
        let a = c.acquire(pg(3) + 7, 0).unwrap();
        assert_eq!(a.pages(), pg(3)..pg(3));
        let b = c.acquire(pg(3), 0).unwrap();
        assert_eq!(c.stats().hits, 1);
        c.release(a);
        c.release(b);
        // Never kept once unreferenced: it holds no bytes for the capacity to bound.
        assert_eq!(c.pinner().unpins(), [span(3, 3)]);
        // Covered by an entry holding its page, but not by one that ends there.
        let page = c.acquire(pg(4), 1).unwrap();
        let before = c.acquire(pg(2), page_size()).unwrap();
        let z = c.acquire(pg(4) + 9, 0).unwrap();
        assert_eq!(z.pages(), pg(4)..pg(5));
        let z3 = c.acquire(pg(3), 0).unwrap();
        assert_eq!(z3.pages(), pg(3)..pg(3));
        // Invalidating its page drops it.
        assert_eq!(c.invalidate(pg(3), 1), 1);
        for lease in [page, before, z, z3] {
            c.release(lease);
        }
    }

    #[test]
    fn drop_unpins_everything_left() {
        let c = cache(16);
        let kept = c.acquire(pg(0), 1).unwrap();
        c.release(kept);
        // Dropped instead of released: its entry stays referenced, but the pin is unshared.
        drop(c.acquire(pg(4), 1).unwrap());
        let invalidated = c.acquire(pg(8), 1).unwrap();
        c.invalidate(pg(8), 1);
        drop(invalidated);
        let events = Arc::clone(&c.pinner().events);
        drop(c);
        let mut unpins: Vec<_> = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| {
                if let Event::Unpin(r) = e {
                    Some(r.start)
                } else {
                    None
                }
            })
            .collect();
        unpins.sort_unstable();
        assert_eq!(unpins, [pg(0), pg(4), pg(8)]);
    }

    #[test]
    #[should_panic(expected = "does not come from this cache")]
    fn foreign_lease_panics() {
        let c1 = cache(16);
        let c2 = cache(16);
        let a = c1.acquire(pg(0), 1).unwrap();
        c2.release(a);
    }

    /// A cache that its own pinner can call back into, to stage races deterministically.
    fn reentrant() -> Arc<RegCache<Recorder>> {
        Arc::new(cache(16))
    }

    fn hook(c: &Arc<RegCache<Recorder>>, f: impl FnOnce(&RegCache<Recorder>) + Send + 'static) {
        let weak: Weak<RegCache<Recorder>> = Arc::downgrade(c);
        *c.pinner().hook.lock().unwrap() =
            Some(Box::new(move || f(&weak.upgrade().expect("cache alive"))));
    }

    #[test]
    fn invalidation_during_pin_is_not_cached() {
        let c = reentrant();
        hook(&c, |c| assert_eq!(c.invalidate(pg(1), 1), 0));
        let a = c.acquire(pg(0), 2 * page_size()).unwrap();
        // The caller gets its pages, but the cache keeps no entry of them.
        assert_eq!(a.pages(), pg(0)..pg(2));
        let s = c.stats();
        assert_eq!(
            (s.misses, s.entries, s.pinned_bytes),
            (1, 0, 2 * page_size())
        );
        let b = c.acquire(pg(0), 1).unwrap();
        assert_eq!(c.stats().misses, 2);
        c.release(a);
        assert_eq!(c.pinner().unpins(), [span(0, 2)]);
        c.release(b);
        // A non-overlapping invalidation does not spoil a pin.
        hook(&c, |c| assert_eq!(c.invalidate(pg(9), 1), 0));
        let d = c.acquire(pg(5), 1).unwrap();
        assert_eq!(c.stats().entries, 2);
        c.release(d);
    }

    #[test]
    fn duplicate_pin_from_a_race_is_unpinned() {
        let c = reentrant();
        // While our pin runs without the lock, "another thread" caches a cover of our range.
        hook(&c, |c| {
            c.release(c.acquire(pg(0), 4 * page_size()).unwrap())
        });
        let a = c.acquire(pg(1), 1).unwrap();
        assert_eq!(a.pages(), pg(0)..pg(4));
        assert_eq!(c.pinner().unpins(), [span(1, 2)]);
        let s = c.stats();
        assert_eq!((s.misses, s.hits, s.entries), (1, 1, 1));
        c.release(a);
    }

    fn configured(config: Config) -> RegCache<Recorder> {
        RegCache::new(Recorder::default(), config)
    }

    #[test]
    fn region_budget_evicts_oldest() {
        let c = configured(Config {
            capacity_bytes: 1 << 30,
            capacity_regions: 2,
            ..Config::default()
        });
        for i in 0..4 {
            c.release(c.acquire(pg(2 * i), 1).unwrap());
        }
        let s = c.stats();
        assert_eq!((s.idle_entries, s.entries, s.evictions), (2, 2, 2));
        assert_eq!(c.pinner().unpins(), [span(0, 1), span(2, 3)]);
        // The newest two are still hits.
        c.release(c.acquire(pg(4), 1).unwrap());
        c.release(c.acquire(pg(6), 1).unwrap());
        assert_eq!(c.stats().hits, 2);
        assert_eq!(c.flush(), 2);
        assert_eq!(c.stats().idle_entries, 0);
        assert_eq!(c.stats().pinned_bytes, 0);
    }

    #[test]
    fn merge_pins_the_union_of_touching_registrations() {
        let c = configured(Config {
            merge: true,
            ..Config::default()
        });
        let a = c.acquire(pg(0), 2 * page_size()).unwrap();
        // Idle entries never merge (their memory may have been freed).
        c.release(c.acquire(pg(3), page_size()).unwrap());
        // Its bytes overlap the first (leased) entry's: one entry for pages 0..3.
        let b = c.acquire(pg(2) - 10, 110).unwrap();
        assert_eq!(b.pages(), span(0, 3));
        assert_eq!(c.pinner().events().last(), Some(&Event::Pin(span(0, 3))));
        let s = c.stats();
        assert_eq!((s.merges, s.entries), (1, 2), "{s:?}");
        // The merged leased entry left the cache; it is unpinned on release, not kept.
        c.release(a);
        assert!(c.pinner().unpins().contains(&span(0, 2)));
        // Adjacent bytes, or a gap: no merge, even where pages touch.
        let d = c.acquire(pg(2) + 200, 10).unwrap();
        assert_eq!(d.pages(), span(0, 3), "a hit");
        let e = c.acquire(pg(4) + 8, 8).unwrap();
        assert_eq!(e.pages(), span(4, 5));
        let g = c.acquire(pg(5), page_size()).unwrap();
        assert_eq!(g.pages(), span(5, 6), "touching bytes stay apart");
        c.release(g);
        assert_eq!(c.stats().merges, 1);
        // A union far larger than the request is not pinned.
        let big = c.acquire(pg(10), 16 * page_size()).unwrap();
        let small = c.acquire(pg(26) - 1, 2).unwrap();
        assert_eq!(small.pages(), span(25, 27));
        c.release(big);
        c.release(small);
        // Requests inside now hit.
        let f = c.acquire(pg(1), page_size()).unwrap();
        assert_eq!(f.pages(), span(0, 3));
        for l in [b, d, e, f] {
            c.release(l);
        }
    }

    /// Refuses hits on pinned ranges listed as stale.
    #[derive(Default)]
    struct Checking {
        inner: Recorder,
        stale: Mutex<Vec<Range<usize>>>,
    }

    impl Pinner for Checking {
        type Pinned = Range<usize>;
        type Error = Refused;
        fn pin(&self, pages: Range<usize>) -> Result<Range<usize>, Refused> {
            self.inner.pin(pages)
        }
        fn unpin(&self, pages: Range<usize>, pinned: Range<usize>) {
            self.inner.unpin(pages, pinned)
        }
        fn is_current(&self, pages: Range<usize>, _: &Range<usize>) -> bool {
            !self.stale.lock().unwrap().contains(&pages)
        }
    }

    #[test]
    fn validated_hits_never_return_stale_pins() {
        let c = RegCache::new(
            Checking::default(),
            Config {
                validate_hits: true,
                ..Config::default()
            },
        );
        let a = c.acquire(pg(0), page_size()).unwrap();
        c.release(c.acquire(pg(0), 1).unwrap());
        assert_eq!(c.stats().hits, 1);
        // The memory under the entry changed: the next request pins afresh.
        c.pinner().stale.lock().unwrap().push(span(0, 1));
        let b = c.acquire(pg(0), 1).unwrap();
        assert!(!Arc::ptr_eq(&a.pinned, &b.pinned), "a new pin");
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.stale_hits), (1, 2, 1));
        c.pinner().stale.lock().unwrap().clear();
        c.release(a);
        c.release(b);
        assert_eq!(c.pinner().inner.pins(), 2);
    }

    #[test]
    fn cache_and_lease_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<RegCache<Recorder>>();
        check::<Lease<Range<usize>>>();
    }
}
