//! The registered regions of a NIC as this process reaches them.
//!
//! Every kind of NIC registers memory through the same path (the
//! registration cache over arenas, `mem/`); what this process then keeps per
//! region is a [`Resolved`]: its bounds, protection tag, RDMA enables and
//! every extent already mapped. Translation of posted descriptors and the
//! local side of every transfer look regions up here, by memory handle (the
//! handle itself is chosen by the device: a soft NIC's permuted table index,
//! a verbs memory region's rkey).
//!
//! The same table, under the same lock, holds what undoes each registration
//! (the registration path's record) and the parked registrations
//! (`parked.rs`), which stay in place under their handles, marked dead:
//! registering the same buffer again, or deregistering it, is one critical
//! section that flips one entry and moves nothing.
//!
//! Lookups on the posting path go through a [`RegionCache`] per work queue:
//! a few regions, each validated by the change count of its handle's bucket
//! (removals, parking and attribute changes bump it; new registrations do
//! not), so a hit costs one load and registering or deregistering *other*
//! buffers — a message layer does it around every message — leaves it
//! valid; when the count moved, the region's own liveness (one more load)
//! tells whether it is still its handle's (a registration parked and taken
//! back is the same region).
#![forbid(unsafe_code)]

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::parked::Parked;

use crate::mem::region::Resolved;

/// Hashes a memory handle by one multiplication (handles are either random
/// already or small integers; either way the high product bits spread them).
#[derive(Default)]
pub(crate) struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | *b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 16;
    }
}

/// Builds [`HandleHasher`]s.
pub(crate) type BuildHandleHasher = BuildHasherDefault<HandleHasher>;

/// Hashes keys made of integers (addresses, lengths, handles, sessions) by
/// a rotate, xor and multiply per word: a few instructions where the
/// standard SipHash costs hundreds. For keys no adversary chooses against
/// this process.
#[derive(Default)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
}

/// Builds [`WordHasher`]s.
pub(crate) type BuildWordHasher = BuildHasherDefault<WordHasher>;

/// Buckets of change counts (a power of two).
const BUCKETS: usize = 256;

/// The table of the provider: registrations as `nic.rs` keeps them (what
/// undoes each, and what a parked one kept of its device entry).
pub(crate) type RegionTable = Table<Box<crate::nic::RegionRec>, crate::nic::ParkedReg>;

/// The write lock of a [`RegionTable`].
pub(crate) type TableWriter<'a> = Writer<'a, Box<crate::nic::RegionRec>, crate::nic::ParkedReg>;

/// A registration: how this process reaches its region, the record `R` of
/// what undoes it, and, once deregistered and parked, what `P` it kept.
pub(crate) struct Live<R, P> {
    /// `None` once the memory went away under it (revoked): the handle
    /// stays until it is deregistered, but no longer translates.
    pub region: Option<Arc<Resolved>>,
    pub rec: R,
    /// Deregistered and kept whole for the same registration again
    /// (parked): the handle is dead, every lookup passes it by.
    pub parked: Option<P>,
}

/// Everything under the table's lock: the registrations by handle, live
/// and parked, and the parked ones' handles by what was registered, so
/// that a registration or deregistration is one critical section over one
/// map.
pub(crate) struct Registrations<R, P> {
    /// By handle (a handful of instructions per insert or removal, a fifth
    /// of a `HashMap`'s).
    live: crate::handle_map::HandleMap<Live<R, P>>,
    /// The parked registrations' handles, by exact bytes, tag and enables.
    pub parked: Parked<u32>,
}

impl<R, P> Registrations<R, P> {
    /// The records of the live registrations (not the parked ones: their
    /// bytes are deregistered memory).
    pub fn records(&self) -> impl Iterator<Item = &R> {
        self.live
            .values()
            .filter(|l| l.parked.is_none())
            .map(|l| &l.rec)
    }
}

/// The live regions of one NIC, by memory handle, with the registrations'
/// records (`R`) and the parked registrations (`P`).
pub(crate) struct Table<R, P> {
    map: RwLock<Registrations<R, P>>,
    version: AtomicU64,
    /// Per bucket of handles, a count bumped whenever a region of the
    /// bucket is removed or changed (after the change).
    changes: [AtomicU64; BUCKETS],
}

impl<R, P> Default for Table<R, P> {
    fn default() -> Self {
        Table::new(0)
    }
}

fn bucket(handle: u32) -> usize {
    (handle.wrapping_mul(0x9e37_79b9) >> 24) as usize % BUCKETS
}

impl<R, P> Table<R, P> {
    /// An empty table parking at most `parked` deregistered registrations.
    pub fn new(parked: usize) -> Self {
        Table {
            map: RwLock::new(Registrations {
                live: Default::default(),
                parked: Parked::new(parked),
            }),
            version: AtomicU64::new(1),
            changes: [const { AtomicU64::new(0) }; BUCKETS],
        }
    }

    /// The current version: changes whenever a region is removed or
    /// changed. Adding one leaves it (a new handle invalidates nothing that
    /// was found before; handles never come back without a removal first),
    /// so registering around every message does not empty the engines'
    /// caches of this table.
    pub fn version(&self) -> u64 {
        // Acquire: pairs with the Release store in `changed`.
        self.version.load(Ordering::Acquire)
    }

    /// Moves the version and `handle`'s change count on. Called with the
    /// write lock held, which serialises the writers: a load and a store
    /// each, no read-modify-write. A reader that sees a new count and then
    /// reads the map waits for the lock, so it finds the change.
    fn changed(&self, handle: u32) {
        // Release: publishes the table change to caches that see the new
        // count (pairs with the Acquire in `version` and `changes`).
        let c = &self.changes[bucket(handle)];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
        self.version
            .store(self.version.load(Ordering::Relaxed) + 1, Ordering::Release);
    }

    /// The change count of `handle`'s bucket (moves when a region of the
    /// bucket is removed or changed, not when one is added).
    pub fn changes(&self, handle: u32) -> u64 {
        // Acquire: pairs with the Release store in `changed`, so a count
        // read before a lookup that found the old region differs from the
        // count after the change.
        self.changes[bucket(handle)].load(Ordering::Acquire)
    }

    /// The region of `handle` (live, not parked).
    pub fn get(&self, handle: u32) -> Option<Arc<Resolved>> {
        self.map
            .read()
            .unwrap()
            .live
            .get(handle)
            .filter(|l| l.parked.is_none())
            .and_then(|l| l.region.clone())
    }

    /// The registrations, to read.
    pub fn read(&self) -> RwLockReadGuard<'_, Registrations<R, P>> {
        self.map.read().unwrap()
    }

    /// The registrations, to change.
    pub fn write(&self) -> Writer<'_, R, P> {
        Writer {
            t: self,
            g: self.map.write().unwrap(),
        }
    }
}

/// The table's write lock, through which every change goes (so that the
/// change counts move with removals and changes).
pub(crate) struct Writer<'a, R, P> {
    t: &'a Table<R, P>,
    g: RwLockWriteGuard<'a, Registrations<R, P>>,
}

impl<R, P> Writer<'_, R, P> {
    /// Adds a registration (a new handle: invalidates nothing).
    pub fn insert(&mut self, handle: u32, region: Arc<Resolved>, rec: R) {
        region.live.set(true);
        self.g.live.insert(
            handle,
            Live {
                region: Some(region),
                rec,
                parked: None,
            },
        );
    }

    /// The live registration of `handle` (not a parked one).
    pub fn get(&self, handle: u32) -> Option<&Live<R, P>> {
        self.g.live.get(handle).filter(|l| l.parked.is_none())
    }

    fn get_mut(&mut self, handle: u32) -> Option<&mut Live<R, P>> {
        self.g.live.get_mut(handle).filter(|l| l.parked.is_none())
    }

    /// The record of `handle`, to change (not its region).
    pub fn rec_mut(&mut self, handle: u32) -> Option<&mut R> {
        self.get_mut(handle).map(|l| &mut l.rec)
    }

    /// Takes the registration of `handle` out, live or parked.
    pub fn remove(&mut self, handle: u32) -> Option<Live<R, P>> {
        let l = self.g.live.remove(handle)?;
        // A parked one stopped translating when it was parked.
        if let Some(r) = l.region.as_ref().filter(|_| l.parked.is_none()) {
            r.live.set(false);
            self.t.changed(handle);
        }
        Some(l)
    }

    /// Parks the live registration of `handle` in place (its handle dead
    /// from now on, as after a removal), keeping `p`; false if it is not
    /// live.
    pub fn park(&mut self, handle: u32, p: P) -> bool {
        let Some(l) = self.get_mut(handle) else {
            return false;
        };
        l.parked = Some(p);
        if let Some(r) = &l.region {
            r.live.set(false);
        }
        self.t.changed(handle);
        true
    }

    /// The parked registration of `handle` live again (as a new one, it
    /// invalidates nothing); what it kept.
    pub fn unpark(&mut self, handle: u32) -> Option<P> {
        let l = self.g.live.get_mut(handle)?;
        let p = l.parked.take()?;
        if let Some(r) = &l.region {
            r.live.set(true);
        }
        Some(p)
    }

    /// Takes the parked registrations `select` takes from the parked
    /// handles out of the table.
    pub fn take_parked(
        &mut self,
        select: impl FnOnce(&mut Parked<u32>) -> Vec<u32>,
    ) -> Vec<Live<R, P>> {
        select(&mut self.g.parked)
            .into_iter()
            .filter_map(|h| self.g.live.remove(h))
            .collect()
    }

    /// The region of `handle` stops translating (its handle stays live);
    /// returns whether it translated until now.
    pub fn revoke(&mut self, handle: u32) -> bool {
        let gone = self
            .get_mut(handle)
            .and_then(|l| l.region.take())
            .inspect(|r| r.live.set(false))
            .is_some();
        if gone {
            self.t.changed(handle);
        }
        gone
    }

    /// Changes the protection tag and RDMA enables of a live region.
    pub fn set_attributes(&mut self, handle: u32, ptag: u32, flags: u32) -> bool {
        let Some(old) = self.get_mut(handle).and_then(|l| l.region.as_mut()) else {
            return false;
        };
        let mut r = (**old).clone();
        r.ptag = ptag;
        r.flags = flags;
        old.live.set(false);
        *old = Arc::new(r);
        self.t.changed(handle);
        true
    }

    /// The handles of the live registrations (not the parked ones) whose
    /// record satisfies `f`.
    pub fn handles_where(&self, f: impl Fn(&R) -> bool) -> Vec<u32> {
        let mut v = Vec::new();
        for (h, l) in self.g.live.iter() {
            if l.parked.is_none() && f(&l.rec) {
                v.push(h);
            }
        }
        v
    }

    /// Takes every registration out, live and parked (the parked handles
    /// too).
    pub fn drain(&mut self) -> Vec<(u32, Live<R, P>)> {
        self.g.parked.drain();
        let all = self.g.live.drain();
        for (h, l) in &all {
            if let Some(r) = l.region.as_ref().filter(|_| l.parked.is_none()) {
                r.live.set(false);
                self.t.changed(*h);
            }
        }
        all
    }

    /// The parked registrations' handles, by what was registered.
    pub fn parked(&mut self) -> &mut Parked<u32> {
        &mut self.g.parked
    }
}

#[cfg(test)]
impl<P> Table<(), P> {
    /// Adds a region without a record.
    pub fn insert(&self, r: Resolved) {
        self.write().insert(r.handle, Arc::new(r), ());
    }

    /// Removes the region of `handle`.
    pub fn remove(&self, handle: u32) -> Option<Arc<Resolved>> {
        self.write().remove(handle).and_then(|l| l.region)
    }

    /// Changes a region's tag and enables.
    pub fn set_attributes(&self, handle: u32, ptag: u32, flags: u32) -> bool {
        self.write().set_attributes(handle, ptag, flags)
    }
}

/// A small cache of regions for one user of the table (a work queue): each
/// entry valid while its handle's bucket is unchanged, so a hit costs a scan
/// of a few handles and one load instead of a lock.
#[derive(Default)]
pub(crate) struct RegionCache {
    handles: [u32; RegionCache::SIZE],
    /// The bucket change count when each entry was filled.
    stamps: [u64; RegionCache::SIZE],
    regions: [Option<Arc<Resolved>>; RegionCache::SIZE],
    /// Next entry to replace (round robin).
    next: usize,
}

impl RegionCache {
    /// Entries kept.
    const SIZE: usize = 4;

    #[inline]
    fn find(&self, handle: u32) -> Option<usize> {
        // Handle 0 is never a region's (every kind reserves it), so an empty
        // entry never matches.
        (0..Self::SIZE).find(|&i| self.handles[i] == handle && handle != 0)
    }

    /// The region of `handle` if the cache holds it (no validation: for a
    /// lookup right after [`RegionCache::get`] under the same lock, or
    /// after translation found the region current otherwise:
    /// `translate::WrRegions::of`).
    pub fn peek(&self, handle: u32) -> Option<&Resolved> {
        self.find(handle).and_then(|i| self.regions[i].as_deref())
    }

    /// The region of `handle`, from the cache or the table (a hit inline:
    /// every post looks up two regions).
    #[inline]
    pub fn get<R, P>(&mut self, t: &Table<R, P>, handle: u32) -> Option<&Arc<Resolved>> {
        let now = t.changes(handle);
        match self.find(handle) {
            Some(i) if self.stamps[i] == now => self.regions[i].as_ref(),
            // The bucket changed, but this region is still its handle's
            // (another handle of the bucket changed, or this registration
            // was parked and taken back, the same region): kept, at the
            // new count.
            Some(i) if self.regions[i].as_ref().is_some_and(|r| r.live.get()) => {
                self.stamps[i] = now;
                self.regions[i].as_ref()
            }
            found => self.refill(t, handle, now, found),
        }
    }

    /// [`RegionCache::get`] on a miss, or an entry `found` that is stale.
    #[inline(never)]
    fn refill<R, P>(
        &mut self,
        t: &Table<R, P>,
        handle: u32,
        now: u64,
        found: Option<usize>,
    ) -> Option<&Arc<Resolved>> {
        if let Some(i) = found {
            // Removed or changed since: forget it, look again.
            self.handles[i] = 0;
            self.regions[i] = None;
        }
        // The count was read before the lookup: a change after it makes the
        // entry stale at the next `get`.
        let r = t.get(handle)?;
        let i = self.next;
        self.next = (i + 1) % Self::SIZE;
        self.handles[i] = handle;
        self.stamps[i] = now;
        self.regions[i] = Some(r);
        self.regions[i].as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(handle: u32, va: u64) -> Resolved {
        Resolved {
            handle,
            va,
            len: 100,
            ptag: 1,
            flags: 0,
            pid: 1,
            extents: Default::default(),
            live: Default::default(),
        }
    }

    #[test]
    fn insert_lookup_change_remove() {
        let t = Table::<(), ()>::default();
        let v0 = t.version();
        t.insert(region(0xdead_0001, 0x1000));
        // Adding a region invalidates nothing found before.
        assert_eq!(t.version(), v0);
        assert_eq!(t.get(0xdead_0001).unwrap().va, 0x1000);
        assert!(t.get(0xdead_0002).is_none());
        assert!(t.set_attributes(0xdead_0001, 7, 3));
        let v1 = t.version();
        assert!(v1 > v0, "a change moves the version");
        let r = t.get(0xdead_0001).unwrap();
        assert_eq!((r.ptag, r.flags), (7, 3));
        assert!(!t.set_attributes(0xdead_0002, 7, 3));
        assert_eq!(t.version(), v1, "a refused change does not");
        assert!(t.remove(0xdead_0001).is_some());
        assert!(t.version() > v1, "a removal moves the version");
        assert!(t.remove(0xdead_0001).is_none());
        assert!(t.get(0xdead_0001).is_none());
    }

    #[test]
    fn parked_registrations_are_dead_in_place_until_taken_back() {
        let t = Table::<u32, &str>::new(4);
        let key = crate::parked::Key {
            va: 0x5000,
            len: 0x1000,
            ptag: 1,
            flags: 0,
        };
        t.write().insert(5, Arc::new(region(5, 0x5000)), 55);
        let mut cache = RegionCache::default();
        let first = cache.get(&t, 5).unwrap().clone();
        let before = t.changes(5);
        {
            let mut w = t.write();
            assert!(w.park(5, "kept"));
            assert!(!w.park(5, "again"), "parked already");
            assert_eq!(w.parked().put(key, 5), None);
            assert!(w.get(5).is_none(), "a parked handle is dead");
            assert!(w.rec_mut(5).is_none());
            assert!(w.handles_where(|_| true).is_empty());
            assert!(!w.revoke(5));
        }
        assert!(t.changes(5) > before, "parking invalidates like a removal");
        assert!(t.get(5).is_none());
        assert!(cache.get(&t, 5).is_none(), "no cache serves it");
        assert_eq!(t.read().records().count(), 0, "its bytes are deregistered");
        // Taken back: the same entry, live again without a change.
        let now = t.changes(5);
        {
            let mut w = t.write();
            let h = w.parked().take(&key).unwrap();
            assert_eq!(h, 5);
            assert_eq!(w.unpark(h), Some("kept"));
            assert_eq!(w.unpark(h), None, "live now");
            assert_eq!(w.get(5).unwrap().rec, 55);
        }
        assert_eq!(t.changes(5), now);
        assert_eq!(t.get(5).unwrap().va, 0x5000);
        assert_eq!(t.read().records().count(), 1);
        // A cache entry filled before the parking serves it again, the
        // same region (live again), at the moved change count.
        let mut old = RegionCache::default();
        old.get(&t, 5).unwrap();
        assert!(t.write().park(5, "kept"));
        t.write().unpark(5).unwrap();
        let before = t.changes(5);
        assert!(Arc::ptr_eq(old.get(&t, 5).unwrap(), &first));
        assert_eq!(
            old.stamps[old.find(5).unwrap()],
            before,
            "kept at the new count"
        );
        // While parked, a filled entry serves nothing.
        assert!(t.write().park(5, "kept"));
        assert!(old.get(&t, 5).is_none(), "dead while parked");
        t.write().unpark(5).unwrap();
        // A change of attributes replaces the region: caches drop the old.
        assert!(t.write().set_attributes(5, 9, 0));
        assert_eq!(old.get(&t, 5).unwrap().ptag, 9);
        assert!(!first.live.get());
        // Parked again and dropped for good: out of the table.
        let mut w = t.write();
        assert!(w.park(5, "kept"));
        assert_eq!(w.parked().put(key, 5), None);
        let gone = w.take_parked(|p| p.drain());
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].rec, gone[0].parked), (55, Some("kept")));
        assert!(w.get(5).is_none());
        assert!(w.drain().is_empty());
    }

    #[test]
    fn a_cache_never_returns_a_removed_region() {
        let t = Table::<(), ()>::default();
        let mut c = RegionCache::default();
        for h in 1..=6 {
            t.insert(region(h, h as u64 * 0x1000));
        }
        for h in 1..=6 {
            assert_eq!(c.get(&t, h).unwrap().va, h as u64 * 0x1000);
        }
        // Cached (4 most recent), then removed: the entry goes stale.
        assert!(c.get(&t, 6).is_some());
        t.remove(6);
        assert!(c.get(&t, 6).is_none());
        // New registrations leave cached entries valid; removing one of
        // them does not make another come back wrong.
        assert!(c.get(&t, 4).is_some());
        t.insert(region(7, 0x7000));
        assert_eq!(c.get(&t, 4).unwrap().va, 0x4000);
        t.remove(4);
        assert!(c.get(&t, 4).is_none());
        assert_eq!(c.get(&t, 7).unwrap().va, 0x7000);
        // A changed region comes back changed.
        assert!(c.get(&t, 5).is_some());
        t.set_attributes(5, 9, 1);
        assert_eq!(c.get(&t, 5).unwrap().ptag, 9);
    }
}
