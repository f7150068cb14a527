//! The library's side of the viad session.
//!
//! One [`Agent`] per process: a `SOCK_SEQPACKET` connection to the daemon,
//! a reader thread that routes replies to the threads waiting for them, and
//! a worker thread that handles the daemon's events (a peer died, a peer
//! disconnected). Events are handled off the reader thread because handling
//! them takes engine locks, and an engine may itself be waiting for a reply.
//!
//! When no daemon listens, [`Agent::connect`] starts one (`viad --daemon`)
//! and connects to it: nobody starts a daemon by hand.
#![forbid(unsafe_code)]

mod spawn;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::proto::{self, Reply, Request};
use crate::sys;

pub use spawn::find_viad;

/// The abstract socket name of this user's daemon:
/// `via-rs/<uid>/<VIA_INSTANCE or "default">`.
pub fn socket_name() -> Vec<u8> {
    let instance = std::env::var("VIA_INSTANCE").unwrap_or_else(|_| "default".into());
    format!("via-rs/{}/{}", sys::getuid(), instance).into_bytes()
}

type Waiter = SyncSender<(Reply, Vec<OwnedFd>)>;

/// A reply and the descriptors that came with it.
pub type Answer = (Reply, Vec<OwnedFd>);

/// An outstanding request.
pub struct Pending {
    rx: Receiver<Answer>,
}

impl Pending {
    /// Waits for the reply.
    pub fn wait(self) -> io::Result<Answer> {
        self.rx.recv().map_err(|_| gone())
    }

    /// The reply if it has arrived; `Ok(None)` if not yet.
    pub fn poll(&self) -> io::Result<Option<Answer>> {
        match self.rx.try_recv() {
            Ok(a) => Ok(Some(a)),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => Err(gone()),
        }
    }

    /// Waits at most `t` for the reply.
    pub fn wait_timeout(&self, t: Duration) -> io::Result<Option<Answer>> {
        match self.rx.recv_timeout(t) {
            Ok(a) => Ok(Some(a)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "viad connection lost")
}

/// The session with the daemon.
pub struct Agent {
    sock: OwnedFd,
    send_lock: Mutex<()>,
    pending: Arc<Mutex<HashMap<u32, Waiter>>>,
    next_id: AtomicU32,
    lost: Arc<AtomicBool>,
    /// Session id assigned by the daemon.
    pub session: u64,
    /// This host's VIA address.
    pub host: Vec<u8>,
    /// This host's name.
    pub host_name: String,
}

impl Agent {
    /// Connects to (starting if needed) the daemon and opens a session.
    /// `on_event` runs on the agent's worker thread for every event.
    pub fn connect(on_event: Box<dyn Fn(Reply) + Send + Sync>) -> io::Result<Agent> {
        let mut last = None;
        for attempt in 0..8 {
            let sock = match spawn::connect_or_start(attempt) {
                Ok(s) => s,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            // Hello synchronously, before the reader thread exists.
            let hello = Request::Hello {
                version: proto::VERSION,
            }
            .encode(1);
            let mut buf = vec![0u8; proto::MAX_FRAME];
            let answer = sys::send_with_fds(sock.as_raw_fd(), &hello, &[])
                .and_then(|_| sys::set_recv_timeout(sock.as_raw_fd(), Duration::from_secs(5)))
                .and_then(|_| sys::recv_with_fds(sock.as_raw_fd(), &mut buf));
            match answer {
                Ok((n, _)) if n > 0 => match Reply::decode(&buf[..n]) {
                    Ok((
                        1,
                        Reply::Welcome {
                            session,
                            host,
                            name,
                        },
                    )) => {
                        sys::set_recv_timeout(sock.as_raw_fd(), Duration::ZERO)?;
                        return Ok(Agent::start(sock, session, host, name, on_event));
                    }
                    other => {
                        last = Some(io::Error::other(format!(
                            "unexpected Hello answer {other:?}"
                        )));
                    }
                },
                // The daemon was exiting as we connected: start another.
                Ok(_) => last = Some(gone()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(gone))
    }

    fn start(
        sock: OwnedFd,
        session: u64,
        host: Vec<u8>,
        host_name: String,
        on_event: Box<dyn Fn(Reply) + Send + Sync>,
    ) -> Agent {
        let pending: Arc<Mutex<HashMap<u32, Waiter>>> = Arc::default();
        let lost = Arc::new(AtomicBool::new(false));
        let (ev_tx, ev_rx) = mpsc::channel::<Reply>();
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
        log::debug!("viad session {session}");
        Agent {
            sock,
            send_lock: Mutex::new(()),
            pending,
            next_id: AtomicU32::new(2),
            lost,
            session,
            host,
            host_name,
        }
    }

    /// Whether the daemon connection was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Sends a request and returns a handle on its reply.
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
        let fds: Vec<_> = fd.iter().map(|f| f.as_raw_fd()).collect();
        let r = {
            let _g = self.send_lock.lock().unwrap();
            sys::send_with_fds(self.sock.as_raw_fd(), &req.encode(id), &fds)
        };
        if let Err(e) = r {
            self.pending.lock().unwrap().remove(&id);
            return Err(e);
        }
        Ok(Pending { rx })
    }

    /// Sends a request and waits for its reply.
    pub fn call(&self, req: &Request, fd: Option<BorrowedFd<'_>>) -> io::Result<Answer> {
        self.request(req, fd)?.wait()
    }

    /// Sends a message that has no reply (`Retire`, `DisconnectAck`).
    pub fn send(&self, req: &Request) -> io::Result<()> {
        let _g = self.send_lock.lock().unwrap();
        sys::send_with_fds(self.sock.as_raw_fd(), &req.encode(0), &[]).map(|_| ())
    }

    /// Publishes a shared object for peers.
    pub fn publish(&self, key: proto::ObjKey, fd: &OwnedFd) -> io::Result<()> {
        match self.call(&Request::Publish { key }, Some(fd.as_fd()))?.0 {
            Reply::Ok => Ok(()),
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

fn reader(
    sock: OwnedFd,
    pending: Arc<Mutex<HashMap<u32, Waiter>>>,
    lost: Arc<AtomicBool>,
    events: mpsc::Sender<Reply>,
) {
    let mut buf = vec![0u8; proto::MAX_FRAME + 1];
    loop {
        match sys::recv_with_fds(sock.as_raw_fd(), &mut buf) {
            Ok((0, _)) => break,
            Ok((n, fds)) => match Reply::decode(&buf[..n]) {
                Ok((0, ev)) => {
                    if events.send(ev).is_err() {
                        break;
                    }
                }
                Ok((id, rep)) => {
                    if let Some(w) = pending.lock().unwrap().remove(&id) {
                        let _ = w.send((rep, fds));
                    }
                }
                Err(e) => {
                    log::error!("viad sent a malformed frame ({e}); dropping the session");
                    break;
                }
            },
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::error!("viad connection: {e}");
                break;
            }
        }
    }
    log::warn!(
        "lost the viad session: new connections will fail; existing ones continue without death detection"
    );
    lost.store(true, Ordering::Release);
    // Wake every waiter with an error (their senders drop here).
    pending.lock().unwrap().clear();
}
