//! The Virtual Interface: two work queues and a connection state machine.
//!
//! ```text
//!            connect request/accept/peer          break (error, peer lost,
//!   IDLE ─────────► CONNECT_PENDING ─────► CONNECTED ────── remote disconnect) ──► ERROR
//!    ▲                   │ refused/timeout       │                                 │
//!    └───────────────────┘◄──────── VipDisconnect┴─────────────────────────────────┘
//! ```
//!
//! Each work queue is a FIFO of posted descriptors kept here (for
//! `Vip*Done`/`Vip*Wait`, which dequeue in posting order); completion is
//! written into the descriptor in memory by whoever ran it (`completion`).
//! Validated work requests go to the NIC's device; the connection itself
//! (what the peer is on the wire) belongs to the device too.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::agent::Pending;
use crate::attrs::{Reliability, ViAttributes, ViState};
use crate::backend::Kick;
use crate::completion::{self, StatusLoc, interest};
use crate::cq::CqCore;
use crate::descriptor::status;
use crate::error::{Error, ErrorKind, Result};
use crate::nic::{AsyncError, ErrorCode, NicInner, ResourceCode};
use crate::proto::{Endpoint, Request};
use crate::shm::mapping::Mapping;
use crate::translate;

/// A posted descriptor waiting to be dequeued.
#[derive(Default)]
pub(crate) struct Posted {
    pub desc_va: u64,
    pub status: StatusLoc,
}

/// The posted descriptors of one work queue, oldest first: positions
/// `head..tail` of a ring indexed by position (a power of two in size,
/// grown by doubling while the queue deepens, so a post or a dequeue in
/// the steady state allocates nothing). A dequeued slot keeps its status
/// location: the next post through the same mapping only changes the
/// offset, not the mapping's reference count. (So a shadow mapping stays
/// until its slots are reused or the VI destroyed, as one held by the
/// queue's region cache stays until the cache refills.)
pub(crate) struct Ring {
    slots: Vec<Posted>,
    head: u64,
    tail: u64,
}

impl Default for Ring {
    fn default() -> Self {
        Ring {
            slots: (0..Ring::FIRST).map(|_| Posted::default()).collect(),
            head: 0,
            tail: 0,
        }
    }
}

impl Ring {
    /// Slots of a new ring.
    const FIRST: usize = 16;

    fn slot(&self, pos: u64) -> &Posted {
        &self.slots[pos as usize & (self.slots.len() - 1)]
    }

    /// Descriptors posted and not dequeued.
    pub fn len(&self) -> usize {
        (self.tail - self.head) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// The `i`th oldest.
    pub fn get(&self, i: usize) -> Option<&Posted> {
        (i < self.len()).then(|| self.slot(self.head + i as u64))
    }

    /// The oldest.
    #[inline(always)]
    pub fn front(&self) -> Option<&Posted> {
        (self.head != self.tail).then(|| self.slot(self.head))
    }

    /// Oldest first, with their positions.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Posted)> {
        (self.head..self.tail).map(|p| (p, self.slot(p)))
    }

    /// Oldest first, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Posted> {
        // The live slots are one run of the ring, which may wrap.
        let size = self.slots.len();
        let (start, n) = (self.head as usize & (size - 1), self.len());
        let (low, high) = self.slots.split_at_mut(start);
        let wrapped = (start + n).saturating_sub(size);
        high.iter_mut().take(n).chain(low.iter_mut().take(wrapped))
    }

    /// The slot the next [`Ring::commit`] makes the newest (room made
    /// first): a post resolves its descriptor's status location straight
    /// into it. Until the commit the slot is not part of the queue.
    #[inline(always)]
    pub fn next_slot(&mut self) -> &mut Posted {
        if self.len() == self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        &mut self.slots[self.tail as usize & mask]
    }

    /// Appends the descriptor at `desc_va`, whose status location
    /// [`Ring::next_slot`] holds.
    #[inline(always)]
    pub fn commit(&mut self, desc_va: u64) -> &Posted {
        let mask = self.slots.len() - 1;
        let slot = &mut self.slots[self.tail as usize & mask];
        self.tail += 1;
        slot.desc_va = desc_va;
        slot
    }

    #[cold]
    fn grow(&mut self) {
        let n = self.slots.len() * 2;
        let mut slots: Vec<Posted> = (0..n).map(|_| Posted::default()).collect();
        let old = self.slots.len() - 1;
        for p in self.head..self.tail {
            slots[p as usize & (n - 1)] = std::mem::take(&mut self.slots[p as usize & old]);
        }
        self.slots = slots;
    }

    /// Dequeues the oldest if `f` makes something of it (one test of
    /// emptiness: what a poll runs); the slot keeps its status location
    /// for reuse.
    #[inline(always)]
    pub fn take_front<R>(&mut self, f: impl FnOnce(&Posted) -> Option<R>) -> Option<R> {
        if self.head == self.tail {
            return None;
        }
        let r = f(self.slot(self.head))?;
        self.head += 1;
        Some(r)
    }
}

/// One work queue as this process sees it.
#[derive(Default)]
pub(crate) struct Queue {
    pub posted: Ring,
    /// Completions already returned by a scanning CQ (CQ2), from the head.
    pub reported: usize,
    /// Next ring position (receive queue) or sequence number (send queue).
    pub tail: u64,
    /// Receive ring positions before this one are finished (taken or flushed).
    pub consumer_pos: u64,
    /// Translations of the regions this queue's descriptors use.
    pub regions: crate::regions::RegionCache,
    /// The work request being posted (send queue).
    wr: translate::SendWr,
    /// The work request being posted (receive queue).
    rwr: translate::RecvWr,
    /// Where a descriptor's segments are copied when they cannot be read
    /// in place.
    copy: translate::SegCopy,
    /// The extent the last descriptor was read from.
    descs: translate::DescCache,
}

/// A completed descriptor, dequeued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Address of the descriptor.
    pub desc: u64,
    /// Its final `CS.Status`.
    pub status: u32,
}

/// Which work queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// The send queue.
    Send,
    /// The receive queue.
    Recv,
}

/// A notify handler: runs once, on the provider thread, with the dequeued
/// descriptor.
pub(crate) type ViHandler = Box<dyn FnOnce(Completion) + Send>;

pub(crate) struct State {
    pub state: ViState,
    /// The peer disconnected before this side finished connecting (the
    /// event can overtake the connecting thread).
    pub early_disconnect: bool,
    pub peer: Option<Endpoint>,
    pub peer_request: Option<Pending>,
}

#[derive(Default)]
struct Fast {
    state: AtomicU32,
    ptag: AtomicU32,
    mtu: AtomicU32,
    reliable: AtomicBool,
}

/// A VI.
pub(crate) struct ViCore {
    pub slot: u32,
    pub generation: u16,
    pub attrs: RwLock<ViAttributes>,
    /// What the posting path needs of the attributes and state, readable
    /// without a lock; written under the `state` lock.
    fast: Fast,
    pub state: Mutex<State>,
    /// Set (before the state changes) when the connection breaks, so the
    /// device stops using it at once.
    pub broken: AtomicBool,
    /// In ERROR by [`ViCore::enter_error`], the rest of the break
    /// ([`ViCore::break_connection`]) still to come.
    break_due: AtomicBool,
    /// Set once `VipDestroyVi` succeeded (handles cached by the C layer
    /// check it).
    pub destroyed: AtomicBool,
    /// The shared receive queue the VI receives from (an extension, not
    /// VIPL 1.0; [`NO_SRQ`]: its own receive queue).
    pub srq: std::sync::atomic::AtomicU32,
    /// The work queues: a [`doorbell::BiasedLock`] (no poisoning checks),
    /// taken once by every post and every dequeue; biased to the thread
    /// that uses the VI, which then takes it with plain loads and stores
    /// (no locked instruction to wait behind the stores of the call before).
    pub send: doorbell::BiasedLock<Queue>,
    pub recv: doorbell::BiasedLock<Queue>,
    pub send_cq: Option<Arc<CqCore>>,
    pub recv_cq: Option<Arc<CqCore>>,
    pub notify_send: Mutex<VecDeque<ViHandler>>,
    pub notify_recv: Mutex<VecDeque<ViHandler>>,
}

/// [`ViCore::srq`] of a VI with its own receive queue.
pub(crate) const NO_SRQ: u32 = u32::MAX;

fn check_attrs(nic: &NicInner, a: &ViAttributes) -> Result<()> {
    if a.max_transfer_size == 0 || a.max_transfer_size > nic.limits.max_transfer {
        return Err(Error::InvalidMtu);
    }
    if !nic.ptag_valid(a.ptag) {
        return Err(Error::InvalidPtag);
    }
    if nic.limits.reliability & a.reliability.bits() == 0 {
        return Err(Error::InvalidReliabilityLevel);
    }
    if a.enable_rdma_read && nic.limits.rdma_read & a.reliability.bits() == 0 {
        return Err(Error::InvalidRdmaRead);
    }
    Ok(())
}

impl ViCore {
    /// `VipCreateVi`.
    pub fn create(
        nic: &Arc<NicInner>,
        attrs: ViAttributes,
        send_cq: Option<Arc<CqCore>>,
        recv_cq: Option<Arc<CqCore>>,
    ) -> Result<Arc<ViCore>> {
        check_attrs(nic, &attrs)?;
        let vi = nic
            .vis
            .write()
            .unwrap()
            .insert_with(|slot, generation| {
                Arc::new(ViCore {
                    slot,
                    generation,
                    attrs: RwLock::new(attrs),
                    fast: Fast::default(),
                    state: Mutex::new(State {
                        state: ViState::Idle,
                        early_disconnect: false,
                        peer: None,
                        peer_request: None,
                    }),
                    broken: AtomicBool::new(false),
                    break_due: AtomicBool::new(false),
                    destroyed: AtomicBool::new(false),
                    srq: std::sync::atomic::AtomicU32::new(NO_SRQ),
                    send: doorbell::BiasedLock::new(Queue::default()),
                    recv: doorbell::BiasedLock::new(Queue::default()),
                    send_cq,
                    recv_cq,
                    notify_send: Mutex::new(VecDeque::new()),
                    notify_recv: Mutex::new(VecDeque::new()),
                })
            })
            .cloned()
            .ok_or(Error::Resource)?;
        nic.ptag_ref(attrs.ptag, 1)?;
        vi.publish_attrs();
        for (cq, recv) in [(&vi.send_cq, false), (&vi.recv_cq, true)] {
            if let Some(cq) = cq {
                cq.attach(&vi, recv);
            }
        }
        if let Err(e) = nic.dev.add_vi(nic, &vi) {
            let _ = vi.destroy(nic);
            return Err(e);
        }
        Ok(vi)
    }

    /// Where completers of this VI wake its waiters.
    pub fn signals<'a>(&self, nic: &'a NicInner) -> crate::backend::ViSignals<'a> {
        nic.dev.vi_signals(self.slot)
    }

    /// The attributes.
    pub fn attributes(&self) -> ViAttributes {
        *self.attrs.read().unwrap()
    }

    fn publish_attrs(&self) {
        let a = *self.attrs.read().unwrap();
        self.fast.ptag.store(a.ptag.id(), Ordering::Relaxed);
        self.fast.mtu.store(a.max_transfer_size, Ordering::Relaxed);
        self.fast
            .reliable
            .store(a.reliability.is_reliable(), Ordering::Relaxed);
    }

    /// The reliability level.
    pub fn reliability(&self) -> Reliability {
        self.attrs.read().unwrap().reliability
    }

    /// The current state.
    pub fn vi_state(&self) -> ViState {
        let s = match self.fast.state.load(Ordering::Acquire) {
            0 => ViState::Idle,
            1 => ViState::Connected,
            2 => ViState::ConnectPending,
            _ => ViState::Error,
        };
        if s == ViState::Connected && self.broken.load(Ordering::Acquire) {
            ViState::Error
        } else {
            s
        }
    }

    /// The state as the program reads it (`VipQueryVi`): [`ViCore::vi_state`],
    /// and ERROR too when the device knows the peer's side found the
    /// connection broken while the break is still on its way here (a
    /// program that saw the failed receive status the peer wrote finds
    /// the VI in ERROR).
    pub fn state_seen(&self, nic: &NicInner) -> ViState {
        match self.vi_state() {
            ViState::Connected if nic.dev.broken_by_peer(self) => ViState::Error,
            s => s,
        }
    }

    /// Whether [`ViCore::vi_state`] is `Error` (fewer loads and branches).
    #[inline(always)]
    fn in_error(&self) -> bool {
        // Acquire: as in `vi_state`.
        let s = self.fast.state.load(Ordering::Acquire);
        s > ViState::ConnectPending.code()
            || (s == ViState::Connected.code() && self.broken.load(Ordering::Acquire))
    }

    /// Changes the state (caller holds the `state` lock, passed as `st`).
    fn set_state(&self, st: &mut State, s: ViState) {
        if s != ViState::Error {
            // A break still due is void once the VI left ERROR (a
            // disconnect, done under the same lock).
            self.break_due.store(false, Ordering::Relaxed);
        }
        st.state = s;
        // Release: pairs with the Acquire in `vi_state`.
        self.fast.state.store(s.code(), Ordering::Release);
    }

    /// Session of the connected peer.
    pub fn peer_session(&self) -> Option<u64> {
        self.state.lock().unwrap().peer.as_ref().map(|p| p.session)
    }

    /// `VipQueryVi`: state, attributes, and whether each queue is empty.
    pub fn query(&self, nic: &NicInner) -> (ViState, ViAttributes, bool, bool) {
        (
            self.state_seen(nic),
            *self.attrs.read().unwrap(),
            self.send.lock().posted.is_empty(),
            self.recv.lock().posted.is_empty(),
        )
    }

    /// `VipSetViAttributes`: only while idle.
    pub fn set_attributes(&self, nic: &NicInner, a: ViAttributes) -> Result<()> {
        let st = self.state.lock().unwrap();
        if st.state != ViState::Idle {
            return Err(Error::InvalidState);
        }
        check_attrs(nic, &a)?;
        let old = *self.attrs.read().unwrap();
        if old.ptag != a.ptag {
            nic.ptag_ref(a.ptag, 1)?;
            let _ = nic.ptag_ref(old.ptag, -1);
        }
        *self.attrs.write().unwrap() = a;
        self.publish_attrs();
        nic.dev.vi_attributes(self, &a);
        Ok(())
    }

    /// `VipDestroyVi`: the VI must be idle with both queues empty.
    pub fn destroy(self: &Arc<Self>, nic: &NicInner) -> Result<()> {
        let st = self.state.lock().unwrap();
        if st.state != ViState::Idle
            || !self.send.lock().posted.is_empty()
            || !self.recv.lock().posted.is_empty()
        {
            return Err(Error::InvalidState);
        }
        drop(st);
        // Release: a thread that sees the flag sees the VI gone.
        self.destroyed.store(true, Ordering::Release);
        nic.dev.remove_vi(nic, self);
        nic.vis.write().unwrap().remove(self.slot, self.generation);
        for cq in [&self.send_cq, &self.recv_cq].into_iter().flatten() {
            cq.detach(self);
        }
        let _ = nic.ptag_ref(self.attrs.read().unwrap().ptag, -1);
        Ok(())
    }

    /// The first receive queue position not finished (taken or flushed):
    /// where a new peer starts.
    pub fn recv_start(&self) -> u64 {
        self.recv.lock().consumer_pos
    }

    /// This VI as its peer needs to know it.
    pub fn endpoint(&self, nic: &NicInner) -> Endpoint {
        let a = *self.attrs.read().unwrap();
        Endpoint {
            session: nic.process.session(),
            nic: nic.id,
            vi: self.slot,
            vi_gen: self.generation as u32,
            reliability: a.reliability.bits(),
            mtu: a.max_transfer_size,
            rdma_write: a.enable_rdma_write,
            rdma_read: a.enable_rdma_read,
            device: nic.dev.endpoint_blob(self),
        }
    }

    // ---- posting ----

    /// `VipPostSend`.
    pub fn post_send(&self, nic: &NicInner, desc_va: u64, handle: u32) -> Result<()> {
        // Connected or in error (broken or not): one load, no decoding.
        // Acquire: as in `vi_state`.
        let s = self.fast.state.load(Ordering::Acquire);
        if s == ViState::Idle.code() || s == ViState::ConnectPending.code() {
            return Err(Error::InvalidState);
        }
        let cx = translate::SendCtx {
            vi: (self.slot, self.generation),
            ptag: self.fast.ptag.load(Ordering::Relaxed),
            mtu: self.fast.mtu.load(Ordering::Relaxed),
            reliable: self.fast.reliable.load(Ordering::Relaxed),
            desc_va,
            desc_handle: handle,
            seq: 0,
        };
        let kick = {
            let mut q = self.send.lock();
            if q.posted.len() >= nic.limits.queue_depth as usize {
                return Err(Error::Resource);
            }
            let Queue {
                posted,
                tail,
                regions,
                wr,
                copy,
                descs,
                ..
            } = &mut *q;
            let cx = translate::SendCtx {
                seq: *tail as u32,
                ..cx
            };
            // The descriptor is read straight into the queue's work request,
            // and its status location straight into the ring slot the post
            // fills (no copy, no reference count change when the slot last
            // held a descriptor of the same mapping).
            let slot = posted.next_slot();
            translate::read_send(
                &nic.regions,
                regions,
                descs,
                &cx,
                wr,
                &mut slot.status,
                copy,
            )?;
            // Clear the status so that polling the descriptor in memory is
            // meaningful from now on.
            slot.status.clear();
            *tail += 1;
            let posted = posted.commit(desc_va);
            // Handed over under the queue lock: the device sees this VI's
            // requests in posting order.
            let t = translate::Translated {
                cache: regions,
                descs,
                status: &posted.status,
            };
            nic.dev.post_send_queued(nic, self, wr, t)?
        };
        if kick == Kick::Needed {
            nic.dev.kick(nic, Some(self));
        }
        Ok(())
    }

    /// `VipPostRecv`.
    pub fn post_recv(&self, nic: &NicInner, desc_va: u64, handle: u32) -> Result<()> {
        // A VI attached to a shared receive queue has no receive queue.
        if self.srq.load(Ordering::Relaxed) != NO_SRQ {
            return Err(Error::InvalidState);
        }
        let ptag = self.fast.ptag.load(Ordering::Relaxed);
        let in_error = self.in_error();
        let mut q = self.recv.lock();
        if q.posted.len() >= nic.limits.queue_depth as usize {
            return Err(Error::Resource);
        }
        let Queue {
            regions,
            rwr: pd,
            posted,
            tail,
            copy,
            descs,
            ..
        } = &mut *q;
        // As in `post_send`: the descriptor straight into the queue's work
        // request, the status location straight into the slot.
        let slot = posted.next_slot();
        translate::read_recv(
            &nic.regions,
            regions,
            descs,
            desc_va,
            handle,
            ptag,
            pd,
            &mut slot.status,
            copy,
        )?;
        let pos = *tail;
        *tail += 1;
        let slot = posted.commit(desc_va);
        slot.status.clear();
        let immediate = if pd.fault != 0 {
            Some(status::DONE | status::OP_RECEIVE | pd.fault)
        } else if in_error {
            Some(status::DONE | status::OP_RECEIVE | status::DESC_FLUSHED_ERROR)
        } else {
            None
        };
        match immediate {
            Some(st) => {
                let status = slot.status.clone();
                // Never offered to the peer: its engine skips finished slots.
                nic.dev.skip_recv(nic, self, pos);
                drop(q);
                completion::local(nic, self, Which::Recv, &status, st, None, None);
            }
            None => {
                nic.dev.post_recv(nic, self, pos, pd)?;
            }
        }
        Ok(())
    }

    // ---- completion ----

    fn queue(&self, w: Which) -> &doorbell::BiasedLock<Queue> {
        match w {
            Which::Send => &self.send,
            Which::Recv => &self.recv,
        }
    }

    /// `VipSendDone` / `VipRecvDone`: dequeues the head if it completed.
    pub fn done(&self, w: Which) -> Result<Completion> {
        self.take_done(w).ok_or(Error::NotDone)
    }

    /// The head of queue `w`, dequeued, if it completed.
    #[inline(always)]
    fn take_done(&self, w: Which) -> Option<Completion> {
        let mut q = self.queue(w).lock();
        let c = q.posted.take_front(|head| {
            let st = head.status.status();
            (st & status::DONE != 0).then_some(Completion {
                desc: head.desc_va,
                status: st,
            })
        })?;
        q.reported = q.reported.saturating_sub(1);
        Some(c)
    }

    /// [`ViCore::done`]; if nothing completed, lets the device progress
    /// inline once (a polling program need not wait for a thread switch)
    /// and looks again, unless the device has nothing to progress.
    #[inline(always)]
    pub fn done_polling(&self, nic: &NicInner, w: Which) -> Result<Completion> {
        if let Some(c) = self.take_done(w) {
            if w == Which::Recv {
                self.received(nic, &c);
            }
            return Ok(c);
        }
        if nic.dev_polls {
            nic.dev.poll(nic, self);
            if let Some(c) = self.take_done(w) {
                return Ok(c);
            }
        }
        Err(Error::NotDone)
    }

    /// A receive was dequeued: the lines the answer touches next are asked
    /// for now, so that their transfers overlap the caller's work.
    #[inline(always)]
    fn received(&self, nic: &NicInner, c: &Completion) {
        nic.dev.received(self);
        // The descriptor is usually posted again next, and the post clears
        // its status: a line the peer wrote last.
        crate::shm::prefetch_write(c.desc as usize);
    }

    fn head_done(&self, w: Which) -> bool {
        let q = self.queue(w).lock();
        q.posted
            .front()
            .is_some_and(|h| h.status.status() & status::DONE != 0)
    }

    /// `VipSendWait` / `VipRecvWait`: spin, then sleep until the head
    /// completes or the timeout passes (`None` = forever).
    pub fn wait(&self, nic: &NicInner, w: Which, timeout: Option<Duration>) -> Result<Completion> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let signals = self.signals(nic);
        let ec = signals.wake(w);
        loop {
            match self.done(w) {
                Err(e) if e.kind() == ErrorKind::NotDone => {}
                Ok(c) if w == Which::Recv => {
                    self.received(nic, &c);
                    return Ok(c);
                }
                r => return r,
            }
            let ok =
                doorbell::wait_until(ec, nic.process.config.spin, deadline, || self.head_done(w));
            if !ok {
                return match self.done(w) {
                    Err(e) if e.kind() == ErrorKind::NotDone => Err(Error::Timeout),
                    r => r,
                };
            }
        }
    }

    /// Claims one completion not yet reported through a scanning CQ.
    pub fn take_unreported(&self, w: Which) -> bool {
        let mut q = self.queue(w).lock();
        let i = q.reported;
        match q.posted.get(i) {
            Some(p) if p.status.status() & status::DONE != 0 => {
                q.reported += 1;
                true
            }
            _ => false,
        }
    }

    /// `VipSendNotify` / `VipRecvNotify`: `h` runs once for the next completion.
    pub fn notify(&self, nic: &NicInner, w: Which, h: ViHandler) {
        let bit = match w {
            Which::Send => interest::SEND_NOTIFY,
            Which::Recv => interest::RECV_NOTIFY,
        };
        match w {
            Which::Send => self.notify_send.lock().unwrap(),
            Which::Recv => self.notify_recv.lock().unwrap(),
        }
        .push_back(h);
        self.signals(nic).interest.fetch_or(bit, Ordering::SeqCst);
        // Heavy fence: pairs with the completer's light fence between
        // writing a status and reading `interest` (Dekker), so either it
        // sees the bit or the provider's scan, which follows this, sees the
        // completion. (Where the barrier fails, the provider's sleeps are
        // bounded and it scans again: `doorbell::asymmetric`.)
        doorbell::asymmetric::heavy_fence();
        nic.provider.arm(nic, self.slot, self.generation);
    }

    /// Runs pending notify handlers whose completion arrived (provider
    /// thread). Returns whether one ran, and whether any is still pending.
    pub fn run_notifies(&self, nic: &NicInner) -> (bool, bool) {
        let mut ran = false;
        let mut pending = false;
        for (w, list, bit) in [
            (Which::Send, &self.notify_send, interest::SEND_NOTIFY),
            (Which::Recv, &self.notify_recv, interest::RECV_NOTIFY),
        ] {
            loop {
                let mut l = list.lock().unwrap();
                if l.is_empty() {
                    let interest = self.signals(nic).interest;
                    interest.fetch_and(!bit, Ordering::SeqCst);
                    // A handler registered after the clear re-sets the bit.
                    if !l.is_empty() {
                        interest.fetch_or(bit, Ordering::SeqCst);
                    }
                    break;
                }
                match self.done(w) {
                    Ok(c) => {
                        let h = l.pop_front().unwrap();
                        drop(l);
                        h(c);
                        ran = true;
                    }
                    Err(_) => {
                        pending = true;
                        break;
                    }
                }
            }
        }
        (ran, pending)
    }

    // ---- connection ----

    /// Moves IDLE → CONNECT_PENDING.
    pub fn begin_connect(&self) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        if st.state != ViState::Idle || st.peer_request.is_some() {
            return Err(Error::InvalidState);
        }
        st.early_disconnect = false;
        self.set_state(&mut st, ViState::ConnectPending);
        Ok(())
    }

    /// Back to IDLE after a failed attempt.
    pub fn abort_connect(&self) {
        let mut st = self.state.lock().unwrap();
        if st.state == ViState::ConnectPending {
            self.set_state(&mut st, ViState::Idle);
        }
        st.peer_request = None;
    }

    /// CONNECT_PENDING → CONNECTED to `peer`, over the device's side of
    /// the connection (set up with `Device::connect`). If the peer already
    /// disconnected, the connection breaks at once (`CONN_LOST`).
    pub fn install(&self, nic: &NicInner, peer: &Endpoint) {
        let early = {
            let mut st = self.state.lock().unwrap();
            self.broken.store(false, Ordering::Release);
            self.set_state(&mut st, ViState::Connected);
            st.peer = Some(peer.clone());
            std::mem::take(&mut st.early_disconnect)
        };
        if early {
            self.break_connection_as(nic, ErrorCode::ConnLost, false, false, true);
        }
    }

    /// The peer disconnected: break the connection, or remember it if this
    /// side is still connecting.
    pub fn peer_disconnected(&self, nic: &NicInner) {
        {
            let mut st = self.state.lock().unwrap();
            if st.state == ViState::ConnectPending {
                st.early_disconnect = true;
                return;
            }
        }
        self.break_connection_as(nic, ErrorCode::ConnLost, false, false, true);
    }

    /// The peer broke the connection over an error it saw on our side
    /// (`code`: an RDMA protection violation here, a message that found no
    /// receive): the VI breaks with `code`. If it broke already (its own
    /// device saw the connection fail first, as `CONN_LOST`), the error
    /// callback still hears `code`: the reason comes second then. A VI
    /// that is not broken (idle again, or connecting anew) ignores it: the
    /// reason was for a connection it has left.
    pub fn peer_reported(&self, nic: &NicInner, code: ErrorCode) {
        if self.break_connection_as(nic, code, false, false, false) {
            return;
        }
        if self.vi_state() != ViState::Error {
            log::debug!("VI {}: {code:?} from a former peer, ignored", self.slot);
            return;
        }
        nic.report(AsyncError {
            resource: ResourceCode::Vi,
            code,
            vi: Some((self.slot, self.generation)),
            cq: None,
            descriptor: 0,
        });
    }

    /// Connects to `peer` (CONNECT_PENDING → CONNECTED).
    pub fn complete_connect(&self, nic: &NicInner, peer: &Endpoint) -> Result<()> {
        nic.dev.connect(nic, self, peer)?;
        self.install(nic, peer);
        Ok(())
    }

    /// Breaks the connection: the VI enters ERROR, outstanding descriptors
    /// complete with `DESC_FLUSHED_ERROR`, and the error callback runs with
    /// `code`. `tell_peer` pushes `CONN_LOST` into the peer's error ring;
    /// `peer_dead` also flushes receives a dead peer had taken.
    pub fn break_connection(
        &self,
        nic: &NicInner,
        code: ErrorCode,
        tell_peer: bool,
        peer_dead: bool,
    ) {
        self.break_connection_as(nic, code, tell_peer, peer_dead, false);
    }

    /// [`ViCore::break_connection`]; `orderly`: the peer disconnected on
    /// purpose (`VipDisconnect`), which is reported to the callback as
    /// always but is not logged as an error when there is none. False if
    /// the VI was not connected (nothing done).
    pub fn break_connection_as(
        &self,
        nic: &NicInner,
        code: ErrorCode,
        tell_peer: bool,
        peer_dead: bool,
        orderly: bool,
    ) -> bool {
        {
            let mut st = self.state.lock().unwrap();
            let due = st.state == ViState::Error && self.break_due.swap(false, Ordering::Relaxed);
            if st.state != ViState::Connected && !due {
                return false;
            }
            self.set_state(&mut st, ViState::Error);
            self.broken.store(true, Ordering::Release);
        }
        nic.dev.disconnect(nic, self, tell_peer);
        self.flush(nic, peer_dead);
        log::debug!("VI {} broke: {code:?}", self.slot);
        nic.report_as(
            AsyncError {
                resource: ResourceCode::Vi,
                code,
                vi: Some((self.slot, self.generation)),
                cq: None,
                descriptor: 0,
            },
            orderly,
        );
        true
    }

    /// Puts a connected VI in ERROR at once, for a device that found the
    /// connection broken where it cannot finish the break (its completer,
    /// about to write the failed descriptor's status): a program that sees
    /// that status finds the VI in ERROR. The device then calls
    /// [`ViCore::break_connection`], which does the rest (the device's
    /// disconnect, the flush, the error callback) as if it were still
    /// connected.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub fn enter_error(&self) {
        let mut st = self.state.lock().unwrap();
        if st.state == ViState::Connected {
            self.set_state(&mut st, ViState::Error);
            self.break_due.store(true, Ordering::Relaxed);
            self.broken.store(true, Ordering::Release);
        }
    }

    /// Whether [`ViCore::enter_error`] put the VI in ERROR and the rest of
    /// the break is still to come (read under the `state` lock).
    pub fn break_due(&self) -> bool {
        self.break_due.load(Ordering::Relaxed)
    }

    /// Completes every outstanding descriptor with `DESC_FLUSHED_ERROR`.
    pub fn flush(&self, nic: &NicInner, peer_dead: bool) {
        // Sends: run what is in the doorbells; with the link gone the engine
        // completes this VI's descriptors as flushed, in order.
        nic.dev.quiesce(nic);
        let flushed = status::DONE | status::DESC_FLUSHED_ERROR;
        let mut todo = Vec::new();
        {
            let mut q = self.recv.lock();
            for (pos, p) in q.posted.iter() {
                if p.status.status() & status::DONE == 0
                    && nic.dev.cancel_recv(nic, self, pos, peer_dead)
                {
                    todo.push(p.status.clone());
                }
            }
            q.consumer_pos = q.tail;
        }
        for st in todo {
            completion::local(
                nic,
                self,
                Which::Recv,
                &st,
                flushed | status::OP_RECEIVE,
                None,
                None,
            );
        }
    }

    /// Moves the status locations of this VI's posted descriptors that lie
    /// in `windows` (borrowed windows of a registration going away) into
    /// library-owned copies ([`StatusLoc::detach`]); returns how many.
    pub fn detach_posted(&self, windows: &[Arc<Mapping>], pid: i32) -> usize {
        let mut n = 0;
        for w in [Which::Send, Which::Recv] {
            let mut q = self.queue(w).lock();
            for p in q.posted.iter_mut() {
                n += p.status.detach(windows, pid, p.desc_va) as usize;
            }
        }
        n
    }

    /// Tells `peer`, through viad, that its connection to this VI is lost
    /// (`CONN_LOST`); returns once its engine no longer uses it.
    pub(crate) fn tell_peer_lost(&self, nic: &NicInner, peer: Endpoint) -> std::io::Result<()> {
        let me = self.endpoint(nic);
        let a = nic
            .process
            .agent()
            .map_err(|_| std::io::Error::other("no viad session"))?;
        let reason = crate::proto::REASON_CONN_LOST;
        a.call(&Request::Disconnect { peer, me, reason }, None)
            .map(|_| ())
    }

    /// `VipDisconnect`.
    pub fn disconnect(&self, nic: &NicInner) -> Result<()> {
        let peer = {
            let mut st = self.state.lock().unwrap();
            match st.state {
                ViState::Connected | ViState::Error => {}
                ViState::Idle | ViState::ConnectPending => return Err(Error::InvalidState),
            }
            // (In ERROR by `enter_error`, the peer is not told yet.)
            let was_connected = st.state == ViState::Connected || self.break_due();
            self.set_state(&mut st, ViState::Error);
            self.broken.store(true, Ordering::Release);
            let peer = st.peer.take();
            if was_connected { peer } else { None }
        };
        nic.dev.disconnect(nic, self, false);
        // Our engine no longer touches the peer once this returns.
        nic.dev.quiesce(nic);
        if let Some(peer) = peer {
            // Wait until the peer's engine no longer uses this connection.
            if let Err(e) = self.tell_peer_lost(nic, peer) {
                log::warn!("disconnect: viad unreachable ({e}); flushing anyway");
            }
        }
        self.flush(nic, true);
        let mut st = self.state.lock().unwrap();
        self.set_state(&mut st, ViState::Idle);
        self.broken.store(false, Ordering::Release);
        Ok(())
    }
}

/// A work queue as a CQ2 probe: (VI, is-receive-queue).
pub(crate) struct QueueProbe(pub Arc<ViCore>, pub bool);

impl cq::Probe for QueueProbe {
    fn take_ready(&self) -> Option<u64> {
        let w = if self.1 { Which::Recv } else { Which::Send };
        self.0
            .take_unreported(w)
            .then(|| crate::cq::entry(self.0.slot, self.0.generation, self.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Ring::iter_mut` visits the live slots oldest first, also when they
    /// wrap around the end of the ring, and only them.
    #[test]
    fn a_ring_s_live_slots_in_order_across_the_wrap() {
        let mut r = Ring::default();
        let mut next = 1u64;
        let mut post = |r: &mut Ring| {
            r.next_slot();
            r.commit(next);
            next += 1;
        };
        for _ in 0..Ring::FIRST - 3 {
            post(&mut r);
        }
        for _ in 0..Ring::FIRST - 5 {
            assert!(r.take_front(|_| Some(())).is_some());
        }
        // Head near the end: 5 live slots before the end, 3 after the wrap.
        for _ in 0..6 {
            post(&mut r);
        }
        let want: Vec<u64> = r.iter().map(|(_, p)| p.desc_va).collect();
        assert_eq!(want.len(), 8);
        assert_eq!(
            want,
            ((Ring::FIRST as u64 - 4)..(Ring::FIRST as u64 + 4)).collect::<Vec<_>>()
        );
        let got: Vec<u64> = r.iter_mut().map(|p| p.desc_va).collect();
        assert_eq!(got, want);
    }
}
