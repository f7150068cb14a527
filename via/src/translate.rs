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

use crate::backend::soft::memory::{self, Space};
use crate::descriptor::{ControlSegment, DataSegment, SEGMENT_SIZE, control, status};
use crate::error::{Error, Result};
use crate::nic::NicInner;
use crate::shm::arena::{Arenas, CMA};
use crate::shm::layout::{LocalSeg, MAX_INLINE, MAX_SEGS, SendPd};
use crate::shm::mapping::Mapping;
use crate::tpt::Snapshot;
use std::sync::Arc;

/// This process's registered memory, reached through the arenas' shadows.
pub(crate) struct LocalSpace<'a> {
    pub arenas: &'a Arenas,
    pub pid: i32,
}

impl Space for LocalSpace<'_> {
    fn arena(&self, id: u32) -> Option<Arc<Mapping>> {
        self.arenas.shadow(id)
    }
    fn pid(&self) -> i32 {
        self.pid
    }
}

/// Where a descriptor's status word lives, resolved once at post time.
#[derive(Clone)]
pub(crate) enum StatusLoc {
    /// Offset of the descriptor in a shadow mapping.
    Map(Arc<Mapping>, usize),
    /// Virtual address of the descriptor (cross-memory attach on ourselves).
    Cma(i32, u64),
}

impl StatusLoc {
    /// Reads `CS.Status` (Acquire).
    pub fn status(&self) -> u32 {
        self.word(crate::descriptor::offsets::STATUS)
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

    /// Writes status words of a completion: `imm` and `len` first, then
    /// `status` with Release.
    pub fn complete(&self, status: u32, len: Option<u32>, imm: Option<u32>) {
        use crate::descriptor::offsets;
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
                    let _ = crate::sys::process_vm_write(*pid, &i.to_ne_bytes(), va + offsets::IMMEDIATE_DATA as u64);
                }
                if let Some(l) = len {
                    let _ = crate::sys::process_vm_write(*pid, &l.to_ne_bytes(), va + offsets::LENGTH as u64);
                }
                let _ = crate::sys::process_vm_write(*pid, &status.to_ne_bytes(), va + offsets::STATUS as u64);
            }
        }
    }
}

/// A user descriptor read from memory.
pub(crate) struct UserDesc {
    pub cs: ControlSegment,
    pub segs: Vec<DataSegment>,
    pub region: Snapshot,
    pub status: StatusLoc,
}

fn parse_cs(b: &[u8; 32]) -> ControlSegment {
    let u32at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap());
    let u16at = |i: usize| u16::from_ne_bytes(b[i..i + 2].try_into().unwrap());
    ControlSegment {
        next: crate::descriptor::Addr64 {
            bits: u64::from_ne_bytes(b[0..8].try_into().unwrap()),
        },
        next_handle: u32at(8),
        seg_count: u16at(12),
        control: u16at(14),
        reserved: u32at(16),
        immediate_data: u32at(20),
        length: u32at(24),
        status: u32at(28),
    }
}

fn parse_seg(b: &[u8]) -> DataSegment {
    DataSegment {
        data: crate::descriptor::Addr64 {
            bits: u64::from_ne_bytes(b[0..8].try_into().unwrap()),
        },
        handle: u32::from_ne_bytes(b[8..12].try_into().unwrap()),
        length: u32::from_ne_bytes(b[12..16].try_into().unwrap()),
    }
}

/// Reads the descriptor at `va`, which `handle` must cover.
///
/// # Errors
/// `InvalidParameter` for a dead or foreign handle; `DescriptorError` for a
/// misaligned descriptor, one outside the region or of another protection
/// tag, more than [`MAX_SEGS`] segments, or a reserved control bit or
/// operation.
pub(crate) fn read_desc(nic: &NicInner, va: u64, handle: u32, ptag: u32) -> Result<UserDesc> {
    let region = nic.tpt.lookup(handle).ok_or(Error::InvalidParameter)?;
    if va % crate::descriptor::ALIGNMENT as u64 != 0 || !region.covers(va, 32) || region.ptag != ptag {
        return Err(Error::DescriptorError);
    }
    let space = LocalSpace {
        arenas: &nic.process.arenas,
        pid: nic.process.pid,
    };
    let off = va - region.va;
    let mut cs = [0u8; 32];
    memory::read(&space, &region, off, &mut cs).map_err(|_| Error::DescriptorError)?;
    let cs = parse_cs(&cs);
    let n = cs.seg_count as usize;
    if n > MAX_SEGS || cs.control & control::RESERVED != 0 || cs.control & control::OP_MASK == control::OP_RESERVED {
        return Err(Error::DescriptorError);
    }
    let seg_bytes = (n * SEGMENT_SIZE) as u64;
    if !region.covers(va, 32 + seg_bytes) {
        return Err(Error::DescriptorError);
    }
    let mut raw = vec![0u8; n * SEGMENT_SIZE];
    memory::read(&space, &region, off + 32, &mut raw).map_err(|_| Error::DescriptorError)?;
    let segs = raw.chunks_exact(SEGMENT_SIZE).map(parse_seg).collect();
    let status = match memory::place(&space, &region, off) {
        Ok((memory::Place::Map(m, at), n)) if n >= 32 => StatusLoc::Map(m, at),
        Ok(_) => {
            let (ext, _) = region.locate(off).ok_or(Error::DescriptorError)?;
            debug_assert_eq!(ext.arena, CMA);
            StatusLoc::Cma(nic.process.pid, va)
        }
        Err(_) => return Err(Error::DescriptorError),
    };
    Ok(UserDesc {
        cs,
        segs,
        region,
        status,
    })
}

/// Checks a local data segment; the error status if it is not allowed.
fn check_local(nic: &NicInner, s: &DataSegment, ptag: u32) -> std::result::Result<Snapshot, u32> {
    let snap = nic.tpt.lookup(s.handle).ok_or(status::PROTECTION_ERROR)?;
    if snap.ptag != ptag || !snap.covers(s.data.bits, s.length as u64) {
        return Err(status::PROTECTION_ERROR);
    }
    Ok(snap)
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
pub(crate) fn send_pd(nic: &NicInner, d: &UserDesc, cx: &SendCtx) -> Result<SendPd> {
    let op = d.cs.control & control::OP_MASK;
    if op == control::OP_RDMAREAD && !cx.reliable {
        return Err(Error::DescriptorError);
    }
    let (ptag, mtu, inline_max) = (cx.ptag, cx.mtu, cx.inline_max);
    let mut pd = SendPd {
        vi: cx.vi.0,
        vi_gen: cx.vi.1 as u32,
        control: d.cs.control,
        imm: d.cs.immediate_data,
        desc_va: cx.desc_va,
        desc_handle: cx.desc_handle,
        ..SendPd::default()
    };
    let local: &[DataSegment] = match op {
        control::OP_SENDRECV => &d.segs,
        _ => {
            // RDMA: the address segment comes first.
            let Some(a) = d.segs.first() else {
                return Err(Error::DescriptorError);
            };
            if op == control::OP_RDMAREAD && d.cs.control & control::IMMEDIATE != 0 {
                return Err(Error::DescriptorError);
            }
            pd.remote_va = a.data.bits;
            pd.remote_handle = a.handle;
            &d.segs[1..]
        }
    };
    let mut total: u64 = 0;
    for (i, s) in local.iter().enumerate() {
        if let Err(st) = check_local(nic, s, ptag) {
            pd.fault |= st;
        }
        pd.segs[i] = LocalSeg {
            va: s.data.bits,
            len: s.length,
            handle: s.handle,
        };
        total += s.length as u64;
    }
    pd.seg_count = local.len() as u16;
    if total > mtu as u64 || (op != control::OP_RDMAREAD && total != d.cs.length as u64) {
        pd.fault |= status::LENGTH_ERROR;
    }
    pd.length = total.min(u32::MAX as u64) as u32;
    if pd.fault == 0 && op == control::OP_SENDRECV && total as usize <= inline_max.min(MAX_INLINE) && total > 0 {
        let space = LocalSpace {
            arenas: &nic.process.arenas,
            pid: nic.process.pid,
        };
        let mut done = 0usize;
        for s in local {
            let n = s.length as usize;
            if n == 0 {
                continue;
            }
            let snap = nic.tpt.lookup(s.handle).expect("checked above");
            if memory::read(&space, &snap, s.data.bits - snap.va, &mut pd.inline[done..done + n]).is_err() {
                pd.fault |= status::PROTECTION_ERROR;
                break;
            }
            done += n;
        }
        pd.inline_len = done as u32;
    }
    Ok(pd)
}

/// A pre-translated receive: what goes into the receive ring slot.
pub(crate) struct RecvPd {
    pub desc_off: u64,
    pub desc_handle: u32,
    pub segs: Vec<(u64, u32, u32)>,
    pub fault: u32,
}

/// Builds the pre-translated form of a receive descriptor.
pub(crate) fn recv_pd(nic: &NicInner, d: &UserDesc, desc_va: u64, desc_handle: u32, ptag: u32) -> RecvPd {
    let mut pd = RecvPd {
        desc_off: desc_va - d.region.va,
        desc_handle,
        segs: Vec::with_capacity(d.segs.len()),
        fault: 0,
    };
    if d.cs.control & control::OP_MASK != control::OP_SENDRECV {
        pd.fault |= status::FORMAT_ERROR;
    }
    for s in &d.segs {
        match check_local(nic, s, ptag) {
            Ok(snap) => pd.segs.push((s.data.bits - snap.va, s.length, s.handle)),
            Err(st) => pd.fault |= st,
        }
    }
    pd
}
