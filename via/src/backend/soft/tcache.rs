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
use crate::regions::RegionTable;

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
    retired: std::collections::HashMap<(u64, u32), u32>,
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
            retired: std::collections::HashMap::new(),
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

    fn counts(&mut self, u: Use) -> &mut CacheCounts {
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

/// The regions one descriptor uses, addressed by index while it runs, on
/// top of the translation cache.
pub(crate) struct Regions {
    work: Vec<(u64, u32, u32, Arc<Resolved>)>,
    pub cache: TranslationCache,
}

impl Regions {
    pub fn new(entries: usize, ways: usize) -> Regions {
        Regions {
            work: Vec::with_capacity(8),
            cache: TranslationCache::new(entries, ways),
        }
    }

    fn find(&self, owner: (u64, u32), handle: u32) -> Option<usize> {
        self.work
            .iter()
            .position(|w| (w.0, w.1) == owner && w.2 == handle)
    }

    /// The local region of `handle`; its index in the working set.
    pub fn local(&mut self, t: &RegionTable, handle: u32, u: Use) -> Option<usize> {
        if let Some(i) = self.find(LOCAL, handle) {
            return Some(i);
        }
        let v = t.version();
        let r = match self.cache.hit(LOCAL, handle, v, u) {
            Some(r) => r,
            None => self.cache.lookup(LOCAL, None, handle, v, v, u, || {
                t.get(handle).map(|r| (r, v))
            })?,
        };
        self.work.push((LOCAL.0, LOCAL.1, handle, r));
        Some(self.work.len() - 1)
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
        let owner = (r.session, r.nic);
        if let Some(i) = self.find(owner, handle) {
            return Some(i);
        }
        let now = tpt::seq(&r.view(), handle)? as u64;
        let region = match self.cache.hit(owner, handle, now, u) {
            Some(region) => region,
            None => {
                self.cache.sweep_retired(r);
                self.cache
                    .lookup(owner, Some(r), handle, now, local_version, u, || {
                        r.resolve(handle).map(|(reg, stamp)| (reg, stamp as u64))
                    })?
            }
        };
        self.work.push((owner.0, owner.1, handle, region));
        Some(self.work.len() - 1)
    }

    /// The region at working-set index `i`.
    pub fn get(&self, i: usize) -> &Resolved {
        &self.work[i].3
    }

    /// Ends a descriptor: the working set empties (the cache keeps the
    /// regions).
    pub fn trim(&mut self) {
        self.work.clear();
    }

    /// Drops every region of a peer session (it died).
    pub fn forget(&mut self, session: u64) {
        self.work.retain(|w| w.0 != session);
        self.cache.forget(session);
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
        })
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
