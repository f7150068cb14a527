//! `viad_socket`: a real `viad` fed hostile frames over its socket.
//!
//! The scenario format is `viad_broker`'s ([`crate::broker::parse`]); each
//! session is a real connection (so `Reopen` closes a socket, and a frame
//! that does not decode gets the connection dropped by viad); clock ticks
//! are ignored. Every frame viad sends is read back and must pass
//! `Reply::decode` (what the library runs on it). After each scenario a
//! well-behaved client must get `Welcome` to `Hello` and an `Address` for
//! `localhost` within [`ANSWER`], and the viad process must still be alive.
//! One viad (its own `VIA_INSTANCE`) serves the whole run.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use via::proto::{MAX_FRAME, Reply, Request, VERSION};
use via::sys;

use crate::broker::{Ctx, Op, SLOTS, gen_request, parse, some_fd};

/// Longest wait for an answer from viad to a well-behaved request.
pub const ANSWER: Duration = Duration::from_secs(5);

struct Daemon {
    child: Child,
    path: std::path::PathBuf,
}

static DAEMON: Mutex<Option<Daemon>> = Mutex::new(None);

fn start() -> Daemon {
    // The instance goes to viad's environment only: this process's own
    // environment is left alone (the descriptor target sets its own).
    let inst = format!("fuzz-sock-{}", std::process::id());
    let path = via::agent::place::user_socket_for(&inst).expect("viad's socket path");
    let child = Command::new(crate::env::viad_path())
        .args(["--idle-ms", "10000"])
        .env("VIA_INSTANCE", &inst)
        // The probe shares the fuzzing process's pid: the per-pid connection
        // limit (tested in tests/tests/viad_pressure.rs) is not the subject.
        .env("VIA_VIAD_MAX_CONNECTIONS", "1000000")
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn viad");
    let t = Instant::now();
    while sys::seqpacket_connect_path(&path, Duration::from_millis(50)).is_err() {
        assert!(t.elapsed() < ANSWER, "viad does not listen");
        std::thread::sleep(Duration::from_millis(5));
    }
    Daemon { child, path }
}

/// Sends `req` and waits (at most [`ANSWER`]) for the reply with its id.
fn call(fd: &OwnedFd, id: u32, req: &Request) -> Option<Reply> {
    sys::send_with_fds(fd.as_raw_fd(), &req.encode(id), &[]).ok()?;
    let deadline = Instant::now() + ANSWER;
    let mut buf = vec![0u8; MAX_FRAME + 1];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        sys::set_recv_timeout(fd.as_raw_fd(), left.max(Duration::from_millis(1))).ok()?;
        let (n, _) = sys::recv_with_fds(fd.as_raw_fd(), &mut buf).ok()?;
        if n == 0 {
            return None;
        }
        let (rid, rep) = Reply::decode(&buf[..n]).expect("viad sent a frame that does not decode");
        if rid == id {
            return Some(rep);
        }
    }
}

/// Reads whatever viad has sent on `fd`; false once viad closed it.
fn drain(fd: &OwnedFd) -> bool {
    let mut buf = vec![0u8; MAX_FRAME + 1];
    loop {
        match sys::recv_with_fds(fd.as_raw_fd(), &mut buf) {
            Ok((0, _)) => return false,
            Ok((n, _fds)) => {
                if let Err(e) = Reply::decode(&buf[..n]) {
                    panic!(
                        "viad sent a frame that does not decode ({e}): {:?}",
                        &buf[..n]
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

struct Client {
    fd: OwnedFd,
    session: u64,
}

fn connect(path: &std::path::Path) -> OwnedFd {
    sys::seqpacket_connect_path(path, ANSWER).expect("viad stopped listening")
}

fn open(path: &std::path::Path, bare: bool) -> Option<Client> {
    let fd = connect(path);
    let mut session = 0;
    if !bare {
        match call(&fd, 1, &Request::Hello { version: VERSION }) {
            Some(Reply::Welcome { session: s, .. }) => session = s,
            other => panic!("Hello answered with {other:?}"),
        }
    }
    sys::set_nonblocking(fd.as_raw_fd(), true).ok()?;
    Some(Client { fd, session })
}

fn probe(path: &std::path::Path) {
    let fd = connect(path);
    let host = match call(&fd, 7, &Request::Hello { version: VERSION }) {
        Some(Reply::Welcome { host, .. }) => host,
        other => panic!("viad answered Hello of a well-behaved client with {other:?}"),
    };
    let name = Request::ResolveName {
        name: "localhost".into(),
    };
    match call(&fd, 8, &name) {
        Some(Reply::Address { host: h }) => assert_eq!(h, host, "localhost resolves elsewhere"),
        other => panic!("viad answered ResolveName(localhost) with {other:?}"),
    }
}

pub fn viad_socket(data: &[u8]) {
    let mut g = DAEMON.lock().unwrap_or_else(|e| e.into_inner());
    let d = g.get_or_insert_with(start);
    let mut clients: [Option<Client>; SLOTS] = Default::default();
    let mut gone = [false; SLOTS];
    for op in parse(data) {
        match op {
            Op::Frame { who, .. } | Op::Gen { who, .. } if clients[who].is_none() => {
                if gone[who] {
                    continue;
                }
                clients[who] = open(&d.path, false);
            }
            _ => {}
        }
        match op {
            Op::Frame { who, bytes, fd } => send(&mut clients[who], &mut gone[who], bytes, fd),
            Op::Gen { who, bytes, fd } => {
                let sessions: [u64; SLOTS] =
                    std::array::from_fn(|k| clients[k].as_ref().map_or(0, |c| c.session));
                let cx = Ctx {
                    sessions: &sessions,
                    me: who,
                    host: &[],
                    name: "localhost",
                };
                let (id, req) = gen_request(bytes, &cx);
                send(&mut clients[who], &mut gone[who], &req.encode(id), fd);
            }
            Op::Reopen { who, bare } => {
                clients[who] = None;
                gone[who] = false;
                clients[who] = open(&d.path, bare);
            }
            Op::Tick { .. } => {}
        }
    }
    for c in clients.iter().flatten() {
        drain(&c.fd);
    }
    probe(&d.path);
    if let Ok(Some(st)) = d.child.try_wait() {
        panic!("viad died: {st}");
    }
}

/// Sends one frame; a connection viad dropped is marked gone.
fn send(c: &mut Option<Client>, gone: &mut bool, bytes: &[u8], fd: bool) {
    let Some(cl) = c else { return };
    let extra = if fd { Some(some_fd()) } else { None };
    let fds: Vec<_> = extra.iter().map(|f| f.as_raw_fd()).collect();
    let ok = sys::send_with_fds(cl.fd.as_raw_fd(), bytes, &fds).is_ok() && drain(&cl.fd);
    if !ok {
        *c = None;
        *gone = true;
    }
}
