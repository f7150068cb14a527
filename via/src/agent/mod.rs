//! The library's side of the viad session.
//!
//! One [`Agent`] per process: a `SOCK_SEQPACKET` connection to the daemon,
//! a reader thread that routes replies to the threads waiting for them, and
//! a worker thread that handles the daemon's events (a peer died, a peer
//! disconnected, the daemon itself is gone). Events are handled off the
//! reader thread because handling them takes engine locks, and an engine
//! may itself be waiting for a reply.
//!
//! The daemon is found at a path in a private directory ([`place`]); before
//! anything is sent, `SO_PEERCRED` must show the expected uid. The system
//! daemon (`viad --system`, root) is used when it runs and checks out;
//! otherwise the per-user one: when none listens, [`Agent::connect`] starts
//! one (`viad --daemon`) and connects to it. The `Welcome` tells which
//! daemon it is and the session's limits ([`DaemonInfo`]); a `Publish` of
//! an arena beyond the system daemon's pinning quota fails with
//! [`QuotaExceeded`].
//!
//! Nothing waits on the daemon without a deadline: connecting and the Hello
//! are bounded by [`timeout`] (`VIA_VIAD_TIMEOUT_MS`), and so is every
//! request the daemon answers at once; requests that wait for another
//! process (Listen, Connect, PeerConnect) by their own timeout plus
//! [`timeout`] when finite.
#![forbid(unsafe_code)]

pub use via_wire::place;
mod spawn;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::proto::{self, DaemonMode, Refusal, Reply, Request, SessionLimits};
use crate::sys;

pub use spawn::find_viad;

pub use via_wire::{DEFAULT_TIMEOUT, timeout};

/// How long the daemon may take to answer `req`; `None`: no bound (a
/// request that waits forever for another process by the caller's choice).
fn reply_deadline(req: &Request, now: Instant) -> Option<Instant> {
    let t = timeout();
    let wait = |ms: u32| (ms != proto::INFINITE).then(|| Duration::from_millis(ms as u64) + t);
    let d = match req {
        Request::Listen { timeout_ms, .. }
        | Request::Connect { timeout_ms, .. }
        | Request::PeerConnect { timeout_ms, .. } => wait(*timeout_ms),
        // The daemon waits up to its own ack deadline for the peer.
        Request::Disconnect { .. } => Some(t + proto::DISCONNECT_ACK),
        _ => Some(t),
    };
    d.map(|d| now + d)
}

type Waiter = SyncSender<(Reply, Vec<OwnedFd>)>;
type Waiters = Arc<Mutex<HashMap<u32, Waiter>>>;

/// A reply and the descriptors that came with it.
pub type Answer = (Reply, Vec<OwnedFd>);

/// What the agent's worker thread hands to the process.
#[derive(Debug)]
pub enum Event {
    /// An event from the daemon.
    Daemon(Reply),
    /// The connection to the daemon is gone (it died, or broke the
    /// protocol): deaths are no longer reported.
    Lost,
}

/// An outstanding request.
pub struct Pending {
    rx: Receiver<Answer>,
    id: u32,
    deadline: Option<Instant>,
    waiters: Waiters,
}

impl Pending {
    /// A request answered by another thread of this process through the
    /// returned sender (a kind of NIC that asks another host's viad
    /// itself); it has no deadline of its own: the answerer keeps it.
    pub fn answered_locally() -> (mpsc::Sender<Answer>, Pending) {
        let (tx, rx) = mpsc::channel();
        let p = Pending {
            rx,
            id: 0,
            deadline: None,
            waiters: Arc::new(Mutex::new(HashMap::new())),
        };
        (tx, p)
    }

    /// Waits for the reply, at most until the request's deadline.
    pub fn wait(self) -> io::Result<Answer> {
        match self.deadline {
            None => self.rx.recv().map_err(|_| gone()),
            Some(d) => match self
                .rx
                .recv_timeout(d.saturating_duration_since(Instant::now()))
            {
                Ok(a) => Ok(a),
                Err(mpsc::RecvTimeoutError::Timeout) => Err(self.expired()),
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
            },
        }
    }

    /// The reply if it has arrived; `Ok(None)` if not yet.
    pub fn poll(&self) -> io::Result<Option<Answer>> {
        match self.rx.try_recv() {
            Ok(a) => Ok(Some(a)),
            Err(mpsc::TryRecvError::Empty) => {
                if self.deadline.is_some_and(|d| Instant::now() >= d) {
                    Err(self.expired())
                } else {
                    Ok(None)
                }
            }
            Err(mpsc::TryRecvError::Disconnected) => Err(gone()),
        }
    }

    /// Waits at most `t` (and at most until the deadline) for the reply.
    pub fn wait_timeout(&self, t: Duration) -> io::Result<Option<Answer>> {
        let t = match self.deadline {
            Some(d) => t.min(d.saturating_duration_since(Instant::now())),
            None => t,
        };
        match self.rx.recv_timeout(t) {
            Ok(a) => Ok(Some(a)),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if self.deadline.is_some_and(|d| Instant::now() >= d) {
                    Err(self.expired())
                } else {
                    Ok(None)
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }

    fn expired(&self) -> io::Error {
        self.waiters.lock().unwrap().remove(&self.id);
        let e = io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "viad did not answer in time (VIA_VIAD_TIMEOUT_MS = {} ms)",
                timeout().as_millis()
            ),
        );
        log::error!("{e}");
        e
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // An abandoned request: a late reply finds nobody.
        if let Ok(mut w) = self.waiters.lock() {
            w.remove(&self.id);
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "viad connection lost")
}

/// The daemon refused the request because the client is over one of its
/// limits.
fn over_limit(what: &str) -> io::Error {
    let e = io::Error::new(
        io::ErrorKind::OutOfMemory,
        format!("viad refused {what}: this process is over one of its limits"),
    );
    log::error!("{e}");
    e
}

/// The daemon refused to lock more memory for this process (its pinning
/// quota, or its user's, is used up): the payload of the `io::Error` that
/// [`Agent::publish`] returns then (see [`is_quota`]).
#[derive(Debug)]
pub struct QuotaExceeded {
    /// The session's limits as the daemon announced them.
    pub limits: SessionLimits,
}

impl std::fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = |b: u64| {
            if b == proto::UNLIMITED {
                "unlimited".to_string()
            } else {
                format!("{b} bytes")
            }
        };
        write!(
            f,
            "the system viad refused to lock more memory: pinning quota used up (per process {}, per user {})",
            q(self.limits.pin_process),
            q(self.limits.pin_user)
        )
    }
}

impl std::error::Error for QuotaExceeded {}

/// Whether `e` is a refusal for pinning quota ([`QuotaExceeded`]).
pub fn is_quota(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<QuotaExceeded>())
}

/// Which daemon a session has, and what it may hold (from the `Welcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DaemonInfo {
    /// Per-user or system daemon.
    pub mode: DaemonMode,
    /// The session's limits.
    pub limits: SessionLimits,
}

/// What the daemon's `Welcome` says.
struct Welcome {
    session: u64,
    host: Vec<u8>,
    name: String,
    info: DaemonInfo,
}

/// The session with the daemon.
pub struct Agent {
    sock: OwnedFd,
    send_lock: Mutex<()>,
    pending: Waiters,
    next_id: AtomicU32,
    lost: Arc<AtomicBool>,
    /// Session id assigned by the daemon.
    pub session: u64,
    /// This host's VIA address.
    pub host: Vec<u8>,
    /// This host's name.
    pub host_name: String,
    /// Which daemon serves the session, and its limits.
    pub daemon: DaemonInfo,
}

/// Whether a failed attempt to open a session may succeed if tried again
/// (the daemon was exiting, or two daemons raced to start).
fn retryable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED) | Some(libc::ENOENT) | Some(libc::ECONNRESET)
    ) || e.kind() == io::ErrorKind::ConnectionAborted
}

/// Sends the Hello on `sock` and waits, until `deadline`, for the Welcome.
fn hello(sock: &OwnedFd, deadline: Instant) -> io::Result<Welcome> {
    let fd = sock.as_raw_fd();
    sys::set_send_timeout(fd, timeout())?;
    let frame = Request::Hello {
        version: proto::VERSION,
    }
    .encode(1);
    sys::send_with_fds(fd, &frame, &[])?;
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    let left = deadline.saturating_duration_since(Instant::now());
    if sys::poll(&mut p, left.as_millis().min(i32::MAX as u128) as i32)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "viad did not answer the Hello within {:?} (VIA_VIAD_TIMEOUT_MS)",
                timeout()
            ),
        ));
    }
    let mut buf = vec![0u8; proto::MAX_FRAME];
    let (n, _) = sys::recv_with_fds(fd, &mut buf)?;
    if n == 0 {
        // The daemon was exiting as we connected.
        return Err(gone());
    }
    match Reply::decode(&buf[..n]) {
        Ok((
            1,
            Reply::Welcome {
                session,
                host,
                name,
                mode,
                limits,
            },
        )) => Ok(Welcome {
            session,
            host,
            name,
            info: DaemonInfo { mode, limits },
        }),
        Ok((1, Reply::Refused(Refusal::Limit))) => Err(over_limit("a new session")),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected answer to the Hello: {other:?}"),
        )),
    }
}

impl Agent {
    /// Connects to (starting if needed) the daemon and opens a session.
    /// `on_event` runs on the agent's worker thread for every event.
    pub fn connect(on_event: Box<dyn Fn(Event) + Send + Sync>) -> io::Result<Agent> {
        let t = timeout();
        let targets = place::targets()?;
        // The system daemon is used when it is there and answers as root.
        for target in targets.iter().filter(|x| x.kind == place::Kind::System) {
            let deadline = Instant::now() + t;
            match spawn::connect_checked(target, t).and_then(|s| Ok((hello(&s, deadline)?, s))) {
                Ok((w, sock)) => {
                    if w.info.mode != DaemonMode::System {
                        log::warn!(
                            "the daemon at {} is not in system mode; using it all the same",
                            target.path.display()
                        );
                    }
                    return Ok(Agent::start(sock, w, on_event));
                }
                Err(e) => log::warn!(
                    "system daemon at {}: {e}; using the per-user daemon",
                    target.path.display()
                ),
            }
        }
        let Some(user) = targets.iter().find(|x| x.kind == place::Kind::User) else {
            return Err(gone());
        };
        let mut last = None;
        for attempt in 0..8 {
            let r = spawn::connect_or_start(user, attempt, t).and_then(|s| {
                let w = hello(&s, Instant::now() + t)?;
                Ok((w, s))
            });
            match r {
                Ok((w, sock)) => {
                    return Ok(Agent::start(sock, w, on_event));
                }
                Err(e) if retryable(&e) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(gone))
    }

    fn start(sock: OwnedFd, w: Welcome, on_event: Box<dyn Fn(Event) + Send + Sync>) -> Agent {
        let Welcome {
            session,
            host,
            name: host_name,
            info,
        } = w;
        let pending: Waiters = Arc::default();
        let lost = Arc::new(AtomicBool::new(false));
        let (ev_tx, ev_rx) = mpsc::channel::<Event>();
        let reader_sock = sock.try_clone().expect("dup viad socket");
        {
            let pending = pending.clone();
            let lost = lost.clone();
            std::thread::Builder::new()
                .name("via-agent".into())
                .spawn(move || reader(reader_sock, pending, lost, ev_tx))
                .expect("spawn via-agent thread");
        }
        std::thread::Builder::new()
            .name("via-events".into())
            .spawn(move || {
                for ev in ev_rx {
                    on_event(ev);
                }
            })
            .expect("spawn via-events thread");
        log::debug!("viad session {session} ({info:?})");
        Agent {
            sock,
            send_lock: Mutex::new(()),
            pending,
            next_id: AtomicU32::new(2),
            lost,
            session,
            host,
            host_name,
            daemon: info,
        }
    }

    /// Whether the daemon connection was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Sends a request and returns a handle on its reply, which must come
    /// by the request's deadline (see the module documentation).
    pub fn request(&self, req: &Request, fd: Option<BorrowedFd<'_>>) -> io::Result<Pending> {
        if self.is_lost() {
            return Err(gone());
        }
        let id = loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                break id;
            }
        };
        let (tx, rx) = mpsc::sync_channel(1);
        self.pending.lock().unwrap().insert(id, tx);
        let pending = Pending {
            rx,
            id,
            deadline: reply_deadline(req, Instant::now()),
            waiters: self.pending.clone(),
        };
        let fds: Vec<_> = fd.iter().map(|f| f.as_raw_fd()).collect();
        {
            // The socket has a send timeout: a daemon that stops reading
            // cannot hold this lock forever.
            let _g = self.send_lock.lock().unwrap();
            sys::send_with_fds(self.sock.as_raw_fd(), &req.encode(id), &fds)
                .map_err(send_failed)?;
        }
        Ok(pending)
    }

    /// Sends a request and waits for its reply.
    pub fn call(&self, req: &Request, fd: Option<BorrowedFd<'_>>) -> io::Result<Answer> {
        let a = self.request(req, fd)?.wait()?;
        if let Reply::Refused(Refusal::Limit) = a.0 {
            return Err(over_limit(req.name()));
        }
        Ok(a)
    }

    /// Sends a message that has no reply (`Retire`, `DisconnectAck`).
    pub fn send(&self, req: &Request) -> io::Result<()> {
        if self.is_lost() {
            return Err(gone());
        }
        let _g = self.send_lock.lock().unwrap();
        sys::send_with_fds(self.sock.as_raw_fd(), &req.encode(0), &[])
            .map(|_| ())
            .map_err(send_failed)
    }

    /// Publishes a shared object for peers. A refusal for pinning quota
    /// is an error for which [`is_quota`] holds.
    pub fn publish(&self, key: proto::ObjKey, fd: &OwnedFd) -> io::Result<()> {
        match self.call(&Request::Publish { key }, Some(fd.as_fd()))?.0 {
            Reply::Ok => Ok(()),
            Reply::Refused(Refusal::Quota) => Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                QuotaExceeded {
                    limits: self.daemon.limits,
                },
            )),
            other => Err(io::Error::other(format!("publish refused: {other:?}"))),
        }
    }

    /// Fetches a peer's shared object.
    pub fn fetch(&self, session: u64, key: proto::ObjKey) -> io::Result<OwnedFd> {
        match self.call(&Request::Fetch { session, key }, None)? {
            (Reply::Fd, mut fds) if fds.len() == 1 => Ok(fds.pop().unwrap()),
            (other, _) => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("fetch {key:?}: {other:?}"),
            )),
        }
    }
}

fn send_failed(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        let e = io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "viad did not take a request within {:?} (VIA_VIAD_TIMEOUT_MS)",
                timeout()
            ),
        );
        log::error!("{e}");
        e
    } else {
        e
    }
}

fn reader(sock: OwnedFd, pending: Waiters, lost: Arc<AtomicBool>, events: mpsc::Sender<Event>) {
    let mut buf = vec![0u8; proto::MAX_FRAME + 1];
    let why = loop {
        match sys::recv_with_fds(sock.as_raw_fd(), &mut buf) {
            Ok((0, _)) => break "viad closed the session".to_string(),
            Ok((n, fds)) => match Reply::decode(&buf[..n]) {
                Ok((0, ev)) => {
                    if events.send(Event::Daemon(ev)).is_err() {
                        return;
                    }
                }
                Ok((id, rep)) => {
                    let w = pending.lock().unwrap().remove(&id);
                    if let Some(w) = w {
                        let _ = w.send((rep, fds));
                    }
                }
                Err(e) => break format!("viad sent a malformed frame ({e})"),
            },
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break format!("viad connection: {e}"),
        }
    };
    log::error!(
        "lost the viad session ({why}): connected VIs break with CONN_LOST, requests to viad fail until every NIC is closed"
    );
    lost.store(true, Ordering::Release);
    // Wake every waiter with an error (their senders drop here).
    pending.lock().unwrap().clear();
    let _ = events.send(Event::Lost);
}
