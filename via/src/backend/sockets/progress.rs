//! The progress thread of a sockets NIC: reads the frames of every
//! connection, checks and places them, completes receives in the user's
//! descriptors, answers requests, sends heartbeats and breaks silent
//! connections. So a receiver or an RDMA target that never calls the
//! library still progresses.
//!
//! It polls the connections (and a wake-up socket), spinning without
//! sleeping for `$VIA_SOCK_SPIN_US` after the last activity, then sleeping
//! in `ppoll` until data arrives, the next heartbeat is due, or an owed
//! acknowledgement is (`conn.rs`: a thread polling a connection that leaves
//! an acknowledgement owed wakes it if it would sleep past that). `poll`
//! rather than epoll: a NIC has few VIs, and the set changes only when a
//! connection comes or goes. It never blocks on a write (see `conn.rs`).
#![forbid(unsafe_code)]

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::conn::{Conn, Taken};
use super::frame::{self, HEADER, Header};
use super::io::Scatter;
use super::{Break, MAX_TRANSFER, Shared};
use crate::attrs::Reliability;
use crate::completion;
use crate::descriptor::status;
use crate::mem::region::Resolved;
use crate::nic::{AsyncError, ErrorCode, NicInner, ResourceCode, flags};
use crate::translate::{RecvWr, WrSeg};
use crate::vi::{ViCore, Which};

/// Where the payload of the frame being read goes.
enum Target {
    /// The taken receive (`Conn::taken`).
    Recv,
    /// An RDMA target region that passed the checks.
    Rdma(Arc<Resolved>),
    /// The local segments of our RDMA read.
    Read(Vec<WrSeg>),
    /// Nowhere (Unreliable without a receive).
    Discard,
    /// Nowhere: the RDMA write failed the target's protection checks.
    Denied,
}

/// Bytes read at once into the read buffer: headers, small payloads, the
/// first bytes of a large one, and payloads that go nowhere. The rest of a
/// payload of at least [`DIRECT_MIN`] bytes is read straight into its
/// target (`read_direct`).
const READ_CHUNK: usize = 16 << 10;

/// Payload bytes from which the rest of a frame is read straight into its
/// target rather than through the read buffer.
const DIRECT_MIN: usize = 4 << 10;

/// Bytes one `read_conn` reads at most before it returns (the socket is
/// polled again at once, level-triggered): bounds how long it holds the
/// region users' lock (`Shared::region_users`) that deregistration waits
/// for.
const READ_BUDGET: usize = 4 << 20;

/// Bytes of answers (RDMA read responses) queued for a peer that does not
/// read them, beyond which its requests are not read either: a peer cannot
/// make us buffer without bound (a pair that both read and write in bulk
/// stays far below it).
const OUTBOX_LIMIT: usize = 64 << 20;

/// How long the progress thread sleeps no longer than the acknowledgement
/// delay after a polling thread last left an acknowledgement owed.
const TICKING: Duration = Duration::from_millis(10);

/// The reading state of one connection.
pub(crate) struct Rx {
    buf: Vec<u8>,
    hdr: [u8; HEADER],
    hgot: usize,
    cur: Option<(Header, Target)>,
    /// Payload bytes still to read, and read so far.
    left: usize,
    off: usize,
    /// The `seq` the next request frame must carry.
    expect_seq: u32,
    /// The peer's last cumulative acknowledgement.
    peer_ack: u32,
}

impl Default for Rx {
    fn default() -> Rx {
        Rx {
            buf: Vec::new(),
            hdr: [0; HEADER],
            hgot: 0,
            cur: None,
            left: 0,
            off: 0,
            expect_seq: 0,
            peer_ack: 0,
        }
    }
}

fn lost(c: &Conn) -> Break {
    Break {
        vi: c.vi,
        code: ErrorCode::ConnLost,
        orderly: false,
    }
}

fn pollfd(fd: i32, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// The thread's body; returns when the NIC closes.
pub(crate) fn run(shared: Arc<Shared>, nic: Weak<NicInner>) {
    // A pinned creator (a benchmark, an MPI rank) must not pin the thread
    // that progresses its receives to the core its own polling loop holds.
    if let Err(e) = via_sys::allow_all_cpus() {
        log::debug!("sockets progress: affinity: {e}");
    }
    let mut conns: Vec<Arc<Conn>> = Vec::new();
    let mut version = u32::MAX;
    let mut last_active = Instant::now();
    let mut ticking_until = last_active;
    let settings = shared.settings;
    let beat = settings.timeout / 4;
    let mut fds = Vec::new();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        // Acquire: pairs with the Release bump after a connection is
        // installed or removed.
        let v = shared.conns_version.load(Ordering::Acquire);
        if v != version {
            version = v;
            conns.clear();
            for w in shared.vis.iter() {
                let Some(c) = w.conn.read().unwrap().clone() else {
                    continue;
                };
                if !c.closed.load(Ordering::Acquire) {
                    conns.push(c);
                }
            }
        }
        fds.clear();
        fds.push(pollfd(shared.wake_rx.as_raw_fd(), libc::POLLIN));
        for c in &conns {
            let queued = c.outbox_len();
            let ev = if queued > OUTBOX_LIMIT {
                libc::POLLOUT
            } else if queued > 0 {
                libc::POLLIN | libc::POLLOUT
            } else {
                libc::POLLIN
            };
            fds.push(pollfd(c.stream.as_raw_fd(), ev));
        }
        let now = Instant::now();
        let mut until = if last_active.elapsed() < settings.spin {
            now
        } else {
            now + beat.clamp(Duration::from_millis(1), Duration::from_secs(1))
        };
        // Published before the owed acknowledgements are read (see
        // `Shared::wake_by`).
        shared
            .asleep_until
            .store(shared.micros(until), Ordering::SeqCst);
        for c in &conns {
            if let Some(d) = c.ack_deadline() {
                until = until.min(d);
            }
        }
        if shared.polled_owed.swap(false, Ordering::Relaxed) {
            ticking_until = now + TICKING;
        }
        if now < ticking_until {
            until = until.min(now + settings.ack_delay);
        }
        shared
            .asleep_until
            .store(shared.micros(until), Ordering::SeqCst);
        let r = via_sys::ppoll(&mut fds, Some(until.saturating_duration_since(now)));
        shared.asleep_until.store(0, Ordering::SeqCst);
        if let Err(e) = r {
            if e.kind() != io::ErrorKind::Interrupted {
                log::error!("sockets progress: poll: {e}");
                return;
            }
            continue;
        }
        if fds[0].revents != 0 {
            let mut b = [0u8; 64];
            while matches!((&shared.wake_rx).read(&mut b), Ok(n) if n > 0) {}
        }
        let Some(nic) = nic.upgrade() else {
            return;
        };
        let mut breaks = Vec::new();
        for (i, c) in conns.iter().enumerate() {
            if c.closed.load(Ordering::Acquire) {
                continue;
            }
            let re = fds[i + 1].revents;
            if re & libc::POLLOUT != 0 {
                c.flush_outbox();
            }
            if re & !libc::POLLOUT != 0 {
                last_active = Instant::now();
                // Busy: a polling thread reads it now.
                if let Ok(mut rx) = c.rx.try_lock() {
                    if let Err(b) = read_conn(&nic, &shared, c, &mut rx) {
                        drop(rx);
                        breaks.push((c.clone(), b));
                        continue;
                    }
                }
            }
            c.ack_if_due(Instant::now());
            let now = c.now_ms();
            if now.saturating_sub(c.last_rx.load(Ordering::Relaxed))
                > settings.timeout.as_millis() as u64
            {
                log::debug!("VI {}: nothing heard for {:?}", c.vi.0, settings.timeout);
                breaks.push((c.clone(), lost(c)));
            } else if now.saturating_sub(c.last_tx.load(Ordering::Relaxed))
                >= beat.as_millis() as u64
            {
                c.queue(
                    Header {
                        op: frame::HEARTBEAT,
                        ..Header::default()
                    },
                    &[],
                );
            }
        }
        for (c, b) in breaks {
            settle(&nic, &shared, &c, b);
        }
    }
}

/// Progress by a thread that polls for a completion of the VI in `slot`
/// (or of a CQ it is a member of): reads its connection if nobody else
/// does.
pub(crate) fn poll(nic: &NicInner, shared: &Shared, slot: u32) {
    let Some(c) = shared
        .vis
        .get(slot as usize)
        .and_then(|w| w.conn.read().unwrap().clone())
    else {
        return;
    };
    if c.closed.load(Ordering::Acquire) {
        return;
    }
    if c.outbox_pending() {
        c.flush_outbox();
    }
    let r = match c.rx.try_lock() {
        Ok(mut rx) => read_conn(nic, shared, &c, &mut rx),
        Err(_) => Ok(()),
    };
    if let Err(b) = r {
        settle(nic, shared, &c, b);
        return;
    }
    // An acknowledgement owed: sent alone once due; until then the
    // progress thread must look by then (this thread may stop polling).
    if let Some(due) = c.ack_if_due(Instant::now()) {
        shared.wake_by(due);
    }
}

/// Breaks the connection of `c` for `b`. The VI breaks only if `c` is
/// still its connection: one its own `VipDisconnect` took away (and shut
/// down, so that reading it ends) may be read to its end after the VI
/// connected again, and must not break the new connection (the C program
/// `accept_disconnect` between hosts: a server that accepts, disconnects
/// and accepts again found its VI in ERROR right after an accept, under
/// load).
pub(crate) fn settle(nic: &NicInner, shared: &Shared, c: &Conn, b: Break) {
    let current = shared.vis[c.vi.0 as usize]
        .conn
        .read()
        .unwrap()
        .as_ref()
        .is_some_and(|cur| std::ptr::eq(cur.as_ref(), c));
    if !current {
        log::debug!("VI {}: a former connection ended", c.vi.0);
        c.close();
        return;
    }
    if let Some(vi) = nic.vi(b.vi.0, b.vi.1) {
        if b.orderly {
            vi.peer_disconnected(nic);
        } else {
            vi.break_connection(nic, b.code, false, false);
        }
    }
    // Whatever the VI's state was (connecting, or already broken): this
    // connection is over.
    c.close();
}

/// Reads what `c` has; `Err`: the connection must break.
fn read_conn(nic: &NicInner, shared: &Shared, c: &Conn, rx: &mut Rx) -> Result<(), Break> {
    if c.outbox_len() > OUTBOX_LIMIT {
        return Ok(());
    }
    let vi = nic.vi(c.vi.0, c.vi.1).ok_or_else(|| lost(c))?;
    // Held while bytes may land in registered memory: a deregistration
    // waits for it (`quiesce_region_users`), and regions are looked up
    // under it (one removed before is not found).
    let _users = shared.region_users.read().unwrap();
    let mut buf = std::mem::take(&mut rx.buf);
    buf.resize(READ_CHUNK, 0);
    let r = read_into(nic, shared, c, &vi, rx, &mut buf);
    rx.buf = buf;
    r
}

fn read_into(
    nic: &NicInner,
    shared: &Shared,
    c: &Conn,
    vi: &ViCore,
    rx: &mut Rx,
    buf: &mut [u8],
) -> Result<(), Break> {
    let mut budget = READ_BUDGET;
    loop {
        // The rest of a large payload goes straight into its target.
        if rx.cur.is_some() && rx.left >= DIRECT_MIN {
            let want = rx.left;
            match read_direct(nic, c, vi, rx) {
                None => {}
                Some(Ok(0)) => return Err(lost(c)),
                Some(Ok(k)) => {
                    c.last_rx.store(c.now_ms(), Ordering::Relaxed);
                    rx.left -= k;
                    rx.off += k;
                    if rx.left == 0 {
                        finish(nic, shared, c, vi, rx)?;
                    }
                    budget = budget.saturating_sub(k);
                    // Fewer bytes than asked for: the socket is empty now
                    // (poll reports the next ones, level-triggered).
                    if k < want || budget == 0 {
                        return Ok(());
                    }
                    continue;
                }
                Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Some(Err(e)) if e.raw_os_error() == Some(libc::EFAULT) => {
                    // The target's memory went away under the read: the
                    // rest of the payload is discarded through the buffer.
                    log::debug!("VI {}: payload target unreachable: {e}", c.vi.0);
                    target_fault(c, rx);
                }
                Some(Err(_)) => return Err(lost(c)),
            }
        }
        let n = match super::io::recv(c.stream.as_raw_fd(), buf) {
            Ok(0) => return Err(lost(c)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(lost(c)),
        };
        c.last_rx.store(c.now_ms(), Ordering::Relaxed);
        let mut p = 0;
        while p < n {
            if rx.cur.is_none() {
                let k = (HEADER - rx.hgot).min(n - p);
                rx.hdr[rx.hgot..rx.hgot + k].copy_from_slice(&buf[p..p + k]);
                rx.hgot += k;
                p += k;
                if rx.hgot == HEADER {
                    rx.hgot = 0;
                    let h = Header::decode(&rx.hdr).map_err(|e| violation(c, e.0))?;
                    begin(nic, shared, c, vi, rx, h)?;
                }
            } else {
                let k = rx.left.min(n - p);
                place(nic, c, vi, rx, &buf[p..p + k]);
                rx.left -= k;
                rx.off += k;
                p += k;
                if rx.left == 0 {
                    finish(nic, shared, c, vi, rx)?;
                }
            }
        }
        budget = budget.saturating_sub(n);
        if n < buf.len() || budget == 0 {
            return Ok(());
        }
    }
}

/// The current frame's target cannot take its bytes (they are discarded):
/// the receive completes with a protection error, an RDMA write is
/// refused, our read completes with a protection error.
fn target_fault(c: &Conn, rx: &mut Rx) {
    let Some((h, target)) = &mut rx.cur else {
        return;
    };
    match target {
        Target::Recv => {
            if let Some(t) = c.taken.lock().unwrap().as_mut() {
                t.fault |= status::PROTECTION_ERROR;
            }
        }
        Target::Rdma(_) => *target = Target::Denied,
        Target::Read(_) => h.status |= status::PROTECTION_ERROR,
        Target::Discard | Target::Denied => {}
    }
}

/// The regions and byte ranges of the window `off..off + len` of the
/// concatenated segments `segs` ((handle, address, length)), each checked
/// inside its region and reachable by address; `None` if one is not (the
/// read buffer's path then finds and reports the fault).
fn window(
    nic: &NicInner,
    segs: impl Iterator<Item = (u32, u64, u64)>,
    mut off: u64,
    mut len: u64,
) -> Option<Vec<(Arc<Resolved>, u64, u64)>> {
    let mut out = Vec::new();
    for (handle, va, n) in segs {
        if len == 0 {
            break;
        }
        if off >= n {
            off -= n;
            continue;
        }
        let k = (n - off).min(len);
        let r = nic.regions.get(handle)?;
        let at = va.checked_add(off)?;
        if !super::io::reachable(&r, at, k) {
            return None;
        }
        out.push((r, at, k));
        len -= k;
        off = 0;
    }
    (len == 0).then_some(out)
}

/// Reads the next payload bytes of the current frame straight into its
/// target: the posted receive's scatter list, an RDMA write's target region
/// (which passed the target-side checks in `begin` and is still
/// registered), or the local segments of our RDMA read. `None`: the bytes
/// go through the read buffer (the target is none of those, has a fault,
/// or is not reachable by address).
fn read_direct(nic: &NicInner, c: &Conn, vi: &ViCore, rx: &mut Rx) -> Option<io::Result<usize>> {
    let fd = c.stream.as_raw_fd();
    let (off, left) = (rx.off as u64, rx.left as u64);
    let (h, target) = rx.cur.as_mut()?;
    let read = |w: Vec<(Arc<Resolved>, u64, u64)>| {
        let mut s = Scatter::new();
        for (r, va, n) in &w {
            if !s.push_region(r, *va, *n) {
                return None;
            }
        }
        Some(s.read_from(fd))
    };
    match target {
        Target::Rdma(r) => {
            if !rdma_still(nic, vi, h, r) {
                *target = Target::Denied;
                return None;
            }
            read(window(
                nic,
                [(r.handle, h.va, h.len as u64)].into_iter(),
                off,
                left,
            )?)
        }
        Target::Recv => {
            // Held across the read: a disconnect flushes the receive
            // either before or after, never while its bytes land.
            let t = c.taken.lock().unwrap();
            let t = t.as_ref().filter(|t| t.fault == 0)?;
            // Receive segments are (offset in region, length, handle).
            let segs = t.wr.segs[..t.wr.n].iter().map(|s| {
                let base = nic.regions.get(s.2).map_or(0, |r| r.va);
                (s.2, base.saturating_add(s.0), s.1 as u64)
            });
            read(window(nic, segs, off, left)?)
        }
        Target::Read(segs) => {
            let segs = segs.iter().map(|s| (s.handle, s.va, s.len as u64));
            read(window(nic, segs, off, left)?)
        }
        Target::Discard | Target::Denied => None,
    }
}

fn violation(c: &Conn, what: &str) -> Break {
    log::warn!("VI {}: the peer broke the protocol ({what})", c.vi.0);
    lost(c)
}

/// The next posted receive of `vi`.
fn take_recv(shared: &Shared, vi: &ViCore) -> Option<RecvWr> {
    shared.vis[vi.slot as usize]
        .recvs
        .lock()
        .unwrap()
        .pop_front()
        .map(|(_, wr)| wr)
}

/// An RDMA target region of `vi` allowing `need` and covering the frame's
/// bytes: the target side's protection checks.
fn rdma_target(nic: &NicInner, vi: &ViCore, h: &Header, need: u32) -> Option<Arc<Resolved>> {
    let r = nic.regions.get(h.handle)?;
    let a = vi.attributes();
    let vi_ok = match need {
        flags::RDMA_WRITE => a.enable_rdma_write,
        _ => a.enable_rdma_read,
    };
    (vi_ok && r.flags & need != 0 && r.ptag == a.ptag.id() && r.covers(h.va, h.len as u64))
        .then_some(r)
}

/// Whether the RDMA write target `r` (checked at the frame's header) still
/// passes the checks: registered, with the same attributes, or else again
/// (then `r` becomes the region as it is now). Called under
/// `Shared::region_users` before bytes land.
fn rdma_still(nic: &NicInner, vi: &ViCore, h: &Header, r: &mut Arc<Resolved>) -> bool {
    if nic
        .regions
        .get(r.handle)
        .is_some_and(|x| Arc::ptr_eq(&x, r))
    {
        return true;
    }
    match rdma_target(nic, vi, h, flags::RDMA_WRITE) {
        Some(now) => {
            *r = now;
            true
        }
        None => false,
    }
}

/// No receive for a message: Unreliable drops it; the reliable levels
/// break the connection (`RECVQ_EMPTY`), after telling a waiting sender.
fn recvq_empty(c: &Conn, vi: &ViCore, h: &Header) -> Result<Target, Break> {
    if !vi.reliability().is_reliable() {
        return Ok(Target::Discard);
    }
    if h.flags & frame::WANT_ACK != 0 {
        c.refuse(h.seq, status::REMOTE_DESC_ERROR);
    }
    Err(Break {
        vi: c.vi,
        code: ErrorCode::RecvqEmpty,
        orderly: false,
    })
}

/// A frame's header arrived: choose where its payload goes.
fn begin(
    nic: &NicInner,
    shared: &Shared,
    c: &Conn,
    vi: &ViCore,
    rx: &mut Rx,
    h: Header,
) -> Result<(), Break> {
    // Every frame acknowledges our requests the peer placed before it.
    if h.ack != rx.peer_ack {
        c.acked(nic, vi, rx.peer_ack, h.ack)
            .map_err(|e| violation(c, e.0))?;
        rx.peer_ack = h.ack;
    }
    if matches!(h.op, frame::SEND | frame::WRITE | frame::READ_REQ) {
        if h.seq != rx.expect_seq {
            return Err(violation(c, "sequence"));
        }
        rx.expect_seq = rx.expect_seq.wrapping_add(1);
    }
    if h.len > MAX_TRANSFER {
        return Err(violation(c, "length"));
    }
    let target = match h.op {
        frame::SEND => match take_recv(shared, vi) {
            Some(wr) => {
                let cap: u64 = wr.segs[..wr.n].iter().map(|s| s.1 as u64).sum();
                let fault = if h.len as u64 > cap {
                    status::LENGTH_ERROR
                } else {
                    0
                };
                *c.taken.lock().unwrap() = Some(Taken { wr, fault });
                Target::Recv
            }
            None => recvq_empty(c, vi, &h)?,
        },
        frame::WRITE => match rdma_target(nic, vi, &h, flags::RDMA_WRITE) {
            Some(r) if h.flags & frame::IMM != 0 => match take_recv(shared, vi) {
                Some(wr) => {
                    *c.taken.lock().unwrap() = Some(Taken { wr, fault: 0 });
                    Target::Rdma(r)
                }
                None => recvq_empty(c, vi, &h)?,
            },
            Some(r) => Target::Rdma(r),
            None => Target::Denied,
        },
        frame::READ_RESP => match c.next_read(h.seq) {
            Some(segs) => {
                let want: u64 = segs.iter().map(|s| s.len as u64).sum();
                if h.status == 0 && h.len as u64 != want || h.status != 0 && h.len != 0 {
                    return Err(violation(c, "read response length"));
                }
                Target::Read(segs)
            }
            _ => return Err(violation(c, "read response without a read")),
        },
        _ => Target::Discard,
    };
    rx.cur = Some((h, target));
    rx.left = h.payload();
    rx.off = 0;
    if rx.left == 0 {
        finish(nic, shared, c, vi, rx)?;
    }
    Ok(())
}

/// Writes `bytes`, at offset `off` of the concatenated `segs`
/// ((address, length, handle)), into the regions.
fn scatter(
    nic: &NicInner,
    segs: impl Iterator<Item = (Option<u64>, u64, u32)>,
    mut off: usize,
    bytes: &[u8],
) -> bool {
    let mut done = 0usize;
    for (va, len, handle) in segs {
        let len = len as usize;
        if off >= len {
            off -= len;
            continue;
        }
        let k = (len - off).min(bytes.len() - done);
        let Some(r) = nic.regions.get(handle) else {
            return false;
        };
        let at = va.unwrap_or(r.va);
        if r.write(at + off as u64, &bytes[done..done + k]).is_err() {
            return false;
        }
        done += k;
        off = 0;
        if done == bytes.len() {
            break;
        }
    }
    done == bytes.len()
}

/// Places payload bytes of the current frame.
fn place(nic: &NicInner, c: &Conn, vi: &ViCore, rx: &mut Rx, bytes: &[u8]) {
    let Some((h, target)) = &mut rx.cur else {
        return;
    };
    match target {
        Target::Recv => {
            let mut t = c.taken.lock().unwrap();
            if let Some(t) = t.as_mut().filter(|t| t.fault == 0) {
                // Receive segments are (offset in region, length, handle).
                let segs = t.wr.segs[..t.wr.n].iter().map(|s| {
                    let base = nic.regions.get(s.2).map_or(0, |r| r.va);
                    (Some(base + s.0), s.1 as u64, s.2)
                });
                if !scatter(nic, segs, rx.off, bytes) {
                    t.fault = status::PROTECTION_ERROR;
                }
            }
        }
        Target::Rdma(r) => {
            if !rdma_still(nic, vi, h, r) || r.write(h.va + rx.off as u64, bytes).is_err() {
                *target = Target::Denied;
            }
        }
        Target::Read(segs) => {
            let segs = segs.iter().map(|s| (Some(s.va), s.len as u64, s.handle));
            if !scatter(nic, segs, rx.off, bytes) {
                h.status |= status::PROTECTION_ERROR;
            }
        }
        Target::Discard | Target::Denied => {}
    }
}

fn report(nic: &NicInner, c: &Conn, code: ErrorCode) {
    nic.report(AsyncError {
        resource: ResourceCode::Vi,
        code,
        vi: Some(c.vi),
        cq: None,
        descriptor: 0,
    });
}

/// A protection violation on the target: the initiator hears
/// `RDMA_PROT_ERROR`; a reliable connection breaks.
fn violated(nic: &NicInner, c: &Conn, vi: &ViCore, code: ErrorCode) -> Result<(), Break> {
    if vi.reliability().is_reliable() {
        Err(Break {
            vi: c.vi,
            code,
            orderly: false,
        })
    } else {
        report(nic, c, code);
        Ok(())
    }
}

/// Completes receive `wr` of `vi`.
fn complete_recv(
    nic: &NicInner,
    vi: &ViCore,
    wr: &RecvWr,
    st: u32,
    len: Option<u32>,
    imm: Option<u32>,
) {
    if let Some(d) = nic.regions.get(wr.desc_handle) {
        let va = d.va + wr.desc_off;
        if completion::write_in_region(&d, va, st, len, imm).is_ok() {
            completion::after_local(nic, vi, Which::Recv);
        }
    }
}

/// Completes the receive `c` was filling as flushed (the connection
/// ended under it).
pub(crate) fn flush_taken(nic: &NicInner, vi: &ViCore, c: &Conn) {
    let t = c.taken.lock().unwrap().take();
    if let Some(t) = t {
        complete_recv(
            nic,
            vi,
            &t.wr,
            status::DONE | status::DESC_FLUSHED_ERROR | status::OP_RECEIVE,
            None,
            None,
        );
    }
}

/// Puts `vi` in ERROR before a failed status of its reliable connection
/// `c` is written, when the failure breaks the connection (the break
/// itself follows: [`settle`], or the peer's end of the stream): a program
/// that sees the status finds the VI in ERROR. Not when `c` is no longer
/// the VI's connection (one read to its end after a disconnect, the VI
/// perhaps connected anew); holding the connection's lock, a disconnect
/// cannot take `c` away before the mark is made.
pub(crate) fn breaks_now(shared: &Shared, c: &Conn, vi: &ViCore) {
    if !vi.reliability().is_reliable() {
        return;
    }
    let cur = shared.vis[c.vi.0 as usize].conn.read().unwrap();
    if cur
        .as_ref()
        .is_some_and(|cur| std::ptr::eq(cur.as_ref(), c))
    {
        // Release: pairs with the Acquire in `ViCore::vi_state`.
        vi.broken.store(true, Ordering::Release);
    }
}

/// The current frame is complete.
fn finish(
    nic: &NicInner,
    shared: &Shared,
    c: &Conn,
    vi: &ViCore,
    rx: &mut Rx,
) -> Result<(), Break> {
    let Some((h, target)) = rx.cur.take() else {
        return Ok(());
    };
    let imm = (h.flags & frame::IMM != 0).then_some(h.imm);
    let imm_bit = if imm.is_some() { status::IMMEDIATE } else { 0 };
    let want_ack = h.flags & frame::WANT_ACK != 0;
    // Reliable Reception acknowledges within the delay, riding on the next
    // frame out if it can; the other levels acknowledge (their RDMA
    // writes) at once.
    let now = vi.reliability() != Reliability::ReliableReception;
    match h.op {
        frame::SEND => {
            if !matches!(target, Target::Recv) {
                c.handled(false, now);
                return Ok(());
            }
            // None: flushed by a disconnect meanwhile.
            let Some(t) = c.taken.lock().unwrap().take() else {
                c.handled(false, now);
                return Ok(());
            };
            // Acknowledged (owed) before the completion is visible: a
            // reply the application posts on seeing it carries the
            // acknowledgement.
            if t.fault != 0 {
                if want_ack {
                    c.refuse(h.seq, status::REMOTE_DESC_ERROR);
                } else {
                    c.handled(false, now);
                }
            } else {
                c.handled(want_ack, now);
            }
            if t.fault != 0 {
                breaks_now(shared, c, vi);
            }
            let len = (t.fault == 0).then_some(h.len).or(Some(0));
            complete_recv(
                nic,
                vi,
                &t.wr,
                status::DONE | status::OP_RECEIVE | t.fault | imm_bit,
                len,
                imm,
            );
            if t.fault != 0 && vi.reliability().is_reliable() {
                return Err(lost(c));
            }
        }
        frame::WRITE => match target {
            Target::Denied => {
                if want_ack {
                    c.refuse(h.seq, status::RDMA_PROT_ERROR);
                } else {
                    c.handled(false, now);
                }
                return violated(nic, c, vi, ErrorCode::RdmawProt);
            }
            Target::Rdma(_) => {
                c.handled(want_ack, now);
                if imm.is_some() {
                    if let Some(t) = c.taken.lock().unwrap().take() {
                        complete_recv(
                            nic,
                            vi,
                            &t.wr,
                            status::DONE | status::OP_REMOTE_RDMA_WRITE | imm_bit,
                            Some(h.len),
                            imm,
                        );
                    }
                }
            }
            _ => {
                c.handled(want_ack, now);
            }
        },
        frame::READ_REQ => {
            let data = rdma_target(nic, vi, &h, flags::RDMA_READ).and_then(|r| {
                let mut d = vec![0u8; h.len as usize];
                r.read(h.va, &mut d).ok().map(|()| d)
            });
            c.handled(false, now);
            match data {
                Some(d) => c.queue(
                    Header {
                        op: frame::READ_RESP,
                        len: h.len,
                        seq: h.seq,
                        ..Header::default()
                    },
                    &d,
                ),
                None => {
                    c.queue(
                        Header {
                            op: frame::READ_RESP,
                            seq: h.seq,
                            status: status::RDMA_PROT_ERROR,
                            ..Header::default()
                        },
                        &[],
                    );
                    return violated(nic, c, vi, ErrorCode::RdmarProt);
                }
            }
        }
        frame::READ_RESP => {
            if h.status != 0 {
                breaks_now(shared, c, vi);
            }
            c.answered(nic, vi, h.seq, true, h.status)
                .map_err(|e| violation(c, e.0))?;
        }
        // Status 0: the acknowledgement (`begin`) was all it carried.
        frame::ACK if h.status != 0 => {
            breaks_now(shared, c, vi);
            c.answered(nic, vi, h.seq, false, h.status)
                .map_err(|e| violation(c, e.0))?;
        }
        frame::BYE => {
            return Err(Break {
                vi: c.vi,
                code: ErrorCode::ConnLost,
                orderly: true,
            });
        }
        _ => {}
    }
    Ok(())
}
