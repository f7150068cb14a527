//! Translation of a user descriptor into a checked physical descriptor.
//!
//! At post time the descriptor is read from registered memory (through the
//! library's shadow mappings, never through the application's pointer) and
//! every segment is checked against the translation and protection table:
//! the handle is live and belongs to this NIC, the region's protection tag is
//! the VI's, the bytes lie inside the region. What the engine needs is then
//! fixed in a [`SendWr`] or a [`RecvWr`]; errors found here either refuse the
//! post (the descriptor itself is unusable) or become a completion status
//! (the NIC would have found them while processing it).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::completion::StatusLoc;
use crate::descriptor::{MAX_SEGMENTS as MAX_SEGS, SEGMENT_SIZE, control, offsets, status};
use crate::error::{Error, Result};
use crate::mem::region::Resolved;
use crate::regions::{RegionCache, RegionTable};

/// One local data segment of a work request: `len` bytes at virtual address
/// `va` in the region of `handle` (checked at post time).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WrSeg {
    /// Virtual address in the posting process.
    pub va: u64,
    /// Bytes.
    pub len: u32,
    /// Memory handle.
    pub handle: u32,
}

/// A validated send, RDMA write or RDMA read: what every kind of NIC gets
/// from `VipPostSend`. Integers only, without padding, so that a kind may
/// carry it by value through a shared ring (the soft NIC's doorbell).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SendWr {
    /// VI slot.
    pub vi: u32,
    /// VI generation.
    pub vi_gen: u32,
    /// `CS.Control` of the descriptor (operation and flags).
    pub control: u16,
    /// Local segments in use.
    pub seg_count: u16,
    /// Error status found at post time (0 = none): the device completes
    /// the descriptor with it, in order.
    pub fault: u32,
    /// Immediate data.
    pub imm: u32,
    /// Total bytes of the local segments.
    pub length: u32,
    /// Virtual address of the user descriptor.
    pub desc_va: u64,
    /// Memory handle covering the user descriptor.
    pub desc_handle: u32,
    /// Position of the descriptor in its VI's send queue.
    pub seq: u32,
    /// Remote address of an RDMA operation.
    pub remote_va: u64,
    /// Remote memory handle of an RDMA operation.
    pub remote_handle: u32,
    _pad: u32,
    /// Local segments.
    pub segs: [WrSeg; MAX_SEGS],
}

impl Default for SendWr {
    fn default() -> Self {
        SendWr {
            vi: 0,
            vi_gen: 0,
            control: 0,
            seg_count: 0,
            fault: 0,
            imm: 0,
            length: 0,
            desc_va: 0,
            desc_handle: 0,
            seq: 0,
            remote_va: 0,
            remote_handle: 0,
            _pad: 0,
            segs: [WrSeg::default(); MAX_SEGS],
        }
    }
}

impl SendWr {
    /// The operation (`control::OP_*`).
    pub fn op(&self) -> u16 {
        self.control & control::OP_MASK
    }

    /// The local segments.
    pub fn local(&self) -> &[WrSeg] {
        &self.segs[..(self.seg_count as usize).min(MAX_SEGS)]
    }
}

/// One data or address segment as read from the descriptor.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawSeg {
    pub addr: u64,
    pub handle: u32,
    pub len: u32,
}

/// A user descriptor read from memory (each work queue keeps one to read
/// into, so no post builds or moves one).
#[derive(Default)]
pub(crate) struct UserDesc {
    pub control: u16,
    pub imm: u32,
    pub length: u32,
    pub n: usize,
    pub segs: [RawSeg; MAX_SEGS],
    /// The region holding the descriptor, as [`read_desc`] checked it: its
    /// handle, first address, length and protection tag.
    pub region_handle: u32,
    pub region_va: u64,
    pub region_len: u64,
    pub region_ptag: u32,
    pub status: StatusLoc,
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes(b[i..i + 4].try_into().unwrap())
}

/// Reads the descriptor at `va`, which `handle` must cover.
///
/// # Errors
/// `InvalidParameter` for a dead or foreign handle; `DescriptorError` for a
/// misaligned descriptor, one outside the region or of another protection
/// tag, more than [`MAX_SEGS`] segments, or a reserved control bit or
/// operation.
#[inline(always)]
pub(crate) fn read_desc(
    table: &RegionTable,
    va: u64,
    handle: u32,
    ptag: u32,
    cache: &mut RegionCache,
    out: &mut UserDesc,
) -> Result<()> {
    let mut status = std::mem::take(&mut out.status);
    let r = read_desc_at(table, va, handle, ptag, cache, out, &mut status);
    out.status = status;
    r
}

/// [`read_desc`], with the descriptor's status location resolved into
/// `status` (a work queue's slot) instead of `out.status`.
#[inline(always)]
pub(crate) fn read_desc_at(
    table: &RegionTable,
    va: u64,
    handle: u32,
    ptag: u32,
    cache: &mut RegionCache,
    out: &mut UserDesc,
    status: &mut StatusLoc,
) -> Result<()> {
    let region = cache.get(table, handle).ok_or(Error::InvalidParameter)?;
    if va % crate::descriptor::ALIGNMENT as u64 != 0
        || !region.covers(va, 32)
        || region.ptag != ptag
    {
        return Err(Error::DescriptorError);
    }
    let segs = &mut out.segs;
    let (n, control, imm, length);
    if let Some((m, at, room)) = region.locate(va, 32) {
        // Fast path: the descriptor lies in one arena; read its words
        // through one bounds check (the 32-byte control segment).
        let head = m.slice::<AtomicU32>(at, 8).ok_or(Error::DescriptorError)?;
        let word = |o: usize| head[o / 4].load(Ordering::Relaxed);
        let w = word(offsets::SEG_COUNT);
        let (first, second) = if cfg!(target_endian = "little") {
            (w as u16, (w >> 16) as u16)
        } else {
            ((w >> 16) as u16, w as u16)
        };
        (n, control) = (first as usize, second);
        imm = word(offsets::IMMEDIATE_DATA);
        length = word(offsets::LENGTH);
        check_head(n, control)?;
        let end = offsets::SEGMENTS + n * SEGMENT_SIZE;
        if !region.covers(va, end as u64) {
            return Err(Error::DescriptorError);
        }
        let words = (room >= end as u64)
            .then(|| m.slice::<AtomicU64>(at + offsets::SEGMENTS, 2 * n))
            .flatten();
        if let Some(words) = words {
            for (s, w) in segs.iter_mut().zip(words.chunks_exact(2)) {
                let hl = w[1].load(Ordering::Relaxed);
                *s = RawSeg {
                    addr: w[0].load(Ordering::Relaxed),
                    handle: hl as u32,
                    len: (hl >> 32) as u32,
                };
            }
        } else {
            read_segs(region, va, n, segs)?;
        }
        status.set_map(m, at);
    } else {
        let mut cs = [0u8; 32];
        region
            .read(va, &mut cs)
            .map_err(|_| Error::DescriptorError)?;
        let at = |o: usize| [cs[o], cs[o + 1]];
        n = u16::from_ne_bytes(at(offsets::SEG_COUNT)) as usize;
        control = u16::from_ne_bytes(at(offsets::CONTROL));
        imm = u32_at(&cs, offsets::IMMEDIATE_DATA);
        length = u32_at(&cs, offsets::LENGTH);
        check_head(n, control)?;
        let end = offsets::SEGMENTS + n * SEGMENT_SIZE;
        if !region.covers(va, end as u64) {
            return Err(Error::DescriptorError);
        }
        read_segs(region, va, n, segs)?;
        *status = StatusLoc::of(region, va);
    }
    out.control = control;
    out.imm = imm;
    out.length = length;
    out.n = n;
    out.region_handle = handle;
    out.region_va = region.va;
    out.region_len = region.len;
    out.region_ptag = region.ptag;
    Ok(())
}

/// Refuses a segment count or control word no descriptor may have.
#[inline(always)]
fn check_head(n: usize, control: u16) -> Result<()> {
    if n > MAX_SEGS
        || control & control::RESERVED != 0
        || control & control::OP_MASK == control::OP_RESERVED
    {
        return Err(Error::DescriptorError);
    }
    Ok(())
}

/// Reads the `n` segments of the descriptor at `va` by copy (they straddle
/// extents, or the region is reached by cross-memory attach).
#[cold]
fn read_segs(region: &Resolved, va: u64, n: usize, segs: &mut [RawSeg; MAX_SEGS]) -> Result<()> {
    let mut buf = [0u8; MAX_SEGS * SEGMENT_SIZE];
    region
        .read(va + offsets::SEGMENTS as u64, &mut buf[..n * SEGMENT_SIZE])
        .map_err(|_| Error::DescriptorError)?;
    for (i, s) in segs.iter_mut().enumerate().take(n) {
        let b = &buf[i * SEGMENT_SIZE..];
        *s = RawSeg {
            addr: u64::from_ne_bytes(b[0..8].try_into().unwrap()),
            handle: u32_at(b, 8),
            len: u32_at(b, 12),
        };
    }
    Ok(())
}

/// Checks a local data segment; the error status if it is not allowed.
/// A segment in the descriptor's own region (the common layout) is checked
/// against what [`read_desc`] found for it a moment ago under the same
/// queue lock, without a second lookup.
#[inline(always)]
fn check_local(
    table: &RegionTable,
    s: &RawSeg,
    ptag: u32,
    cache: &mut RegionCache,
    d: &UserDesc,
) -> std::result::Result<u64, u32> {
    let (va, len, region_ptag) = if s.handle == d.region_handle {
        (d.region_va, d.region_len, d.region_ptag)
    } else {
        let r = cache.get(table, s.handle).ok_or(status::PROTECTION_ERROR)?;
        (r.va, r.len, r.ptag)
    };
    let inside = s.addr >= va
        && s.addr
            .checked_add(s.len as u64)
            .is_some_and(|e| e <= va + len);
    if region_ptag != ptag || !inside {
        return Err(status::PROTECTION_ERROR);
    }
    Ok(va)
}

/// The regions translation found for a request: the one holding its
/// descriptor and the one holding its first local segment, for a device
/// that runs the request at once (it need not look them up again).
#[derive(Clone, Copy, Default)]
pub(crate) struct WrRegions<'a> {
    pub desc: Option<&'a Resolved>,
    pub seg: Option<&'a Resolved>,
    /// Where the descriptor's status is written (found by [`read_desc`]).
    pub status: Option<&'a StatusLoc>,
}

impl<'a> WrRegions<'a> {
    /// The regions of `wr` in `cache` (just filled by translating it), and
    /// its descriptor's status location.
    #[inline(always)]
    pub fn of(wr: &SendWr, cache: &'a RegionCache, status: &'a StatusLoc) -> WrRegions<'a> {
        let desc = cache.peek(wr.desc_handle);
        // The common layout: the data in the descriptor's own region (one
        // lookup, not two).
        let seg = match wr.local().first() {
            Some(s) if s.handle == wr.desc_handle => desc,
            Some(s) => cache.peek(s.handle),
            None => None,
        };
        WrRegions {
            desc,
            seg,
            status: Some(status),
        }
    }
}

/// What [`send_wr`] needs to know about the VI and the post.
pub(crate) struct SendCtx {
    pub vi: (u32, u16),
    pub ptag: u32,
    pub mtu: u32,
    pub reliable: bool,
    pub desc_va: u64,
    pub desc_handle: u32,
    pub seq: u32,
}

/// Builds the work request of a send, RDMA write or RDMA read into `wr`.
/// Problems the NIC would report in the status become `wr.fault`.
///
/// # Errors
/// `DescriptorError` for an RDMA descriptor without address segment, RDMA
/// read with immediate data, or RDMA read on an unreliable VI.
#[inline(always)]
pub(crate) fn send_wr(
    table: &RegionTable,
    d: &UserDesc,
    cx: &SendCtx,
    wr: &mut SendWr,
    cache: &mut RegionCache,
) -> Result<()> {
    let op = d.control & control::OP_MASK;
    if op == control::OP_RDMAREAD && !cx.reliable {
        return Err(Error::DescriptorError);
    }
    wr.vi = cx.vi.0;
    wr.vi_gen = cx.vi.1 as u32;
    wr.control = d.control;
    wr.imm = d.imm;
    wr.desc_va = cx.desc_va;
    wr.desc_handle = cx.desc_handle;
    wr.seq = cx.seq;
    wr.fault = 0;
    let local: &[RawSeg] = match op {
        control::OP_SENDRECV => &d.segs[..d.n],
        _ => {
            // RDMA: the address segment comes first.
            if d.n == 0 {
                return Err(Error::DescriptorError);
            }
            if op == control::OP_RDMAREAD && d.control & control::IMMEDIATE != 0 {
                return Err(Error::DescriptorError);
            }
            wr.remote_va = d.segs[0].addr;
            wr.remote_handle = d.segs[0].handle;
            &d.segs[1..d.n]
        }
    };
    let mut total: u64 = 0;
    for (i, s) in local.iter().enumerate() {
        if let Err(st) = check_local(table, s, cx.ptag, cache, d) {
            wr.fault |= st;
        }
        wr.segs[i] = WrSeg {
            va: s.addr,
            len: s.len,
            handle: s.handle,
        };
        total += s.len as u64;
    }
    wr.seg_count = local.len() as u16;
    if total > cx.mtu as u64 || (op != control::OP_RDMAREAD && total != d.length as u64) {
        wr.fault |= status::LENGTH_ERROR;
    }
    wr.length = total.min(u32::MAX as u64) as u32;
    Ok(())
}

/// A validated receive: what every kind of NIC gets from `VipPostRecv`.
#[derive(Clone, Default)]
pub(crate) struct RecvWr {
    pub desc_off: u64,
    pub desc_handle: u32,
    pub n: usize,
    /// (offset in region, length, handle) per segment.
    pub segs: [(u64, u32, u32); MAX_SEGS],
    pub fault: u32,
}

/// Builds the work request of a receive descriptor into `pd`.
#[inline(always)]
pub(crate) fn recv_wr(
    table: &RegionTable,
    d: &UserDesc,
    desc_va: u64,
    desc_handle: u32,
    ptag: u32,
    cache: &mut RegionCache,
    pd: &mut RecvWr,
) {
    pd.desc_off = desc_va - d.region_va;
    pd.desc_handle = desc_handle;
    pd.n = 0;
    pd.fault = 0;
    if d.control & control::OP_MASK != control::OP_SENDRECV {
        pd.fault |= status::FORMAT_ERROR;
    }
    for s in &d.segs[..d.n] {
        match check_local(table, s, ptag, cache, d) {
            Ok(base) => {
                pd.segs[pd.n] = (s.addr - base, s.len, s.handle);
                pd.n += 1;
            }
            Err(st) => pd.fault |= st,
        }
    }
}
