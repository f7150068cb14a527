//! The translation and protection table: registered regions by memory handle,
//! as the peers of a soft NIC see them.
//!
//! The table lives in the NIC segment ([`crate::backend::soft::layout::TptEntry`]) so
//! that the engines of connected peers can check an RDMA target or a
//! pre-translated receive against it without asking the owner. The owner is
//! the only writer and uses a seqlock per entry; readers take a consistent
//! [`Snapshot`] and retry (bounded) while an entry changes.
//!
//! A memory handle (`VIP_MEM_HANDLE`) is the image of a per-NIC
//! registration counter under a keyed 32-bit permutation (a Feistel network
//! with per-NIC random round keys, as RDMA devices derive rkeys from a
//! secret): a handle value comes back only after 2^32 registrations of the
//! NIC, and one handle says nothing about the others. Its low 16 bits
//! select a *handle slot*, which names the table entry the registration
//! lives in (a registration whose image falls on a busy slot takes the
//! next counter value); the entry stores the whole handle, so a stale
//! handle or one of another NIC is refused. Entries are handed out most
//! recently freed first, so a program that registers around every message
//! reuses one entry whose lines are in the cache (and the table's pages are
//! touched only as far as regions are live at once), while handles stay
//! spread over the whole 32-bit space.
#![forbid(unsafe_code)]

use std::sync::atomic::{Ordering, fence};

use super::layout::{MAX_EXTENTS, MAX_REGIONS, NicView, Segment, TptEntry};
use crate::backend::RegionSlot;
use crate::error::{Error, Result};
use crate::mem::arena::Extent;

/// Bit of [`TptEntry::check`] marking a live entry.
pub const VALID: u32 = 1 << 31;

/// A registered region as seen at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The memory handle.
    pub handle: u32,
    /// RDMA enable flags.
    pub flags: u32,
    /// Protection tag id.
    pub ptag: u32,
    /// First address.
    pub va: u64,
    /// Length.
    pub len: u64,
    /// Extents in use.
    pub n_extents: usize,
    /// Extents (virtual address, len, arena, arena offset); the first may
    /// start before the region (extents are whole pages).
    pub extents: [Extent; MAX_EXTENTS],
}

const NO_EXTENT: Extent = Extent {
    va: 0,
    len: 0,
    arena: 0,
    arena_off: 0,
};

#[cfg(test)]
impl Snapshot {
    /// Whether `va..va+len` lies inside the region.
    pub fn covers(&self, va: u64, len: u64) -> bool {
        va >= self.va && va.checked_add(len).is_some_and(|e| e <= self.va + self.len)
    }
}

/// The handle slot of a handle.
pub fn slot_of(handle: u32) -> u32 {
    handle & 0xffff
}

/// The table entry `handle` names in a (possibly remote, untrusted) table:
/// the entry its handle slot points to, whatever that entry now holds (the
/// callers compare the entry's handle).
fn entry_of<'a>(view: &NicView<'a>, handle: u32) -> Option<&'a TptEntry> {
    // Acquire: pairs with the Release that publishes a slot after its entry
    // is written, so the entry is at least as new as the slot.
    let index = view.handle_slot(slot_of(handle))?.load(Ordering::Acquire);
    view.tpt(index)
}

/// Reads the entry of `handle` in a (possibly remote, untrusted) table.
/// `None` if the handle is not live there or the entry keeps changing. Also
/// returns the entry's sequence value, which changes with any later write
/// (for caches).
pub fn read(view: &NicView<'_>, handle: u32) -> Option<(Snapshot, u32)> {
    let e = entry_of(view, handle)?;
    snapshot(e).filter(|(s, _)| s.handle == handle)
}

/// Everything of a table entry over one extent but its handle and sequence
/// value: what tells a registration that came back (parked, then taken
/// back: the same entry, written twice) from any other the entry held
/// since. Arena ids never repeat within a process, so equal fields name
/// the same memory in the same arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OneExtent {
    va: u64,
    len: u64,
    ptag: u32,
    flags: u32,
    ext: Extent,
}

/// Reads entry `e` under its seqlock: its sequence value and what `f`
/// makes of it (`None`: not a stable read, or `f` refused it).
#[inline(always)]
fn stable<T>(e: &TptEntry, f: impl Fn(&TptEntry) -> Option<T>) -> Option<(T, u32)> {
    for _ in 0..64 {
        // Acquire: as in `snapshot`.
        let s1 = e.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let v = f(e);
        // Acquire fence: the loads in `f` happen before the re-check.
        fence(Ordering::Acquire);
        if e.seq.load(Ordering::Relaxed) == s1 {
            return v.map(|v| (v, s1));
        }
    }
    None
}

/// What entry `e` holds for `handle`, if it is live there over one extent.
#[inline(always)]
fn one_extent_of(e: &TptEntry, handle: u32) -> Option<OneExtent> {
    let x = &e.extents[0];
    (e.handle.load(Ordering::Relaxed) == handle
        && e.check.load(Ordering::Relaxed) & VALID != 0
        && e.n_extents.load(Ordering::Relaxed) == 1)
        .then(|| OneExtent {
            va: e.va.load(Ordering::Relaxed),
            len: e.len.load(Ordering::Relaxed),
            ptag: e.ptag.load(Ordering::Relaxed),
            flags: e.flags.load(Ordering::Relaxed),
            ext: Extent {
                va: x.va.load(Ordering::Relaxed),
                len: x.len.load(Ordering::Relaxed),
                arena: x.arena.load(Ordering::Relaxed),
                arena_off: x.arena_off.load(Ordering::Relaxed),
            },
        })
}

/// What entry `index` holds for `handle` at sequence value `seq` (the
/// value a cache resolved it at), if that is still so and the region lies
/// in one extent: for [`holds_again`] later.
pub fn one_extent(view: &NicView<'_>, index: u32, handle: u32, seq: u32) -> Option<OneExtent> {
    let e = view.tpt(index)?;
    stable(e, |e| one_extent_of(e, handle)).and_then(|(id, s)| (s == seq).then_some(id))
}

/// Entry `index`, with its sequence value now, if it holds `handle` and
/// exactly `id` again (a registration that came back whole, or one whose
/// entry was rewritten unchanged): a cache that resolved it may go on
/// using what it resolved. A few loads of the entry in place.
#[inline]
pub fn holds_again<'a>(
    view: &NicView<'a>,
    index: u32,
    handle: u32,
    id: &OneExtent,
) -> Option<(&'a TptEntry, u32)> {
    let e = view.tpt(index)?;
    let (same, s) = stable(e, |e| Some(one_extent_of(e, handle).as_ref() == Some(id)))?;
    same.then_some((e, s))
}

/// Whether the entry of `handle` holds, apart from the handle, what `snap`
/// says (bounds, tag, enables, the same extents); its sequence value if so.
/// Compares in place under the entry's seqlock: no snapshot is built, so a
/// registration that comes back costs its peer a few loads.
pub fn holds(view: &NicView<'_>, handle: u32, snap: &Snapshot) -> Option<u32> {
    let e = entry_of(view, handle)?;
    let n = snap.n_extents;
    let (same, s) = stable(e, |e| {
        Some(
            e.handle.load(Ordering::Relaxed) == handle
                && e.check.load(Ordering::Relaxed) & VALID != 0
                && e.va.load(Ordering::Relaxed) == snap.va
                && e.len.load(Ordering::Relaxed) == snap.len
                && e.ptag.load(Ordering::Relaxed) == snap.ptag
                && e.flags.load(Ordering::Relaxed) == snap.flags
                && e.n_extents.load(Ordering::Relaxed) as usize == n
                && e.extents[..n].iter().zip(&snap.extents[..n]).all(|(x, y)| {
                    x.va.load(Ordering::Relaxed) == y.va
                        && x.len.load(Ordering::Relaxed) == y.len
                        && x.arena.load(Ordering::Relaxed) == y.arena
                        && x.arena_off.load(Ordering::Relaxed) == y.arena_off
                }),
        )
    })?;
    same.then_some(s)
}

/// Whether `handle` is still registered in a (possibly remote) table: a few
/// loads, for checks in the middle of a transfer. A handle names one
/// registration: the only handle that comes back is a parked registration
/// taken back whole (the same bytes, tag and enables), so a live handle is
/// the same registration.
pub fn is_live(view: &NicView<'_>, handle: u32) -> bool {
    entry_of(view, handle).is_some_and(|e| entry_live(e, handle))
}

/// [`is_live`] on the entry that held `handle` when it was found.
pub fn entry_live(e: &TptEntry, handle: u32) -> bool {
    // Acquire: pairs with the Release that ends the owner's write.
    e.seq.load(Ordering::Acquire);
    e.handle.load(Ordering::Acquire) == handle && e.check.load(Ordering::Acquire) & VALID != 0
}

/// The index of the entry that holds `handle` now, with its sequence value
/// (as [`seq`]): for a cache that later checks that entry in place
/// ([`unchanged`]) instead of finding it through the handle slot again.
pub fn index_seq(view: &NicView<'_>, handle: u32) -> Option<(u32, u32)> {
    // Acquire: as in `entry_of`.
    let index = view.handle_slot(slot_of(handle))?.load(Ordering::Acquire);
    let e = view.tpt(index)?;
    // Acquire: as in `seq`.
    let s = e.seq.load(Ordering::Acquire);
    (e.handle.load(Ordering::Acquire) == handle).then_some((index, s))
}

/// Entry `index` if it still holds `handle` with sequence value `seq`: the
/// registration [`index_seq`] found, unchanged since (every write of an
/// entry, retirement and revival included, moves its sequence value).
#[inline(always)]
pub fn unchanged<'a>(
    view: &NicView<'a>,
    index: u32,
    handle: u32,
    seq: u32,
) -> Option<&'a TptEntry> {
    let e = view.tpt(index)?;
    // Acquire: pairs with the Release that ends the owner's write, as in
    // `seq`; the handle is read after the sequence value.
    (e.seq.load(Ordering::Acquire) == seq && e.handle.load(Ordering::Acquire) == handle)
        .then_some(e)
}

/// The current sequence value of the entry of `handle` (cache validation:
/// equal to a value returned by [`read`] means the entry is unchanged);
/// `None` once the handle is gone (its entry may hold another region).
pub fn seq(view: &NicView<'_>, handle: u32) -> Option<u32> {
    let e = entry_of(view, handle)?;
    // Acquire: pairs with the writer's final Release, as in `snapshot`.
    let s = e.seq.load(Ordering::Acquire);
    (e.handle.load(Ordering::Acquire) == handle).then_some(s)
}

fn snapshot(e: &TptEntry) -> Option<(Snapshot, u32)> {
    for _ in 0..64 {
        // Acquire: pairs with the Release that ends a write, so the fields
        // below are at least as new as this sequence value.
        let s1 = e.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let check = e.check.load(Ordering::Relaxed);
        let mut snap = Snapshot {
            handle: e.handle.load(Ordering::Relaxed),
            flags: e.flags.load(Ordering::Relaxed),
            ptag: e.ptag.load(Ordering::Relaxed),
            va: e.va.load(Ordering::Relaxed),
            len: e.len.load(Ordering::Relaxed),
            n_extents: (e.n_extents.load(Ordering::Relaxed) as usize).min(MAX_EXTENTS),
            extents: [NO_EXTENT; MAX_EXTENTS],
        };
        for i in 0..snap.n_extents {
            let x = &e.extents[i];
            snap.extents[i] = Extent {
                va: x.va.load(Ordering::Relaxed),
                len: x.len.load(Ordering::Relaxed),
                arena: x.arena.load(Ordering::Relaxed),
                arena_off: x.arena_off.load(Ordering::Relaxed),
            };
        }
        // Acquire fence: the field loads above happen before the re-check.
        fence(Ordering::Acquire);
        if e.seq.load(Ordering::Relaxed) == s1 {
            if check & VALID == 0 || snap.va.checked_add(snap.len).is_none() {
                return None;
            }
            return Some((snap, s1));
        }
    }
    log::warn!("translation entry kept changing; treating it as invalid");
    None
}

/// Handle allocation: which handle slots are busy, which entries are free,
/// and the permutation.
struct Alloc {
    /// One bit per handle slot (8 KiB: stays in cache).
    busy: Vec<u64>,
    /// Entries freed, the most recently freed last (taken first).
    free: Vec<u32>,
    /// Entries never used yet start here.
    fresh: u32,
    /// Entries in use (live regions, and retired ones kept for revival).
    live: u32,
    /// Handle slots busy (live regions).
    busy_slots: u32,
    /// Next registration number (its image is the next handle tried).
    counter: u32,
    /// The permutation's round keys (random per NIC).
    keys: [u64; 4],
}

impl Alloc {
    /// The keyed permutation of 32-bit values: a 4-round Feistel network
    /// whose round function mixes the half with a random 64-bit round key
    /// (multiply, xor-shift, multiply). A Feistel network is a permutation
    /// whatever the round function; this one costs a few instructions where
    /// a SipHash per round cost about 800 per registration.
    fn permute(&self, x: u32) -> u32 {
        let (mut l, mut r) = ((x >> 16) as u16, x as u16);
        for k in self.keys {
            let mut m = (r as u64 ^ k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            m ^= m >> 29;
            m = m.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            (l, r) = (r, l ^ (m >> 48) as u16);
        }
        ((l as u32) << 16) | r as u32
    }

    /// The next handle whose slot is free, and a free entry for it; `None`
    /// when the table is full.
    ///
    /// Handles stay the permutation's images of successive counter values
    /// (those on a busy slot skipped: few while few regions are live), so a
    /// handle comes back only after 2^32 registrations and none follows
    /// from another.
    fn next(&mut self) -> Option<(u32, u32)> {
        if self.live >= MAX_REGIONS - 1 {
            return None;
        }
        let handle = self.next_handle()?;
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.fresh += 1;
                self.fresh - 1
            }
        };
        self.live += 1;
        Some((handle, index))
    }

    /// The next handle whose slot is free (its slot taken); `None` if every
    /// slot is busy.
    fn next_handle(&mut self) -> Option<u32> {
        // Slots are busy only for live handles (at most MAX_REGIONS - 1 of
        // the 65,536), so this ends.
        if self.busy_slots >= MAX_REGIONS - 1 {
            return None;
        }
        loop {
            let h = self.permute(self.counter);
            self.counter = self.counter.wrapping_add(1);
            let slot = slot_of(h);
            let (w, bit) = (slot as usize / 64, 1u64 << (slot % 64));
            if h != 0 && slot != 0 && self.busy[w] & bit == 0 {
                self.busy[w] |= bit;
                self.busy_slots += 1;
                return Some(h);
            }
        }
    }

    /// Frees `handle`'s slot; whether it was busy.
    fn free_handle(&mut self, handle: u32) -> bool {
        let slot = slot_of(handle);
        let (w, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        let busy = self.busy[w] & bit != 0;
        if busy {
            self.busy[w] &= !bit;
            self.busy_slots -= 1;
        }
        busy
    }

    /// Frees an entry (its handle already freed).
    fn free_index(&mut self, index: u32) {
        self.live -= 1;
        self.free.push(index);
    }

    fn free(&mut self, handle: u32, index: u32) {
        if self.free_handle(handle) {
            self.free_index(index);
        }
    }
}

/// A region to add to the table.
pub struct NewRegion<'a> {
    /// First byte.
    pub va: u64,
    /// Length.
    pub len: u64,
    /// Protection tag id.
    pub ptag: u32,
    /// RDMA enable flags.
    pub flags: u32,
    /// Backing extents, as peers see them.
    pub extents: &'a [Extent],
}

/// The owner's side of the table (the shared entries and the allocation
/// of handles).
pub struct TranslationTable {
    seg: Segment,
    /// Without poisoning (`doorbell::Lock`): every registration that comes
    /// back takes it once.
    alloc: doorbell::Lock<Alloc>,
}

impl TranslationTable {
    /// The table inside the NIC segment `map`, with a fresh random key.
    pub fn new(seg: Segment) -> TranslationTable {
        use std::hash::BuildHasher;
        // Keys from the standard library's per-process random source.
        let seed = std::collections::hash_map::RandomState::new();
        let keys = [0u8, 1, 2, 3].map(|i| seed.hash_one(("round", i)));
        let counter = seed.hash_one("start") as u32;
        TranslationTable {
            seg,
            alloc: doorbell::Lock::new(Alloc {
                busy: vec![0; MAX_REGIONS as usize / 64],
                free: Vec::new(),
                // Entry 0 is never used.
                fresh: 1,
                live: 0,
                busy_slots: 0,
                counter,
                keys,
            }),
        }
    }

    /// The segment (our own: formatted by `NicView::init` at creation).
    #[inline(always)]
    fn view(&self) -> NicView<'_> {
        self.seg.view()
    }

    fn write(e: &TptEntry, f: impl FnOnce(&TptEntry)) {
        let s = e.seq.load(Ordering::Relaxed);
        e.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        // Release fence: orders the odd sequence before the field stores, so
        // a reader that sees a new field also sees the odd sequence.
        fence(Ordering::Release);
        f(e);
        // Release: publishes the fields; pairs with the Acquire in `snapshot`.
        e.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// Adds a region; returns its memory handle.
    ///
    /// # Errors
    /// `Resource` when the table is full or the region needs more than
    /// [`MAX_EXTENTS`] extents.
    #[cfg(test)]
    pub fn insert(&self, r: NewRegion<'_>) -> Result<u32> {
        let slot = self.reserve()?;
        self.fill(slot, r)
    }

    /// Takes the handle and table entry of the next registration, and starts
    /// fetching the entry's cache lines (usually still there: the entry
    /// freed last comes back first); the registration path reserves first
    /// and pins meanwhile. Give it back with [`TranslationTable::unreserve`]
    /// if the registration fails.
    ///
    /// # Errors
    /// `Resource` when the table is full.
    pub fn reserve(&self) -> Result<RegionSlot> {
        let (handle, index) = self.alloc.lock().next().ok_or(Error::Resource)?;
        if let Some(e) = self.view().tpt(index) {
            crate::shm::mapping::prefetch_lines(e);
        }
        Ok(RegionSlot { handle, index })
    }

    /// Gives back a reservation that was not filled.
    pub fn unreserve(&self, r: RegionSlot) {
        self.alloc.lock().free(r.handle, r.index);
    }

    /// Fills a reserved entry with the region `r`; returns its memory handle.
    ///
    /// # Errors
    /// `Resource` if the region needs more than [`MAX_EXTENTS`] extents (the
    /// reservation is given back).
    pub fn fill(&self, slot: RegionSlot, r: NewRegion<'_>) -> Result<u32> {
        let NewRegion {
            va,
            len,
            ptag,
            flags,
            extents,
        } = r;
        if extents.len() > MAX_EXTENTS {
            self.unreserve(slot);
            return Err(Error::Resource);
        }
        let RegionSlot { handle, index } = slot;
        let view = self.view();
        let e = view.tpt(index).expect("index in range");
        Self::write(e, |e| {
            e.flags.store(flags, Ordering::Relaxed);
            e.ptag.store(ptag, Ordering::Relaxed);
            e.va.store(va, Ordering::Relaxed);
            e.len.store(len, Ordering::Relaxed);
            e.n_extents.store(extents.len() as u32, Ordering::Relaxed);
            for (slot, x) in e.extents.iter().zip(extents) {
                slot.va.store(x.va, Ordering::Relaxed);
                slot.len.store(x.len, Ordering::Relaxed);
                slot.arena.store(x.arena, Ordering::Relaxed);
                slot.arena_off.store(x.arena_off, Ordering::Relaxed);
            }
            e.handle.store(handle, Ordering::Relaxed);
            e.check.store(VALID, Ordering::Relaxed);
        });
        Self::publish(&view, handle, index);
        Ok(handle)
    }

    /// Points `handle`'s slot at the entry `index` just written for it.
    fn publish(view: &NicView<'_>, handle: u32, index: u32) {
        // Release: the entry is written before readers find it.
        view.handle_slot(slot_of(handle))
            .expect("slot in range")
            .store(index, Ordering::Release);
    }

    /// Looks up a handle of this table.
    pub fn lookup(&self, handle: u32) -> Option<Snapshot> {
        read(&self.view(), handle).map(|(s, _)| s)
    }

    /// Invalidates a handle.
    ///
    /// # Errors
    /// `InvalidParameter` if the handle is not live.
    pub fn remove(&self, handle: u32) -> Result<()> {
        let index = self.retire(handle)?;
        self.release(index);
        Ok(())
    }

    /// Invalidates a handle like [`TranslationTable::remove`] but keeps its
    /// entry (with the region's fields) out of the free list; returns the
    /// retired entry (its index, and the handle it had), for
    /// [`TranslationTable::revive`] or [`TranslationTable::release`].
    ///
    /// Takes no lock and leaves the handle's slot pointing at the entry: the
    /// entry itself says the handle is dead (its handle field cleared), and
    /// the slot stays busy until the entry is revived or released, so
    /// deregistering a parked registration changes no shared counter and
    /// reviving it writes the entry alone.
    ///
    /// # Errors
    /// `InvalidParameter` if the handle is not live.
    pub fn retire(&self, handle: u32) -> Result<u64> {
        let view = self.view();
        if !is_live(&view, handle) {
            return Err(Error::InvalidParameter);
        }
        let index = view
            .handle_slot(slot_of(handle))
            .expect("checked")
            .load(Ordering::Relaxed);
        Self::write(view.tpt(index).expect("checked"), |e| {
            e.check.store(0, Ordering::Relaxed);
            e.handle.store(0, Ordering::Relaxed);
        });
        Ok(u64::from(handle) << 32 | u64::from(index))
    }

    /// A retired entry live again under the handle it had (the region's
    /// fields, and the handle's slot pointing at the entry, are still
    /// there): the same registration taken back whole, so the same handle
    /// names the same bytes, tag and enables again. Every write of the entry
    /// moves its sequence value, so a peer's cached translation is checked
    /// again all the same, and a transfer that began before the retirement
    /// has ended by then (the deregistration waited for it). Writes the
    /// entry alone: no allocation lock, no slot, no new cache line for the
    /// peers to fetch.
    pub fn revive(&self, retired: u64) -> u32 {
        let (handle, index) = ((retired >> 32) as u32, retired as u32);
        let view = self.view();
        Self::write(view.tpt(index).expect("a retired index"), |e| {
            e.handle.store(handle, Ordering::Relaxed);
            e.check.store(VALID, Ordering::Relaxed);
        });
        handle
    }

    /// Frees a retired entry, and the slot of the handle it had (emptied:
    /// it pointed at the entry until now, and no other handle could take it).
    pub fn release(&self, retired: u64) {
        let (old, index) = ((retired >> 32) as u32, retired as u32);
        let view = self.view();
        let mut a = self.alloc.lock();
        // Release: as in `publish` (readers compare the entry's handle anyway).
        view.handle_slot(slot_of(old))
            .expect("a retired handle's slot")
            .store(0, Ordering::Release);
        a.free_handle(old);
        a.free_index(index);
    }

    /// Changes the protection attributes of a live region.
    ///
    /// # Errors
    /// `InvalidParameter` if the handle is not live.
    pub fn set_attributes(&self, handle: u32, ptag: u32, flags: u32) -> Result<()> {
        self.lookup(handle).ok_or(Error::InvalidParameter)?;
        let view = self.view();
        Self::write(entry_of(&view, handle).expect("checked"), |e| {
            e.ptag.store(ptag, Ordering::Relaxed);
            e.flags.store(flags, Ordering::Relaxed);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::soft::layout::OFFSETS;
    use crate::shm::mapping::Mapping;
    use std::sync::Arc;

    fn nr<'a>(va: u64, len: u64, ptag: u32, flags: u32, extents: &'a [Extent]) -> NewRegion<'a> {
        NewRegion {
            va,
            len,
            ptag,
            flags,
            extents,
        }
    }

    fn tpt_seq(t: &TranslationTable, index: u32) -> u32 {
        t.view().tpt(index).unwrap().seq.load(Ordering::Relaxed)
    }

    fn table() -> TranslationTable {
        let (_fd, m) = Mapping::create("via-tpt-test", OFFSETS.len).unwrap();
        let seg = Segment::new(Arc::new(m)).unwrap();
        NicView::init(&seg, 1, 1, 1);
        TranslationTable::new(seg)
    }

    #[test]
    fn insert_lookup_remove() {
        let t = table();
        let ext = [
            Extent {
                va: 0x10000,
                len: 0x1000,
                arena: 3,
                arena_off: 0,
            },
            Extent {
                va: 0x11000,
                len: 0x1000,
                arena: crate::mem::arena::CMA,
                arena_off: 0x11000,
            },
        ];
        let h = t.insert(nr(0x10100, 0x1800, 7, 1, &ext)).unwrap();
        assert_eq!(t.lookup(h).unwrap().n_extents, 2);
        assert_ne!(h, 0);
        let s = t.lookup(h).unwrap();
        assert_eq!(
            (s.va, s.len, s.ptag, s.flags, s.n_extents),
            (0x10100, 0x1800, 7, 1, 2)
        );
        assert!(s.covers(0x10100, 0x1800));
        assert!(!s.covers(0x10100, 0x1801));
        assert!(!s.covers(0x100ff, 1));
        t.set_attributes(h, 8, 3).unwrap();
        assert_eq!(t.lookup(h).unwrap().ptag, 8);
        t.remove(h).unwrap();
        assert!(t.lookup(h).is_none(), "deregistered handle refused");
        assert_eq!(t.remove(h), Err(Error::InvalidParameter));
        let h2 = t.insert(nr(1, 1, 1, 0, &[])).unwrap();
        assert_ne!(h2, h, "never the same handle again");
        assert!(t.lookup(h).is_none());
    }

    /// A parked registration's entry: retired (its handle dead at once, the
    /// entry kept and counted), revived under the handle it had with its
    /// fields intact and its sequence value moved, released for good (its
    /// handle dead, its slot and entry free).
    #[test]
    fn retired_entries_come_back_under_their_handles() {
        let t = table();
        let x = [Extent {
            va: 0x1000,
            len: 0x2000,
            arena: 7,
            arena_off: 0x3000,
        }];
        let h0 = t.insert(nr(0x1100, 0x1800, 3, 1, &x)).unwrap();
        let want = t.lookup(h0).unwrap();
        let mut retired = t.retire(h0).unwrap();
        let index = retired as u32;
        assert_eq!(t.lookup(h0), None, "a retired handle is dead");
        assert_eq!(t.retire(h0), Err(Error::InvalidParameter));
        assert_eq!(t.remove(h0), Err(Error::InvalidParameter));
        let view = t.view();
        let mut seq = tpt_seq(&t, index);
        for _ in 0..1000 {
            let h = t.revive(retired);
            assert_eq!(h, h0, "the handle it had");
            let got = t.lookup(h).unwrap();
            assert_eq!(got, want, "the region is intact");
            let now = tpt_seq(&t, index);
            assert_ne!(now, seq, "a revival moves the sequence value");
            assert!(
                unchanged(&view, index, h, seq).is_none(),
                "cached checks fail"
            );
            seq = now;
            retired = t.retire(h).unwrap();
            assert_eq!(retired as u32, index, "the same entry");
            assert_eq!(t.lookup(h), None);
            assert!(!is_live(&view, h));
        }
        // A retired handle's slot stays taken: one slot busy.
        assert_eq!(t.alloc.lock().busy_slots, 1);
        // Kept entries count against the table: MAX_REGIONS - 2 more fit.
        let all: Vec<u32> = (0..MAX_REGIONS - 2)
            .map(|_| t.insert(nr(0, 1, 1, 0, &[])).unwrap())
            .collect();
        assert_eq!(t.insert(nr(0, 1, 1, 0, &[])), Err(Error::Resource));
        // Released, the entry is free for another region, and the handle
        // stays dead whatever takes the entry.
        t.release(retired);
        assert_eq!(t.alloc.lock().busy_slots, MAX_REGIONS - 2);
        assert!(!is_live(&view, h0));
        let h = t.insert(nr(0x5000, 1, 1, 0, &[])).unwrap();
        assert_eq!(t.lookup(h).unwrap().va, 0x5000);
        for h in all {
            t.remove(h).unwrap();
        }
    }

    #[test]
    fn handles_never_alias_and_fill_the_table() {
        let t = table();
        // One entry reused over and over (register, deregister): every
        // handle differs from every earlier one, far beyond 65,536
        // registrations, and their low bits spread over the handle slots.
        let view = t.view();
        let mut seen = std::collections::HashSet::new();
        let mut slots = std::collections::HashSet::new();
        let mut entries = std::collections::HashSet::new();
        for _ in 0..300_000 {
            let h = t.insert(nr(0, 10, 1, 0, &[])).unwrap();
            assert!(seen.insert(h), "handle {h:#x} came back");
            slots.insert(slot_of(h));
            entries.insert(
                view.handle_slot(slot_of(h))
                    .unwrap()
                    .load(Ordering::Relaxed),
            );
            t.remove(h).unwrap();
            assert_eq!(
                view.handle_slot(slot_of(h))
                    .unwrap()
                    .load(Ordering::Relaxed),
                0,
                "a removed handle's slot is empty"
            );
        }
        assert!(slots.len() > 60_000, "{} slots", slots.len());
        // The entry freed last comes back first: one entry, in the cache.
        assert_eq!(entries.len(), 1, "{entries:?}");
        // Handles of one run do not follow from one another.
        let a = t.insert(nr(0, 1, 1, 0, &[])).unwrap();
        let b = t.insert(nr(0, 1, 1, 0, &[])).unwrap();
        assert!(b.wrapping_sub(a) > 1 && a.wrapping_sub(b) > 1);
        t.remove(a).unwrap();
        t.remove(b).unwrap();
        // The table holds MAX_REGIONS - 1 regions, then refuses.
        let all: Vec<u32> = (0..MAX_REGIONS - 1)
            .map(|_| t.insert(nr(0, 1, 1, 0, &[])).unwrap())
            .collect();
        assert_eq!(t.insert(nr(0, 1, 1, 0, &[])), Err(Error::Resource));
        for h in &all {
            assert_eq!(t.lookup(*h).unwrap().handle, *h);
        }
    }

    #[test]
    fn handles_of_another_table_are_refused() {
        let a = table();
        let b = table();
        let ha = a.insert(nr(0, 10, 1, 0, &[])).unwrap();
        b.insert(nr(0, 10, 1, 0, &[])).unwrap();
        assert!(b.lookup(ha).is_none());
        assert!(a.lookup(0).is_none());
        assert!(a.lookup(0xffff_ffff).is_none());
    }
}
