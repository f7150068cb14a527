//! The engine's translation cache: resolved regions (local, and of peers)
//! by memory handle, as the thesis's NIC-side translation cache (AT3).
//!
//! Set-associative, `entries` entries in sets of `ways` (default 1024,
//! direct-mapped: the thesis found 1024 direct-mapped entries as good as
//! 8-way for the NAS traces, and a direct-mapped lookup is one probe). An
//! entry is valid while its region is: local entries while the local
//! translation table's version is unchanged, a peer's entries while the
//! peer's table entry keeps its sequence value (one load each). Misses are
//! counted apart: compulsory (first reference to the handle) and the others
//! (capacity and conflict), for each kind of lookup.
//!
//! While a descriptor runs, the regions it uses live in a small working
//! set addressed by index ([`Regions`]), so a conflict in the cache never
//! takes a region away from the descriptor that uses it.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::sync::Arc;

pub use crate::backend::{CacheCounts, TranslationStats};
use crate::mem::region::Resolved;
use crate::regions::Table;

use super::remote::RemoteNic;
use super::tpt;

/// What a lookup was for (counted apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// A local region of a send, RDMA or completion of the initiator.
    Send,
    /// A peer's posted receive descriptor or its buffers.
    Recv,
    /// A peer's RDMA target or source.
    Rdma,
}

/// Owner key of local entries (no session is 0).
const LOCAL: (u64, u32) = (0, 0);

/// Most handles remembered for the compulsory-miss count; beyond it the
/// memory is cleared (counts stay exact for any working set below it).
/// Its room is taken at the first miss, so that a program registering
/// around every message (a new handle each time) never makes the set grow
/// and rehash on the data path (about 1 MiB per engine).
const SEEN_MAX: usize = 1 << 15;

struct Entry {
    /// `(0, 0)` for local regions, else the peer's (session, NIC id).
    owner: (u64, u32),
    /// The peer's mapping (remote entries), to check the entry is current.
    remote: Option<Arc<RemoteNic>>,
    handle: u32,
    /// Table version (local) or entry sequence value (peer).
    stamp: u64,
    region: Arc<Resolved>,
    /// Last use (for LRU within a set).
    used: u64,
}

/// The cache.
pub(crate) struct TranslationCache {
    sets: usize,
    ways: usize,
    slots: Vec<Option<Entry>>,
    clock: u64,
    /// Next slot [`TranslationCache::sweep`] checks.
    sweep_at: usize,
    /// Each peer's arena-retirement count when its entries were last swept.
    retired: std::collections::HashMap<(u64, u32), u32, crate::regions::BuildWordHasher>,
    seen: HashSet<((u64, u32), u32), crate::regions::BuildWordHasher>,
    stats: TranslationStats,
}

impl TranslationCache {
    /// `entries` rounded up to a power of two, in sets of `ways`.
    pub fn new(entries: usize, ways: usize) -> TranslationCache {
        let ways = ways.clamp(1, 64);
        let entries = entries.max(ways).next_power_of_two();
        let sets = (entries / ways).max(1);
        TranslationCache {
            sets,
            ways,
            slots: (0..sets * ways).map(|_| None).collect(),
            clock: 0,
            sweep_at: 0,
            retired: Default::default(),
            seen: HashSet::default(),
            stats: TranslationStats {
                entries: sets * ways,
                ways,
                ..Default::default()
            },
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> TranslationStats {
        self.stats
    }

    fn set_of(&self, owner: (u64, u32), handle: u32) -> usize {
        // Handles are already random (a keyed permutation); mix the owner in.
        let h = (handle as u64) ^ owner.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ owner.1 as u64;
        (h as usize) & (self.sets - 1)
    }

    pub(crate) fn counts(&mut self, u: Use) -> &mut CacheCounts {
        match u {
            Use::Send => &mut self.stats.send,
            Use::Recv => &mut self.stats.recv,
            Use::Rdma => &mut self.stats.rdma,
        }
    }

    /// Drops up to `n` entries (checked round robin) whose region changed
    /// since: deregistered regions hold mappings of arenas their owner may
    /// have retired, which are unmapped once no entry holds them. Run on
    /// every miss, so stale entries go at the pace translations change.
    fn sweep(&mut self, n: usize, local_version: u64) {
        for _ in 0..n.min(self.slots.len()) {
            let i = self.sweep_at;
            self.sweep_at = (i + 1) % self.slots.len();
            let stale = match &self.slots[i] {
                None => false,
                Some(e) => match &e.remote {
                    Some(r) => tpt::seq(&r.view(), e.handle).map(u64::from) != Some(e.stamp),
                    None => e.stamp != local_version,
                },
            };
            if stale {
                self.slots[i] = None;
            }
        }
    }

    /// Drops every entry of the peer `r` whose region changed, if the peer
    /// retired arenas since the last look: the mappings of retired arenas
    /// go as soon as this side translates anything of that peer again.
    fn sweep_retired(&mut self, r: &RemoteNic) {
        let owner = (r.session, r.nic);
        let now = r.retired();
        if self.retired.get(&owner) == Some(&now) {
            return;
        }
        self.retired.insert(owner, now);
        let view = r.view();
        for s in &mut self.slots {
            let stale = s.as_ref().is_some_and(|e| {
                e.owner == owner && tpt::seq(&view, e.handle).map(u64::from) != Some(e.stamp)
            });
            if stale {
                *s = None;
            }
        }
    }

    /// The entry of `(owner, handle)` if it is valid (stamp `current`): a
    /// hit, counted. `None` counts nothing (the caller then looks up).
    fn hit(
        &mut self,
        owner: (u64, u32),
        handle: u32,
        current: u64,
        u: Use,
    ) -> Option<Arc<Resolved>> {
        let base = self.set_of(owner, handle) * self.ways;
        self.clock += 1;
        let clock = self.clock;
        for e in self.slots[base..base + self.ways].iter_mut().flatten() {
            if e.handle == handle && e.owner == owner && e.stamp == current {
                e.used = clock;
                let r = e.region.clone();
                self.counts(u).hits += 1;
                return Some(r);
            }
        }
        None
    }

    /// Looks `(owner, handle)` up; `current` is the stamp the entry must
    /// carry, `resolve` builds it on a miss.
    #[allow(clippy::too_many_arguments)]
    fn lookup(
        &mut self,
        owner: (u64, u32),
        remote: Option<&Arc<RemoteNic>>,
        handle: u32,
        current: u64,
        local_version: u64,
        u: Use,
        resolve: impl FnOnce() -> Option<(Arc<Resolved>, u64)>,
    ) -> Option<Arc<Resolved>> {
        self.clock += 1;
        let base = self.set_of(owner, handle) * self.ways;
        let set = base..base + self.ways;
        let mut hit_stale = false;
        for i in set.clone() {
            if let Some(e) = &mut self.slots[i] {
                if e.owner == owner && e.handle == handle {
                    if e.stamp == current {
                        e.used = self.clock;
                        let r = e.region.clone();
                        self.counts(u).hits += 1;
                        return Some(r);
                    }
                    hit_stale = true;
                }
            }
        }
        if self.seen.capacity() < SEEN_MAX {
            self.seen.reserve(SEEN_MAX);
        }
        let first = self.seen.len() < SEEN_MAX && self.seen.insert((owner, handle));
        if self.seen.len() >= SEEN_MAX {
            self.seen.clear();
        }
        let c = self.counts(u);
        if first && !hit_stale {
            c.compulsory += 1;
        } else {
            c.other += 1;
        }
        // One entry per miss: each check may miss on a peer's table line.
        self.sweep(1, local_version);
        let (region, stamp) = resolve()?;
        // Replace the same key if present, else an empty way, else the LRU.
        let victim = set
            .clone()
            .find(|&i| {
                self.slots[i]
                    .as_ref()
                    .is_some_and(|e| e.owner == owner && e.handle == handle)
            })
            .or_else(|| set.clone().find(|&i| self.slots[i].is_none()))
            .unwrap_or_else(|| {
                set.clone()
                    .min_by_key(|&i| self.slots[i].as_ref().map_or(0, |e| e.used))
                    .expect("non-empty set")
            });
        self.slots[victim] = Some(Entry {
            owner,
            remote: remote.cloned(),
            handle,
            stamp,
            region: region.clone(),
            used: self.clock,
        });
        Some(region)
    }

    /// Drops every entry of a peer session (it died).
    pub fn forget(&mut self, session: u64) {
        self.retired.retain(|o, _| o.0 != session);
        for s in &mut self.slots {
            if s.as_ref()
                .is_some_and(|e| e.owner.0 == session && e.owner != LOCAL)
            {
                *s = None;
            }
        }
    }
}

/// Regions kept from the last descriptors ([`Regions`]).
const MEMO: usize = 4;

/// Peer regions remembered by their table contents ([`Revived`]).
const REVIVED: usize = 4;

/// The peer regions resolved last, by what the peer's table said about
/// them apart from the handle: a program that registers around every
/// message deregisters and registers the same bytes again, and the peer's
/// parked registration comes back in the same table entry with the same
/// extents, under the handle it had (its sequence value moved, so the
/// cached translation fails its check) or a fresh one. Its region is then
/// the one resolved before: no arena lookup, no new extent list.
///
/// Sound because the snapshot it is matched against is the live entry of
/// the handle, and arena ids never repeat within a process, so equal
/// extents name the same memory, mapped by the same arenas. Dropped when
/// the peer retires an arena (its count moved), so that a retired arena is
/// not kept mapped by this memory.
#[derive(Default)]
struct Revived {
    recs: [Option<RevivedRec>; REVIVED],
    next: usize,
}

struct RevivedRec {
    owner: (u64, u32),
    /// The peer's arena-retirement count when it was resolved.
    retired: u32,
    /// The table contents, handle zeroed.
    snap: tpt::Snapshot,
    region: Arc<Resolved>,
}

impl Revived {
    /// Resolves `handle` of peer `r` by mapping its extents (after
    /// [`Revived::reuse`] found no record), and records it.
    fn resolve(&mut self, r: &RemoteNic, handle: u32) -> Option<(Arc<Resolved>, u32)> {
        let (mut snap, seq) = tpt::read(&r.view(), handle)?;
        let owner = (r.session, r.nic);
        let retired = r.retired();
        // Records from before the owner retired an arena go now, so that
        // they do not keep a retired arena mapped.
        for x in &mut self.recs {
            if x.as_ref()
                .is_some_and(|x| x.owner == owner && x.retired != retired)
            {
                *x = None;
            }
        }
        let region = r.build(&snap)?;
        snap.handle = 0;
        self.recs[self.next] = Some(RevivedRec {
            owner,
            retired,
            snap,
            region: region.clone(),
        });
        self.next = (self.next + 1) % REVIVED;
        Some((region, seq))
    }

    /// `handle` of peer `r` if its table entry holds what a recorded one
    /// held: that region (under the new handle if it changed). Compares the
    /// entry in place ([`tpt::holds`]), so it costs a few loads (and one
    /// allocation for a fresh handle); `None`
    /// leaves the work to [`Revived::resolve`].
    fn reuse(&self, r: &RemoteNic, handle: u32) -> Option<(Arc<Resolved>, u32)> {
        let owner = (r.session, r.nic);
        let retired = r.retired();
        let view = r.view();
        self.recs.iter().flatten().find_map(|x| {
            if x.owner != owner || x.retired != retired {
                return None;
            }
            let seq = tpt::holds(&view, handle, &x.snap)?;
            if x.region.handle == handle {
                return Some((x.region.clone(), seq));
            }
            let mut region = (*x.region).clone();
            region.handle = handle;
            Some((Arc::new(region), seq))
        })
    }

    /// Forgets the regions of a peer session (it died).
    fn forget(&mut self, session: u64) {
        for x in &mut self.recs {
            if x.as_ref().is_some_and(|x| x.owner.0 == session) {
                *x = None;
            }
        }
    }
}

/// A region a recent descriptor used: `(owner, handle)` valid while its
/// stamp is current (as a cache entry).
struct Memo {
    owner: (u64, u32),
    handle: u32,
    stamp: u64,
    region: Arc<Resolved>,
}

/// The regions one descriptor uses, addressed by index while it runs, on
/// top of the translation cache.
///
/// The regions of the last descriptors stay at hand ([`MEMO`] of them): a
/// stream of descriptors over the same few regions (a ping-pong) finds its
/// regions there with one stamp check, without probing the cache or
/// changing a reference count. Indices below [`MEMO`] name these entries,
/// the others the working set proper. The memo changes only in
/// [`Regions::trim`], between descriptors, so an index stays valid for the
/// whole descriptor; after a descriptor that missed the cache it keeps
/// only that descriptor's regions, so it never holds a changed region
/// (and the mappings behind it) longer than the cache would.
pub(crate) struct Regions {
    memo: [Option<Memo>; MEMO],
    memo_next: usize,
    /// The current descriptor looked a region up in the cache and missed.
    missed: bool,
    work: Vec<Memo>,
    revived: Revived,
    pub cache: TranslationCache,
}

impl Regions {
    pub fn new(entries: usize, ways: usize) -> Regions {
        Regions {
            memo: [const { None }; MEMO],
            memo_next: 0,
            missed: false,
            work: Vec::with_capacity(8),
            revived: Revived::default(),
            cache: TranslationCache::new(entries, ways),
        }
    }

    /// The index of `(owner, handle)` with stamp `now` among the kept
    /// regions (counted as a cache hit), then in the working set.
    #[inline]
    fn find(&mut self, owner: (u64, u32), handle: u32, now: u64, u: Use) -> Option<usize> {
        let kept = self.memo.iter().position(|m| {
            m.as_ref()
                .is_some_and(|m| m.handle == handle && m.owner == owner && m.stamp == now)
        });
        if let Some(i) = kept {
            self.cache.counts(u).hits += 1;
            return Some(i);
        }
        self.work
            .iter()
            .position(|w| w.owner == owner && w.handle == handle && w.stamp == now)
            .map(|i| MEMO + i)
    }

    /// Adds a region found in the cache (or resolved on a miss) to the
    /// working set.
    fn push(&mut self, owner: (u64, u32), handle: u32, stamp: u64, region: Arc<Resolved>) -> usize {
        self.work.push(Memo {
            owner,
            handle,
            stamp,
            region,
        });
        MEMO + self.work.len() - 1
    }

    /// The local region of `handle`; its index in the working set.
    ///
    /// A kept region is checked against the change count of its handle's
    /// bucket, read before any lookup: deregistering *other* buffers (a
    /// message layer does it around every message) leaves it valid. The
    /// cache's entries follow the table's version.
    pub fn local<R, P>(&mut self, t: &Table<R, P>, handle: u32, u: Use) -> Option<usize> {
        let b = t.changes(handle);
        if let Some(i) = self.find(LOCAL, handle, b, u) {
            return Some(i);
        }
        let v = t.version();
        let r = match self.cache.hit(LOCAL, handle, v, u) {
            Some(r) => r,
            None => {
                self.missed = true;
                self.cache.lookup(LOCAL, None, handle, v, v, u, || {
                    t.get(handle).map(|r| (r, v))
                })?
            }
        };
        Some(self.push(LOCAL, handle, b, r))
    }

    /// The peer's region of `handle`; its index in the working set.
    /// `local_version` is this process's table version (for the sweep).
    pub fn remote(
        &mut self,
        r: &Arc<RemoteNic>,
        handle: u32,
        local_version: u64,
        u: Use,
    ) -> Option<usize> {
        let now = tpt::seq(&r.view(), handle)?;
        self.remote_at(r, handle, now, local_version, u)
    }

    /// [`Regions::remote`] with the sequence value of the handle's table
    /// entry already read (`tpt::index_seq`).
    #[inline]
    pub fn remote_at(
        &mut self,
        r: &Arc<RemoteNic>,
        handle: u32,
        now: u32,
        local_version: u64,
        u: Use,
    ) -> Option<usize> {
        let owner = (r.session, r.nic);
        let now = now as u64;
        if let Some(i) = self.find(owner, handle, now, u) {
            return Some(i);
        }
        let (region, stamp) = match self.cache.hit(owner, handle, now, u) {
            Some(region) => (region, now),
            None => {
                self.missed = true;
                self.cache.sweep_retired(r);
                // A registration that came back (under its old handle, or a
                // fresh one): the region resolved before, without entering
                // the cache (the kept regions hold it for the next
                // descriptors). Counted as compulsory.
                if let Some((region, stamp)) = self.revived.reuse(r, handle) {
                    self.cache.counts(u).compulsory += 1;
                    return Some(self.push(owner, handle, stamp as u64, region));
                }
                let mut stamp = now;
                let revived = &mut self.revived;
                let region =
                    self.cache
                        .lookup(owner, Some(r), handle, now, local_version, u, || {
                            revived.resolve(r, handle).map(|(reg, s)| {
                                stamp = s as u64;
                                (reg, s as u64)
                            })
                        })?;
                (region, stamp)
            }
        };
        Some(self.push(owner, handle, stamp, region))
    }

    /// The region at working-set index `i`.
    #[inline(always)]
    pub fn get(&self, i: usize) -> &Resolved {
        match i.checked_sub(MEMO) {
            Some(w) => &self.work[w].region,
            None => &self.memo[i].as_ref().expect("a kept region's index").region,
        }
    }

    /// Ends a descriptor: the working set empties into the kept regions
    /// (all of them replaced after a miss), and the cache keeps them too.
    #[inline(always)]
    pub fn trim(&mut self) {
        if !self.work.is_empty() || self.missed {
            self.keep();
        }
    }

    /// [`Regions::trim`] when the descriptor used regions not kept yet.
    #[inline(never)]
    fn keep(&mut self) {
        if std::mem::take(&mut self.missed) {
            self.memo = [const { None }; MEMO];
        }
        for w in self.work.drain(..) {
            let i = self
                .memo
                .iter()
                .position(|m| {
                    m.as_ref()
                        .is_some_and(|m| m.owner == w.owner && m.handle == w.handle)
                })
                .unwrap_or_else(|| {
                    let i = self.memo_next;
                    self.memo_next = (i + 1) % MEMO;
                    i
                });
            self.memo[i] = Some(w);
        }
    }

    /// Drops every region of a peer session (it died).
    pub fn forget(&mut self, session: u64) {
        self.work.retain(|w| w.owner.0 != session);
        for m in &mut self.memo {
            if m.as_ref().is_some_and(|m| m.owner.0 == session) {
                *m = None;
            }
        }
        self.cache.forget(session);
        self.revived.forget(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(handle: u32) -> Arc<Resolved> {
        Arc::new(Resolved {
            handle,
            va: 0,
            len: 0,
            ptag: 0,
            flags: 0,
            pid: 0,
            extents: Default::default(),
            live: Default::default(),
        })
    }

    fn local_region(handle: u32, len: u64) -> Resolved {
        Resolved {
            len,
            ..Arc::unwrap_or_clone(region(handle))
        }
    }

    #[test]
    fn kept_regions_hit_without_the_cache_and_follow_changes() {
        let t = Table::<(), ()>::default();
        t.insert(local_region(5, 100));
        t.insert(local_region(6, 200));
        let mut r = Regions::new(4, 1);
        // First descriptor: misses, then kept.
        let a = r.local(&t, 5, Use::Send).unwrap();
        let b = r.local(&t, 6, Use::Send).unwrap();
        assert_eq!((r.get(a).len, r.get(b).len), (100, 200));
        assert_eq!(
            r.local(&t, 5, Use::Send),
            Some(a),
            "same descriptor, same index"
        );
        r.trim();
        let s = r.cache.stats().send;
        assert_eq!((s.hits, s.compulsory), (0, 2));
        // Next descriptors: found among the kept regions, counted as hits.
        for _ in 0..3 {
            let a = r.local(&t, 5, Use::Send).unwrap();
            let b = r.local(&t, 6, Use::Send).unwrap();
            assert_eq!((r.get(a).len, r.get(b).len), (100, 200));
            r.trim();
        }
        assert_eq!(r.cache.stats().send.hits, 6);
        // Another region registered and deregistered (a message layer does
        // it around every message; one of another bucket of handles):
        // the kept regions still hit.
        let (c5, c6) = (t.changes(5), t.changes(6));
        let other = (100..)
            .find(|&h| {
                t.insert(local_region(h, 1));
                t.remove(h);
                (t.changes(5), t.changes(6)) == (c5, c6)
            })
            .unwrap();
        assert!(t.get(other).is_none());
        let a = r.local(&t, 5, Use::Send).unwrap();
        let b = r.local(&t, 6, Use::Send).unwrap();
        assert_eq!((r.get(a).len, r.get(b).len), (100, 200));
        r.trim();
        let s = r.cache.stats().send;
        assert_eq!((s.hits, s.compulsory + s.other), (8, 2));
        // A changed region is looked up again, never served from the memo.
        t.remove(5);
        t.insert(local_region(5, 300));
        let a = r.local(&t, 5, Use::Send).unwrap();
        assert_eq!(r.get(a).len, 300);
        let b = r.local(&t, 6, Use::Send).unwrap();
        assert_eq!(r.get(b).len, 200);
        r.trim();
        let a = r.local(&t, 5, Use::Send).unwrap();
        assert_eq!(r.get(a).len, 300);
        r.trim();
        // A removed region is not found at all.
        t.remove(6);
        assert_eq!(r.local(&t, 6, Use::Send), None);
        r.trim();
    }

    #[test]
    fn more_regions_than_are_kept() {
        let t = Table::<(), ()>::default();
        for h in 1..=(2 * MEMO as u32) {
            t.insert(local_region(h, h as u64));
        }
        let mut r = Regions::new(64, 1);
        for _ in 0..3 {
            let idx: Vec<usize> = (1..=(2 * MEMO as u32))
                .map(|h| r.local(&t, h, Use::Send).unwrap())
                .collect();
            for (h, i) in (1..).zip(idx) {
                assert_eq!(r.get(i).len, h as u64);
            }
            r.trim();
        }
    }

    #[test]
    fn counts_compulsory_and_other_misses_apart() {
        let mut c = TranslationCache::new(4, 1);
        let owner = (7, 1);
        let look = |c: &mut TranslationCache, h: u32, stamp: u64| {
            c.lookup(owner, None, h, stamp, 0, Use::Recv, || {
                Some((region(h), stamp))
            })
            .unwrap()
            .handle
        };
        assert_eq!(look(&mut c, 1, 10), 1);
        assert_eq!(look(&mut c, 1, 10), 1);
        // The entry changed (re-registered): a miss, not compulsory.
        assert_eq!(look(&mut c, 1, 11), 1);
        let s = c.stats().recv;
        assert_eq!((s.hits, s.compulsory, s.other), (1, 1, 1));
        // Many handles in 4 direct-mapped entries: conflicts evict.
        for h in 2..100 {
            look(&mut c, h, 1);
        }
        for h in 2..100 {
            look(&mut c, h, 1);
        }
        let s = c.stats().recv;
        assert_eq!(s.compulsory, 99);
        assert!(s.other > 90, "{s:?}");
        assert_eq!(c.stats().send, CacheCounts::default());
    }

    #[test]
    fn associativity_keeps_a_working_set_that_fits() {
        // 8 handles that all fall in one set of a direct-mapped cache thrash;
        // in an 8-way cache of the same size they stay.
        for (ways, expect_hits) in [(8usize, true), (1, false)] {
            let mut c = TranslationCache::new(8, ways);
            let owner = (1, 1);
            let mut handles = Vec::new();
            let mut h = 1u32;
            while handles.len() < 8 {
                if c.set_of(owner, h) == 0 {
                    handles.push(h);
                }
                h += 1;
            }
            for _ in 0..3 {
                for &h in &handles {
                    c.lookup(owner, None, h, 1, 1, Use::Rdma, || Some((region(h), 1)));
                }
            }
            let s = c.stats().rdma;
            assert_eq!(s.hits > 0, expect_hits, "{ways} ways: {s:?}");
        }
    }
}
