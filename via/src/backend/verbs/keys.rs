//! The local keys of memory regions as a posting queue reaches them: a few
//! (handle → lkey, first address) entries per queue (a VI's QP, an SRQ),
//! valid while the NIC's count of region removals is unchanged.
//!
//! A post needs the lkey of every segment's region. The NIC's map of MRs
//! (`Verbs::mrs`, by memory handle) is behind a lock shared by every
//! thread; the queue's own entries are read under the queue's lock the
//! post holds anyway, so a hit costs one atomic load and a scan of four
//! handles. Removing a region bumps the count after the MR left the map:
//! an entry filled before (or during) a removal is dropped at the next
//! post, as the common path's region cache does (`regions.rs`).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

/// The NIC-wide count of region removals.
#[derive(Default)]
pub(super) struct Epoch(AtomicU64);

impl Epoch {
    /// The count now.
    pub fn now(&self) -> u64 {
        // Acquire: pairs with the Release in `bump`, so a post that reads
        // the new count does not use a key the removal dropped.
        self.0.load(Ordering::Acquire)
    }

    /// Records a removal (after the MR left the map).
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// A region's local key and first registered address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Key {
    pub lkey: u32,
    pub addr: u64,
}

/// Keys of the regions a queue posted from last.
#[derive(Default)]
pub(super) struct KeyCache {
    /// The removal count the entries were filled under.
    epoch: u64,
    /// Handle 0 never names a region (`add_region` refuses it): empty.
    handles: [u32; KeyCache::SIZE],
    keys: [Key; KeyCache::SIZE],
    next: usize,
}

impl KeyCache {
    const SIZE: usize = 4;

    /// Forgets every entry if a region was removed since they were filled
    /// (`epoch`: [`Epoch::now`], read once per post).
    #[inline]
    pub fn validate(&mut self, epoch: u64) {
        if self.epoch != epoch {
            self.handles = [0; Self::SIZE];
            self.epoch = epoch;
        }
    }

    /// The key of `handle`, from the cache or `lookup` (the NIC's map);
    /// `None` if the handle names no live region. Call
    /// [`KeyCache::validate`] first (once per post).
    #[inline]
    pub fn get(&mut self, handle: u32, lookup: impl FnOnce(u32) -> Option<Key>) -> Option<Key> {
        if handle != 0 {
            for i in 0..Self::SIZE {
                if self.handles[i] == handle {
                    return Some(self.keys[i]);
                }
            }
        }
        self.miss(handle, lookup)
    }

    #[cold]
    fn miss(&mut self, handle: u32, lookup: impl FnOnce(u32) -> Option<Key>) -> Option<Key> {
        let k = lookup(handle)?;
        let i = self.next;
        self.next = (i + 1) % Self::SIZE;
        self.handles[i] = handle;
        self.keys[i] = k;
        Some(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(h: u32) -> Option<Key> {
        (h != 0 && h < 100).then_some(Key {
            lkey: h + 1000,
            addr: h as u64 * 4096,
        })
    }

    #[test]
    fn hits_misses_and_removals() {
        let e = Epoch::default();
        let mut c = KeyCache::default();
        let lookups = std::cell::Cell::new(0);
        let get = |c: &mut KeyCache, h| {
            c.get(h, |h| {
                lookups.set(lookups.get() + 1);
                key(h)
            })
        };
        c.validate(e.now());
        assert_eq!(get(&mut c, 5).unwrap().lkey, 1005);
        assert_eq!(get(&mut c, 5).unwrap().addr, 5 * 4096);
        assert_eq!(lookups.get(), 1);
        assert_eq!(get(&mut c, 0), None);
        assert_eq!(get(&mut c, 500), None);
        for h in 1..=4 {
            get(&mut c, h);
        }
        // 5 was replaced (four entries), the others hit.
        let before = lookups.get();
        get(&mut c, 3);
        assert_eq!(lookups.get(), before);
        get(&mut c, 5);
        assert_eq!(lookups.get(), before + 1);
        // A removal anywhere drops every entry.
        e.bump();
        c.validate(e.now());
        get(&mut c, 5);
        assert_eq!(lookups.get(), before + 2);
    }
}
