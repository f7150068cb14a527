//! The engine: the soft NIC's "firmware", run by the process that initiates.
//!
//! It pops physical descriptors from the doorbells and runs them: a send
//! takes the next posted receive of the peer VI and copies the message into
//! it, an RDMA write or read checks the peer's translation table and copies,
//! and each completes into the user descriptors on both sides.
//!
//! Inline progress (default): whichever thread posts takes the engine lock
//! and drains the doorbells; a thread that finds the lock taken leaves its
//! descriptor to the holder, which checks the doorbells again after
//! releasing the lock. The two sides meet Dekker-style: the holder fences
//! (SeqCst) between its release and the re-check, the poster fences between
//! its push and a second `try_lock`, so a post that raced with the release
//! is never stranded. The lock also guards the engine's caches (translations
//! of local and peer regions), so the data path takes no other lock for
//! them. No thread spins on behalf of the engine: on
//! 2 cores a polling ping-pong already uses both. Thread progress
//! (`VIA_PROGRESS=thread`): an engine thread sleeps on the doorbell's event
//! count and posters ring it.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError};

use doorbell::DoorbellMode;

use std::collections::HashMap;

use crate::backend::soft::complete;
use crate::backend::soft::memory::{self, Cursor, EMPTY, Fault, Seg};
use crate::backend::soft::remote::PeerLink;
use crate::backend::soft::tcache::{Regions, Use};
use crate::backend::{Device, Pinned};
use crate::config::{Config, Progress};
use crate::descriptor::{control, status};
use crate::error::{Error, Result};
use crate::nic::{ErrorCode, NicInner};
use crate::shm::layout::{DOORBELL_SLOTS, MAX_SEGS, SendPd, VI_DOORBELL_SLOTS, flags, slot};
use crate::shm::rings::MappedDoorbell;
use crate::tpt;
use crate::vi::ViCore;

/// A reliable-connection break found while the engine lock was held; acted
/// on after it is released (breaking takes VI locks).
struct Break {
    vi: (u32, u16),
    code: ErrorCode,
    tell_peer: bool,
}

/// The engine's view of each VI's connection, validated by the VI's link
/// epoch (one load) instead of taking the link lock per descriptor.
/// Tearing a connection down bumps the epoch and then waits for the engine
/// lock (`Device::quiesce`), so no descriptor runs on a stale link.
#[derive(Default)]
struct Links {
    slots: Vec<Option<CachedLink>>,
}

/// (VI generation, link epoch, link).
type CachedLink = (u16, u32, Option<Arc<PeerLink>>);

impl Links {
    fn get(&mut self, vi: &ViCore) -> Option<&PeerLink> {
        let epoch = vi.link_epoch();
        let i = vi.slot as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        let fresh = matches!(&self.slots[i], Some((g, e, _)) if *g == vi.generation && *e == epoch);
        if !fresh {
            self.slots[i] = Some((vi.generation, epoch, vi.link.read().unwrap().clone()));
        }
        self.slots[i].as_ref().and_then(|(_, _, l)| l.as_deref())
    }
}

/// What the engine keeps between descriptors; guarded by the engine lock.
struct EngineState {
    regions: Regions,
    links: Links,
    /// Connection breaks found while running, acted on after the lock is
    /// released (breaking takes VI locks).
    breaks: Vec<Break>,
}

/// One descriptor being run.
struct Op<'a> {
    nic: &'a NicInner,
    vi: &'a ViCore,
    link: &'a PeerLink,
    pd: &'a SendPd,
    regions: &'a mut Regions,
    breaks: &'a mut Vec<Break>,
    /// The initiator's status when a transfer stopped because a region was
    /// deregistered under it.
    cut: Option<u32>,
}

/// A filler for unused slots of segment arrays.
const NO_SEG: Seg<'static> = Seg {
    region: &EMPTY,
    va: 0,
    len: 0,
};

impl Op<'_> {
    fn brk(&mut self, code: ErrorCode, tell_peer: bool) {
        self.breaks.push(Break {
            vi: (self.vi.slot, self.vi.generation),
            code,
            tell_peer,
        });
    }

    /// Indices of the regions of the local segments; the error status if
    /// one is no longer registered or no longer covers its segment.
    fn local_regions(&mut self, idx: &mut [usize; MAX_SEGS]) -> std::result::Result<usize, u32> {
        let n = (self.pd.seg_count as usize).min(MAX_SEGS);
        for i in 0..n {
            let s = &self.pd.segs[i];
            let j = match i.checked_sub(1) {
                Some(p) if self.regions.get(idx[p]).handle == s.handle => idx[p],
                _ => self
                    .regions
                    .local(&self.nic.tpt, s.handle, Use::Send)
                    .ok_or(status::PROTECTION_ERROR)?,
            };
            if !self.regions.get(j).covers(s.va, s.len as u64) {
                return Err(status::PROTECTION_ERROR);
            }
            idx[i] = j;
        }
        Ok(n)
    }

    /// Takes the next posted receive of the peer VI. `None` if there is none.
    fn take_receive(&self) -> Option<u64> {
        let link = self.link;
        let view = link.remote.view();
        let mut pos = link.rq_pos.load(Ordering::Relaxed);
        for _ in 0..crate::shm::layout::RQ_SLOTS {
            let s = view.rq_slot(link.vi, pos)?;
            // Claim it directly (one ownership transfer of the line instead
            // of a read and then an upgrade). Acquire: pairs with the owner's
            // Release store of POSTED, so the descriptor fields read
            // afterwards are the ones it wrote.
            let seq = match s.seq.compare_exchange(
                slot::seq(pos, slot::POSTED),
                slot::seq(pos, slot::TAKEN),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    link.rq_pos.store(pos + 1, Ordering::Relaxed);
                    return Some(pos);
                }
                Err(seq) => seq,
            };
            if seq == slot::seq(pos, slot::DONE) {
                // Completed at post time (bad descriptor) or flushed: skip.
                pos += 1;
                continue;
            }
            log::debug!(
                "no receive at position {pos} of VI {} (seq {seq:#x})",
                link.vi
            );
            break;
        }
        link.rq_pos.store(pos, Ordering::Relaxed);
        None
    }

    /// Sender-side status when the receiver could not take a message
    /// (no receive, too short, bad receive): the table in the README.
    fn remote_failure(&mut self, peer_code: ErrorCode) -> u32 {
        use crate::attrs::Reliability::*;
        match self.link.reliability {
            Unreliable => 0,
            ReliableDelivery | ReliableReception => {
                self.link.tell_peer(peer_code);
                self.brk(ErrorCode::ConnLost, false);
                if self.link.reliability == ReliableReception {
                    status::REMOTE_DESC_ERROR
                } else {
                    0
                }
            }
        }
    }

    /// Delivers into the receive at `pos`: data (from the local segments or
    /// the inline payload, if `copy_data`), then the descriptor. Returns the
    /// receive's error bits (0 = delivered).
    fn deliver(
        &mut self,
        pos: u64,
        recv_op: u32,
        copy_data: bool,
        len: u32,
    ) -> std::result::Result<(), u32> {
        let (link, pd) = (self.link, self.pd);
        let view = link.remote.view();
        let s = view.rq_slot(link.vi, pos).expect("slot in range");
        let desc_handle = s.desc_handle.load(Ordering::Relaxed);
        let desc_off = s.desc_off.load(Ordering::Relaxed);
        let n = s.seg_count.load(Ordering::Relaxed) as usize;
        // Mutable phase: find every region (indices stay valid).
        let lv = self.nic.tpt.version();
        let desc_i = self
            .regions
            .remote(&link.remote, desc_handle, lv, Use::Recv);
        let mut fault = if n > MAX_SEGS {
            status::FORMAT_ERROR
        } else {
            0
        };
        let mut dst_i = [0usize; MAX_SEGS];
        let mut cap: u64 = 0;
        if fault == 0 && copy_data {
            for i in 0..n {
                let h = s.segs[i].handle.load(Ordering::Relaxed);
                let prev = i.checked_sub(1).map(|p| dst_i[p]).or(desc_i);
                let j = match prev {
                    Some(p) if self.regions.get(p).handle == h => Some(p),
                    _ => self.regions.remote(&link.remote, h, lv, Use::Recv),
                };
                let off = s.segs[i].off.load(Ordering::Relaxed);
                let l = s.segs[i].len.load(Ordering::Relaxed) as u64;
                match j.filter(|&j| {
                    off.checked_add(l)
                        .is_some_and(|e| e <= self.regions.get(j).len)
                }) {
                    Some(j) => dst_i[i] = j,
                    None => {
                        fault = status::PROTECTION_ERROR;
                        break;
                    }
                }
                cap += l;
            }
            if fault == 0 && len as u64 > cap {
                fault = status::LENGTH_ERROR;
            }
        }
        let mut src_i = [0usize; MAX_SEGS];
        let src_n = if fault == 0 && copy_data && pd.inline_len == 0 {
            match self.local_regions(&mut src_i) {
                Ok(m) => m,
                Err(_) => {
                    fault = status::PROTECTION_ERROR;
                    0
                }
            }
        } else {
            0
        };
        // Immutable phase: move the bytes, then complete.
        let regions = &*self.regions;
        let desc = desc_i.map(|i| regions.get(i));
        let desc_va = desc.and_then(|d| d.va.checked_add(desc_off)).unwrap_or(0);
        let desc = desc.filter(|d| d.covers(desc_va, 32));
        if desc.is_none() {
            fault = status::FORMAT_ERROR;
        }
        if fault == 0 && copy_data {
            let nic = self.nic;
            let dst_handles: [u32; MAX_SEGS] = std::array::from_fn(|i| {
                if i < n {
                    regions.get(dst_i[i]).handle
                } else {
                    0
                }
            });
            let mut still =
                || still_registered(nic, link, pd, &dst_handles[..n], status::REMOTE_DESC_ERROR);
            fault = match move_fast(regions, s, &dst_i, n, pd, &src_i, src_n, len) {
                Some(r) => r,
                None => move_general(regions, s, &dst_i, n, pd, &src_i, src_n, len, &mut still),
            };
            if fault & CUT != 0 {
                // Stopped at a chunk boundary: the receive failed, and the
                // initiator hears why (never DONE).
                self.cut = Some(fault & !CUT);
                fault = status::PROTECTION_ERROR;
            }
        }
        // The owner may have deregistered the receive descriptor's memory:
        // nothing is written into it then.
        let desc = desc.filter(|d| crate::tpt::is_live(&view, d.handle));
        // The slot is finished before the status becomes visible: once the
        // owner sees DONE it may recycle the slot.
        s.seq.store(slot::seq(pos, slot::DONE), Ordering::Release);
        if let Some(d) = desc {
            let imm = (pd.control & control::IMMEDIATE != 0).then_some(pd.imm);
            let st =
                status::DONE | recv_op | fault | if imm.is_some() { status::IMMEDIATE } else { 0 };
            let got = if fault == 0 { len } else { 0 };
            complete::remote_recv(
                &link.remote,
                (link.vi, link.vi_gen as u16),
                d,
                desc_va,
                st,
                got,
                imm,
            );
        }
        if fault == 0 { Ok(()) } else { Err(fault) }
    }

    fn send(&mut self) -> u32 {
        if self.pd.length > self.link.mtu {
            return status::LENGTH_ERROR;
        }
        let Some(pos) = self.take_receive() else {
            return self.remote_failure(ErrorCode::RecvqEmpty);
        };
        match self.deliver(pos, status::OP_RECEIVE, true, self.pd.length) {
            Ok(()) => 0,
            Err(_) => {
                let st = self.remote_failure(ErrorCode::ConnLost);
                self.cut.take().unwrap_or(st)
            }
        }
    }

    /// Checks an RDMA target: region live, same tag as the target VI, the
    /// enable bit on both, bytes in bounds. Returns its index.
    fn rdma_target(&mut self, need: u32) -> Option<usize> {
        let (link, pd) = (self.link, self.pd);
        let view = link.remote.view();
        let tvi = view.vi(link.vi)?;
        let lv = self.nic.tpt.version();
        let i = self
            .regions
            .remote(&link.remote, pd.remote_handle, lv, Use::Rdma)?;
        let r = self.regions.get(i);
        let ok = tvi.flags.load(Ordering::Acquire) & need != 0
            && r.flags & need != 0
            && r.ptag == tvi.ptag.load(Ordering::Relaxed)
            && r.covers(pd.remote_va, pd.length as u64);
        ok.then_some(i)
    }

    fn rdma_violation(&mut self, code: ErrorCode) -> u32 {
        // The target always hears of it; reliable connections also break.
        self.link.tell_peer(code);
        if self.link.reliability.is_reliable() {
            self.brk(ErrorCode::ConnLost, false);
        }
        status::RDMA_PROT_ERROR
    }

    /// Copies between the local segments and the peer region at index
    /// `far` (`to_remote`: RDMA write; else RDMA read).
    fn rdma_copy(&mut self, far: usize, to_remote: bool) -> std::result::Result<(), u32> {
        let mut idx = [0usize; MAX_SEGS];
        let m = self.local_regions(&mut idx)?;
        let (nic, link, pd) = (self.nic, self.link, self.pd);
        let regions = &*self.regions;
        let far_handle = [regions.get(far).handle];
        let mut still = || still_registered(nic, link, pd, &far_handle, status::RDMA_PROT_ERROR);
        let mut local = [NO_SEG; MAX_SEGS];
        for i in 0..m {
            local[i] = Seg {
                region: regions.get(idx[i]),
                va: pd.segs[i].va,
                len: pd.segs[i].len as u64,
            };
        }
        let remote = [Seg {
            region: regions.get(far),
            va: pd.remote_va,
            len: pd.length as u64,
        }];
        let (mut a, mut b) = (Cursor::new(&local[..m]), Cursor::new(&remote));
        let r = if to_remote {
            memory::copy(&mut a, &mut b, pd.length as u64, &mut still)
        } else {
            memory::copy(&mut b, &mut a, pd.length as u64, &mut still)
        };
        r.map_err(|f| match f {
            Fault::Protection => status::PROTECTION_ERROR,
            Fault::Transport => status::TRANSPORT_ERROR,
            Fault::Cut(st) => st,
        })
    }

    fn rdma_write(&mut self) -> u32 {
        if self.pd.length > self.link.mtu {
            return status::LENGTH_ERROR;
        }
        let Some(target) = self.rdma_target(flags::RDMA_WRITE) else {
            return self.rdma_violation(ErrorCode::RdmawProt);
        };
        // Write-with-immediate needs a receive at the target: take it first
        // so that no data lands when there is none.
        let imm_pos = if self.pd.control & control::IMMEDIATE != 0 {
            match self.take_receive() {
                Some(p) => Some(p),
                None => return self.remote_failure(ErrorCode::RecvqEmpty),
            }
        } else {
            None
        };
        if let Err(e) = self.rdma_copy(target, true) {
            return e;
        }
        if let Some(pos) = imm_pos {
            if self
                .deliver(pos, status::OP_REMOTE_RDMA_WRITE, false, self.pd.length)
                .is_err()
            {
                return self.remote_failure(ErrorCode::ConnLost);
            }
        }
        0
    }

    fn rdma_read(&mut self) -> u32 {
        if self.pd.length > self.link.mtu {
            return status::LENGTH_ERROR;
        }
        let Some(source) = self.rdma_target(flags::RDMA_READ) else {
            return self.rdma_violation(ErrorCode::RdmarProt);
        };
        match self.rdma_copy(source, false) {
            Ok(()) => 0,
            Err(st) => st,
        }
    }
}

/// The engine of one NIC.
pub(crate) struct Engine {
    state: Mutex<EngineState>,
    mode: DoorbellMode,
    progress: Progress,
    central: Option<MappedDoorbell<SendPd>>,
    per_vi: RwLock<HashMap<u32, Arc<MappedDoorbell<SendPd>>>>,
    /// Where the engine thread sleeps (thread progress); posters notify it
    /// after pushing into any doorbell.
    wake: Arc<doorbell::EventCount>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    name: String,
    /// A direct execution (in `post_send`) left connection breaks to settle.
    breaks_waiting: AtomicBool,
}

impl Engine {
    /// An engine with the configured doorbells.
    pub fn new(config: &Config, session: u64, nic: u32) -> Result<Engine> {
        let name = format!("via-engine:{session}:{nic}");
        let central = match config.doorbell {
            DoorbellMode::Central => {
                Some(MappedDoorbell::create(&name, DOORBELL_SLOTS).map_err(|e| {
                    log::error!("cannot create the doorbell: {e}");
                    Error::Resource
                })?)
            }
            DoorbellMode::PerVi => None,
        };
        Ok(Engine {
            state: Mutex::new(EngineState {
                regions: Regions::new(config.tcache_entries, config.tcache_ways),
                links: Links::default(),
                breaks: Vec::new(),
            }),
            mode: config.doorbell,
            progress: config.progress,
            central,
            per_vi: RwLock::new(HashMap::new()),
            wake: Arc::new(doorbell::EventCount::new()),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            name,
            breaks_waiting: AtomicBool::new(false),
        })
    }

    pub(crate) fn central(&self) -> Option<&doorbell::Doorbell<SendPd>> {
        self.central.as_ref().map(|d| d.get())
    }

    /// Wakes the engine thread (thread progress) after a push.
    pub(crate) fn wake_engine(&self) {
        self.wake.notify_all();
    }

    pub(crate) fn threaded(&self) -> bool {
        self.progress == Progress::Thread
    }

    fn try_lock(&self) -> Option<MutexGuard<'_, EngineState>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            // A panic inside the engine poisoned the lock; the state is only
            // caches and pending breaks, so carry on with it.
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    pub(crate) fn pending(&self) -> bool {
        if let Some(db) = self.central() {
            return !db.ring_view().is_empty();
        }
        self.per_vi
            .read()
            .unwrap()
            .values()
            .any(|d| !d.get().ring_view().is_empty())
    }

    /// Runs the engine unless another thread does. `hint` is the VI that
    /// just posted (saves looking it up).
    pub(crate) fn kick_inline(&self, nic: &NicInner, hint: Option<&ViCore>) {
        loop {
            let mut g = match self.try_lock() {
                Some(g) => g,
                None => {
                    // SeqCst fence: our push is ordered before the second
                    // look at the lock; pairs with the holder's fence after
                    // its release (see the module doc).
                    fence(Ordering::SeqCst);
                    match self.try_lock() {
                        Some(g) => g,
                        None => return,
                    }
                }
            };
            self.drain(nic, &mut g, hint);
            let breaks = std::mem::take(&mut g.breaks);
            self.breaks_waiting.store(false, Ordering::Relaxed);
            drop(g);
            // SeqCst fence: the release above is ordered before the re-check
            // below; pairs with the poster's fence.
            fence(Ordering::SeqCst);
            settle(nic, breaks);
            if !self.pending() {
                return;
            }
        }
    }

    /// Runs everything queued now, waiting for the lock if another thread
    /// holds it. After this returns no descriptor posted before the call is
    /// still in a doorbell and no engine step is in progress.
    fn drain_now(&self, nic: &NicInner) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.drain(nic, &mut g, None);
        self.release(nic, g);
    }

    /// Releases the engine lock like every holder must: fence, act on the
    /// breaks found, and run what was posted while the lock was held (its
    /// poster saw the lock taken and left the descriptor to us).
    fn release(&self, nic: &NicInner, mut g: MutexGuard<'_, EngineState>) {
        let breaks = std::mem::take(&mut g.breaks);
        self.breaks_waiting.store(false, Ordering::Relaxed);
        drop(g);
        // SeqCst fence: the release above is ordered before the re-check
        // below; pairs with the poster's fence (module doc).
        fence(Ordering::SeqCst);
        settle(nic, breaks);
        if self.pending() {
            if self.threaded() {
                self.wake_engine();
            } else {
                self.kick_inline(nic, None);
            }
        }
    }

    fn drain(&self, nic: &NicInner, st: &mut EngineState, hint: Option<&ViCore>) {
        if let Some(db) = self.central() {
            while let Some(pd) = db.poll() {
                execute(nic, st, &pd, hint);
            }
            return;
        }
        // Per-VI doorbells: poll every VI's ring (the D1 design: the cost
        // grows with the number of VIs).
        let dbs: Vec<_> = self.per_vi.read().unwrap().values().cloned().collect();
        loop {
            let mut any = false;
            for d in &dbs {
                while let Some(pd) = d.get().poll() {
                    execute(nic, st, &pd, hint);
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
    }
}

/// Moves one segment to one segment when both lie in one arena each (the
/// common case): a single `memcpy`. `None` if the case does not apply.
#[allow(clippy::too_many_arguments)]
fn move_fast(
    regions: &Regions,
    slot: &crate::shm::layout::RecvSlot,
    dst_i: &[usize; MAX_SEGS],
    n: usize,
    pd: &SendPd,
    src_i: &[usize; MAX_SEGS],
    src_n: usize,
    len: u32,
) -> Option<u32> {
    if n != 1 || (pd.inline_len == 0 && src_n != 1) || len as u64 > memory::CHUNK {
        return None;
    }
    let dr = regions.get(dst_i[0]);
    let (dm, dat) = dr.span(dr.va + slot.segs[0].off.load(Ordering::Relaxed), len as u64)?;
    let ok = if pd.inline_len > 0 {
        dm.write(dat, &pd.inline[..pd.inline_len as usize])
    } else {
        let (sm, sat) = regions.get(src_i[0]).span(pd.segs[0].va, len as u64)?;
        crate::shm::mapping::Mapping::copy(sm, sat, dm, dat, len as usize)
    };
    Some(if ok { 0 } else { status::PROTECTION_ERROR })
}

/// Moves a scatter/gather message chunk by chunk. Returns the error bits.
#[allow(clippy::too_many_arguments)]
fn move_general(
    regions: &Regions,
    slot: &crate::shm::layout::RecvSlot,
    dst_i: &[usize; MAX_SEGS],
    n: usize,
    pd: &SendPd,
    src_i: &[usize; MAX_SEGS],
    src_n: usize,
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
    let r = if pd.inline_len > 0 {
        memory::copy_from_bytes(&pd.inline[..pd.inline_len as usize], &mut to)
    } else {
        let mut src = [NO_SEG; MAX_SEGS];
        for i in 0..src_n {
            src[i] = Seg {
                region: regions.get(src_i[i]),
                va: pd.segs[i].va,
                len: pd.segs[i].len as u64,
            };
        }
        memory::copy(&mut Cursor::new(&src[..src_n]), &mut to, len as u64, still)
    };
    match r {
        Ok(()) => 0,
        Err(Fault::Protection) => status::PROTECTION_ERROR,
        Err(Fault::Transport) => status::TRANSPORT_ERROR,
        Err(Fault::Cut(st)) => CUT | st,
    }
}

/// Marks a `move_general` result that stopped at a chunk boundary (the
/// status bits that follow are for the initiator).
const CUT: u32 = 1 << 31;

/// Whether every region of a running transfer is still registered: the
/// local segments of `pd`, and `remote` in the peer's table. `None` if so,
/// else the initiator's status (`remote_status` when the peer's region
/// went).
fn still_registered(
    nic: &NicInner,
    link: &PeerLink,
    pd: &SendPd,
    remote: &[u32],
    remote_status: u32,
) -> Option<u32> {
    let own = nic.view();
    let n = (pd.seg_count as usize).min(MAX_SEGS);
    if pd.inline_len == 0 && pd.segs[..n].iter().any(|s| !tpt::is_live(&own, s.handle)) {
        return Some(status::PROTECTION_ERROR);
    }
    let far = link.remote.view();
    if remote.iter().any(|&h| !tpt::is_live(&far, h)) {
        return Some(remote_status);
    }
    None
}

/// Completes the send descriptor of `pd` (its region looked up through the
/// engine's cache).
fn complete_send(nic: &NicInner, regions: &mut Regions, vi: &ViCore, pd: &SendPd, status: u32) {
    let r = regions
        .local(&nic.tpt, pd.desc_handle, Use::Send)
        .map(|i| regions.get(i))
        .filter(|r| r.covers(pd.desc_va, 32));
    complete::send(nic, vi, pd, r, status);
}

/// Runs one physical descriptor.
fn execute(nic: &NicInner, st: &mut EngineState, pd: &SendPd, hint: Option<&ViCore>) {
    let found;
    let vi: &ViCore = match hint {
        Some(h) if h.slot == pd.vi && h.generation as u32 == pd.vi_gen => h,
        _ => match nic.vi(pd.vi, pd.vi_gen as u16) {
            Some(v) => {
                found = v;
                &found
            }
            None => {
                log::warn!("doorbell entry for a destroyed VI {}", pd.vi);
                return;
            }
        },
    };
    let op = pd.control & control::OP_MASK;
    let op_status = match op {
        control::OP_RDMAWRITE => status::OP_RDMA_WRITE,
        control::OP_RDMAREAD => status::OP_RDMA_READ,
        _ => status::OP_SEND,
    };
    let EngineState {
        regions,
        links,
        breaks,
    } = st;
    let link = match links.get(vi) {
        Some(l) if !vi.broken.load(Ordering::Acquire) => l,
        _ => {
            complete_send(
                nic,
                regions,
                vi,
                pd,
                status::DONE | status::DESC_FLUSHED_ERROR | op_status,
            );
            regions.trim();
            return;
        }
    };
    let mut o = Op {
        nic,
        vi,
        link,
        pd,
        regions,
        breaks,
        cut: None,
    };
    // Inside the operation for the peer's deregistration path: it waits
    // for this epoch to move before `VipDeregisterMem` returns.
    let access = link.begin_access();
    let r = if pd.fault != 0 {
        if link.reliability.is_reliable() {
            o.brk(ErrorCode::PostDesc, true);
        }
        pd.fault
    } else if !link.peer_alive() {
        o.brk(ErrorCode::ConnLost, false);
        status::DESC_FLUSHED_ERROR
    } else {
        match op {
            control::OP_SENDRECV => o.send(),
            control::OP_RDMAWRITE => o.rdma_write(),
            _ => o.rdma_read(),
        }
    };
    link.end_access(access);
    complete_send(nic, o.regions, vi, pd, status::DONE | r | op_status);
    o.regions.trim();
}

/// Acts on the connection breaks found while running.
fn settle(nic: &NicInner, breaks: Vec<Break>) {
    for b in breaks {
        if let Some(vi) = nic.vi(b.vi.0, b.vi.1) {
            vi.break_connection(nic, b.code, b.tell_peer, false);
        }
    }
}

impl Device for Engine {
    fn kind(&self) -> &'static str {
        "soft"
    }

    fn start(&self, nic: &Arc<NicInner>) {
        if !self.threaded() {
            return;
        }
        let weak = Arc::downgrade(nic);
        let stop = self.stop.clone();
        let sleeper = self.wake.clone();
        let t = std::thread::Builder::new()
            .name("via-engine".into())
            .spawn(move || {
                loop {
                    // Register as a sleeper before the last look, so that a
                    // post landing after it wakes us (eventcount handshake).
                    let key = sleeper.prepare_wait();
                    // SeqCst: pairs with the store in `stop` (same handshake).
                    if stop.load(Ordering::SeqCst) {
                        sleeper.cancel_wait(key);
                        return;
                    }
                    let Some(nic) = weak.upgrade() else {
                        sleeper.cancel_wait(key);
                        return;
                    };
                    if nic.dev.has_work() {
                        sleeper.cancel_wait(key);
                        nic.dev.quiesce(&nic);
                        continue;
                    }
                    // Sleep holding no reference to the NIC.
                    drop(nic);
                    sleeper.wait(key, None);
                }
            })
            .expect("spawn engine thread");
        *self.thread.lock().unwrap() = Some(t);
    }

    fn stop(&self) {
        // SeqCst: the engine thread checks `stop` after registering as a
        // sleeper; `notify_all` below then finds it registered.
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify_all();
        if let Some(t) = self.thread.lock().unwrap().take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        log::debug!("{} stopped", self.name);
    }

    fn pin(&self, nic: &NicInner, range: &crate::mem::arena::UserRange) -> std::io::Result<Pinned> {
        // The registration path: the process's registration cache over the
        // arenas (overlapping registrations share their pinned pages). Memory
        // events read so far are applied first, so a hit never returns the
        // translation of memory the application has since unmapped.
        if let Some(m) = &nic.process.monitor {
            m.sync();
        }
        let lease = nic
            .process
            .registrations
            .acquire(range.addr(), range.len())
            .map_err(|e| match e {
                regcache::Error::Pin(e) => e,
                other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
            })?;
        Ok(Pinned {
            extents: lease.pinned().clone(),
            token: Box::new(lease),
        })
    }

    fn unpin(&self, nic: &NicInner, pinned: Pinned) {
        match pinned
            .token
            .downcast::<regcache::Lease<Vec<crate::mem::arena::Extent>>>()
        {
            Ok(lease) => nic.process.registrations.release(*lease),
            Err(_) => log::error!("unpin: not a registration of this device"),
        }
    }

    fn add_vi(&self, nic: &NicInner, slot: u32) -> Result<()> {
        if self.mode != DoorbellMode::PerVi {
            return Ok(());
        }
        let d = MappedDoorbell::create(
            &format!("via-vi-doorbell:{}:{slot}", nic.id),
            VI_DOORBELL_SLOTS,
        )
        .map_err(|e| {
            log::error!("cannot create a VI doorbell: {e}");
            Error::Resource
        })?;
        self.per_vi.write().unwrap().insert(slot, Arc::new(d));
        Ok(())
    }

    fn remove_vi(&self, slot: u32) {
        self.per_vi.write().unwrap().remove(&slot);
    }

    fn post_send(&self, nic: &NicInner, vi: &ViCore, pd: SendPd) -> Result<()> {
        // Inline progress with nothing queued: run the descriptor here, no
        // round trip through the doorbell ring (ordering holds: the VI's
        // send lock is held and nothing of it waits in a doorbell). The
        // breaks it finds are settled by the `kick` that follows the post.
        if !self.threaded() && !self.pending() {
            if let Some(mut g) = self.try_lock() {
                if !self.pending() {
                    execute(nic, &mut g, &pd, Some(vi));
                    if !g.breaks.is_empty() {
                        self.breaks_waiting.store(true, Ordering::Release);
                    }
                    return Ok(());
                }
            }
        }
        match self.central() {
            Some(db) => self.post(nic, db, pd),
            None => {
                let db = self
                    .per_vi
                    .read()
                    .unwrap()
                    .get(&vi.slot)
                    .cloned()
                    .ok_or(Error::Resource)?;
                self.post(nic, db.get(), pd)
            }
        }
    }

    fn kick(&self, nic: &NicInner, vi: Option<&ViCore>) {
        if self.threaded() {
            return;
        }
        // SeqCst fence: whatever was posted before this point (by us, or a
        // poster that found the engine lock taken by our direct execution)
        // is seen below; pairs with the poster's fence in `kick_inline`.
        fence(Ordering::SeqCst);
        if self.pending() || self.breaks_waiting.load(Ordering::Acquire) {
            self.kick_inline(nic, vi);
        }
    }

    fn quiesce(&self, nic: &NicInner) {
        self.drain_now(nic);
    }

    fn translation_stats(&self) -> Option<crate::backend::soft::tcache::TranslationStats> {
        Some(
            self.state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .regions
                .cache
                .stats(),
        )
    }

    fn quiesce_light(&self, _nic: &NicInner) {
        // Every engine step holds the lock: taking it once waits for the
        // step in progress; later steps see the updated table.
        drop(self.state.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn has_work(&self) -> bool {
        self.pending()
    }

    fn peer_gone(&self, nic: &NicInner, session: u64) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        g.regions.forget(session);
        for l in g.links.slots.iter_mut() {
            if l.as_ref()
                .and_then(|(_, _, l)| l.as_ref())
                .is_some_and(|l| l.remote.session == session)
            {
                *l = None;
            }
        }
        self.release(nic, g);
    }

    fn post_recv(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        pos: u64,
        pd: &crate::translate::RecvPd,
    ) -> Result<()> {
        super::ring::offer(nic, vi.slot, pos, pd);
        Ok(())
    }

    fn skip_recv(&self, nic: &NicInner, vi: &ViCore, pos: u64) {
        super::ring::skip(nic, vi.slot, pos);
    }

    fn cancel_recv(&self, nic: &NicInner, vi: &ViCore, pos: u64, force: bool) -> bool {
        super::ring::cancel(nic, vi.slot, pos, force)
    }
}
