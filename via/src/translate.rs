//! Translation of a user descriptor into a checked physical descriptor.
//!
//! At post time the descriptor is read from registered memory (through the
//! library's shadow mappings, never through the application's pointer) and
//! every segment is checked against the translation and protection table:
//! the handle is live and belongs to this NIC, the region's protection tag is
//! the VI's, the bytes lie inside the region. What the engine needs is then
//! fixed in a [`SendPd`] or a [`RecvPd`]; errors found here either refuse the
//! post (the descriptor itself is unusable) or become a completion status
//! (the NIC would have found them while processing it).
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::backend::soft::memory::Resolved;
use crate::descriptor::{SEGMENT_SIZE, control, offsets, status};
use crate::error::{Error, Result};
use crate::nic::NicInner;
use crate::shm::layout::{LocalSeg, MAX_INLINE, MAX_SEGS, SendPd};
use crate::shm::mapping::Mapping;
use crate::tpt::RegionCache;

/// Where a descriptor's control segment lives, resolved once at post time.
#[derive(Clone)]
pub(crate) enum StatusLoc {
    /// Offset of the descriptor in a shadow mapping.
    Map(Arc<Mapping>, usize),
    /// Virtual address of the descriptor (cross-memory attach on ourselves).
    Cma(i32, u64),
}

impl StatusLoc {
    /// The location of the control segment at `va` of `region`.
    pub fn of(region: &Resolved, va: u64) -> StatusLoc {
        match region.control_segment(va) {
            Some((m, at)) => StatusLoc::Map(m, at),
            None => StatusLoc::Cma(region.pid, va),
        }
    }

    /// Reads `CS.Status` (Acquire).
    pub fn status(&self) -> u32 {
        self.word(offsets::STATUS)
    }

    /// Reads a 32-bit control-segment word at `off`.
    pub fn word(&self, off: usize) -> u32 {
        match self {
            StatusLoc::Map(m, at) => m
                .u32_at(at + off)
                // Acquire: pairs with the Release store of the completing engine.
                .map(|w| w.load(std::sync::atomic::Ordering::Acquire))
                .unwrap_or(0),
            StatusLoc::Cma(pid, va) => {
                let mut b = [0u8; 4];
                let _ = crate::sys::process_vm_read(*pid, &mut b, va + off as u64);
                u32::from_ne_bytes(b)
            }
        }
    }

    /// Writes a completion: `imm` and `len` first, then `status` (Release).
    pub fn complete(&self, status: u32, len: Option<u32>, imm: Option<u32>) {
        match self {
            StatusLoc::Map(m, at) => {
                use std::sync::atomic::Ordering;
                if let Some(i) = imm {
                    if let Some(w) = m.u32_at(at + offsets::IMMEDIATE_DATA) {
                        w.store(i, Ordering::Relaxed);
                    }
                }
                if let Some(l) = len {
                    if let Some(w) = m.u32_at(at + offsets::LENGTH) {
                        w.store(l, Ordering::Relaxed);
                    }
                }
                if let Some(w) = m.u32_at(at + offsets::STATUS) {
                    // Release: orders the data and the words above before the status.
                    w.store(status, Ordering::Release);
                }
            }
            StatusLoc::Cma(pid, va) => {
                if let Some(i) = imm {
                    let _ = crate::sys::process_vm_write(
                        *pid,
                        &i.to_ne_bytes(),
                        va + offsets::IMMEDIATE_DATA as u64,
                    );
                }
                if let Some(l) = len {
                    let _ = crate::sys::process_vm_write(
                        *pid,
                        &l.to_ne_bytes(),
                        va + offsets::LENGTH as u64,
                    );
                }
                let _ = crate::sys::process_vm_write(
                    *pid,
                    &status.to_ne_bytes(),
                    va + offsets::STATUS as u64,
                );
            }
        }
    }
}

/// One data or address segment as read from the descriptor.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawSeg {
    pub addr: u64,
    pub handle: u32,
    pub len: u32,
}

/// A user descriptor read from memory.
pub(crate) struct UserDesc {
    pub control: u16,
    pub imm: u32,
    pub length: u32,
    pub n: usize,
    pub segs: [RawSeg; MAX_SEGS],
    /// First address of the region holding the descriptor.
    pub region_va: u64,
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
pub(crate) fn read_desc(
    nic: &NicInner,
    va: u64,
    handle: u32,
    ptag: u32,
    cache: &mut RegionCache,
) -> Result<UserDesc> {
    let region = cache.get(&nic.tpt, handle).ok_or(Error::InvalidParameter)?;
    if va % crate::descriptor::ALIGNMENT as u64 != 0
        || !region.covers(va, 32)
        || region.ptag != ptag
    {
        return Err(Error::DescriptorError);
    }
    let mut segs = [RawSeg::default(); MAX_SEGS];
    let (n, control, imm, length);
    if let Some((m, at)) = region.span(va, 32) {
        // Fast path: the descriptor lies in one arena; read its words.
        let w = m.load_u32(at + 12);
        (n, control) = ((w & 0xffff) as usize, (w >> 16) as u16);
        imm = m.load_u32(at + 20);
        length = m.load_u32(at + 24);
    } else {
        let mut cs = [0u8; 32];
        region
            .read(va, &mut cs)
            .map_err(|_| Error::DescriptorError)?;
        n = u16::from_ne_bytes([cs[12], cs[13]]) as usize;
        control = u16::from_ne_bytes([cs[14], cs[15]]);
        imm = u32_at(&cs, 20);
        length = u32_at(&cs, 24);
    }
    if n > MAX_SEGS
        || control & control::RESERVED != 0
        || control & control::OP_MASK == control::OP_RESERVED
    {
        return Err(Error::DescriptorError);
    }
    let end = 32 + n * SEGMENT_SIZE;
    if !region.covers(va, end as u64) {
        return Err(Error::DescriptorError);
    }
    if let Some((m, at)) = region.span(va + 32, (n * SEGMENT_SIZE) as u64) {
        for (i, s) in segs.iter_mut().enumerate().take(n) {
            let o = at + i * SEGMENT_SIZE;
            let w = m.load_u64(o + 8);
            *s = RawSeg {
                addr: m.load_u64(o),
                handle: w as u32,
                len: (w >> 32) as u32,
            };
        }
    } else if n > 0 {
        let mut buf = [0u8; MAX_SEGS * SEGMENT_SIZE];
        region
            .read(va + 32, &mut buf[..n * SEGMENT_SIZE])
            .map_err(|_| Error::DescriptorError)?;
        for (i, s) in segs.iter_mut().enumerate().take(n) {
            let b = &buf[i * SEGMENT_SIZE..];
            *s = RawSeg {
                addr: u64::from_ne_bytes(b[0..8].try_into().unwrap()),
                handle: u32_at(b, 8),
                len: u32_at(b, 12),
            };
        }
    }
    let status = StatusLoc::of(region, va);
    Ok(UserDesc {
        control,
        imm,
        length,
        n,
        segs,
        region_va: region.va,
        status,
    })
}

/// Checks a local data segment; the error status if it is not allowed.
fn check_local(
    nic: &NicInner,
    s: &RawSeg,
    ptag: u32,
    cache: &mut RegionCache,
) -> std::result::Result<u64, u32> {
    let r = cache
        .get(&nic.tpt, s.handle)
        .ok_or(status::PROTECTION_ERROR)?;
    if r.ptag != ptag || !r.covers(s.addr, s.len as u64) {
        return Err(status::PROTECTION_ERROR);
    }
    Ok(r.va)
}

/// What [`send_pd`] needs to know about the VI and the post.
pub(crate) struct SendCtx {
    pub vi: (u32, u16),
    pub ptag: u32,
    pub mtu: u32,
    pub reliable: bool,
    pub inline_max: usize,
    pub desc_va: u64,
    pub desc_handle: u32,
}

/// Builds the physical descriptor of a send, RDMA write or RDMA read.
/// Problems the NIC would report in the status become `pd.fault`.
///
/// # Errors
/// `DescriptorError` for an RDMA descriptor without address segment, RDMA
/// read with immediate data, or RDMA read on an unreliable VI.
pub(crate) fn send_pd(
    nic: &NicInner,
    d: &UserDesc,
    cx: &SendCtx,
    pd: &mut SendPd,
    cache: &mut RegionCache,
) -> Result<()> {
    let op = d.control & control::OP_MASK;
    if op == control::OP_RDMAREAD && !cx.reliable {
        return Err(Error::DescriptorError);
    }
    pd.vi = cx.vi.0;
    pd.vi_gen = cx.vi.1 as u32;
    pd.control = d.control;
    pd.imm = d.imm;
    pd.desc_va = cx.desc_va;
    pd.desc_handle = cx.desc_handle;
    pd.fault = 0;
    pd.inline_len = 0;
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
            pd.remote_va = d.segs[0].addr;
            pd.remote_handle = d.segs[0].handle;
            &d.segs[1..d.n]
        }
    };
    let mut total: u64 = 0;
    for (i, s) in local.iter().enumerate() {
        if let Err(st) = check_local(nic, s, cx.ptag, cache) {
            pd.fault |= st;
        }
        pd.segs[i] = LocalSeg {
            va: s.addr,
            len: s.len,
            handle: s.handle,
        };
        total += s.len as u64;
    }
    pd.seg_count = local.len() as u16;
    if total > cx.mtu as u64 || (op != control::OP_RDMAREAD && total != d.length as u64) {
        pd.fault |= status::LENGTH_ERROR;
    }
    pd.length = total.min(u32::MAX as u64) as u32;
    if pd.fault == 0
        && op == control::OP_SENDRECV
        && total > 0
        && total as usize <= cx.inline_max.min(MAX_INLINE)
    {
        let mut done = 0usize;
        for s in local {
            let n = s.len as usize;
            if n == 0 {
                continue;
            }
            let ok = cache
                .get(&nic.tpt, s.handle)
                .is_some_and(|r| r.read(s.addr, &mut pd.inline[done..done + n]).is_ok());
            if !ok {
                pd.fault |= status::PROTECTION_ERROR;
                break;
            }
            done += n;
        }
        pd.inline_len = done as u32;
    }
    Ok(())
}

/// A pre-translated receive: what goes into the receive ring slot.
pub(crate) struct RecvPd {
    pub desc_off: u64,
    pub desc_handle: u32,
    pub n: usize,
    /// (offset in region, length, handle) per segment.
    pub segs: [(u64, u32, u32); MAX_SEGS],
    pub fault: u32,
}

/// Builds the pre-translated form of a receive descriptor.
pub(crate) fn recv_pd(
    nic: &NicInner,
    d: &UserDesc,
    desc_va: u64,
    desc_handle: u32,
    ptag: u32,
    cache: &mut RegionCache,
) -> RecvPd {
    let mut pd = RecvPd {
        desc_off: desc_va - d.region_va,
        desc_handle,
        n: 0,
        segs: [(0, 0, 0); MAX_SEGS],
        fault: 0,
    };
    if d.control & control::OP_MASK != control::OP_SENDRECV {
        pd.fault |= status::FORMAT_ERROR;
    }
    for s in &d.segs[..d.n] {
        match check_local(nic, s, ptag, cache) {
            Ok(base) => {
                pd.segs[pd.n] = (s.addr - base, s.len, s.handle);
                pd.n += 1;
            }
            Err(st) => pd.fault |= st,
        }
    }
    pd
}
