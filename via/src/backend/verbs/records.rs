//! Work requests posted to the device, kept until their completion: for a
//! send, where its completion goes; for a receive, that and the scatter
//! list it was posted with (a VI whose attributes change posts it again to
//! its new QP).
//!
//! Records live in preallocated slots, found by the position the request's
//! `wr_id` carries: a post fills a slot in place and a completion frees
//! it, no map and no allocation on the path. A VI's records ([`PosRing`])
//! are indexed by queue position modulo the ring's size: each of the VI's
//! queues holds at most `QUEUE_DEPTH` descriptors, so the live positions
//! lie within that window. An SRQ's ([`RecvSlab`]) may be taken in any
//! order by any of its QPs: slots come from a free list, and the position
//! names the slot and a serial number (a stale completion finds another
//! serial).
#![forbid(unsafe_code)]

use super::ibv::Sge;
use super::keys::Key;
use crate::descriptor::MAX_SEGMENTS;
use crate::translate::RecvWr;

/// Bits of a receive's position in its `wr_id`.
pub(super) const POS_MASK: u64 = 0x7fff_ffff;

/// The position of a free slot.
const FREE: u64 = u64::MAX;

/// A receive posted to the device.
#[derive(Clone, Copy)]
pub(super) struct RecvRec {
    /// Where its completion goes.
    pub done: RecvDone,
    n: usize,
    sges: [Sge; MAX_SEGMENTS],
}

/// Where a receive's completion goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RecvDone {
    /// Memory handle of the region holding the descriptor.
    pub desc_handle: u32,
    /// Offset of the descriptor in that region.
    pub desc_off: u64,
    /// Its address (what an SRQ reports).
    pub desc_va: u64,
}

impl RecvRec {
    const FREE: RecvRec = RecvRec {
        done: RecvDone {
            desc_handle: 0,
            desc_off: 0,
            desc_va: 0,
        },
        n: 0,
        sges: [Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        }; MAX_SEGMENTS],
    };

    /// The scatter list posted.
    pub fn sges(&self) -> &[Sge] {
        &self.sges[..self.n]
    }

    /// Fills the record of the validated receive `wr` (descriptor at
    /// `desc_va`), each segment's key from `key` (by memory handle);
    /// false if a segment's region is gone.
    #[inline]
    pub fn fill(
        &mut self,
        wr: &RecvWr,
        desc_va: u64,
        mut key: impl FnMut(u32) -> Option<Key>,
    ) -> bool {
        let n = wr.n.min(MAX_SEGMENTS);
        for (d, &(off, len, h)) in self.sges.iter_mut().zip(&wr.segs[..n]) {
            let Some(k) = key(h) else {
                return false;
            };
            *d = Sge {
                addr: k.addr + off,
                len,
                lkey: k.lkey,
            };
        }
        self.filled(wr, desc_va, n)
    }

    /// [`RecvRec::fill`] without a key lookup, on a device whose lkeys are
    /// the memory handles, when every segment of `wr` lies in its
    /// descriptor's region or in the one data region translation found
    /// (the common cases: translation checked them and found the regions'
    /// first addresses); false, and nothing usable filled, when one lies
    /// elsewhere.
    #[inline]
    pub fn fill_in_known_regions(&mut self, wr: &RecvWr, desc_va: u64) -> bool {
        let n = wr.n.min(MAX_SEGMENTS);
        for (d, &(off, len, h)) in self.sges.iter_mut().zip(&wr.segs[..n]) {
            let base = if h == wr.desc_handle {
                wr.desc_base
            } else if h == wr.data_handle && h != 0 {
                wr.data_base
            } else {
                return false;
            };
            *d = Sge {
                addr: base + off,
                len,
                lkey: h,
            };
        }
        self.filled(wr, desc_va, n)
    }

    /// The fills' end, once the `n` entries of the scatter list are in:
    /// their count and where the completion goes. True.
    #[inline(always)]
    fn filled(&mut self, wr: &RecvWr, desc_va: u64, n: usize) -> bool {
        self.n = n;
        self.done = RecvDone {
            desc_handle: wr.desc_handle,
            desc_off: wr.desc_off,
            desc_va,
        };
        true
    }
}

impl Default for RecvRec {
    fn default() -> RecvRec {
        RecvRec::FREE
    }
}

/// The records of one of a VI's queues, by queue position.
pub(super) struct PosRing<T> {
    /// Each record's position ([`FREE`]: none), and the record; a power of
    /// two long, at most `max`.
    recs: Vec<(u64, T)>,
    max: usize,
    live: usize,
}

impl<T: Copy + Default> PosRing<T> {
    /// Sizes the ring starts at (it doubles when two live positions meet
    /// in one slot).
    const FIRST: usize = 64;

    /// An empty ring for positions within a window of `max` (a power of
    /// two: the queue's depth).
    pub fn new(max: usize) -> PosRing<T> {
        debug_assert!(max.is_power_of_two());
        PosRing {
            recs: vec![(FREE, T::default()); Self::FIRST.min(max)],
            max,
            live: 0,
        }
    }

    fn index(&self, pos: u64) -> usize {
        (pos & POS_MASK) as usize & (self.recs.len() - 1)
    }

    /// The slot for a request at `pos`, marked taken; the caller fills it
    /// or gives it back ([`PosRing::take`]).
    #[inline(always)]
    pub fn insert(&mut self, pos: u64) -> &mut T {
        let pos = pos & POS_MASK;
        let mut i = self.index(pos);
        let old = self.recs[i].0;
        if old != FREE && old != pos {
            i = self.make_room(pos);
        } else if old == FREE {
            self.live += 1;
        }
        self.recs[i].0 = pos;
        &mut self.recs[i].1
    }

    /// The slot of `pos` when another live position holds it: the ring
    /// doubles (up to `max`).
    #[cold]
    fn make_room(&mut self, pos: u64) -> usize {
        while self.recs.len() < self.max {
            let len = 2 * self.recs.len();
            let old = std::mem::replace(&mut self.recs, vec![(FREE, T::default()); len]);
            for r in old.into_iter().filter(|r| r.0 != FREE) {
                let i = self.index(r.0);
                self.recs[i] = r;
            }
            if self.recs[self.index(pos)].0 == FREE {
                break;
            }
        }
        let i = self.index(pos);
        match self.recs[i].0 {
            FREE => self.live += 1,
            // Cannot be: the queue holds at most `max` positions.
            old => log::warn!("verbs: the record of {old} replaced by {pos}'s"),
        }
        i
    }

    /// Takes the record of the request at `pos` (the low bits a `wr_id`
    /// carries suffice); `None` if there is none (completed, cancelled).
    #[inline(always)]
    pub fn take(&mut self, pos: u64) -> Option<&T> {
        let pos = pos & POS_MASK;
        let i = self.index(pos);
        let r = &mut self.recs[i];
        if r.0 != pos {
            return None;
        }
        r.0 = FREE;
        self.live -= 1;
        Some(&r.1)
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Whether a record of `pos` is live.
    pub fn contains(&self, pos: u64) -> bool {
        let pos = pos & POS_MASK;
        self.recs[self.index(pos)].0 == pos
    }

    /// Live records.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn clear(&mut self) {
        for r in &mut self.recs {
            r.0 = FREE;
        }
        self.live = 0;
    }

    /// The live records and their positions.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.recs
            .iter()
            .filter(|r| r.0 != FREE)
            .map(|r| (r.0, &r.1))
    }
}

/// The records of an SRQ's receives, in slots of a free list.
pub(super) struct RecvSlab {
    /// Each record's position ([`FREE`]: none), and the record.
    recs: Vec<(u64, RecvRec)>,
    free: Vec<u32>,
    /// Serial number of the next receive.
    serial: u64,
}

impl RecvSlab {
    /// Bits of a position that name the slot.
    const SLOT_BITS: u32 = 11;

    /// Room for `entries` receives (at most 2^11).
    pub fn new(entries: u32) -> RecvSlab {
        let entries = entries.min(1 << Self::SLOT_BITS);
        RecvSlab {
            recs: vec![(FREE, RecvRec::FREE); entries as usize],
            free: (0..entries).rev().collect(),
            serial: 0,
        }
    }

    /// A free slot, marked taken, and the position to post it under;
    /// `None` when all are taken.
    pub fn insert(&mut self) -> Option<(u64, &mut RecvRec)> {
        let i = self.free.pop()?;
        let pos = ((self.serial << Self::SLOT_BITS) | i as u64) & POS_MASK;
        self.serial += 1;
        let r = &mut self.recs[i as usize];
        r.0 = pos;
        Some((pos, &mut r.1))
    }

    /// Takes the record of the receive posted under `pos`.
    pub fn take(&mut self, pos: u64) -> Option<RecvDone> {
        let i = (pos & ((1 << Self::SLOT_BITS) - 1)) as usize;
        let r = self.recs.get_mut(i)?;
        if r.0 != pos & POS_MASK {
            return None;
        }
        r.0 = FREE;
        self.free.push(i as u32);
        Some(r.1.done)
    }

    /// The live records.
    pub fn iter(&self) -> impl Iterator<Item = &RecvRec> {
        self.recs.iter().filter(|r| r.0 != FREE).map(|r| &r.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(handle: u32, off: u64) -> RecvWr {
        let mut w = RecvWr {
            desc_off: off,
            desc_handle: handle,
            n: 1,
            ..RecvWr::default()
        };
        w.segs[0] = (16, 8, handle);
        w
    }

    fn key(h: u32) -> Option<Key> {
        Some(Key {
            lkey: h + 1,
            addr: 0x1000,
        })
    }

    #[test]
    fn a_ring_finds_each_position_once() {
        let mut r = PosRing::<RecvRec>::new(1024);
        assert!(r.is_empty());
        // More positions than the first size: the ring grows.
        for pos in 0..300u64 {
            assert!(r.insert(pos).fill(&wr(7, pos), pos, key));
        }
        assert!(r.take(5).is_some());
        assert!(r.take(5).is_none());
        let d = r.take(299).unwrap();
        assert_eq!((d.done.desc_handle, d.done.desc_off), (7, 299));
        assert_eq!(r.iter().count(), 298);
        let (_, rec) = r.iter().next().unwrap();
        assert_eq!(rec.sges()[0].addr, 0x1010);
        assert_eq!(rec.sges()[0].lkey, 8);
        // Positions beyond the 31 bits of a wr_id match by their low bits.
        r.clear();
        assert!(r.is_empty());
        let big = (1u64 << 31) + 3;
        r.insert(big).fill(&wr(1, 0), 0, key);
        assert!(r.take(3).is_some());
        // Window of `max`: consecutive positions never collide.
        for pos in 1000..3000u64 {
            if pos >= 2024 {
                assert!(r.take(pos - 1024).is_some());
            }
            r.insert(pos);
        }
        assert_eq!(r.recs.len(), 1024);
    }

    #[test]
    fn a_fill_fails_on_a_gone_region() {
        let mut r = PosRing::<RecvRec>::new(64);
        assert!(!r.insert(0).fill(&wr(7, 0), 0, |_| None));
        assert!(r.take(0).is_some());
        assert!(r.is_empty());
    }

    #[test]
    fn a_slab_takes_in_any_order() {
        let mut s = RecvSlab::new(3);
        let a = s.insert().unwrap().0;
        let b = s.insert().unwrap().0;
        let c = s.insert().unwrap().0;
        assert!(s.insert().is_none());
        assert!(s.take(b).is_some());
        assert!(s.take(b).is_none());
        let d = s.insert().unwrap().0;
        assert_ne!(d, b, "a new serial");
        // A stale completion (the old serial of b's slot) finds nothing.
        assert!(s.take(b).is_none());
        for p in [a, c, d] {
            assert!(s.take(p).is_some());
        }
        assert_eq!(s.iter().count(), 0);
    }
}
