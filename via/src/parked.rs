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
//! enables takes it back and only makes its device entry live again (the
//! soft NIC's entry was kept, and comes back under the handle it had: the
//! same registration, whole; a device that kept nothing adds the region
//! anew under a fresh handle).
//!
//! Parked registrations hold their cache lease, so memory events must drop
//! them like any cache entry ([`Parked::take_overlapping`]); they are only
//! used where a memory-event monitor exists (without one, hits must be
//! checked against the mappings, which the registration cache does).
//! Few are kept ([`CAPACITY`] per NIC, least recently parked evicted
//! first): the cache behind them holds the rest.
#![forbid(unsafe_code)]

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

    /// A well-mixed hash (buffers are page-aligned and of a few sizes:
    /// the low bits alone would collide).
    fn hash(&self) -> u64 {
        let x = self.va
            ^ self.len.rotate_left(32)
            ^ (u64::from(self.ptag) << 40 | u64::from(self.flags));
        x.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

/// No place (end of a chain, empty bucket).
const EMPTY: u16 = u16::MAX;

/// One place: everything a lookup, a take or a put touches of it, together
/// (a registration that comes back reads one or two lines here).
struct Place<T> {
    key: Key,
    /// When it was parked (0: the place is empty).
    stamp: u64,
    /// Next place in the same bucket's chain.
    next: u16,
    value: Option<T>,
}

/// The parked registrations of one NIC, in fixed places (taking one moves
/// nothing). The NIC keeps them under the lock of its live registrations,
/// so that taking one back and making it live is one critical section.
///
/// Found through buckets of chained places (a head per bucket, a next per
/// place; at least twice as many buckets as places): a lookup hashes the
/// key once and usually compares one entry, and taking one unlinks it
/// without moving any other. A `HashMap` cost several times more on this
/// path, which every repeated registration takes.
pub struct Parked<T> {
    /// First place of each bucket's chain.
    heads: Vec<u16>,
    shift: u32,
    places: Vec<Place<T>>,
    /// Empty places.
    free: Vec<u16>,
    clock: u64,
    capacity: usize,
    /// Registrations served by [`Parked::take`].
    hits: u64,
}

impl<T> Parked<T> {
    /// An empty set keeping at most `capacity` (0: parking disabled; at
    /// most 32,767).
    pub fn new(capacity: usize) -> Parked<T> {
        assert!(
            capacity < EMPTY as usize / 2,
            "{capacity} parked registrations"
        );
        let buckets = (capacity * 2).next_power_of_two().max(2);
        Parked {
            heads: vec![EMPTY; buckets],
            shift: 64 - buckets.trailing_zeros(),
            places: Vec::with_capacity(capacity),
            free: Vec::with_capacity(capacity),
            clock: 0,
            capacity,
            hits: 0,
        }
    }

    fn bucket(&self, key: &Key) -> usize {
        // The top bits of the product are the best mixed.
        (key.hash() >> self.shift) as usize
    }

    /// The place holding `key`, the place before it in its chain (`EMPTY`:
    /// it is the head), and its bucket.
    fn find(&self, key: &Key) -> Option<(u16, usize, usize)> {
        let b = self.bucket(key);
        let mut prev = EMPTY;
        let mut i = self.heads[b];
        while i != EMPTY {
            let p = &self.places[i as usize];
            if p.key == *key {
                return Some((prev, i as usize, b));
            }
            prev = i;
            i = p.next;
        }
        None
    }

    /// Empties place `i`, found after `prev` in the chain of bucket `b`.
    fn remove(&mut self, prev: u16, i: usize, b: usize) -> Option<T> {
        let p = &mut self.places[i];
        let after = p.next;
        p.stamp = 0;
        let v = p.value.take();
        if prev == EMPTY {
            self.heads[b] = after;
        } else {
            self.places[prev as usize].next = after;
        }
        self.free.push(i as u16);
        v
    }

    /// Empties place `i` (parked, so its key is in a chain).
    fn take_at(&mut self, i: usize) -> Option<T> {
        if self.places[i].stamp == 0 {
            return None;
        }
        let key = self.places[i].key;
        let (prev, _, b) = self.find(&key).expect("a parked key is chained");
        self.remove(prev, i, b)
    }

    /// Takes the registration parked under `key`.
    pub fn take(&mut self, key: &Key) -> Option<T> {
        let (prev, i, b) = self.find(key)?;
        self.hits += 1;
        self.remove(prev, i, b)
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
        let evicted = if let Some((prev, i, b)) = self.find(&key) {
            self.remove(prev, i, b)
        } else if self.free.is_empty() && self.places.len() == self.capacity {
            let oldest = (0..self.places.len())
                .min_by_key(|&i| self.places[i].stamp)
                .expect("full, so not empty");
            self.take_at(oldest)
        } else {
            None
        };
        let b = self.bucket(&key);
        let place = Place {
            key,
            stamp,
            next: self.heads[b],
            value: Some(v),
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.places[i as usize] = place;
                i
            }
            None => {
                self.places.push(place);
                (self.places.len() - 1) as u16
            }
        };
        self.heads[b] = i;
        evicted
    }

    /// Takes every registration over bytes of `r` (the memory went away).
    pub fn take_overlapping(&mut self, r: &Range<usize>) -> Vec<T> {
        self.take_if(|k| k.overlaps(r))
    }

    /// Takes every registration whose key satisfies `f`.
    pub fn take_if(&mut self, f: impl Fn(&Key) -> bool) -> Vec<T> {
        (0..self.places.len())
            .filter(|&i| self.places[i].stamp != 0 && f(&self.places[i].key))
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|i| self.take_at(i))
            .collect()
    }

    /// Takes them all, least recently parked first.
    pub fn drain(&mut self) -> Vec<T> {
        let mut order: Vec<usize> = (0..self.places.len())
            .filter(|&i| self.places[i].stamp != 0)
            .collect();
        order.sort_by_key(|&i| self.places[i].stamp);
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

    /// Random puts and takes against a plain model, with keys that collide
    /// in the buckets (same page-aligned addresses, few lengths), so that
    /// chains and unlinking from their middle are exercised.
    #[test]
    fn agrees_with_a_model_under_collisions() {
        let mut p = Parked::new(8);
        let mut model: Vec<(Key, u64, u32)> = Vec::new(); // key, stamp, value
        let mut stamp = 0u64;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for n in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = key(0x1000 * (x % 12), 4096 * (1 + (x >> 8) % 2));
            if x >> 20 & 1 == 0 {
                stamp += 1;
                let got = p.put(k, n);
                let want = if let Some(j) = model.iter().position(|m| m.0 == k) {
                    Some(model.remove(j).2)
                } else if model.len() == 8 {
                    let j = (0..model.len()).min_by_key(|&j| model[j].1).unwrap();
                    Some(model.remove(j).2)
                } else {
                    None
                };
                model.push((k, stamp, n));
                assert_eq!(got, want, "put {k:?} at step {n}");
            } else {
                let want = model
                    .iter()
                    .position(|m| m.0 == k)
                    .map(|j| model.remove(j).2);
                assert_eq!(p.take(&k), want, "take {k:?} at step {n}");
            }
        }
        model.sort_by_key(|m| m.1);
        assert_eq!(p.drain(), model.iter().map(|m| m.2).collect::<Vec<_>>());
    }
}
