//! Moving the bytes of one request: the one-`memcpy` case, the general
//! scatter/gather case in chunks, and the check between chunks that every
//! region of the transfer is still registered (`VipDeregisterMem` waits for
//! at most one chunk, see `SoftNic::quiesce_region_users`).
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::descriptor::status;
use crate::mem::region::{self, Cursor, EMPTY, Fault, Seg};
use crate::shm::mapping::Mapping;
use crate::translate::SendWr;

use crate::backend::soft::SoftNic;
use crate::backend::soft::layout::{MAX_SEGS, RecvSlot};
use crate::backend::soft::remote::PeerLink;
use crate::backend::soft::tcache::Regions;
use crate::backend::soft::tpt;

/// A filler for unused slots of segment arrays.
pub(crate) const NO_SEG: Seg<'static> = Seg {
    region: &EMPTY,
    va: 0,
    len: 0,
};

/// Marks a `move_general` result that stopped at a chunk boundary (the
/// status bits that follow are for the initiator).
pub(crate) const CUT: u32 = 1 << 31;

/// The source of a send: the local segments (their regions at `src_i`), or
/// the payload carried inline.
pub(crate) struct Source<'a> {
    pub wr: &'a SendWr,
    pub inline: &'a [u8],
    pub src_i: &'a [usize; MAX_SEGS],
    pub src_n: usize,
}

/// Moves one segment to one segment when both lie in one arena each (the
/// common case): a single `memcpy`. `None` if the case does not apply.
pub(crate) fn move_fast(
    regions: &Regions,
    slot: &RecvSlot,
    dst_i: &[usize; MAX_SEGS],
    n: usize,
    src: &Source<'_>,
    len: u32,
) -> Option<u32> {
    let inline = !src.inline.is_empty();
    if n != 1 || (!inline && src.src_n != 1) || len as u64 > region::CHUNK {
        return None;
    }
    let dr = regions.get(dst_i[0]);
    let (dm, dat) = dr.span(dr.va + slot.segs[0].off.load(Ordering::Relaxed), len as u64)?;
    // The receiver reads the message next: from the shared cache.
    let ok = if inline {
        dm.write_for_reader(dat, src.inline)
    } else {
        let (sm, sat) = regions
            .get(src.src_i[0])
            .span(src.wr.segs[0].va, len as u64)?;
        crate::shm::mapping::Mapping::copy_for_reader(sm, sat, dm, dat, len as usize)
    };
    Some(if ok { 0 } else { status::PROTECTION_ERROR })
}

/// Copies `len` bytes from `src[so..]` to `dst[doff..]`, the last 8 last
/// (as one Release word where it is aligned in `dst`) when `end_aligned`:
/// the one-`memcpy` case of `region::copy_tail_last` (an RDMA write whose
/// source and target each lie in one mapped extent). `false` if a range is
/// outside its mapping.
pub(crate) fn copy_mapped_tail_last(
    src: &Mapping,
    so: usize,
    dst: &Mapping,
    doff: usize,
    len: usize,
    end_aligned: bool,
) -> bool {
    if len < 8 || !end_aligned {
        return Mapping::copy(src, so, dst, doff, len);
    }
    let mut tail = [0u8; 8];
    Mapping::copy(src, so, dst, doff, len - 8)
        && src.read(so + len - 8, &mut tail)
        && dst.store_tail(doff + len - 8, tail)
}

/// Moves a scatter/gather message chunk by chunk. Returns the error bits.
pub(crate) fn move_general(
    regions: &Regions,
    slot: &RecvSlot,
    dst_i: &[usize; MAX_SEGS],
    n: usize,
    src: &Source<'_>,
    len: u32,
    still: &mut dyn FnMut() -> Option<u32>,
) -> u32 {
    let mut dst = [NO_SEG; MAX_SEGS];
    for i in 0..n {
        let r = regions.get(dst_i[i]);
        dst[i] = Seg {
            region: r,
            va: r.va + slot.segs[i].off.load(Ordering::Relaxed),
            len: slot.segs[i].len.load(Ordering::Relaxed) as u64,
        };
    }
    let mut to = Cursor::new(&dst[..n]);
    let r = if !src.inline.is_empty() {
        region::copy_from_bytes(src.inline, &mut to)
    } else {
        let mut from = [NO_SEG; MAX_SEGS];
        for ((f, &i), s) in from
            .iter_mut()
            .zip(src.src_i)
            .zip(&src.wr.segs)
            .take(src.src_n)
        {
            *f = Seg {
                region: regions.get(i),
                va: s.va,
                len: s.len as u64,
            };
        }
        region::copy(
            &mut Cursor::new(&from[..src.src_n]),
            &mut to,
            len as u64,
            still,
        )
    };
    match r {
        Ok(()) => 0,
        Err(Fault::Protection) => status::PROTECTION_ERROR,
        Err(Fault::Transport) => status::TRANSPORT_ERROR,
        Err(Fault::Cut(st)) => CUT | st,
    }
}

/// Whether every region of a running transfer is still registered: the
/// local segments of `wr` (unless its payload came inline), and `remote` in
/// the peer's table. `None` if so, else the initiator's status
/// (`remote_status` when the peer's region went).
pub(crate) fn still_registered(
    soft: &SoftNic,
    link: &PeerLink,
    wr: &SendWr,
    inline: bool,
    remote: &[u32],
    remote_status: u32,
) -> Option<u32> {
    let own = soft.view();
    if !inline && wr.local().iter().any(|s| !tpt::is_live(&own, s.handle)) {
        return Some(status::PROTECTION_ERROR);
    }
    let far = link.remote.view();
    if remote.iter().any(|&h| !tpt::is_live(&far, h)) {
        return Some(remote_status);
    }
    None
}
