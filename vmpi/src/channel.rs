//! One connection between two processes: a Reliable Delivery VI, its
//! pre-posted receive slots, send slots, and credit flow control.
//!
//! Layout of the channel's registered region (`R` receive slots, `S` send
//! slots of `slot` bytes each; a slot holds a [`wire::HEADER`] and up to
//! `slot - HEADER` bytes of eager data):
//!
//! | part | size | who writes |
//! |---|---|---|
//! | receive slots | `R * slot` | the peer's engine |
//! | send slots | `S * slot` | this process |
//! | receive descriptors | `R * 64` | this process; the peer's engine completes them |
//! | send descriptors | `S * 64` | this process |
//! | credit word | 64 | the peer, by RDMA write |
//! | credit sources | `S * 8` | this process |
//!
//! **Credits.** VIA breaks a Reliable Delivery connection when a message
//! finds no posted receive, so a process sends only into slots it knows
//! are posted: `credits = R - (sent - freed_by_peer)`. The receiver
//! re-posts a slot as soon as it has copied the message out (matched or
//! into the unexpected queue) and counts it in `freed`. The count travels
//! back in every header (piggyback) and, when half of the slots are
//! re-posted unreported, by an RDMA write of the count into the sender's
//! credit word; an RDMA write consumes no receive descriptor, so credit
//! returns never need credits themselves and cannot deadlock.
//!
//! **The write ring** (two processes, a NIC whose RDMA write stores its
//! last word last: `via::Nic::writes_tail_last`). The receive slots are
//! then a ring the peer writes by RDMA write: message `n` goes to slot
//! `n mod R`, right-aligned, followed by an 8-byte trailer (`n + 1` in the
//! high half, the message's length in the low half) that ends the slot.
//! The receiver polls the trailer of the slot it expects next in its own
//! memory; once it reads the expected number, the message before it is
//! complete. No receive descriptor is consumed and no completion written
//! on the receiving side: one cache line carries an 8-byte message, its
//! header and its trailer, as Open MPI's shared-memory fast box does.
//! Credits are counted exactly as for sends (a slot is free once the
//! receiver has copied its message out). The receive descriptors stay
//! posted but unused: a broken connection flushes them, which is how a
//! polling receiver learns of it.
//!
//! **Send completions are not on a completion queue.** Nobody waits for
//! a message or a credit return to complete (the data was copied into a
//! send slot), so the send queue is reaped lazily, when its descriptor
//! slots run out ([`Channel::desc_free`]) or when an RDMA read is
//! outstanding ([`Channel::reap`]): no CQ entry is pushed by the engine,
//! popped and dispatched per message. Receives go to the process's CQ, or,
//! with a single peer, are polled and waited for on the VI itself.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use via::descriptor::{SEGMENT_SIZE, offsets};
use via::{Cq, DescBuilder, Nic, Ptag, Region, Reliability, Vi, ViAttributes};

use crate::error::{Error, Result};
use crate::wire::{HEADER, Header};

/// A descriptor slot (control segment and two data/address segments).
const DESC: usize = 64;
/// Largest transfer one descriptor carries (the provider's limit is 1 GiB).
pub const MAX_TRANSFER: u32 = 1 << 30;

/// The largest transfer of one descriptor on `nic`: [`MAX_TRANSFER`], or
/// less where the kind of NIC allows less (the sockets NIC: 4 MiB).
pub fn transfer_limit(nic: &Nic) -> u32 {
    MAX_TRANSFER.min(nic.attributes().max_transfer_size.min(u32::MAX as u64) as u32)
}

fn via_err(what: &str, peer: u32, e: via::Error) -> Error {
    Error::Transport(format!("{what} (rank {peer}): {e:?}"))
}

/// Sizes of a channel.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Receive slots (credits).
    pub recv: usize,
    /// Send descriptor slots.
    pub send: usize,
    /// Bytes of a slot (header included; a multiple of 64).
    pub slot: usize,
}

impl Shape {
    /// Eager data a slot carries.
    pub fn eager_room(&self) -> usize {
        self.slot - HEADER
    }
}

/// What a send-queue descriptor was for (they complete in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// A message from a send slot.
    Message,
    /// An RDMA read for request `req`.
    Read(u64),
    /// A credit return.
    Credit,
}

/// A connection to one peer.
pub struct Channel {
    peer: u32,
    shape: Shape,
    vi: Vi,
    region: Region,
    send_images: Vec<Vec<u8>>,
    /// Receive slots re-posted (cumulative, wrapping).
    freed: u32,
    /// `freed` as last told to the peer.
    reported: u32,
    /// Messages sent into the peer's slots (cumulative, wrapping).
    sent: u32,
    /// Best known count of slots the peer has re-posted.
    peer_freed: u32,
    /// Next send descriptor slot.
    send_next: usize,
    inflight: VecDeque<SendOp>,
    /// The peer's credit word (address, handle).
    remote_credit: Option<(u64, u32)>,
    /// RDMA reads completed by a reap and not yet taken by the engine.
    reads_done: Vec<u64>,
    /// A send-queue descriptor that failed (seen by a lazy reap).
    failed: Option<Error>,
    /// Address of the first receive descriptor (completions give addresses).
    rdesc_base: u64,
    /// RDMA reads in `inflight`.
    reads_inflight: u32,
    /// The length a message descriptor in each send descriptor slot was
    /// last written with (0: the slot holds another kind of descriptor).
    /// The provider writes only the status into a send descriptor and
    /// clears it when the descriptor is posted, so a message of the same
    /// length posts the slot's descriptor as it is.
    sdesc_len: Box<[u32]>,
    /// The receive slot expected to complete next: the one after the last
    /// that did (slots are re-posted in the order they complete, so the
    /// receive queue's order stays 0, 1, ..). Only a hint for polling its
    /// status in memory: the provider's dequeue says which one it is.
    next_head: usize,
    /// The first [`HEADER`] bytes of the receive slot `last.0` as read when
    /// its message was taken: an eager message's data that fits in them is
    /// copied from here, with no second read of the slot.
    last: (usize, [u8; HEADER]),
    /// The header of the message taken last ([`Channel::header`]).
    hdr: Header,
    /// Messages travel by RDMA write into the receive slots (the module
    /// doc's write ring).
    ring: Option<Box<Ring>>,
}

/// The state of a channel's write ring.
struct Ring {
    /// The peer's receive slot 0 (address) and its region's handle.
    remote: (u64, u32),
    /// The number (`n + 1`) the next message written carries.
    send_seq: u32,
    /// The peer slot written next.
    send_slot: usize,
    /// The number the slot expected next must carry to hold a message.
    recv_seq: u32,
    /// Where the message of each receive slot starts in it.
    starts: Box<[usize]>,
    /// Each send descriptor slot's RDMA-write descriptor, as written last.
    images: Box<[[u8; DESC]]>,
}

/// Bytes of the trailer that ends a ring slot.
const TRAILER: usize = 8;

impl Channel {
    /// The send descriptor slot after `j` (no division on the send path).
    fn next_slot(&self, j: usize) -> usize {
        if j + 1 == self.shape.send { 0 } else { j + 1 }
    }
    fn off_send(&self, j: usize) -> usize {
        (self.shape.recv + j) * self.shape.slot
    }
    fn off_rdesc(&self, i: usize) -> usize {
        (self.shape.recv + self.shape.send) * self.shape.slot + i * DESC
    }
    fn off_sdesc(&self, j: usize) -> usize {
        self.off_rdesc(self.shape.recv) + j * DESC
    }
    fn off_credit(&self) -> usize {
        self.off_sdesc(self.shape.send)
    }
    fn off_credit_src(&self, j: usize) -> usize {
        self.off_credit() + 64 + j * 8
    }

    /// Creates the VI and region for `peer` and posts every receive slot.
    /// Receive completions go to `cq` (`None`: polled on the VI); send
    /// completions are reaped from the VI.
    pub fn new(nic: &Nic, ptag: Ptag, cq: Option<&Cq>, peer: u32, shape: Shape) -> Result<Channel> {
        let mut attrs = ViAttributes::new(Reliability::ReliableDelivery, ptag);
        attrs.max_transfer_size = transfer_limit(nic);
        attrs.enable_rdma_write = true;
        attrs.enable_rdma_read = true;
        let vi = nic.create_vi(&attrs, None, cq)?;
        let bytes = (shape.recv + shape.send) * (shape.slot + DESC) + 64 + shape.send * 8;
        let region = Region::new(nic, bytes, ptag, true, false)?;
        let mut ch = Channel {
            peer,
            shape,
            vi,
            region,
            send_images: Vec::new(),
            freed: 0,
            reported: 0,
            sent: 0,
            peer_freed: 0,
            send_next: 0,
            inflight: VecDeque::new(),
            remote_credit: None,
            reads_done: Vec::new(),
            failed: None,
            rdesc_base: 0,
            reads_inflight: 0,
            next_head: 0,
            sdesc_len: vec![0; shape.send].into_boxed_slice(),
            last: (usize::MAX, [0; HEADER]),
            hdr: Header::new(crate::wire::Kind::Eager),
            ring: None,
        };
        ch.rdesc_base = ch.region.addr(ch.off_rdesc(0))?;
        for i in 0..shape.recv {
            let at = ch.off_rdesc(i);
            DescBuilder::recv()
                .segment(&ch.region, i * shape.slot, shape.slot as u32)
                .write(&ch.region, at)?;
            ch.vi.post_recv(&ch.region, at)?;
        }
        for j in 0..shape.send {
            let at = ch.off_sdesc(j);
            DescBuilder::send()
                .segment(&ch.region, ch.off_send(j), shape.slot as u32)
                .write(&ch.region, at)?;
            let mut img = vec![0u8; offsets::SEGMENTS + SEGMENT_SIZE];
            ch.region.read(at, &mut img)?;
            ch.send_images.push(img);
        }
        Ok(ch)
    }

    /// The peer's world rank.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// The VI's slot in the NIC (what the CQ reports).
    pub fn vi_slot(&self) -> u32 {
        self.vi.slot()
    }

    /// Where the peer RDMA-writes credits: (address, handle).
    pub fn credit_word(&self) -> Result<(u64, u32)> {
        Ok((self.region.addr(self.off_credit())?, self.region.handle()))
    }

    /// Records the peer's credit word.
    pub fn set_remote_credit(&mut self, addr: u64, handle: u32) {
        self.remote_credit = Some((addr, handle));
    }

    /// Where the peer writes this channel's ring: the address of receive
    /// slot 0 (the region's handle is the credit word's).
    pub fn ring_base(&self) -> Result<u64> {
        Ok(self.region.addr(0)?)
    }

    /// Switches the channel to the write ring: the peer's receive slot 0
    /// is at `base` in the region `handle`. Both sides switch before any
    /// message (at set-up), and both shapes are the same.
    pub fn use_ring(&mut self, base: u64, handle: u32) -> Result<()> {
        let mut images = vec![[0u8; DESC]; self.shape.send].into_boxed_slice();
        for (j, img) in images.iter_mut().enumerate() {
            // Two segments: the peer's address (set per message), then the
            // send slot (its length set per message).
            let at = self.off_sdesc(j);
            DescBuilder::rdma_write(base, handle)
                .segment(&self.region, self.off_send(j), 0)
                .write(&self.region, at)?;
            self.region.read(at, img)?;
            self.sdesc_len[j] = 0;
        }
        self.ring = Some(Box::new(Ring {
            remote: (base, handle),
            send_seq: 1,
            send_slot: 0,
            recv_seq: 1,
            starts: vec![0; self.shape.recv].into_boxed_slice(),
            images,
        }));
        Ok(())
    }

    /// Whether messages travel through the write ring.
    #[inline]
    pub fn is_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// Accepts the peer's request (client/server set-up, server side).
    pub fn accept(&self, req: via::ConnRequest) -> Result<()> {
        req.accept(&self.vi)?;
        Ok(())
    }

    /// Requests the connection to the peer listening on `remote`
    /// (client/server set-up, client side).
    pub fn connect(
        &self,
        local: &via::NetAddr,
        remote: &via::NetAddr,
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.vi.connect(local, remote, timeout)?;
        Ok(())
    }

    /// Slots the peer is known to have posted for us. The credit word
    /// (written by the peer's RDMA write) is read only when the counts
    /// known so far give none.
    #[inline]
    pub fn credits(&mut self) -> u32 {
        let known =
            (self.shape.recv as u32).saturating_sub(self.sent.wrapping_sub(self.peer_freed));
        if known > 0 {
            return known;
        }
        let w = self.region.word(self.off_credit());
        if (w.wrapping_sub(self.peer_freed) as i32) > 0 {
            self.peer_freed = w;
        }
        (self.shape.recv as u32).saturating_sub(self.sent.wrapping_sub(self.peer_freed))
    }

    /// Whether half the send descriptor slots or more are in flight (worth
    /// reaping while nothing else is to be done).
    pub fn half_in_flight(&self) -> bool {
        self.inflight.len() * 2 >= self.shape.send
    }

    /// Whether a send descriptor slot is free (reaping completed sends
    /// when none is).
    #[inline]
    pub fn desc_free(&mut self) -> bool {
        if self.inflight.len() < self.shape.send {
            return true;
        }
        if let Err(e) = self.reap() {
            log::debug!("{e}");
            self.failed.get_or_insert(e);
        }
        self.inflight.len() < self.shape.send
    }

    /// Dequeues every completed send-queue descriptor; completed RDMA
    /// reads are kept for [`Channel::take_read_done`].
    ///
    /// # Errors
    /// `Transport` if one failed (the connection broke).
    pub fn reap(&mut self) -> Result<()> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        while !self.inflight.is_empty() {
            let c = match self.vi.send_done() {
                Ok(c) => c,
                Err(e) if e.kind() == via::ErrorKind::NotDone => break,
                Err(e) => return Err(e.into()),
            };
            if let Some(SendOp::Read(id)) = self.sent_done(c)? {
                self.reads_done.push(id);
            }
        }
        Ok(())
    }

    /// A completed RDMA read's request, reaped earlier.
    pub fn take_read_done(&mut self) -> Option<u64> {
        self.reads_done.pop()
    }

    /// Whether a message may go now (a credit and a send slot).
    #[inline]
    pub fn can_send(&mut self) -> bool {
        self.desc_free() && self.credits() > 0
    }

    /// Sends `h` followed by `data` (at most [`Shape::eager_room`] bytes);
    /// the data is copied, so the caller's buffer is free on return.
    /// Call only when [`Channel::can_send`].
    #[inline(always)]
    pub fn send(&mut self, h: &mut Header, data: &[u8]) -> Result<()> {
        debug_assert!(data.len() <= self.shape.eager_room());
        if self.ring.is_some() {
            return self.ring_send(h, data);
        }
        let j = self.send_next;
        h.freed = self.freed;
        self.reported = self.freed;
        let at = self.off_send(j);
        let hl = h.wire_len();
        let mut head = if h.kind == crate::wire::Kind::Eager {
            h.encode_short()
        } else {
            h.encode()
        };
        if hl + data.len() <= HEADER {
            // Data that fits in the rest of the header's bytes: one write.
            head[hl..hl + data.len()].copy_from_slice(data);
            self.region.write(at, &head[..hl + data.len()])?;
        } else {
            self.region.write(at, &head[..hl])?;
            self.region.write(at + hl, data)?;
        }
        let total = (hl + data.len()) as u32;
        let d =
            (self.shape.recv + self.shape.send) * self.shape.slot + (self.shape.recv + j) * DESC;
        if self.sdesc_len[j] != total {
            let img = &mut self.send_images[j];
            img[offsets::LENGTH..offsets::LENGTH + 4].copy_from_slice(&total.to_ne_bytes());
            let seg_len = offsets::SEGMENTS + 12;
            img[seg_len..seg_len + 4].copy_from_slice(&total.to_ne_bytes());
            self.region.write(d, img)?;
            self.sdesc_len[j] = total;
        }
        self.vi
            .post_send(&self.region, d)
            .map_err(|e| via_err("post a message", self.peer, e))?;
        self.send_next = self.next_slot(j);
        self.sent = self.sent.wrapping_add(1);
        self.inflight.push_back(SendOp::Message);
        Ok(())
    }

    /// [`Channel::send`] through the write ring: header, data and trailer
    /// into the send slot, then one RDMA write of them that ends at the
    /// end of the peer's next slot.
    #[inline(always)]
    fn ring_send(&mut self, h: &mut Header, data: &[u8]) -> Result<()> {
        let j = self.send_next;
        let (at, d) = (self.off_send(j), self.off_sdesc(j));
        let Some(r) = self.ring.as_deref_mut() else {
            return Err(Error::Intern("no write ring".into()));
        };
        h.freed = self.freed;
        self.reported = self.freed;
        let hl = h.wire_len();
        let m = hl + data.len();
        let trailer = ((u64::from(r.send_seq) << 32) | m as u64).to_ne_bytes();
        let mut head = if h.kind == crate::wire::Kind::Eager {
            h.encode_short()
        } else {
            h.encode()
        };
        if m + TRAILER <= HEADER {
            // Header, data and trailer in one write.
            head[hl..m].copy_from_slice(data);
            head[m..m + TRAILER].copy_from_slice(&trailer);
            self.region.write(at, &head[..m + TRAILER])?;
        } else {
            self.region.write(at, &head[..hl])?;
            self.region.write(at + hl, data)?;
            self.region.write(at + m, &trailer)?;
        }
        let total = ((m + TRAILER) as u32).to_ne_bytes();
        let to = r.remote.0 + ((r.send_slot + 1) * self.shape.slot - m - TRAILER) as u64;
        let img = &mut r.images[j];
        img[offsets::LENGTH..offsets::LENGTH + 4].copy_from_slice(&total);
        img[offsets::SEGMENTS..offsets::SEGMENTS + 8].copy_from_slice(&to.to_ne_bytes());
        let seg_len = offsets::SEGMENTS + SEGMENT_SIZE + 12;
        img[seg_len..seg_len + 4].copy_from_slice(&total);
        self.region.write(d, img)?;
        self.vi
            .post_send(&self.region, d)
            .map_err(|e| via_err("write a message", self.peer, e))?;
        r.send_seq = r.send_seq.wrapping_add(1);
        r.send_slot = if r.send_slot + 1 == self.shape.recv {
            0
        } else {
            r.send_slot + 1
        };
        self.send_next = self.next_slot(j);
        self.sent = self.sent.wrapping_add(1);
        self.inflight.push_back(SendOp::Message);
        Ok(())
    }

    /// Reads `len` bytes at `remote` (address, handle) of the peer into
    /// `local` at `off`, for request `req`. Needs a free descriptor slot.
    pub fn read(
        &mut self,
        remote: (u64, u32),
        local: &Region,
        off: usize,
        len: u32,
        req: u64,
    ) -> Result<()> {
        let j = self.send_next;
        let d = self.off_sdesc(j);
        self.sdesc_len[j] = 0;
        DescBuilder::rdma_read(remote.0, remote.1)
            .segment(local, off, len)
            .write(&self.region, d)?;
        self.vi
            .post_send(&self.region, d)
            .map_err(|e| via_err("post an RDMA read", self.peer, e))?;
        self.send_next = self.next_slot(j);
        self.inflight.push_back(SendOp::Read(req));
        self.reads_inflight += 1;
        Ok(())
    }

    /// Returns credits by RDMA write if half the slots went unreported.
    #[inline]
    pub fn return_credits(&mut self, force: bool) -> Result<()> {
        let unreported = self.freed.wrapping_sub(self.reported);
        if unreported == 0 || (!force && (unreported as usize) < self.shape.recv / 2) {
            return Ok(());
        }
        self.write_credits()
    }

    fn write_credits(&mut self) -> Result<()> {
        if !self.desc_free() {
            return Ok(());
        }
        let Some(remote) = self.remote_credit else {
            return Ok(());
        };
        let j = self.send_next;
        let src = self.off_credit_src(j);
        self.region.write(src, &self.freed.to_ne_bytes())?;
        let d = self.off_sdesc(j);
        self.sdesc_len[j] = 0;
        DescBuilder::rdma_write(remote.0, remote.1)
            .segment(&self.region, src, 4)
            .write(&self.region, d)?;
        self.vi.post_send(&self.region, d)?;
        self.reported = self.freed;
        self.send_next = self.next_slot(j);
        self.inflight.push_back(SendOp::Credit);
        Ok(())
    }

    /// Dequeues a completed send-queue descriptor: what it was for.
    ///
    /// # Errors
    /// `Transport` if it failed (the connection broke).
    pub fn send_done(&mut self) -> Result<Option<SendOp>> {
        let c = match self.vi.send_done() {
            Ok(c) => c,
            Err(e) if e.kind() == via::ErrorKind::NotDone => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        self.sent_done(c)
    }

    /// Waits up to `timeout` for the send queue's next completion and
    /// dequeues it (completed RDMA reads are kept for
    /// [`Channel::take_read_done`]); whether one came.
    ///
    /// # Errors
    /// `Transport` if it failed (the connection broke).
    pub fn wait_send(&mut self, timeout: Duration) -> Result<bool> {
        match self.vi.send_wait(Some(timeout)) {
            Ok(c) => {
                if let Some(SendOp::Read(id)) = self.sent_done(c)? {
                    self.reads_done.push(id);
                }
                Ok(true)
            }
            Err(e) if e.kind() == via::ErrorKind::Timeout => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until every send-queue descriptor posted (message, credit
    /// write, read) has completed, at the end of the job. A send is posted
    /// once its data is copied, before the provider has delivered it, and
    /// a disconnect flushes what is still on the send queue: closing right
    /// after the last message lost it now and then, and its receiver waited
    /// for ever. A send that fails here is the peer leaving (nothing); one
    /// still out at `deadline` is dropped with a warning.
    pub fn finish_sends(&mut self, deadline: Instant) -> Result<()> {
        while !self.inflight.is_empty() {
            if Instant::now() > deadline {
                log::warn!(
                    "finalize: {} sends to rank {} not complete in time; dropped",
                    self.inflight.len(),
                    self.peer
                );
                break;
            }
            match self.wait_send(Duration::from_millis(50)) {
                Ok(_) => {}
                Err(Error::Transport(m)) => {
                    log::debug!("while finishing: {m}");
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// RDMA reads posted and not yet dequeued.
    pub fn reads_in_flight(&self) -> bool {
        self.reads_inflight > 0
    }

    #[inline]
    fn sent_done(&mut self, c: via::Completion) -> Result<Option<SendOp>> {
        let op = self.inflight.pop_front();
        if let Some(SendOp::Read(_)) = op {
            self.reads_inflight -= 1;
        }
        if c.status & via::descriptor::status::ERROR_MASK != 0 {
            return Err(self.send_failed(c.status));
        }
        Ok(op)
    }

    #[cold]
    fn send_failed(&self, status: u32) -> Error {
        Error::Transport(format!(
            "send to rank {} failed (status {status:#x})",
            self.peer
        ))
    }

    /// The header of the message taken last (by [`Channel::recv_done`] or
    /// [`Channel::recv_wait`]; read it before taking the next).
    #[inline]
    pub fn header(&self) -> &Header {
        &self.hdr
    }

    /// Dequeues a completed receive: its slot (its header:
    /// [`Channel::header`]).
    ///
    /// # Errors
    /// `Transport` if it failed or carries a corrupt header.
    pub fn recv_done(&mut self) -> Result<Option<usize>> {
        match self.vi.recv_done() {
            Ok(c) => self.received(c).map(Some),
            Err(e) if e.kind() == via::ErrorKind::NotDone => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits up to `timeout` for a receive (a channel whose receives are
    /// not on a CQ): its slot (header: [`Channel::header`]), `None` if
    /// none came.
    ///
    /// # Errors
    /// `Transport` if it failed or carries a corrupt header.
    #[inline]
    pub fn recv_wait(&mut self, timeout: Duration, poll: u32) -> Result<Option<usize>> {
        // The head descriptor's status in memory says whether the message
        // is there (read up to `poll` more times while it is not): then it
        // is only dequeued, without the wait's set-up.
        let r = if self.head_done() || (poll > 0 && self.poll_head(poll)) {
            match self.vi.recv_done() {
                Err(e) if e.kind() == via::ErrorKind::NotDone => self.vi.recv_wait(Some(timeout)),
                r => r,
            }
        } else {
            self.vi.recv_wait(Some(timeout))
        };
        match r {
            Ok(c) => self.received(c).map(Some),
            Err(e) if e.kind() == via::ErrorKind::Timeout => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The next message of the write ring if it has landed: its slot (its
    /// header: [`Channel::header`]).
    ///
    /// # Errors
    /// `Transport` for a trailer or header that cannot be right.
    #[inline]
    pub fn ring_poll(&mut self) -> Result<Option<usize>> {
        let Some(r) = self.ring.as_deref_mut() else {
            return Err(Error::Intern("no write ring".into()));
        };
        let i = self.next_head;
        let end = (i + 1) * self.shape.slot;
        // Acquire: the peer's write stores this word last (Release), so the
        // message before it is complete once it carries the number.
        let w = self
            .region
            .load_u64(end - TRAILER)
            .ok_or_else(|| Error::Intern("ring trailer out of the region".into()))?;
        if (w >> 32) as u32 != r.recv_seq {
            return Ok(None);
        }
        let m = (w as u32) as usize;
        if !(crate::wire::SHORT..=self.shape.slot - TRAILER).contains(&m) {
            return Err(self.corrupt());
        }
        let start = self.shape.slot - TRAILER - m;
        r.starts[i] = start;
        r.recv_seq = r.recv_seq.wrapping_add(1);
        let n = m.min(HEADER);
        self.region
            .read(i * self.shape.slot + start, &mut self.last.1[..n])?;
        let h = Header::decode(&self.last.1).ok_or_else(|| self.corrupt())?;
        // The length the trailer gives must be the header's: data is read
        // only within the message.
        if m != h.wire_len()
            + if h.kind == crate::wire::Kind::Eager {
                h.len as usize
            } else {
                0
            }
        {
            return Err(self.corrupt());
        }
        self.hdr = h;
        self.last.0 = i;
        self.next_head = if i + 1 == self.shape.recv { 0 } else { i + 1 };
        if (h.freed.wrapping_sub(self.peer_freed) as i32) > 0 {
            self.peer_freed = h.freed;
        }
        Ok(Some(i))
    }

    /// A receive completed in error: the connection broke.
    #[cold]
    fn broke(&self, status: u32) -> Error {
        Error::Transport(format!(
            "connection to rank {} broke (receive status {status:#x})",
            self.peer
        ))
    }

    #[cold]
    fn corrupt(&self) -> Error {
        Error::Transport(format!("corrupt message from rank {}", self.peer))
    }

    /// Waits up to `timeout` for the next message of the write ring: its
    /// slot (header: [`Channel::header`]), `None` if none came. Polls the
    /// ring in memory, yielding the processor after `spin`; every 64 polls
    /// it looks at the VI, whose flushed receives tell of a broken
    /// connection (nothing else arrives there).
    ///
    /// # Errors
    /// `Transport` if the connection broke or a message is corrupt.
    pub fn ring_wait(&mut self, timeout: Duration, spin: Duration) -> Result<Option<usize>> {
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                if let Some(i) = self.ring_poll()? {
                    return Ok(Some(i));
                }
                std::hint::spin_loop();
            }
            match self.vi.recv_done() {
                Ok(c) if c.status & via::descriptor::status::ERROR_MASK != 0 => {
                    return Err(self.broke(c.status));
                }
                Ok(c) => {
                    return Err(Error::Intern(format!(
                        "a message by send on a write ring (descriptor {:#x})",
                        c.desc
                    )));
                }
                Err(e) if e.kind() == via::ErrorKind::NotDone => {}
                Err(e) => return Err(e.into()),
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Ok(None);
            }
            if waited >= spin {
                std::thread::yield_now();
            }
        }
    }

    /// Reads the expected receive's status up to `n` times: whether it
    /// completed. (Out of line: `tools/vmpi-count.sh` counts it with the
    /// waits, as the spinning it is.)
    #[inline(never)]
    fn poll_head(&self, n: u32) -> bool {
        for _ in 0..n {
            std::hint::spin_loop();
            if self.head_done() {
                return true;
            }
        }
        false
    }

    /// Whether the receive expected next has completed (its status in
    /// memory; a wrong guess costs a wait, nothing else).
    fn head_done(&self) -> bool {
        self.region.status(self.off_rdesc(self.next_head)) & via::descriptor::status::DONE != 0
    }

    #[inline]
    fn received(&mut self, c: via::Completion) -> Result<usize> {
        if c.status & via::descriptor::status::ERROR_MASK != 0 {
            return Err(self.broke(c.status));
        }
        let base = self.rdesc_base;
        let i = (c.desc.wrapping_sub(base) as usize) / DESC;
        if i >= self.shape.recv {
            return Err(Error::Intern(format!(
                "completion of an unknown descriptor {:#x}",
                c.desc
            )));
        }
        self.next_head = if i + 1 == self.shape.recv { 0 } else { i + 1 };
        self.last.0 = i;
        self.region.read(i * self.shape.slot, &mut self.last.1)?;
        self.hdr = Header::decode(&self.last.1)
            .ok_or_else(|| Error::Transport(format!("corrupt header from rank {}", self.peer)))?;
        if (self.hdr.freed.wrapping_sub(self.peer_freed) as i32) > 0 {
            self.peer_freed = self.hdr.freed;
        }
        Ok(i)
    }

    /// Copies the data of slot `i`, whose header is `h` (from byte `off`
    /// of the data), into `dst`.
    #[inline]
    pub fn read_data(&self, i: usize, h: &Header, off: usize, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let hl = h.wire_len();
        let end = hl + off + dst.len();
        if end > self.shape.slot {
            return Err(Error::Intern("eager data beyond its slot".into()));
        }
        if self.last.0 == i && end <= HEADER {
            // Read with the header.
            dst.copy_from_slice(&self.last.1[hl + off..end]);
            return Ok(());
        }
        let start = self.ring.as_deref().map_or(0, |r| r.starts[i]);
        self.region
            .read(i * self.shape.slot + start + hl + off, dst)?;
        Ok(())
    }

    /// Posts slot `i` again and counts the credit. The descriptor is
    /// posted as it is: the provider writes only `Length`, `ImmediateData`
    /// and `Status` into a receive descriptor, ignores the first two for a
    /// receive being posted, and clears the status when it is posted.
    pub fn repost(&mut self, i: usize) -> Result<()> {
        let at = self.off_rdesc(i);
        if self.last.0 == i {
            self.last.0 = usize::MAX;
        }
        if self.ring.is_some() {
            // A ring slot is free once copied out: counted, nothing posted.
            self.freed = self.freed.wrapping_add(1);
            return Ok(());
        }
        self.vi
            .post_recv(&self.region, at)
            .map_err(|e| via_err("re-post a receive", self.peer, e))?;
        self.freed = self.freed.wrapping_add(1);
        Ok(())
    }

    /// Disconnects (end of the job).
    pub fn disconnect(&self) {
        let _ = self.vi.disconnect();
    }
}
