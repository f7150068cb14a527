//! The peer regions a connection's receives used last, flattened.
//!
//! A stream of sends over one connection lands in the same few regions of
//! the peer (its receive descriptors and buffers). For a region that lies
//! in one mapped arena extent (the common case), the lane keeps where its
//! table entry is, the entry's sequence value when it was resolved, and the
//! arena mapping and offset. Checking it again is two loads of the entry in
//! place (the handle and the sequence value: a handle that comes back names
//! the same registration, and any write of the entry moves its sequence
//! value), and an address is an
//! offset away: no handle slot, no probe of the kept regions, no walk over
//! extents.
//!
//! A lane holds at most two regions per connection and drops one as soon
//! as a send finds it changed, so it keeps a retired arena of the peer
//! mapped no longer than until the next send on that connection.
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::backend::soft::layout::{NicView, TptEntry};
use crate::backend::soft::tpt;
use crate::mem::region::Resolved;
use crate::shm::mapping::Mapping;

/// One region in one arena extent.
pub(crate) struct Flat {
    handle: u32,
    /// Its table entry, and the entry's sequence value when resolved.
    index: u32,
    seq: u32,
    /// What the entry held then (a registration that comes back writes
    /// the same again).
    id: tpt::OneExtent,
    len: u64,
    map: Arc<Mapping>,
    /// Offset of the region's first byte in `map`.
    map_off: usize,
}

impl Flat {
    /// Where bytes `off..off + len` of the region are: `None` outside it.
    #[inline(always)]
    pub fn at(&self, off: u64, len: u64) -> Option<(&Mapping, usize)> {
        if off.checked_add(len)? > self.len {
            return None;
        }
        // In bounds of the mapping too: `keep` checked that the whole
        // region lies in it.
        Some((&self.map, self.map_off + off as usize))
    }
}

/// The flattened regions of the last receives of one connection: one for
/// descriptors, one for data in another region.
#[derive(Default)]
pub(crate) struct Lane {
    regs: [Option<Flat>; 2],
}

impl Lane {
    /// The place of `handle`.
    #[inline(always)]
    fn place_of(&self, handle: u32) -> Option<usize> {
        match &self.regs {
            [Some(f), _] if f.handle == handle => Some(0),
            [_, Some(f)] if f.handle == handle => Some(1),
            _ => None,
        }
    }

    /// The place holding `handle` unchanged, with its table entry (to check
    /// after a copy that it is still registered).
    #[inline(always)]
    fn find<'v>(&self, view: &NicView<'v>, handle: u32) -> Option<(usize, &'v TptEntry)> {
        let k = self.place_of(handle)?;
        let f = self.regs[k].as_ref()?;
        let e = tpt::unchanged(view, f.index, handle, f.seq)?;
        Some((k, e))
    }

    /// After [`Lane::locate`] missed: keeps the places of `handles` whose
    /// entries were written since they were resolved but hold what they
    /// held again (the owner deregistered the region and registered the
    /// same bytes again: parked, then taken back; the same region), at the
    /// entries' new sequence values. A few loads of each entry in place,
    /// where the translation cache would resolve the region again.
    #[cold]
    #[inline(never)]
    pub fn again(&mut self, view: &NicView<'_>, handles: [Option<u32>; 2]) {
        for h in handles.into_iter().flatten() {
            let Some(k) = self.place_of(h) else { continue };
            let Some(f) = self.regs[k].as_mut() else {
                continue;
            };
            if let Some((_, seq)) = tpt::holds_again(view, f.index, h, &f.id) {
                f.seq = seq;
            }
        }
    }

    /// The places of a receive's regions, if the lane holds them unchanged:
    /// the descriptor's region `desc` with its table entry, and the data's
    /// region `data` (if any). Places, not references, so that a caller
    /// may refill the lane on a miss and look again.
    #[inline(always)]
    pub fn locate<'v>(
        &self,
        view: &NicView<'v>,
        desc: u32,
        data: Option<u32>,
    ) -> Option<(usize, &'v TptEntry, Option<usize>)> {
        let (d, e) = self.find(view, desc)?;
        let g = match data {
            Some(h) if h == desc => Some(d),
            Some(h) => Some(self.find(view, h)?.0),
            None => None,
        };
        Some((d, e, g))
    }

    /// The region in place `k` (one [`Lane::locate`] returned).
    #[inline(always)]
    pub fn place(&self, k: usize) -> Option<&Flat> {
        self.regs[k].as_ref()
    }

    /// Remembers region `r` in place `k` (0: descriptors, 1: data) as
    /// table entry `index` of `view` held it at sequence value `seq`, if it
    /// lies in one mapped extent (and the entry still says so); else
    /// forgets place `k`.
    pub fn keep(&mut self, view: &NicView<'_>, k: usize, r: &Resolved, index: u32, seq: u32) {
        let flat = match &r.extents[..] {
            [e] if e.va == r.va && e.len >= r.len => e.map.as_ref().and_then(|m| {
                let map_off = usize::try_from(e.map_off).ok()?;
                let end = map_off.checked_add(usize::try_from(r.len).ok()?)?;
                let id = tpt::one_extent(view, index, r.handle, seq)?;
                (end <= m.len()).then(|| Flat {
                    handle: r.handle,
                    index,
                    seq,
                    id,
                    len: r.len,
                    map: m.clone(),
                    map_off,
                })
            }),
            _ => None,
        };
        self.regs[k] = flat;
    }
}
