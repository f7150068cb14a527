//! Parked registrations: the first level of the pin-down cache, per NIC.
//!
//! Legacy message layers register and deregister the same buffer around
//! every message. The registration cache (`regcache`) already keeps the
//! pinned pages of a deregistered region, but a hit there still rebuilds
//! everything above the pages: the extents this process maps, the fork
//! ranges, the cache's lease. A parked registration is all of that, kept
//! whole at `VipDeregisterMem` (after the device entry is removed and peers
//! are quiesced, so the handle is dead as VIPL requires); a later
//! `VipRegisterMem` of exactly the same bytes, protection tag and RDMA
//! enables takes it back and only gives it a fresh handle and device entry.
//!
//! Parked registrations hold their cache lease, so memory events must drop
//! them like any cache entry ([`Parked::take_overlapping`]); they are only
//! used where a memory-event monitor exists (without one, hits must be
//! checked against the mappings, which the registration cache does).
//! Few are kept ([`CAPACITY`] per NIC, least recently parked evicted
//! first): the cache behind them holds the rest.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Range;

/// Registrations parked per NIC.
pub const CAPACITY: usize = 64;

/// What a parked registration is found by: exactly what was registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// First byte.
    pub va: u64,
    /// Length.
    pub len: u64,
    /// Protection tag id.
    pub ptag: u32,
    /// RDMA enable flags.
    pub flags: u32,
}

impl Key {
    fn overlaps(&self, r: &Range<usize>) -> bool {
        let (a, b) = (self.va as usize, (self.va + self.len.max(1)) as usize);
        a < r.end && r.start < b
    }
}

/// The parked registrations of one NIC, in fixed places (taking one moves
/// nothing). The NIC keeps them under the lock of its live registrations,
/// so that taking one back and making it live is one critical section.
pub struct Parked<T> {
    /// Where each parked key is (one registration per key: parking the
    /// same bytes again evicts the older).
    index: HashMap<Key, usize, crate::regions::BuildWordHasher>,
    keys: Vec<Key>,
    /// When each was parked (0: the place is empty).
    stamps: Vec<u64>,
    values: Vec<Option<T>>,
    clock: u64,
    capacity: usize,
    /// Registrations served by [`Parked::take`].
    hits: u64,
}

impl<T> Parked<T> {
    /// An empty set keeping at most `capacity` (0: parking disabled).
    pub fn new(capacity: usize) -> Parked<T> {
        Parked {
            index: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            keys: Vec::with_capacity(capacity),
            stamps: Vec::with_capacity(capacity),
            values: Vec::with_capacity(capacity),
            clock: 0,
            capacity,
            hits: 0,
        }
    }

    fn take_at(&mut self, i: usize) -> Option<T> {
        if self.stamps[i] != 0 {
            self.index.remove(&self.keys[i]);
        }
        self.stamps[i] = 0;
        self.values[i].take()
    }

    /// Takes the registration parked under `key`.
    pub fn take(&mut self, key: &Key) -> Option<T> {
        let i = *self.index.get(key)?;
        self.hits += 1;
        self.take_at(i)
    }

    /// Registrations served so far.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Parks `v` under `key`; returns what had to leave to make room: the
    /// one parked under the same key, or else the least recently parked.
    pub fn put(&mut self, key: Key, v: T) -> Option<T> {
        if self.capacity == 0 {
            return Some(v);
        }
        self.clock += 1;
        let stamp = self.clock;
        let free = self
            .index
            .get(&key)
            .copied()
            .or_else(|| self.stamps.iter().position(|&s| s == 0));
        let (i, evicted) = match free {
            Some(i) => (i, self.take_at(i)),
            None if self.keys.len() < self.capacity => {
                self.keys.push(key);
                self.stamps.push(0);
                self.values.push(None);
                (self.keys.len() - 1, None)
            }
            None => {
                let oldest = (0..self.stamps.len())
                    .min_by_key(|&i| self.stamps[i])
                    .expect("full, so not empty");
                (oldest, self.take_at(oldest))
            }
        };
        self.keys[i] = key;
        self.stamps[i] = stamp;
        self.values[i] = Some(v);
        self.index.insert(key, i);
        evicted
    }

    /// Takes every registration over bytes of `r` (the memory went away).
    pub fn take_overlapping(&mut self, r: &Range<usize>) -> Vec<T> {
        self.take_if(|k| k.overlaps(r))
    }

    /// Takes every registration whose key satisfies `f`.
    pub fn take_if(&mut self, f: impl Fn(&Key) -> bool) -> Vec<T> {
        (0..self.keys.len())
            .filter(|&i| self.stamps[i] != 0 && f(&self.keys[i]))
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|i| self.take_at(i))
            .collect()
    }

    /// Takes them all, least recently parked first.
    pub fn drain(&mut self) -> Vec<T> {
        let mut order: Vec<usize> = (0..self.keys.len())
            .filter(|&i| self.stamps[i] != 0)
            .collect();
        order.sort_by_key(|&i| self.stamps[i]);
        order.into_iter().filter_map(|i| self.take_at(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(va: u64, len: u64) -> Key {
        Key {
            va,
            len,
            ptag: 1,
            flags: 0,
        }
    }

    #[test]
    fn takes_exact_matches_only() {
        let mut p = Parked::new(4);
        assert!(p.put(key(0x1000, 100), 1).is_none());
        assert_eq!(p.take(&key(0x1000, 99)), None, "another length");
        assert_eq!(
            p.take(&Key {
                ptag: 2,
                ..key(0x1000, 100)
            }),
            None,
            "another tag"
        );
        assert_eq!(
            p.take(&Key {
                flags: 1,
                ..key(0x1000, 100)
            }),
            None,
            "other enables"
        );
        assert_eq!(p.hits(), 0);
        assert_eq!(p.take(&key(0x1000, 100)), Some(1));
        assert_eq!(p.take(&key(0x1000, 100)), None, "taken once");
        assert_eq!(p.hits(), 1);
        // The same bytes parked twice: the newer stays, the older leaves.
        assert!(p.put(key(0x1000, 100), 2).is_none());
        assert_eq!(p.put(key(0x1000, 100), 3), Some(2));
        assert_eq!(p.take(&key(0x1000, 100)), Some(3));
        assert_eq!(p.take(&key(0x1000, 100)), None);
    }

    #[test]
    fn evicts_the_least_recently_parked() {
        let mut p = Parked::new(2);
        assert!(p.put(key(1, 1), 1).is_none());
        assert!(p.put(key(2, 1), 2).is_none());
        assert_eq!(p.put(key(3, 1), 3), Some(1));
        assert_eq!(p.take(&key(1, 1)), None);
        assert_eq!(p.drain(), vec![2, 3]);
        let mut off: Parked<u32> = Parked::new(0);
        assert_eq!(
            off.put(key(1, 1), 7),
            Some(7),
            "nothing parked when disabled"
        );
    }

    #[test]
    fn memory_going_away_takes_what_overlaps() {
        let mut p = Parked::new(8);
        p.put(key(0x1000, 0x1000), 1);
        p.put(key(0x2000, 0x1000), 2);
        p.put(key(0x3000, 0x1000), 3);
        assert!(p.take_overlapping(&(0x5000..0x6000)).is_empty());
        let mut gone = p.take_overlapping(&(0x1fff..0x3001));
        gone.sort();
        assert_eq!(gone, vec![1, 2, 3]);
        p.put(key(0x1000, 0x1000), 4);
        assert!(
            p.take_overlapping(&(0x2000..0x3000)).is_empty(),
            "end is exclusive"
        );
        assert_eq!(p.drain(), vec![4]);
    }
}
