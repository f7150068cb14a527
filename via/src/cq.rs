//! Completion queues as the application sees them.
//!
//! A CQ merges the completions of the work queues associated with it.
//! `VipCQDone` returns (VI, which queue); the application then dequeues the
//! descriptor from that queue. Two mechanisms (`VIA_CQ`):
//!
//! * ring (CQ1): completers push an entry into a `cq::EntryRing` in its own
//!   memfd, which peers map (their engines complete our receives);
//! * scan (CQ2): no entries; `done` scans the associated queues round robin
//!   for completions it has not reported yet.
//!
//! Either way completers wake `CqShared::wake` in the NIC segment, which is
//! where `VipCQWait` sleeps.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::nic::{MAX_CQ_ENTRIES, NicInner};
use crate::proto::{ObjKey, ObjKind, Request};
use crate::shm::layout::{CqShared, interest};
use crate::shm::mapping::Mapping;
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

/// The memfd name of ring generation `generation` of CQ `slot`.
pub(crate) fn ring_key(nic: u32, slot: u32, generation: u32) -> ObjKey {
    ObjKey {
        kind: ObjKind::CqRing,
        nic,
        id: slot,
        generation,
    }
}

/// A completion queue.
pub(crate) struct CqCore {
    pub slot: u32,
    pub generation: u16,
    pub mode: cq::Mode,
    ring: RwLock<Option<Arc<MappedRing>>>,
    ring_gen: AtomicU32,
    limit: AtomicU32,
    members: Mutex<Vec<(Weak<ViCore>, bool)>>,
    scan: Mutex<cq::Scan>,
    pub notify: Mutex<VecDeque<CqHandler>>,
}

fn new_ring(nic: &NicInner, slot: u32, generation: u32, entries: u32) -> Result<Arc<MappedRing>> {
    let cap = entries.next_power_of_two().max(64);
    let len = cq::EntryRing::bytes_for(cap);
    let (fd, map) = Mapping::create(
        &format!(
            "via-cq:{}:{}:{slot}:{generation}",
            nic.process.agent.session, nic.id
        ),
        len,
    )
    .map_err(|_| Error::Resource)?;
    let ring = MappedRing::init(Arc::new(map), 0, len, cap).map_err(|_| Error::Resource)?;
    ring.get()
        .set_limit(entries as usize)
        .map_err(|_| Error::Resource)?;
    nic.process
        .agent
        .publish(ring_key(nic.id, slot, generation), &fd)
        .map_err(|_| Error::Resource)?;
    Ok(Arc::new(ring))
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
                    scan: Mutex::new(cq::Scan::new()),
                    notify: Mutex::new(VecDeque::new()),
                })
            })
            .cloned()
            .ok_or(Error::Resource)?;
        let sh = cq.shared(nic);
        sh.mode
            .store(matches!(mode, cq::Mode::Scan) as u32, Ordering::Relaxed);
        sh.interest.store(0, Ordering::Relaxed);
        if mode == cq::Mode::Ring {
            let generation = sh.generation.load(Ordering::Relaxed).wrapping_add(1).max(1);
            match new_ring(nic, cq.slot, generation, entries) {
                Ok(r) => {
                    *cq.ring.write().unwrap() = Some(r);
                    cq.ring_gen.store(generation, Ordering::Relaxed);
                    // Release: a peer that sees this generation finds the ring published.
                    sh.generation.store(generation, Ordering::Release);
                }
                Err(e) => {
                    nic.cqs.write().unwrap().remove(cq.slot, cq.generation);
                    return Err(e);
                }
            }
        } else {
            sh.generation.store(1, Ordering::Release);
        }
        Ok(cq)
    }

    /// The CQ's entry in the NIC segment.
    pub fn shared<'a>(&self, nic: &'a NicInner) -> &'a CqShared {
        nic.view().cq(self.slot).expect("slot in range")
    }

    pub(crate) fn attach(&self, vi: &Arc<ViCore>, recv: bool) {
        self.members
            .lock()
            .unwrap()
            .push((Arc::downgrade(vi), recv));
    }

    pub(crate) fn detach(&self, vi: &ViCore) {
        self.members
            .lock()
            .unwrap()
            .retain(|(w, _)| w.upgrade().is_some_and(|v| !std::ptr::eq(&*v, vi)));
    }

    /// Pushes an entry for a completion on a queue of this NIC.
    pub fn push(&self, nic: &NicInner, e: u64) {
        if self.mode == cq::Mode::Ring {
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
        wake(self.shared(nic), &nic.view().header().notify);
    }

    /// `VipCQDone`: the next (VI, is-receive-queue) with a completion.
    pub fn done(&self, nic: &NicInner) -> Result<(Arc<ViCore>, bool)> {
        for _ in 0..1024 {
            let e = match self.mode {
                cq::Mode::Ring => {
                    let ring = self.ring.read().unwrap().clone().ok_or(Error::NotDone)?;
                    ring.get().pop().ok_or(Error::NotDone)?
                }
                cq::Mode::Scan => {
                    let probes: Vec<crate::vi::QueueProbe> = self
                        .members
                        .lock()
                        .unwrap()
                        .iter()
                        .filter_map(|(w, r)| w.upgrade().map(|v| crate::vi::QueueProbe(v, *r)))
                        .collect();
                    self.scan
                        .lock()
                        .unwrap()
                        .next(&probes)
                        .ok_or(Error::NotDone)?
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
            cq::Mode::Ring => self
                .ring
                .read()
                .unwrap()
                .as_ref()
                .is_some_and(|r| !r.get().is_empty()),
            cq::Mode::Scan => self.members.lock().unwrap().iter().any(|(w, r)| {
                w.upgrade().is_some_and(|v| {
                    let q = if *r {
                        v.recv.lock().unwrap()
                    } else {
                        v.send.lock().unwrap()
                    };
                    q.fifo
                        .get(q.reported)
                        .is_some_and(|p| p.status.status() & crate::descriptor::status::DONE != 0)
                })
            }),
        }
    }

    /// `VipCQWait`.
    pub fn wait(&self, nic: &NicInner, timeout: Option<Duration>) -> Result<(Arc<ViCore>, bool)> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let sh = self.shared(nic);
        loop {
            match self.done(nic) {
                Err(Error::NotDone) => {}
                r => return r,
            }
            if !doorbell::wait_until(&sh.wake, nic.process.config.spin, deadline, || self.ready()) {
                return match self.done(nic) {
                    Err(Error::NotDone) => Err(Error::Timeout),
                    r => r,
                };
            }
        }
    }

    /// `VipCQNotify`: `h` runs once for the next completion.
    pub fn notify(&self, nic: &NicInner, h: CqHandler) {
        self.notify.lock().unwrap().push_back(h);
        // SeqCst: see `ViCore::notify`.
        self.shared(nic)
            .interest
            .store(interest::RECV_NOTIFY, Ordering::SeqCst);
        nic.provider.arm_cq(nic, self.slot, self.generation);
    }

    /// Runs pending notify handlers (provider thread); returns (ran, still pending).
    pub fn run_notifies(&self, nic: &NicInner) -> (bool, bool) {
        let mut ran = false;
        loop {
            let mut l = self.notify.lock().unwrap();
            if l.is_empty() {
                self.shared(nic).interest.store(0, Ordering::SeqCst);
                if !l.is_empty() {
                    self.shared(nic)
                        .interest
                        .store(interest::RECV_NOTIFY, Ordering::SeqCst);
                }
                return (ran, false);
            }
            match self.done(nic) {
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
                let q = if r {
                    v.recv.lock().unwrap()
                } else {
                    v.send.lock().unwrap()
                };
                q.fifo
                    .iter()
                    .skip(q.reported)
                    .take_while(|p| p.status.status() & crate::descriptor::status::DONE != 0)
                    .count()
            })
            .sum()
    }

    /// `VipResizeCQ`.
    pub fn resize(&self, nic: &NicInner, entries: u32) -> Result<()> {
        if entries == 0 || entries > MAX_CQ_ENTRIES {
            return Err(Error::InvalidParameter);
        }
        if self.mode == cq::Mode::Scan {
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
        let generation = self.ring_gen.load(Ordering::Relaxed).wrapping_add(1).max(1);
        let new = new_ring(nic, self.slot, generation, entries)?;
        old.get().close();
        for e in old.get().drain_closed(Duration::from_millis(100)) {
            let _ = new.get().push(e);
        }
        *g = Some(new);
        self.ring_gen.store(generation, Ordering::Relaxed);
        // Release: peers that see the new generation find the new ring.
        self.shared(nic)
            .generation
            .store(generation, Ordering::Release);
        self.limit.store(entries, Ordering::Relaxed);
        let _ = nic.process.agent.send(&Request::Retire {
            key: ring_key(nic.id, self.slot, generation - 1),
        });
        Ok(())
    }

    /// `VipDestroyCQ`: refused while VIs use it.
    pub fn destroy(&self, nic: &NicInner) -> Result<()> {
        let m = self.members.lock().unwrap();
        if m.iter().any(|(w, _)| w.strong_count() > 0) {
            return Err(Error::InvalidState);
        }
        drop(m);
        self.retire(nic);
        nic.cqs.write().unwrap().remove(self.slot, self.generation);
        Ok(())
    }

    pub(crate) fn retire(&self, nic: &NicInner) {
        self.shared(nic).generation.store(0, Ordering::Release);
        if let Some(r) = self.ring.write().unwrap().take() {
            r.get().close();
            let _ = nic.process.agent.send(&Request::Retire {
                key: ring_key(nic.id, self.slot, self.ring_gen.load(Ordering::Relaxed)),
            });
        }
    }
}

/// Wakes `VipCQWait` sleepers and the provider if a notify waits.
pub(crate) fn wake(sh: &CqShared, provider: &doorbell::EventCount) {
    sh.wake.notify_all();
    // `notify_all` issued a SeqCst fence after the completion was published,
    // so this load pairs with the SeqCst store in `CqCore::notify`.
    if sh.interest.load(Ordering::Relaxed) != 0 {
        provider.notify_all();
    }
}
