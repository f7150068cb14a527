//! Completion: the one writer of completions into user descriptors, then
//! the CQ entry, then the wakeups.
//!
//! Order matters: the descriptor's `Status` is stored last with Release, so
//! a program that sees `DONE` (in `Vip*Done` or by spinning on memory) also
//! sees the data, `Length` and `ImmediateData`. The CQ entry follows the
//! status, so `VipCQDone` followed by `VipRecvDone` always finds the
//! descriptor done. Wakeups come last and cost one fence and one load when
//! nobody sleeps.
//!
//! Every completion of every kind of NIC goes through [`write`] (a
//! descriptor whose control segment is mapped: the common case) or
//! [`write_in_region`] (any registered descriptor, including one of a peer
//! whose memory this process maps); [`StatusLoc`] is where the posting path
//! found a descriptor's control segment.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use doorbell::EventCount;

use crate::backend::{CqSignals, ViSignals};
use crate::cq::entry;
use crate::descriptor::offsets;
use crate::mem::region::{Fault, Resolved};
use crate::nic::{AsyncError, ErrorCode, NicInner, ResourceCode};
use crate::shm::mapping::{Block, Mapping};
use crate::vi::{ViCore, Which};

/// Bits of a VI's `interest` word.
pub mod interest {
    /// A Notify handler waits on the receive queue.
    pub const RECV_NOTIFY: u32 = 1;
    /// A Notify handler waits on the send queue.
    pub const SEND_NOTIFY: u32 = 2;
}

/// Writes a completion into the control segment at `at` of `m`: `imm` and
/// `len` first, then `status` (Release).
#[inline(always)]
pub(crate) fn write(m: &Mapping, at: usize, status: u32, len: Option<u32>, imm: Option<u32>) {
    // The whole control segment through one bounds check (it always lies
    // in the mapping: whoever found `at` checked 32 bytes).
    match m.slice::<AtomicU32>(at, 8) {
        Some(cs) => write_words_of(cs, status, len, imm),
        None => write_words(m, at, status, len, imm),
    }
}

/// [`write`] into the words `cs` of a control segment.
#[inline(always)]
fn write_words_of(cs: &[AtomicU32], status: u32, len: Option<u32>, imm: Option<u32>) {
    if let Some(i) = imm {
        cs[offsets::IMMEDIATE_DATA / 4].store(i, Ordering::Relaxed);
    }
    if let Some(l) = len {
        cs[offsets::LENGTH / 4].store(l, Ordering::Relaxed);
    }
    // Release: the data and the words above happen before a reader that
    // sees this status with Acquire (VipRecvDone, or a program spinning on
    // memory).
    cs[offsets::STATUS / 4].store(status, Ordering::Release);
}

/// [`write`] word by word (each store checked on its own).
#[cold]
fn write_words(m: &Mapping, at: usize, status: u32, len: Option<u32>, imm: Option<u32>) {
    if let Some(i) = imm {
        m.store_u32(at + offsets::IMMEDIATE_DATA, i, Ordering::Relaxed);
    }
    if let Some(l) = len {
        m.store_u32(at + offsets::LENGTH, l, Ordering::Relaxed);
    }
    // Release: as in `write`.
    m.store_u32(at + offsets::STATUS, status, Ordering::Release);
}

/// Writes a completion into the descriptor at `va` of region `r` (which
/// may be a peer's): [`write`] when the control segment lies in one mapped
/// extent, else word by word, the status last.
///
/// # Errors
/// The fault if a word cannot be written (the region no longer covers it,
/// or cross-memory attach failed).
#[inline(always)]
pub(crate) fn write_in_region(
    r: &Resolved,
    va: u64,
    status: u32,
    len: Option<u32>,
    imm: Option<u32>,
) -> Result<(), Fault> {
    if let Some((m, at)) = r.span(va, 32) {
        write(m, at, status, len, imm);
        return Ok(());
    }
    write_in_region_words(r, va, status, len, imm)
}

/// [`write_in_region`] word by word (the control segment straddles
/// extents, or the region is reached by cross-memory attach).
#[cold]
fn write_in_region_words(
    r: &Resolved,
    va: u64,
    status: u32,
    len: Option<u32>,
    imm: Option<u32>,
) -> Result<(), Fault> {
    if let Some(i) = imm {
        r.store_relaxed(va + offsets::IMMEDIATE_DATA as u64, i)?;
    }
    if let Some(l) = len {
        r.store_relaxed(va + offsets::LENGTH as u64, l)?;
    }
    r.store_release(va + offsets::STATUS as u64, status)
}

/// Where a descriptor's control segment lives, resolved once at post time.
#[derive(Clone)]
pub(crate) enum StatusLoc {
    /// The control segment in a shadow mapping, checked once.
    Map(Block),
    /// Virtual address of the descriptor (cross-memory attach on ourselves).
    Cma(i32, u64),
}

impl Default for StatusLoc {
    /// No descriptor (address 0 of no process).
    fn default() -> Self {
        StatusLoc::Cma(0, 0)
    }
}

impl StatusLoc {
    /// The location of the control segment at `va` of `region`.
    pub fn of(region: &Resolved, va: u64) -> StatusLoc {
        match region
            .control_segment(va)
            .and_then(|(m, at)| Block::new(&m, at))
        {
            Some(b) => StatusLoc::Map(b),
            None => StatusLoc::Cma(region.pid, va),
        }
    }

    /// Becomes offset `at` of mapping `m`, changing no reference count when
    /// it is already in `m` (the common case: a work queue's slot reused for
    /// the next descriptor of the same region). False if the 32 bytes at
    /// `at` are not in `m` (whoever found `at` checked that they are).
    #[inline(always)]
    pub fn set_map(&mut self, m: &Arc<Mapping>, at: usize) -> bool {
        match self {
            StatusLoc::Map(b) => b.set(m, at),
            StatusLoc::Cma(..) => match Block::new(m, at) {
                Some(b) => {
                    *self = StatusLoc::Map(b);
                    true
                }
                None => false,
            },
        }
    }

    /// Moves the location into a library-owned copy of the control
    /// segment if it lies in one of `windows` (borrowed windows of a
    /// registration that goes away): the application may unmap that
    /// memory next, and the descriptor, still posted, must stay readable
    /// and completable. True if it moved. Reads the segment as it is now
    /// without trusting the memory to be mapped (cross-memory attach on
    /// ourselves; zeros if it is gone already).
    pub fn detach(&mut self, windows: &[Arc<Mapping>], pid: i32, va: u64) -> bool {
        let StatusLoc::Map(b) = self else {
            return false;
        };
        if !windows.iter().any(|w| Arc::ptr_eq(w, b.mapping())) {
            return false;
        }
        let mut cs = [0u8; 32];
        let _ = crate::sys::process_vm_read(pid, &mut cs, va);
        let Ok(copy) = Mapping::anonymous(cs.len()) else {
            // No memory for a copy: a location that reads through the
            // kernel, which fails cleanly once the memory is gone.
            *self = StatusLoc::Cma(pid, va);
            return true;
        };
        let copy = Arc::new(copy);
        copy.write(0, &cs);
        match Block::new(&copy, 0) {
            Some(b) => *self = StatusLoc::Map(b),
            None => *self = StatusLoc::Cma(pid, va),
        }
        true
    }

    /// Reads `CS.Status` (Acquire).
    #[inline(always)]
    pub fn status(&self) -> u32 {
        match self {
            // Acquire: pairs with the Release store of the completer.
            StatusLoc::Map(b) => b.words()[offsets::STATUS / 4].load(Ordering::Acquire),
            StatusLoc::Cma(pid, va) => {
                let mut b = [0u8; 4];
                let _ = crate::sys::process_vm_read(*pid, &mut b, va + offsets::STATUS as u64);
                u32::from_ne_bytes(b)
            }
        }
    }

    /// Clears `CS.Status` at post time, so that polling the descriptor in
    /// memory is meaningful from then on.
    #[inline]
    pub fn clear(&self) {
        match self {
            // Release as every status store (`write`); the post that follows
            // publishes the descriptor with Release too.
            StatusLoc::Map(b) => b.words()[offsets::STATUS / 4].store(0, Ordering::Release),
            StatusLoc::Cma(..) => self.complete(0, None, None),
        }
    }

    /// Writes a completion: `imm` and `len` first, then `status`.
    pub fn complete(&self, status: u32, len: Option<u32>, imm: Option<u32>) {
        match self {
            StatusLoc::Map(b) => write_words_of(b.words(), status, len, imm),
            StatusLoc::Cma(pid, va) => {
                let words = [
                    (offsets::IMMEDIATE_DATA, imm),
                    (offsets::LENGTH, len),
                    (offsets::STATUS, Some(status)),
                ];
                for (off, v) in words {
                    if let Some(v) = v {
                        let _ =
                            crate::sys::process_vm_write(*pid, &v.to_ne_bytes(), va + off as u64);
                    }
                }
            }
        }
    }
}

/// Wakes the waiters of queue `w` and, if a Notify handler waits on it,
/// the provider thread (`provider`).
#[inline(always)]
pub(crate) fn wake_queue(s: &ViSignals<'_>, w: Which, provider: &EventCount) {
    let bit = match w {
        Which::Send => interest::SEND_NOTIFY,
        Which::Recv => interest::RECV_NOTIFY,
    };
    s.wake(w).notify_all();
    // `notify_all` ran a light fence after the status store; this load
    // pairs with the heavy fence after the update of `interest` in
    // `ViCore::notify`.
    if s.interest.load(Ordering::Relaxed) & bit != 0 {
        provider.notify_all();
    }
}

/// Wakes `VipCQWait` sleepers and the provider if a notify waits.
pub(crate) fn wake_cq(s: &CqSignals<'_>, provider: &EventCount) {
    s.wake.notify_all();
    // `notify_all` ran a light fence after the completion was published;
    // this load pairs with the heavy fence after the store in
    // `CqCore::notify`.
    if s.interest.load(Ordering::Relaxed) != 0 {
        provider.notify_all();
    }
}

/// Completes a descriptor of one of our own queues at `loc`.
pub(crate) fn local(
    nic: &NicInner,
    vi: &ViCore,
    w: Which,
    loc: &StatusLoc,
    status: u32,
    len: Option<u32>,
    imm: Option<u32>,
) {
    loc.complete(status, len, imm);
    after_local(nic, vi, w);
}

/// The CQ entry and wakeups after a completion on one of our queues.
pub(crate) fn after_local(nic: &NicInner, vi: &ViCore, w: Which) {
    after_local_with(
        nic,
        vi,
        w,
        &nic.dev.vi_signals(vi.slot),
        nic.dev.provider_wake(),
    );
}

/// [`after_local`] with the VI's signals and the provider's event count
/// already at hand (a device completing its own work). Inlined: it is
/// on the send path of every direct execution.
#[inline(always)]
pub(crate) fn after_local_with(
    nic: &NicInner,
    vi: &ViCore,
    w: Which,
    signals: &ViSignals<'_>,
    provider: &EventCount,
) {
    let cq = match w {
        Which::Send => &vi.send_cq,
        Which::Recv => &vi.recv_cq,
    };
    if let Some(cq) = cq {
        cq.push(nic, entry(vi.slot, vi.generation, w == Which::Recv));
    }
    wake_queue(signals, w, provider);
}

/// Completes our send descriptor at `desc_va` in region `desc` (`None`: it
/// was deregistered since the post, and there is nothing to write into:
/// the error callback hears `COMP_PROT` instead). For kinds of NIC that
/// complete their own sends (the soft NIC uses [`send_with`]).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn send(
    nic: &NicInner,
    vi: &ViCore,
    desc: Option<&Resolved>,
    desc_va: u64,
    status: u32,
) {
    send_with(
        nic,
        vi,
        desc,
        desc_va,
        status,
        &nic.dev.vi_signals(vi.slot),
        nic.dev.provider_wake(),
    );
}

/// [`send`] with the VI's signals and the provider's event count at hand.
#[inline]
pub(crate) fn send_with(
    nic: &NicInner,
    vi: &ViCore,
    desc: Option<&Resolved>,
    desc_va: u64,
    status: u32,
    signals: &ViSignals<'_>,
    provider: &EventCount,
) {
    match desc {
        Some(r) => {
            if write_in_region(r, desc_va, status, None, None).is_err() {
                log::warn!("VI {}: cannot write send status at {desc_va:#x}", vi.slot);
            }
            after_local_with(nic, vi, Which::Send, signals, provider);
        }
        None => {
            log::warn!(
                "VI {}: send descriptor {desc_va:#x} lost its registration",
                vi.slot
            );
            nic.report(AsyncError {
                resource: ResourceCode::Descriptor,
                code: ErrorCode::CompProt,
                vi: Some((vi.slot, vi.generation)),
                cq: None,
                descriptor: desc_va,
            });
        }
    }
}
