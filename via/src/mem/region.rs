//! Addressing registered memory of this process or of a peer.
//!
//! A registered region is a list of extents (see `mem::arena`): each byte
//! lives either in an arena file that both processes map, or in memory only
//! reachable by cross-memory attach. A [`Resolved`] region has every arena
//! extent already mapped, so moving bytes costs no lookup: [`Cursor`] walks
//! a scatter/gather list chunk by chunk and [`copy`] moves bytes between two
//! lists with the cheapest mechanism each pair of chunks allows
//! (`mem::copy`).
//!
//! Local regions are resolved once at registration (`tpt::LocalTable`);
//! remote ones on first use and cached per connection
//! (`remote::PeerLink::region`).
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::shm::mapping::Mapping;

use super::copy;

/// One extent of a resolved region.
#[derive(Clone, Debug)]
pub(crate) struct ResolvedExtent {
    /// First virtual address (in the owner's address space).
    pub va: u64,
    /// Bytes.
    pub len: u64,
    /// The arena mapping, or `None` for cross-memory attach.
    pub map: Option<Arc<Mapping>>,
    /// Offset of `va` in `map`.
    pub map_off: u64,
}

/// The extents of a [`Resolved`] region, shared: a registration taken back
/// from the parked ones under a fresh handle (a device that kept no entry
/// for it) gets a new `Resolved`, while caches may still hold the old one;
/// its extents (and the mappings they hold) are then shared instead of
/// copied.
#[derive(Clone, Debug, Default)]
pub(crate) enum Extents {
    /// No extent (a const: fillers of segment arrays).
    #[default]
    None,
    /// Extents in address order (the `Vec` they were built in, shared as
    /// it is: no second allocation and copy).
    Some(Arc<Vec<ResolvedExtent>>),
}

impl std::ops::Deref for Extents {
    type Target = [ResolvedExtent];

    fn deref(&self) -> &[ResolvedExtent] {
        match self {
            Extents::None => &[],
            Extents::Some(e) => e,
        }
    }
}

impl<'a> IntoIterator for &'a Extents {
    type Item = &'a ResolvedExtent;
    type IntoIter = std::slice::Iter<'a, ResolvedExtent>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl From<Vec<ResolvedExtent>> for Extents {
    fn from(v: Vec<ResolvedExtent>) -> Extents {
        if v.is_empty() {
            Extents::None
        } else {
            Extents::Some(Arc::new(v))
        }
    }
}

/// Whether a region of this process's table is still the live region of
/// its handle: cleared (before the table's change count moves) when the
/// registration is parked, removed, revoked or replaced, set again when a
/// parked one is taken back, the same region. A work queue's region cache
/// whose change count moved keeps an entry whose region is still live
/// (`regions::RegionCache::get`). A clone is a new region: live. Peers'
/// regions do not use it (their table entries' sequence values say it).
#[derive(Debug)]
pub(crate) struct Liveness(AtomicBool);

impl Liveness {
    pub const fn new() -> Liveness {
        Liveness(AtomicBool::new(true))
    }

    /// Whether the region is live.
    #[inline(always)]
    pub fn get(&self) -> bool {
        // Acquire: pairs with the Release in `set`; a reader that saw the
        // table's change count move (Acquire) after a `set(false)` sees
        // false, or a later `set(true)` of the same region.
        self.0.load(Ordering::Acquire)
    }

    /// Called with the table's write lock held, before the change count
    /// moves.
    pub fn set(&self, live: bool) {
        // Release: as in `get`.
        self.0.store(live, Ordering::Release);
    }
}

impl Clone for Liveness {
    fn clone(&self) -> Liveness {
        Liveness::new()
    }
}

impl Default for Liveness {
    fn default() -> Liveness {
        Liveness::new()
    }
}

/// A registered region with its extents mapped.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    /// Memory handle.
    pub handle: u32,
    /// First byte.
    pub va: u64,
    /// Length.
    pub len: u64,
    /// Protection tag id.
    pub ptag: u32,
    /// RDMA enable flags.
    pub flags: u32,
    /// Owner's process id (cross-memory attach).
    pub pid: i32,
    /// Extents in address order.
    pub extents: Extents,
    /// Still the live region of its handle (this process's regions).
    pub live: Liveness,
}

/// Where a contiguous chunk of bytes lives.
pub(crate) enum Place<'a> {
    /// `off` bytes into a mapping.
    Map(&'a Mapping, usize),
    /// At virtual address `va` of process `pid`.
    Cma(i32, u64),
}

/// Why a transfer failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// A segment is outside its region, or its arena is gone.
    Protection,
    /// A cross-memory-attach call failed.
    Transport,
    /// A region was deregistered (or its memory went away) while the
    /// transfer ran; it stopped at a chunk boundary with this status.
    Cut(u32),
}

/// Bytes moved between two checks that the regions of a transfer are still
/// registered (`VipDeregisterMem` waits for at most one chunk).
pub(crate) const CHUNK: u64 = 256 << 10;

impl Resolved {
    /// Whether `va..va+len` lies inside the region.
    pub fn covers(&self, va: u64, len: u64) -> bool {
        va >= self.va && va.checked_add(len).is_some_and(|e| e <= self.va + self.len)
    }

    /// The place of `va` and how many contiguous bytes follow it there.
    pub fn place(&self, va: u64) -> Option<(Place<'_>, u64)> {
        for e in &self.extents {
            if va >= e.va && va - e.va < e.len {
                let within = va - e.va;
                let n = e.len - within;
                return Some(match &e.map {
                    Some(m) => {
                        let at = usize::try_from(e.map_off + within).ok()?;
                        if at >= m.len() {
                            return None;
                        }
                        (Place::Map(m, at), n.min((m.len() - at) as u64))
                    }
                    None => (Place::Cma(self.pid, va), n),
                });
            }
        }
        None
    }

    /// The mapping and offset of a 4-byte aligned word at `va`, if mapped.
    pub fn word(&self, va: u64) -> Option<(&Mapping, usize)> {
        match self.place(va)? {
            (Place::Map(m, at), n) if n >= 4 => Some((m, at)),
            _ => None,
        }
    }

    /// The mapping (shared), offset and length of `va..va+len` if it lies
    /// in one mapped extent, with how many bytes of the extent follow `va`.
    pub fn locate(&self, va: u64, len: u64) -> Option<(&Arc<Mapping>, usize, u64)> {
        for e in &self.extents {
            if va >= e.va && va - e.va < e.len {
                let m = e.map.as_ref()?;
                let within = va - e.va;
                let at = usize::try_from(e.map_off + within).ok()?;
                let room = (e.len - within).min(m.len().saturating_sub(at) as u64);
                return (room >= len).then_some((m, at, room));
            }
        }
        None
    }

    /// The mapping and offset of `va..va+len` if it lies in one mapped
    /// extent (the common case: one arena per region).
    pub fn span(&self, va: u64, len: u64) -> Option<(&Mapping, usize)> {
        for e in &self.extents {
            if va >= e.va && va - e.va < e.len {
                let m = e.map.as_deref()?;
                let within = va - e.va;
                let at = usize::try_from(e.map_off + within).ok()?;
                let fits = e.len - within >= len
                    && at
                        .checked_add(len as usize)
                        .is_some_and(|end| end <= m.len());
                return fits.then_some((m, at));
            }
        }
        None
    }

    /// The windows of this region on memory the library does not own
    /// (its cross-memory-attach extents, read in place): valid only while
    /// the application keeps them mapped.
    pub fn borrowed_windows(&self) -> Vec<Arc<Mapping>> {
        self.extents
            .iter()
            .filter_map(|e| e.map.as_ref().filter(|m| m.is_borrowed()).cloned())
            .collect()
    }

    /// The mapping (shared) and offset of the 32-byte control segment at
    /// `va`, if it lies in one arena.
    pub fn control_segment(&self, va: u64) -> Option<(Arc<Mapping>, usize)> {
        for e in &self.extents {
            if va >= e.va && va - e.va < e.len {
                let m = e.map.as_ref()?;
                let at = usize::try_from(e.map_off + (va - e.va)).ok()?;
                return (e.len - (va - e.va) >= 32 && at + 32 <= m.len()).then(|| (m.clone(), at));
            }
        }
        None
    }

    /// Copies `out.len()` bytes at `va` out.
    pub fn read(&self, va: u64, out: &mut [u8]) -> Result<(), Fault> {
        let mut done = 0usize;
        while done < out.len() {
            let (p, n) = self.place(va + done as u64).ok_or(Fault::Protection)?;
            let n = (n as usize).min(out.len() - done);
            match p {
                Place::Map(m, at) => {
                    if !m.read(at, &mut out[done..done + n]) {
                        return Err(Fault::Protection);
                    }
                }
                Place::Cma(pid, a) => {
                    crate::sys::process_vm_read(pid, &mut out[done..done + n], a)
                        .map_err(|_| Fault::Transport)?;
                }
            }
            done += n;
        }
        Ok(())
    }

    /// Copies `bytes` in at `va` (no ordering guarantee).
    pub fn write(&self, va: u64, bytes: &[u8]) -> Result<(), Fault> {
        let mut done = 0usize;
        while done < bytes.len() {
            let (p, n) = self.place(va + done as u64).ok_or(Fault::Protection)?;
            let n = (n as usize).min(bytes.len() - done);
            copy::deliver(&bytes[done..done + n], &p)?;
            done += n;
        }
        Ok(())
    }

    /// Stores a 32-bit word at `va`; Release when mapped (the status word:
    /// the last store of a completion).
    pub fn store_release(&self, va: u64, v: u32) -> Result<(), Fault> {
        match self.word(va).and_then(|(m, at)| m.u32_at(at)) {
            Some(w) => {
                // Release: the completion's data, Length and ImmediateData
                // happen before a reader that sees this status with Acquire.
                w.store(v, Ordering::Release);
                Ok(())
            }
            None => self.write(va, &v.to_ne_bytes()),
        }
    }

    /// Stores a 32-bit word at `va` with no ordering of its own.
    pub fn store_relaxed(&self, va: u64, v: u32) -> Result<(), Fault> {
        match self.word(va).and_then(|(m, at)| m.u32_at(at)) {
            Some(w) => {
                w.store(v, Ordering::Relaxed);
                Ok(())
            }
            None => self.write(va, &v.to_ne_bytes()),
        }
    }
}

/// A region with no bytes: the filler of unused [`Seg`] array slots.
pub(crate) static EMPTY: Resolved = Resolved {
    handle: 0,
    va: 0,
    len: 0,
    ptag: 0,
    flags: 0,
    pid: 0,
    extents: Extents::None,
    live: Liveness::new(),
};

/// One segment of a scatter/gather list: `len` bytes at `va` of a region.
#[derive(Clone, Copy)]
pub(crate) struct Seg<'a> {
    pub region: &'a Resolved,
    pub va: u64,
    pub len: u64,
}

/// A position in a scatter/gather list.
pub(crate) struct Cursor<'a> {
    segs: &'a [Seg<'a>],
    i: usize,
    done: u64,
}

impl<'a> Cursor<'a> {
    pub fn new(segs: &'a [Seg<'a>]) -> Cursor<'a> {
        let mut c = Cursor {
            segs,
            i: 0,
            done: 0,
        };
        c.skip_empty();
        c
    }

    fn skip_empty(&mut self) {
        while self.i < self.segs.len() && self.done >= self.segs[self.i].len {
            self.i += 1;
            self.done = 0;
        }
    }

    /// The place of the next byte and how many contiguous bytes follow (at
    /// most `max`); `None` at the end of the list.
    pub fn peek(&self, max: u64) -> Option<Result<(Place<'a>, u64), Fault>> {
        let s = self.segs.get(self.i)?;
        Some(
            s.region
                .place(s.va + self.done)
                .map(|(p, n)| (p, n.min(s.len - self.done).min(max)))
                .ok_or(Fault::Protection),
        )
    }

    /// Moves past `n` bytes (no more than the last `peek` returned).
    pub fn advance(&mut self, n: u64) {
        self.done += n;
        self.skip_empty();
    }
}

/// Copies `len` bytes from `src` to `dst`, asking `still` before every
/// [`CHUNK`] after the first whether the regions are still registered (an
/// error status from it stops the copy).
pub(crate) fn copy(
    src: &mut Cursor<'_>,
    dst: &mut Cursor<'_>,
    mut len: u64,
    still: &mut dyn FnMut() -> Option<u32>,
) -> Result<(), Fault> {
    let mut budget = CHUNK;
    while len > 0 {
        if budget == 0 {
            if let Some(st) = still() {
                return Err(Fault::Cut(st));
            }
            budget = CHUNK;
        }
        let (sp, sn) = src.peek(len.min(budget)).ok_or(Fault::Protection)??;
        let (dp, dn) = dst.peek(sn).ok_or(Fault::Protection)??;
        let n = sn.min(dn);
        match (&sp, &dp) {
            (Place::Map(s, so), Place::Map(d, doff)) => copy::mapped(s, *so, d, *doff, n as usize)?,
            _ => copy::cma(&sp, &dp, n as usize)?,
        }
        src.advance(n);
        dst.advance(n);
        len -= n;
        budget -= n;
    }
    Ok(())
}

/// [`copy`], except that the last 8 bytes are stored last, when `dst_end`
/// (the destination's end address) is 8-byte aligned: as one atomic
/// Release store where they land in a mapped extent, else by a write that
/// follows the rest. A reader that polls that word with an Acquire load
/// and sees the new value sees every byte before it (the soft NIC's RDMA
/// write: `Nic::writes_tail_last`). A `memcpy` gives no such order: for
/// 129..256 bytes glibc stores the tail before part of the middle.
pub(crate) fn copy_tail_last(
    src: &mut Cursor<'_>,
    dst: &mut Cursor<'_>,
    len: u64,
    dst_end: u64,
    still: &mut dyn FnMut() -> Option<u32>,
) -> Result<(), Fault> {
    if len < 8 || dst_end % 8 != 0 {
        return copy(src, dst, len, still);
    }
    copy(src, dst, len - 8, still)?;
    // The last 8 bytes, gathered (they may span local segments).
    let mut tail = [0u8; 8];
    let mut got = 0usize;
    while got < 8 {
        let (sp, sn) = src.peek((8 - got) as u64).ok_or(Fault::Protection)??;
        copy::fetch(&sp, &mut tail[got..got + sn as usize])?;
        src.advance(sn);
        got += sn as usize;
    }
    let (dp, dn) = dst.peek(8).ok_or(Fault::Protection)??;
    if let (Place::Map(m, off), 8) = (&dp, dn) {
        if !m.store_tail(*off, tail) {
            return Err(Fault::Protection);
        }
        dst.advance(8);
        return Ok(());
    }
    // Not in one mapping (cross-memory attach, or an extent boundary
    // inside the word): after the rest, as bytes.
    let mut done = 0usize;
    while done < 8 {
        let (dp, dn) = dst.peek((8 - done) as u64).ok_or(Fault::Protection)??;
        copy::deliver(&tail[done..done + dn as usize], &dp)?;
        dst.advance(dn);
        done += dn as usize;
    }
    Ok(())
}

/// Copies `bytes` (an inline payload) to `dst`.
pub(crate) fn copy_from_bytes(bytes: &[u8], dst: &mut Cursor<'_>) -> Result<(), Fault> {
    let mut done = 0usize;
    while done < bytes.len() {
        let (dp, dn) = dst
            .peek((bytes.len() - done) as u64)
            .ok_or(Fault::Protection)??;
        let n = dn as usize;
        copy::deliver(&bytes[done..done + n], &dp)?;
        dst.advance(dn);
        done += n;
    }
    Ok(())
}
