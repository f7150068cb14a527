//! Completion queues as the application sees them.
//!
//! A CQ merges the completions of the work queues associated with it.
//! `VipCQDone` returns (VI, which queue); the application then dequeues the
//! descriptor from that queue. Two mechanisms (`VIA_CQ`):
//!
//! * ring (CQ1): completers push an entry into a `cq::EntryRing` the device
//!   provides (for the soft NIC, a memfd peers map: their engines complete
//!   our receives);
//! * scan (CQ2): no entries; `done` scans the associated queues round robin
//!   for completions it has not reported yet.
//!
//! Either way completers wake the CQ's signals (in memory the device's
//! completers reach: the NIC segment for the soft NIC), which is where
//! `VipCQWait` sleeps.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::backend::CqSignals;
use crate::completion::{interest, wake_cq};
use crate::config::CqMode;
use crate::error::{Error, ErrorKind, Result};
use crate::nic::{MAX_CQ_ENTRIES, NicInner};
use crate::shm::rings::MappedRing;
use crate::vi::ViCore;

/// Packs a CQ entry: VI slot, generation, and whether it is the receive queue.
pub(crate) fn entry(slot: u32, generation: u16, recv: bool) -> u64 {
    (slot as u64 & 0xffff) | ((generation as u64) << 16) | ((recv as u64) << 32)
}

/// Unpacks a CQ entry.
pub(crate) fn unpack(e: u64) -> (u32, u16, bool) {
    ((e & 0xffff) as u32, (e >> 16) as u16, (e >> 32) & 1 == 1)
}

/// A CQ notify handler: runs once with the VI and the queue kind.
pub(crate) type CqHandler = Box<dyn FnOnce(Arc<ViCore>, bool) + Send>;

/// What a scanning CQ (CQ2) keeps between calls: the scan's position and
/// its work queues as probes, rebuilt only when the members change (not on
/// every `VipCQDone`).
#[derive(Default)]
struct ScanState {
    scan: cq::Scan,
    probes: Vec<crate::vi::QueueProbe>,
    version: u64,
}

/// A completion queue.
pub(crate) struct CqCore {
    pub slot: u32,
    pub generation: u16,
    pub mode: CqMode,
    ring: RwLock<Option<Arc<MappedRing>>>,
    ring_gen: AtomicU32,
    limit: AtomicU32,
    members: Mutex<Vec<(Weak<ViCore>, bool)>>,
    /// Bumped whenever `members` changes.
    members_version: std::sync::atomic::AtomicU64,
    scan: Mutex<ScanState>,
    /// The slots of the member VIs as of `members_version` (the first),
    /// for a poller that lets the device progress them
    /// ([`CqCore::progress_members`]).
    member_slots: Mutex<(u64, Vec<u32>)>,
    pub notify: Mutex<VecDeque<CqHandler>>,
    /// Set once `VipDestroyCQ` succeeded (handles cached by the C layer
    /// check it).
    pub destroyed: std::sync::atomic::AtomicBool,
}

impl CqCore {
    /// `VipCreateCQ`.
    pub fn create(nic: &Arc<NicInner>, entries: u32) -> Result<Arc<CqCore>> {
        if entries == 0 || entries > MAX_CQ_ENTRIES {
            return Err(Error::InvalidParameter);
        }
        let mode = nic.process.config.cq;
        let cq = nic
            .cqs
            .write()
            .unwrap()
            .insert_with(|slot, generation| {
                Arc::new(CqCore {
                    slot,
                    generation,
                    mode,
                    ring: RwLock::new(None),
                    ring_gen: AtomicU32::new(0),
                    limit: AtomicU32::new(entries),
                    members: Mutex::new(Vec::new()),
                    members_version: std::sync::atomic::AtomicU64::new(1),
                    scan: Mutex::new(ScanState::default()),
                    member_slots: Mutex::new((0, Vec::new())),
                    notify: Mutex::new(VecDeque::new()),
                    destroyed: std::sync::atomic::AtomicBool::new(false),
                })
            })
            .cloned()
            .ok_or(Error::Resource)?;
        // Ring generations: the slot's generation in the high half (a new
        // CQ in a reused slot never names an old ring), resizes below.
        let generation = (cq.generation as u32) << 16 | 1;
        cq.signals(nic).interest.store(0, Ordering::Relaxed);
        if mode == CqMode::Ring {
            match nic.dev.cq_ring(nic, cq.slot, generation, entries) {
                Ok(r) => {
                    *cq.ring.write().unwrap() = Some(r);
                    cq.ring_gen.store(generation, Ordering::Relaxed);
                }
                Err(e) => {
                    nic.cqs.write().unwrap().remove(cq.slot, cq.generation);
                    return Err(e);
                }
            }
        }
        nic.dev.cq_state(cq.slot, mode == CqMode::Ring, generation);
        Ok(cq)
    }

    /// Where completers wake this CQ's waiters.
    pub fn signals<'a>(&self, nic: &'a NicInner) -> CqSignals<'a> {
        nic.dev.cq_signals(self.slot)
    }

    pub(crate) fn attach(&self, vi: &Arc<ViCore>, recv: bool) {
        self.members
            .lock()
            .unwrap()
            .push((Arc::downgrade(vi), recv));
        self.members_version.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn detach(&self, vi: &ViCore) {
        self.members
            .lock()
            .unwrap()
            .retain(|(w, _)| w.upgrade().is_some_and(|v| !std::ptr::eq(&*v, vi)));
        self.members_version.fetch_add(1, Ordering::AcqRel);
    }

    /// Pushes an entry for a completion on a queue of this NIC.
    pub fn push(&self, nic: &NicInner, e: u64) {
        if self.mode == CqMode::Ring {
            let ring = self.ring.read().unwrap().clone();
            if let Some(r) = ring {
                if let Err(err) = r.get().push(e) {
                    log::error!("CQ {}: {err}", self.slot);
                    nic.report(crate::nic::AsyncError {
                        resource: crate::nic::ResourceCode::Cq,
                        code: crate::nic::ErrorCode::Catastrophic,
                        vi: None,
                        cq: Some((self.slot, self.generation)),
                        descriptor: 0,
                    });
                }
            }
        }
        wake_cq(&self.signals(nic), nic.dev.provider_wake());
    }

    /// `VipCQDone`: the next (VI, is-receive-queue) with a completion; if
    /// none, lets the device progress inline once and looks again, as
    /// polling a VI does (`ViCore::done_polling`): on verbs a program that
    /// polls a CQ would otherwise wait for the progress thread to wake.
    pub fn done(&self, nic: &NicInner) -> Result<(Arc<ViCore>, bool)> {
        match self.take(nic) {
            Err(e) if e.kind() == ErrorKind::NotDone && self.progress_members(nic) => {
                self.take(nic)
            }
            r => r,
        }
    }

    /// Lets the device progress the member VIs inline ([`Device::poll_any`]),
    /// unless another thread is at it; whether it may have completed
    /// something.
    fn progress_members(&self, nic: &NicInner) -> bool {
        if !nic.dev_polls {
            return false;
        }
        let Ok(mut m) = self.member_slots.try_lock() else {
            return false;
        };
        let v = self.members_version.load(Ordering::Acquire);
        if m.0 != v {
            m.1 = self
                .members
                .lock()
                .unwrap()
                .iter()
                .filter_map(|(w, _)| w.upgrade().map(|vi| vi.slot))
                .collect();
            m.0 = v;
        }
        nic.dev.poll_any(nic, &m.1)
    }

    /// The next (VI, is-receive-queue) with a completion, as the CQ holds
    /// it now.
    fn take(&self, nic: &NicInner) -> Result<(Arc<ViCore>, bool)> {
        for _ in 0..1024 {
            let e = match self.mode {
                CqMode::Ring => {
                    let ring = self.ring.read().unwrap().clone().ok_or(Error::NotDone)?;
                    ring.get().pop().ok_or(Error::NotDone)?
                }
                CqMode::Scan => {
                    let mut st = self.scan.lock().unwrap();
                    let v = self.members_version.load(Ordering::Acquire);
                    if st.version != v {
                        st.probes = self
                            .members
                            .lock()
                            .unwrap()
                            .iter()
                            .filter_map(|(w, r)| w.upgrade().map(|v| crate::vi::QueueProbe(v, *r)))
                            .collect();
                        st.version = v;
                    }
                    let ScanState { scan, probes, .. } = &mut *st;
                    scan.next(probes).ok_or(Error::NotDone)?
                }
            };
            let (slot, generation, recv) = unpack(e);
            if let Some(vi) = nic.vi(slot, generation) {
                return Ok((vi, recv));
            }
            // An entry of a VI destroyed since: skip it.
        }
        Err(Error::NotDone)
    }

    fn ready(&self) -> bool {
        match self.mode {
            CqMode::Ring => self
                .ring
                .read()
                .unwrap()
                .as_ref()
                .is_some_and(|r| !r.get().is_empty()),
            CqMode::Scan => self.members.lock().unwrap().iter().any(|(w, r)| {
                w.upgrade().is_some_and(|v| {
                    let q = if *r { v.recv.lock() } else { v.send.lock() };
                    q.posted
                        .get(q.reported)
                        .is_some_and(|p| p.status.status() & crate::descriptor::status::DONE != 0)
                })
            }),
        }
    }

    /// `VipCQWait`.
    pub fn wait(&self, nic: &NicInner, timeout: Option<Duration>) -> Result<(Arc<ViCore>, bool)> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let signals = self.signals(nic);
        loop {
            match self.take(nic) {
                Err(e) if e.kind() == ErrorKind::NotDone => {}
                r => return r,
            }
            if !doorbell::wait_until(signals.wake, nic.process.config.spin, deadline, || {
                self.ready()
            }) {
                return match self.take(nic) {
                    Err(e) if e.kind() == ErrorKind::NotDone => Err(Error::Timeout),
                    r => r,
                };
            }
        }
    }

    /// `VipCQNotify`: `h` runs once for the next completion.
    pub fn notify(&self, nic: &NicInner, h: CqHandler) {
        self.notify.lock().unwrap().push_back(h);
        self.signals(nic)
            .interest
            .store(interest::RECV_NOTIFY, Ordering::SeqCst);
        // Heavy fence: see `ViCore::notify`.
        doorbell::asymmetric::heavy_fence();
        nic.provider.arm_cq(nic, self.slot, self.generation);
    }

    /// Runs pending notify handlers (provider thread); returns (ran, still pending).
    pub fn run_notifies(&self, nic: &NicInner) -> (bool, bool) {
        let mut ran = false;
        loop {
            let mut l = self.notify.lock().unwrap();
            if l.is_empty() {
                let interest = self.signals(nic).interest;
                interest.store(0, Ordering::SeqCst);
                if !l.is_empty() {
                    interest.store(interest::RECV_NOTIFY, Ordering::SeqCst);
                }
                return (ran, false);
            }
            match self.take(nic) {
                Ok((vi, recv)) => {
                    let h = l.pop_front().unwrap();
                    drop(l);
                    h(vi, recv);
                    ran = true;
                }
                Err(_) => return (ran, true),
            }
        }
    }

    /// Completions a scanning CQ has not reported yet (what a ring would hold).
    fn queued_scan(&self) -> usize {
        self.members
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(w, r)| w.upgrade().map(|v| (v, *r)))
            .map(|(v, r)| {
                let q = if r { v.recv.lock() } else { v.send.lock() };
                q.posted
                    .iter()
                    .skip(q.reported)
                    .take_while(|(_, p)| p.status.status() & crate::descriptor::status::DONE != 0)
                    .count()
            })
            .sum()
    }

    /// `VipResizeCQ`.
    pub fn resize(&self, nic: &NicInner, entries: u32) -> Result<()> {
        if entries == 0 || entries > MAX_CQ_ENTRIES {
            return Err(Error::InvalidParameter);
        }
        if self.mode == CqMode::Scan {
            if self.queued_scan() > entries as usize {
                return Err(Error::InvalidState);
            }
            self.limit.store(entries, Ordering::Relaxed);
            return Ok(());
        }
        let mut g = self.ring.write().unwrap();
        let old = g.clone().ok_or(Error::InvalidState)?;
        if old.get().len() > entries as usize {
            return Err(Error::InvalidState);
        }
        if entries as usize <= old.get().capacity() {
            old.get()
                .set_limit(entries as usize)
                .map_err(|_| Error::InvalidState)?;
            self.limit.store(entries, Ordering::Relaxed);
            return Ok(());
        }
        // Grow: a new ring file, then move the entries over.
        let old_gen = self.ring_gen.load(Ordering::Relaxed);
        let generation = (old_gen & 0xffff_0000) | (old_gen.wrapping_add(1) & 0xffff).max(1);
        let new = nic.dev.cq_ring(nic, self.slot, generation, entries)?;
        old.get().close();
        for e in old.get().drain_closed(Duration::from_millis(100)) {
            let _ = new.get().push(e);
        }
        *g = Some(new);
        self.ring_gen.store(generation, Ordering::Relaxed);
        // Completers that see the new generation find the new ring.
        nic.dev.cq_state(self.slot, true, generation);
        self.limit.store(entries, Ordering::Relaxed);
        nic.dev.retire_cq_ring(nic, self.slot, old_gen);
        Ok(())
    }

    /// `VipDestroyCQ`: refused while VIs use it.
    pub fn destroy(&self, nic: &NicInner) -> Result<()> {
        let m = self.members.lock().unwrap();
        if m.iter().any(|(w, _)| w.strong_count() > 0) {
            return Err(Error::InvalidState);
        }
        drop(m);
        // Release: a thread that sees the flag sees the CQ gone.
        self.destroyed.store(true, Ordering::Release);
        self.retire(nic);
        nic.cqs.write().unwrap().remove(self.slot, self.generation);
        Ok(())
    }

    pub(crate) fn retire(&self, nic: &NicInner) {
        nic.dev.cq_state(self.slot, self.mode == CqMode::Ring, 0);
        // The probes hold their VIs, which hold this CQ.
        let mut st = self.scan.lock().unwrap();
        st.probes.clear();
        st.version = 0;
        drop(st);
        if let Some(r) = self.ring.write().unwrap().take() {
            r.get().close();
            nic.dev
                .retire_cq_ring(nic, self.slot, self.ring_gen.load(Ordering::Relaxed));
        }
    }
}
