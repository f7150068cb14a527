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
//! releasing the lock (with a SeqCst fence, so a post that raced with the
//! release is never stranded). No thread spins on behalf of the engine: on
//! 2 cores a polling ping-pong already uses both. Thread progress
//! (`VIA_PROGRESS=thread`): an engine thread sleeps on the doorbell's event
//! count and posters ring it.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering, fence};
use std::sync::{Arc, Mutex, RwLock};

use doorbell::DoorbellMode;

use std::collections::HashMap;

use crate::backend::Device;
use crate::backend::soft::complete;
use crate::backend::soft::memory::{self, Cursor, Fault, Seg};
use crate::backend::soft::remote::PeerLink;
use crate::config::{Config, Progress};
use crate::descriptor::{control, status};
use crate::error::{Error, Result};
use crate::nic::{ErrorCode, NicInner};
use crate::shm::layout::{DOORBELL_SLOTS, MAX_SEGS, SendPd, VI_DOORBELL_SLOTS, flags, slot};
use crate::shm::rings::MappedDoorbell;
use crate::tpt;
use crate::translate::LocalSpace;
use crate::vi::ViCore;

/// A reliable-connection break found while the engine lock was held; acted
/// on after it is released (breaking takes VI locks).
struct Break {
    vi: Arc<ViCore>,
    code: ErrorCode,
    tell_peer: bool,
}

/// The engine of one NIC.
pub(crate) struct Engine {
    lock: AtomicU32,
    mode: DoorbellMode,
    progress: Progress,
    central: Option<Arc<MappedDoorbell<SendPd>>>,
    per_vi: RwLock<HashMap<u32, Arc<MappedDoorbell<SendPd>>>>,
    breaks: Mutex<Vec<Break>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    name: String,
}

impl Engine {
    /// An engine with the configured doorbells.
    pub fn new(config: &Config, session: u64, nic: u32) -> Result<Engine> {
        let name = format!("via-engine:{session}:{nic}");
        let central = match config.doorbell {
            DoorbellMode::Central => Some(Arc::new(MappedDoorbell::create(&name, DOORBELL_SLOTS).map_err(|e| {
                log::error!("cannot create the doorbell: {e}");
                Error::Resource
            })?)),
            DoorbellMode::PerVi => None,
        };
        Ok(Engine {
            lock: AtomicU32::new(0),
            mode: config.doorbell,
            progress: config.progress,
            central,
            per_vi: RwLock::new(HashMap::new()),
            breaks: Mutex::new(Vec::new()),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            name,
        })
    }

    pub(crate) fn central(&self) -> Option<&doorbell::Doorbell<SendPd>> {
        self.central.as_ref().map(|d| d.get())
    }

    pub(crate) fn threaded(&self) -> bool {
        self.progress == Progress::Thread
    }

    /// The doorbell a VI's descriptors go through.
    fn doorbell_of(&self, slot: u32) -> Option<Arc<MappedDoorbell<SendPd>>> {
        match &self.central {
            Some(c) => Some(c.clone()),
            None => self.per_vi.read().unwrap().get(&slot).cloned(),
        }
    }

    fn try_lock(&self) -> bool {
        // SeqCst: the lock word takes part in the post/release handshake
        // described in the module doc (Dekker with the doorbell contents).
        self.lock.compare_exchange(0, 1, Ordering::SeqCst, Ordering::Relaxed).is_ok()
    }

    fn unlock(&self) {
        self.lock.store(0, Ordering::SeqCst);
        // SeqCst fence: the release above is ordered before the re-check of
        // the doorbells in `kick`, pairing with the poster's push followed by
        // its SeqCst `try_lock`: either the poster gets the lock or we see
        // its descriptor.
        fence(Ordering::SeqCst);
    }

    fn has_work(&self) -> bool {
        if let Some(db) = self.central() {
            return !db.ring_view().is_empty();
        }
        self.per_vi.read().unwrap().values().any(|d| !d.get().ring_view().is_empty())
    }

    pub(crate) fn kick_inline(&self, nic: &NicInner) {
        loop {
            if !self.try_lock() {
                return;
            }
            self.drain(nic);
            self.unlock();
            self.settle(nic);
            if !self.has_work() {
                return;
            }
        }
    }

    /// Runs everything queued now, waiting for the lock if another thread
    /// holds it. After this returns no descriptor posted before the call is
    /// still in a doorbell and no engine step is in progress.
    fn drain_now(&self, nic: &NicInner) {
        let mut spins = 0u32;
        while !self.try_lock() {
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.drain(nic);
        self.unlock();
        self.settle(nic);
    }

    /// Acts on the breaks found while running.
    fn settle(&self, nic: &NicInner) {
        let breaks: Vec<Break> = std::mem::take(&mut *self.breaks.lock().unwrap());
        for b in breaks {
            b.vi.break_connection(nic, b.code, b.tell_peer, false);
        }
    }

    fn drain(&self, nic: &NicInner) {
        if let Some(db) = self.central() {
            while let Some(pd) = db.poll() {
                self.execute(nic, &pd);
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
                    self.execute(nic, &pd);
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
    }

    fn brk(&self, vi: &Arc<ViCore>, code: ErrorCode, tell_peer: bool) {
        self.breaks.lock().unwrap().push(Break {
            vi: vi.clone(),
            code,
            tell_peer,
        });
    }

    /// Runs one physical descriptor.
    fn execute(&self, nic: &NicInner, pd: &SendPd) {
        let Some(vi) = nic.vi(pd.vi, pd.vi_gen as u16) else {
            log::warn!("doorbell entry for a destroyed VI {}", pd.vi);
            return;
        };
        let op = pd.control & control::OP_MASK;
        let op_status = match op {
            control::OP_RDMAWRITE => status::OP_RDMA_WRITE,
            control::OP_RDMAREAD => status::OP_RDMA_READ,
            _ => status::OP_SEND,
        };
        let link = vi.link.read().unwrap().clone();
        let link = match link {
            Some(l) if !vi.broken.load(Ordering::Acquire) => l,
            _ => {
                complete::send(nic, &vi, pd, status::DONE | status::DESC_FLUSHED_ERROR | op_status);
                return;
            }
        };
        if pd.fault != 0 {
            complete::send(nic, &vi, pd, status::DONE | pd.fault | op_status);
            if link.reliability.is_reliable() {
                self.brk(&vi, ErrorCode::PostDesc, true);
            }
            return;
        }
        if !link.peer_alive() {
            complete::send(nic, &vi, pd, status::DONE | status::DESC_FLUSHED_ERROR | op_status);
            self.brk(&vi, ErrorCode::ConnLost, false);
            return;
        }
        let st = match op {
            control::OP_SENDRECV => self.send(nic, &vi, &link, pd),
            control::OP_RDMAWRITE => self.rdma_write(nic, &vi, &link, pd),
            _ => self.rdma_read(nic, &vi, &link, pd),
        };
        complete::send(nic, &vi, pd, status::DONE | st | op_status);
    }

    fn local_segs(&self, nic: &NicInner, pd: &SendPd) -> std::result::Result<Vec<Seg>, u32> {
        let n = (pd.seg_count as usize).min(MAX_SEGS);
        let mut v = Vec::with_capacity(n);
        for s in &pd.segs[..n] {
            let snap = nic.tpt.lookup(s.handle).ok_or(status::PROTECTION_ERROR)?;
            let off = s.va.checked_sub(snap.va).ok_or(status::PROTECTION_ERROR)?;
            if !snap.covers(s.va, s.len as u64) {
                return Err(status::PROTECTION_ERROR);
            }
            v.push(Seg {
                snap,
                off,
                len: s.len as u64,
            });
        }
        Ok(v)
    }

    /// Takes the next posted receive of the peer VI. `None` if there is none.
    fn take_receive(&self, link: &PeerLink) -> Option<u64> {
        let view = link.remote.view();
        let mut pos = link.rq_pos.load(Ordering::Relaxed);
        for _ in 0..crate::shm::layout::RQ_SLOTS {
            let s = view.rq_slot(link.vi, pos)?;
            // Acquire: pairs with the owner's Release store of POSTED, so the
            // descriptor fields read afterwards are the ones it wrote.
            let seq = s.seq.load(Ordering::Acquire);
            if seq == slot::seq(pos, slot::DONE) {
                // Completed at post time (bad descriptor) or flushed: skip.
                pos += 1;
                continue;
            }
            if seq == slot::seq(pos, slot::POSTED)
                && s.seq
                    .compare_exchange(seq, slot::seq(pos, slot::TAKEN), Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                link.rq_pos.store(pos + 1, Ordering::Relaxed);
                return Some(pos);
            }
            log::debug!("no receive at position {pos} of VI {} (seq {seq:#x})", link.vi);
            break;
        }
        link.rq_pos.store(pos, Ordering::Relaxed);
        None
    }

    /// Sender-side status when the receiver could not take a message
    /// (no receive, too short, bad receive): the table in the README.
    fn remote_failure(&self, vi: &Arc<ViCore>, link: &PeerLink, peer_code: ErrorCode) -> u32 {
        use crate::attrs::Reliability::*;
        match link.reliability {
            Unreliable => 0,
            ReliableDelivery | ReliableReception => {
                link.tell_peer(peer_code);
                self.brk(vi, ErrorCode::ConnLost, false);
                if link.reliability == ReliableReception { status::REMOTE_DESC_ERROR } else { 0 }
            }
        }
    }

    /// Delivers into the receive at `pos`: data (from `src`), then the
    /// descriptor. Returns the receive's error bits (0 = delivered).
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &self,
        nic: &NicInner,
        link: &PeerLink,
        pos: u64,
        pd: &SendPd,
        recv_op: u32,
        copy_data: bool,
        len: u32,
    ) -> std::result::Result<(), u32> {
        let view = link.remote.view();
        let s = view.rq_slot(link.vi, pos).expect("slot in range");
        let desc_handle = s.desc_handle.load(Ordering::Relaxed);
        let desc_off = s.desc_off.load(Ordering::Relaxed);
        let n = s.seg_count.load(Ordering::Relaxed) as usize;
        let desc = tpt::read(&view, desc_handle).filter(|d| desc_off.checked_add(32).is_some_and(|e| e <= d.len));
        let finish = |st: u32, len: u32| {
            // The slot is finished before the status becomes visible: once
            // the owner sees DONE it may recycle the slot.
            s.seq.store(slot::seq(pos, slot::DONE), Ordering::Release);
            if let Some(d) = &desc {
                let imm = (pd.control & control::IMMEDIATE != 0).then_some(pd.imm);
                let st = st | if imm.is_some() { status::IMMEDIATE } else { 0 };
                complete::remote_recv(&link.remote, (link.vi, link.vi_gen as u16), d, desc_off, st, len, imm);
            }
        };
        if desc.is_none() || n > MAX_SEGS {
            finish(status::DONE | recv_op | status::FORMAT_ERROR, 0);
            return Err(status::FORMAT_ERROR);
        }
        let mut dst = Vec::with_capacity(n);
        let mut cap: u64 = 0;
        for seg in &s.segs[..n] {
            let h = seg.handle.load(Ordering::Relaxed);
            let off = seg.off.load(Ordering::Relaxed);
            let l = seg.len.load(Ordering::Relaxed) as u64;
            match tpt::read(&view, h).filter(|r| off.checked_add(l).is_some_and(|e| e <= r.len)) {
                Some(snap) => dst.push(Seg { snap, off, len: l }),
                None => {
                    finish(status::DONE | recv_op | status::PROTECTION_ERROR, 0);
                    return Err(status::PROTECTION_ERROR);
                }
            }
            cap += l;
        }
        if copy_data {
            if len as u64 > cap {
                finish(status::DONE | recv_op | status::LENGTH_ERROR, 0);
                return Err(status::LENGTH_ERROR);
            }
            let local = LocalSpace {
                arenas: &nic.process.arenas,
                pid: nic.process.pid,
            };
            let mut to = Cursor::new(&*link.remote, &dst);
            let r = if pd.inline_len > 0 {
                memory::copy_from_bytes(&pd.inline[..pd.inline_len as usize], &mut to)
            } else {
                match self.local_segs(nic, pd) {
                    Ok(src) => memory::copy(&mut Cursor::new(&local, &src), &mut to, len as u64),
                    Err(_) => Err(Fault::Protection),
                }
            };
            if let Err(f) = r {
                let bit = match f {
                    Fault::Protection => status::PROTECTION_ERROR,
                    Fault::Transport => status::TRANSPORT_ERROR,
                };
                finish(status::DONE | recv_op | bit, 0);
                return Err(bit);
            }
        }
        finish(status::DONE | recv_op, len);
        Ok(())
    }

    fn send(&self, nic: &NicInner, vi: &Arc<ViCore>, link: &PeerLink, pd: &SendPd) -> u32 {
        if pd.length > link.mtu {
            return status::LENGTH_ERROR;
        }
        let Some(pos) = self.take_receive(link) else {
            return self.remote_failure(vi, link, ErrorCode::RecvqEmpty);
        };
        match self.deliver(nic, link, pos, pd, status::OP_RECEIVE, true, pd.length) {
            Ok(()) => 0,
            Err(_) => self.remote_failure(vi, link, ErrorCode::ConnLost),
        }
    }

    /// Checks an RDMA target: region live, same tag as the target VI, the
    /// enable bit on both, bytes in bounds.
    fn rdma_target(&self, link: &PeerLink, pd: &SendPd, need: u32) -> Option<Seg> {
        let view = link.remote.view();
        let tvi = view.vi(link.vi)?;
        let snap = tpt::read(&view, pd.remote_handle)?;
        let ok = tvi.flags.load(Ordering::Acquire) & need != 0
            && snap.flags & need != 0
            && snap.ptag == tvi.ptag.load(Ordering::Relaxed)
            && snap.covers(pd.remote_va, pd.length as u64);
        ok.then(|| Seg {
            snap,
            off: pd.remote_va - snap.va,
            len: pd.length as u64,
        })
    }

    fn rdma_violation(&self, vi: &Arc<ViCore>, link: &PeerLink, code: ErrorCode) -> u32 {
        // The target always hears of it; reliable connections also break.
        if link.reliability.is_reliable() {
            link.tell_peer(code);
            self.brk(vi, ErrorCode::ConnLost, false);
        } else {
            link.tell_peer(code);
        }
        status::RDMA_PROT_ERROR
    }

    fn rdma_write(&self, nic: &NicInner, vi: &Arc<ViCore>, link: &PeerLink, pd: &SendPd) -> u32 {
        if pd.length > link.mtu {
            return status::LENGTH_ERROR;
        }
        let Some(target) = self.rdma_target(link, pd, flags::RDMA_WRITE) else {
            return self.rdma_violation(vi, link, ErrorCode::RdmawProt);
        };
        // Write-with-immediate needs a receive at the target: take it first
        // so that no data lands when there is none.
        let imm_pos = if pd.control & control::IMMEDIATE != 0 {
            match self.take_receive(link) {
                Some(p) => Some(p),
                None => return self.remote_failure(vi, link, ErrorCode::RecvqEmpty),
            }
        } else {
            None
        };
        let local = LocalSpace {
            arenas: &nic.process.arenas,
            pid: nic.process.pid,
        };
        let src = match self.local_segs(nic, pd) {
            Ok(s) => s,
            Err(st) => return st,
        };
        let dst = [target];
        if let Err(f) = memory::copy(&mut Cursor::new(&local, &src), &mut Cursor::new(&*link.remote, &dst), pd.length as u64) {
            return match f {
                Fault::Protection => self.rdma_violation(vi, link, ErrorCode::RdmawProt),
                Fault::Transport => status::TRANSPORT_ERROR,
            };
        }
        if let Some(pos) = imm_pos {
            if self
                .deliver(nic, link, pos, pd, status::OP_REMOTE_RDMA_WRITE, false, pd.length)
                .is_err()
            {
                return self.remote_failure(vi, link, ErrorCode::ConnLost);
            }
        }
        0
    }

    fn rdma_read(&self, nic: &NicInner, vi: &Arc<ViCore>, link: &PeerLink, pd: &SendPd) -> u32 {
        if pd.length > link.mtu {
            return status::LENGTH_ERROR;
        }
        let Some(source) = self.rdma_target(link, pd, flags::RDMA_READ) else {
            return self.rdma_violation(vi, link, ErrorCode::RdmarProt);
        };
        let local = LocalSpace {
            arenas: &nic.process.arenas,
            pid: nic.process.pid,
        };
        let dst = match self.local_segs(nic, pd) {
            Ok(s) => s,
            Err(st) => return st,
        };
        let src = [source];
        match memory::copy(&mut Cursor::new(&*link.remote, &src), &mut Cursor::new(&local, &dst), pd.length as u64) {
            Ok(()) => 0,
            Err(Fault::Protection) => status::PROTECTION_ERROR,
            Err(Fault::Transport) => status::TRANSPORT_ERROR,
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
        let central = self.central.clone();
        let t = std::thread::Builder::new()
            .name("via-engine".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let Some(nic) = weak.upgrade() else { return };
                    nic.dev.quiesce(&nic);
                    drop(nic);
                    match &central {
                        // The doorbell proper: posters ring, we sleep.
                        Some(c) => {
                            c.get().wait(None);
                        }
                        // Per-VI doorbells have no common event count: poll
                        // them with a short sleep (thread mode only).
                        None => std::thread::sleep(std::time::Duration::from_micros(50)),
                    }
                }
            })
            .expect("spawn engine thread");
        *self.thread.lock().unwrap() = Some(t);
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(db) = self.central() {
            db.event_count().notify_all();
        }
        if let Some(t) = self.thread.lock().unwrap().take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        log::debug!("{} stopped", self.name);
    }

    fn pin(&self, nic: &NicInner, range: &crate::shm::arena::UserRange) -> std::io::Result<Vec<crate::shm::arena::Extent>> {
        nic.process.arenas.pin(range)
    }

    fn unpin(&self, nic: &NicInner, extents: &[crate::shm::arena::Extent]) {
        nic.process.arenas.unpin(extents)
    }

    fn add_vi(&self, nic: &NicInner, slot: u32) -> Result<()> {
        if self.mode != DoorbellMode::PerVi {
            return Ok(());
        }
        let d = MappedDoorbell::create(&format!("via-vi-doorbell:{}:{slot}", nic.id), VI_DOORBELL_SLOTS).map_err(|e| {
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
        let db = self.doorbell_of(vi.slot).ok_or(Error::Resource)?;
        self.post(nic, db.get(), pd)
    }

    fn kick(&self, nic: &NicInner) {
        if !self.threaded() {
            self.kick_inline(nic);
        }
    }

    fn quiesce(&self, nic: &NicInner) {
        self.drain_now(nic);
    }

    fn post_recv(&self, nic: &NicInner, vi: &ViCore, pos: u64, pd: &crate::translate::RecvPd) -> Result<()> {
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
