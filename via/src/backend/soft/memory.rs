//! Addressing registered memory of this process or of a peer.
//!
//! A registered region is a list of extents (see `shm::arena`): each byte
//! lives either in an arena file that both processes map, or in memory only
//! reachable by cross-memory attach. [`Cursor`] walks a scatter/gather list
//! chunk by chunk and [`copy`] moves bytes between two lists using the
//! cheapest mechanism each pair of chunks allows (`proto::mapped`,
//! `proto::cma`, `proto::inline`).
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::shm::arena::CMA;
use crate::shm::mapping::Mapping;
use crate::tpt::Snapshot;

use super::proto;

/// Whose memory: resolves arena ids to mappings.
pub(crate) trait Space {
    /// The mapping of arena `id`, if it exists.
    fn arena(&self, id: u32) -> Option<Arc<Mapping>>;
    /// Process id, for cross-memory attach.
    fn pid(&self) -> i32;
}

/// Where a contiguous chunk of bytes lives.
pub(crate) enum Place {
    /// `off` bytes into a mapping.
    Map(Arc<Mapping>, usize),
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
}

/// One segment of a scatter/gather list: `len` bytes at `off` in a region.
#[derive(Clone, Copy)]
pub(crate) struct Seg {
    pub snap: Snapshot,
    pub off: u64,
    pub len: u64,
}

/// Resolves `off` in `snap` to a place and the contiguous bytes there.
pub(crate) fn place(space: &dyn Space, snap: &Snapshot, off: u64) -> Result<(Place, u64), Fault> {
    let (ext, n) = snap.locate(off).ok_or(Fault::Protection)?;
    if ext.arena == CMA {
        return Ok((Place::Cma(space.pid(), ext.arena_off), n));
    }
    let map = space.arena(ext.arena).ok_or(Fault::Protection)?;
    let at = usize::try_from(ext.arena_off).map_err(|_| Fault::Protection)?;
    if at >= map.len() {
        return Err(Fault::Protection);
    }
    let n = n.min((map.len() - at) as u64);
    Ok((Place::Map(map, at), n))
}

/// A position in a scatter/gather list.
pub(crate) struct Cursor<'a> {
    space: &'a dyn Space,
    segs: &'a [Seg],
    i: usize,
    done: u64,
}

impl<'a> Cursor<'a> {
    pub fn new(space: &'a dyn Space, segs: &'a [Seg]) -> Cursor<'a> {
        let mut c = Cursor {
            space,
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
    pub fn peek(&self, max: u64) -> Option<Result<(Place, u64), Fault>> {
        let s = self.segs.get(self.i)?;
        Some(place(self.space, &s.snap, s.off + self.done).map(|(p, n)| (p, n.min(s.len - self.done).min(max))))
    }

    /// Moves past `n` bytes (no more than the last `peek` returned).
    pub fn advance(&mut self, n: u64) {
        self.done += n;
        self.skip_empty();
    }
}

/// Copies `len` bytes from `src` to `dst`.
pub(crate) fn copy(src: &mut Cursor<'_>, dst: &mut Cursor<'_>, mut len: u64) -> Result<(), Fault> {
    while len > 0 {
        let (sp, sn) = src.peek(len).ok_or(Fault::Protection)??;
        let (dp, dn) = dst.peek(sn).ok_or(Fault::Protection)??;
        let n = sn.min(dn);
        match (&sp, &dp) {
            (Place::Map(s, so), Place::Map(d, doff)) => proto::mapped::copy(s, *so, d, *doff, n as usize)?,
            _ => proto::cma::copy(&sp, &dp, n as usize)?,
        }
        src.advance(n);
        dst.advance(n);
        len -= n;
    }
    Ok(())
}

/// Copies `bytes` (an inline payload) to `dst`.
pub(crate) fn copy_from_bytes(bytes: &[u8], dst: &mut Cursor<'_>) -> Result<(), Fault> {
    let mut done = 0usize;
    while done < bytes.len() {
        let (dp, dn) = dst.peek((bytes.len() - done) as u64).ok_or(Fault::Protection)??;
        let n = dn as usize;
        proto::inline::deliver(&bytes[done..done + n], &dp)?;
        dst.advance(dn);
        done += n;
    }
    Ok(())
}

/// Reads `out.len()` bytes at `off` of a region.
pub(crate) fn read(space: &dyn Space, snap: &Snapshot, off: u64, out: &mut [u8]) -> Result<(), Fault> {
    let mut done = 0usize;
    while done < out.len() {
        let (p, n) = place(space, snap, off + done as u64)?;
        let n = (n as usize).min(out.len() - done);
        match p {
            Place::Map(m, at) => {
                if !m.read(at, &mut out[done..done + n]) {
                    return Err(Fault::Protection);
                }
            }
            Place::Cma(pid, va) => {
                crate::sys::process_vm_read(pid, &mut out[done..done + n], va).map_err(|_| Fault::Transport)?;
            }
        }
        done += n;
    }
    Ok(())
}

/// Writes `bytes` at `off` of a region (no ordering guarantee).
pub(crate) fn write(space: &dyn Space, snap: &Snapshot, off: u64, bytes: &[u8]) -> Result<(), Fault> {
    let segs = [Seg {
        snap: *snap,
        off,
        len: bytes.len() as u64,
    }];
    copy_from_bytes(bytes, &mut Cursor::new(space, &segs))
}

/// Stores a 32-bit word at `off` of a region with Release ordering (the
/// descriptor status word: the last store of a completion).
pub(crate) fn store_release(space: &dyn Space, snap: &Snapshot, off: u64, v: u32) -> Result<(), Fault> {
    match place(space, snap, off)? {
        (Place::Map(m, at), n) if n >= 4 => {
            let w = m.u32_at(at).ok_or(Fault::Protection)?;
            // Release: the completion's earlier stores (data, Length,
            // ImmediateData) happen before a reader that sees this status
            // with Acquire (VipRecvDone, or a program spinning on memory).
            w.store(v, std::sync::atomic::Ordering::Release);
            Ok(())
        }
        _ => write(space, snap, off, &v.to_ne_bytes()),
    }
}

/// Loads a 32-bit word at `off` of a region with Acquire ordering.
pub(crate) fn load_acquire(space: &dyn Space, snap: &Snapshot, off: u64) -> Result<u32, Fault> {
    match place(space, snap, off)? {
        (Place::Map(m, at), n) if n >= 4 => {
            let w = m.u32_at(at).ok_or(Fault::Protection)?;
            // Acquire: pairs with `store_release`.
            Ok(w.load(std::sync::atomic::Ordering::Acquire))
        }
        _ => {
            let mut b = [0u8; 4];
            read(space, snap, off, &mut b)?;
            Ok(u32::from_ne_bytes(b))
        }
    }
}
