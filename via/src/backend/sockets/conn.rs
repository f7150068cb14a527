//! One VI's TCP connection: the write side and the initiator's queue of
//! requests waiting for their completion.
//!
//! Writers: the posting thread writes its frame itself (blocking until the
//! kernel takes it, bounded by the connection timeout), under `tx`. The
//! progress thread never blocks on a write: its frames (acks, read
//! responses, heartbeats) go to `outbox`, written when `tx` is free and the
//! socket takes them; a poster flushes the outbox before its own frame. So
//! the two progress threads of a connection always read, and no pair of
//! writers can wait on each other.
//!
//! Completion order: a VI's sends complete in posting order. `awaiting`
//! holds every posted request not completed yet; its head completes first.
//! A send on Unreliable or Reliable Delivery knows its status once written;
//! a request that needs an answer (Reliable Reception sends, every RDMA
//! write, every RDMA read) gets its status from the peer: the cumulative
//! `ack` field of any frame (placed), an `ACK` with an error for that
//! request's `seq`, or the `READ_RESP` of that `seq`.
//!
//! Acknowledgements owed ([`Acks`]): every frame this side writes carries
//! the count of the peer's requests handled so far, so an answer, a
//! request (the application's reply), a heartbeat or `BYE` acknowledges
//! every placement before it. On Reliable Reception an acknowledgement
//! waits for such a frame at most `$VIA_SOCK_ACK_DELAY_US`; then whoever
//! progresses the connection (a thread polling it, or the progress thread,
//! which sleeps no longer than that) sends an `ACK` frame alone. Unreliable
//! and Reliable Delivery acknowledge their RDMA writes at once.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::frame::{self, Header};
use super::io::Gather;
use super::progress::Rx;
use crate::completion;
use crate::descriptor::status;
use crate::mem::region::Resolved;
use crate::nic::NicInner;
use crate::translate::{RecvWr, WrSeg};
use crate::vi::ViCore;

/// A request of the initiator not completed yet.
pub(crate) struct Awaiting {
    pub desc_va: u64,
    pub desc_handle: u32,
    /// `status::OP_*` of the operation.
    pub op_status: u32,
    /// Waits for an `ACK` or `READ_RESP` (not answered yet).
    pub answer: bool,
    /// RDMA read: where the bytes go.
    pub read_into: Option<Vec<WrSeg>>,
    /// Error bits once known.
    pub status: Option<u32>,
    /// The request's number on the connection (`Header::seq`; meaningless
    /// for a request completed without being written).
    pub seq: u32,
}

/// The acknowledgements this side owes the peer.
#[derive(Default)]
pub(crate) struct Acks {
    /// The peer's requests handled so far: the `ack` of the next frame.
    placed: u32,
    /// An acknowledgement the peer waits for has not been written since
    /// this instant.
    since: Option<Instant>,
}

/// `a` comes before `b` in the wrapping sequence space.
pub(crate) fn before(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
}

/// The receive the progress thread is filling (taken from the posted
/// queue at the header of a `SEND`, or of a `WRITE` with immediate data).
pub(crate) struct Taken {
    pub wr: RecvWr,
    /// Error bits found so far (`LENGTH_ERROR`, `PROTECTION_ERROR`).
    pub fault: u32,
}

/// The writer's state.
pub(crate) struct Tx {
    /// Requests written so far (the next request's `seq`).
    pub seq: u32,
    /// Header + gathered payload of the frame being written.
    pub staging: Vec<u8>,
}

/// The payload of a request frame.
pub(crate) enum Payload<'a> {
    /// `Tx::staging` (gathered there: reads, or segments this process
    /// cannot hand to the kernel by address).
    Staged,
    /// Straight from registered memory: (region, address, bytes) per
    /// segment, each checked by
    /// [`super::io::reachable`].
    Regions(&'a [(Arc<Resolved>, u64, u64)]),
}

/// Frames of the progress thread not written yet, and how much of the
/// first one the socket took.
#[derive(Default)]
pub(crate) struct Outbox {
    pub bytes: Vec<u8>,
    pub done: usize,
}

/// One VI's connection.
pub(crate) struct Conn {
    /// The VI (slot, generation).
    pub vi: (u32, u16),
    pub stream: TcpStream,
    pub tx: Mutex<Tx>,
    pub outbox: Mutex<Outbox>,
    pub awaiting: Mutex<VecDeque<Awaiting>>,
    /// See [`Taken`]; `disconnect` completes it as flushed.
    pub taken: Mutex<Option<Taken>>,
    /// The reading state: whoever holds it reads the socket (the progress
    /// thread, or a thread polling for a completion).
    pub rx: Mutex<Rx>,
    /// Milliseconds since `epoch` of the last byte read and written.
    pub last_rx: AtomicU64,
    pub last_tx: AtomicU64,
    epoch: Instant,
    /// No more frames are read or written (broken or disconnected).
    pub closed: AtomicBool,
    /// Bound of a blocking write and of silence from the peer.
    pub timeout: Duration,
    /// Most bytes per write system call (0: no bound).
    fragment: usize,
    /// The peer VI's MaxTransferSize (the smaller of the two applies; 0:
    /// not known).
    pub peer_mtu: u32,
    /// See [`Acks`]; taken after `outbox` when both are.
    acks: Mutex<Acks>,
    /// How long an owed acknowledgement waits for a frame to ride on
    /// (`$VIA_SOCK_ACK_DELAY_US`).
    pub ack_delay: Duration,
    /// Requests numbered so far (`Tx::seq`, readable without `tx`): the
    /// peer's `ack` never passes it.
    pub requests: AtomicU32,
}

impl Conn {
    pub fn new(
        vi: (u32, u16),
        stream: TcpStream,
        timeout: Duration,
        fragment: usize,
        peer_mtu: u32,
        ack_delay: Duration,
    ) -> io::Result<Conn> {
        // Every call passes MSG_DONTWAIT anyway (`io.rs`: viad may change
        // this flag of the shared file description).
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            vi,
            stream,
            tx: Mutex::new(Tx {
                seq: 0,
                staging: Vec::new(),
            }),
            outbox: Mutex::new(Outbox::default()),
            awaiting: Mutex::new(VecDeque::new()),
            taken: Mutex::new(None),
            rx: Mutex::new(Rx::default()),
            last_rx: AtomicU64::new(0),
            last_tx: AtomicU64::new(0),
            epoch: Instant::now(),
            closed: AtomicBool::new(false),
            timeout,
            fragment,
            peer_mtu,
            acks: Mutex::new(Acks::default()),
            ack_delay,
            requests: AtomicU32::new(0),
        })
    }

    /// The `ack` of a frame about to be written or queued (the caller
    /// holds `outbox`, so acks go out in order): nothing is owed after it.
    fn take_ack(&self) -> u32 {
        let mut a = self.acks.lock().unwrap();
        a.since = None;
        a.placed
    }

    /// The peer's request was handled (placed, or dropped). `want`: the
    /// peer waits for its acknowledgement, at once (`now`) or within
    /// `ack_delay`. Returns the instant by which it must be written, if it
    /// became owed now.
    pub fn handled(&self, want: bool, now: bool) -> Option<Instant> {
        let mut a = self.acks.lock().unwrap();
        a.placed = a.placed.wrapping_add(1);
        if !want {
            return None;
        }
        if now {
            drop(a);
            self.queue(
                Header {
                    op: frame::ACK,
                    ..Header::default()
                },
                &[],
            );
            return None;
        }
        match a.since {
            Some(_) => None,
            None => {
                let t = Instant::now();
                a.since = Some(t);
                Some(t + self.ack_delay)
            }
        }
    }

    /// The peer's request `seq` is refused with `st` (its `ACK` comes after
    /// the acknowledgement of every request before it).
    pub fn refuse(&self, seq: u32, st: u32) {
        self.queue(
            Header {
                op: frame::ACK,
                seq,
                status: st,
                ..Header::default()
            },
            &[],
        );
        let mut a = self.acks.lock().unwrap();
        a.placed = a.placed.wrapping_add(1);
    }

    /// The instant by which an owed acknowledgement must be written.
    pub fn ack_deadline(&self) -> Option<Instant> {
        self.acks.lock().unwrap().since.map(|t| t + self.ack_delay)
    }

    /// Writes an `ACK` frame alone if an acknowledgement has been owed for
    /// `ack_delay`; else the instant it will be due, if one is owed.
    pub fn ack_if_due(&self, now: Instant) -> Option<Instant> {
        let due = self.ack_deadline()?;
        if due > now {
            return Some(due);
        }
        self.queue(
            Header {
                op: frame::ACK,
                ..Header::default()
            },
            &[],
        );
        None
    }

    /// Milliseconds since the connection was made.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Writes every byte of `g`, waiting for room at most `timeout`
    /// without progress. The caller holds `tx`.
    fn write_blocking(&self, g: &mut Gather<'_>) -> io::Result<()> {
        let mut deadline = Instant::now() + self.timeout;
        let fd = self.stream.as_raw_fd();
        while g.left() > 0 {
            if self.closed.load(Ordering::Acquire) {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "closed"));
            }
            match g.write_to(fd, self.fragment) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => deadline = Instant::now() + self.timeout,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    let mut p = [libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    }];
                    // Short polls: a close by another thread ends the wait.
                    let _ = via_sys::poll(&mut p, (left.as_millis() as i32).clamp(1, 100));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.last_tx.store(self.now_ms(), Ordering::Relaxed);
        Ok(())
    }

    /// Writes what the progress thread queued, then the request `h` (its
    /// `seq` filled in here) with its payload: `tx.staging`, or straight
    /// from registered memory.
    pub fn send_frame(&self, tx: &mut Tx, mut h: Header, payload: Payload<'_>) -> io::Result<()> {
        let pending = {
            let mut o = self.outbox.lock().unwrap();
            // Under `outbox`: a frame queued after this one carries an
            // `ack` at least as large, and goes out after it.
            h.ack = self.take_ack();
            if o.bytes.is_empty() {
                Vec::new()
            } else {
                let done = o.done;
                let rest = o.bytes.split_off(done);
                o.bytes.clear();
                o.done = 0;
                rest
            }
        };
        h.seq = tx.seq;
        tx.seq = tx.seq.wrapping_add(1);
        self.requests.store(tx.seq, Ordering::Release);
        let head = h.encode();
        let mut g = Gather::new();
        g.push_bytes(&pending);
        g.push_bytes(&head);
        match payload {
            Payload::Staged => g.push_bytes(&tx.staging),
            Payload::Regions(segs) => {
                for (r, va, len) in segs {
                    // Checked by the caller (`Payload::Regions`); a failure
                    // here is a bug, not the peer's doing.
                    if !g.push_region(r, *va, *len) {
                        return Err(io::Error::other("a send segment became unreachable"));
                    }
                }
            }
        }
        self.write_blocking(&mut g)
    }

    /// Queues a frame of the progress side (an answer, a heartbeat, `BYE`:
    /// not a request, so not numbered) with the `ack` owed now, and tries
    /// to write it.
    pub fn queue(&self, mut h: Header, payload: &[u8]) {
        {
            let mut o = self.outbox.lock().unwrap();
            h.ack = self.take_ack();
            o.bytes.extend_from_slice(&h.encode());
            o.bytes.extend_from_slice(payload);
        }
        self.flush_outbox();
    }

    /// Writes queued frames if no poster writes now and the socket takes
    /// them. True if bytes remain queued.
    pub fn flush_outbox(&self) -> bool {
        let Ok(_tx) = self.tx.try_lock() else {
            return true;
        };
        let mut o = self.outbox.lock().unwrap();
        while o.done < o.bytes.len() {
            match super::io::send(self.stream.as_raw_fd(), &o.bytes[o.done..]) {
                Ok(0) => break,
                Ok(n) => {
                    o.done += n;
                    self.last_tx.store(self.now_ms(), Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        if o.done == o.bytes.len() {
            o.bytes.clear();
            o.done = 0;
            false
        } else {
            true
        }
    }

    /// Bytes the outbox holds.
    pub fn outbox_len(&self) -> usize {
        let o = self.outbox.lock().unwrap();
        o.bytes.len() - o.done
    }

    /// Whether the outbox holds bytes.
    pub fn outbox_pending(&self) -> bool {
        let o = self.outbox.lock().unwrap();
        o.done < o.bytes.len()
    }

    /// Completes, in order, every request at the head of `q` whose status
    /// is known.
    pub fn drain(nic: &NicInner, vi: &ViCore, q: &mut VecDeque<Awaiting>) {
        while q.front().is_some_and(|a| a.status.is_some()) {
            let a = q.pop_front().unwrap();
            Self::complete(nic, vi, &a, a.status.unwrap());
        }
    }

    fn complete(nic: &NicInner, vi: &ViCore, a: &Awaiting, err: u32) {
        let desc = nic
            .regions
            .get(a.desc_handle)
            .filter(|r| r.covers(a.desc_va, 32));
        completion::send(
            nic,
            vi,
            desc.as_deref(),
            a.desc_va,
            status::DONE | a.op_status | err,
        );
    }

    /// Completes every request not completed yet as flushed (after the
    /// connection is closed). Waits first for a poster still writing a
    /// request (it holds `tx`, and marks what it wrote before it lets go:
    /// `Sockets::post_send`); the close ends its write soon.
    pub fn flush_sends(&self, nic: &NicInner, vi: &ViCore) {
        let _tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let mut q = self.awaiting.lock().unwrap();
        while let Some(a) = q.pop_front() {
            let st = a.status.unwrap_or(status::DESC_FLUSHED_ERROR);
            Self::complete(nic, vi, &a, st);
        }
    }

    /// The peer acknowledges every request numbered below `ack` that waits
    /// for an acknowledgement (not reads: a `READ_RESP` answers those) and
    /// was not refused; `prev` is its previous `ack`. An error if `ack`
    /// goes backwards or passes the requests sent (a protocol violation).
    pub fn acked(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        prev: u32,
        ack: u32,
    ) -> Result<(), frame::BadFrame> {
        let sent = self.requests.load(Ordering::Acquire);
        if before(ack, prev) || before(sent, ack) {
            return Err(frame::BadFrame("acknowledgement out of range"));
        }
        let mut q = self.awaiting.lock().unwrap();
        for a in q.iter_mut() {
            if a.answer && a.read_into.is_none() && before(a.seq, ack) {
                a.answer = false;
                a.status = Some(0);
            }
        }
        Self::drain(nic, vi, &mut q);
        Ok(())
    }

    /// The answer (an `ACK` with error `err`, or a `READ_RESP` with status
    /// `err`; a read's payload is placed before) to request `seq`, which
    /// must be the oldest waiting for an answer and of that kind (`read`);
    /// an error otherwise (a protocol violation).
    pub fn answered(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        seq: u32,
        read: bool,
        err: u32,
    ) -> Result<(), frame::BadFrame> {
        let mut q = self.awaiting.lock().unwrap();
        let Some(a) = q.iter_mut().find(|a| a.answer) else {
            return Err(frame::BadFrame("answer without a request"));
        };
        if a.seq != seq || a.read_into.is_some() != read {
            return Err(frame::BadFrame("answer to another request"));
        }
        a.answer = false;
        a.status = Some(err);
        Self::drain(nic, vi, &mut q);
        Ok(())
    }

    /// The local segments of read `seq`, if it is the oldest request waiting
    /// for an answer.
    pub fn next_read(&self, seq: u32) -> Option<Vec<WrSeg>> {
        let q = self.awaiting.lock().unwrap();
        q.iter()
            .find(|a| a.answer)
            .filter(|a| a.seq == seq)
            .and_then(|a| a.read_into.clone())
    }

    /// Stops reading and writing; the peer sees the end of the stream.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
