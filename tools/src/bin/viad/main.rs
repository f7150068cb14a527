//! viad: the via-rs helper daemon.
//!
//! One per user and host, started by the library when none is listening
//! (`viad --daemon`), exiting after it has had no client for a while. It
//! stores the shared-memory fds of its clients for their peers, brokers
//! connections, answers the name service, and reports the death of a client
//! process to everyone else.
//!
//! Clients reach it on a `SOCK_SEQPACKET` socket in the user's private
//! directory (`via::agent::place`); an `flock` on a lock file beside it
//! keeps it unique. Each connection is checked with `SO_PEERCRED` and
//! watched with a pidfd.

mod broker;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use broker::{Broker, Out};
use via::agent::place;
use via::proto::{self, Reply, Request};
use via::sys;

struct Client {
    fd: OwnedFd,
    pid: i32,
    pidfd: Option<OwnedFd>,
}

struct Options {
    daemon: bool,
    idle: Duration,
    log: Option<std::path::PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: viad [--daemon] [--idle-ms N] [--log FILE]\n\
         \n\
         Serves the VIA sessions of this user on this host. The library starts it\n\
         on demand; running it by hand is only useful for debugging.\n\
         Environment: VIA_INSTANCE (socket instance name), VIA_HOST_ADDRESS (hex),\n\
         VIA_HOSTS (name-service file: 'name hexaddr' per line), RUST_LOG."
    );
    std::process::exit(2)
}

fn parse_args() -> Options {
    let mut o = Options {
        daemon: false,
        idle: Duration::from_secs(5),
        log: std::env::var_os("VIA_VIAD_LOG").map(Into::into),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--daemon" => o.daemon = true,
            "--idle-ms" => {
                let v = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage());
                o.idle = Duration::from_millis(v);
            }
            "--log" => o.log = Some(args.next().unwrap_or_else(|| usage()).into()),
            _ => usage(),
        }
    }
    o
}

fn host_address() -> Vec<u8> {
    if let Ok(hex) = std::env::var("VIA_HOST_ADDRESS") {
        if let Some(v) = parse_hex(&hex) {
            return v;
        }
        log::warn!("ignoring malformed VIA_HOST_ADDRESS {hex:?}");
    }
    // FNV-1a of the host name and machine id: stable across restarts.
    let mut h: u64 = 0xcbf29ce484222325;
    let id = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    for b in sys::hostname().bytes().chain(id.trim().bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    let mut a = h.to_be_bytes()[..6].to_vec();
    a[0] = (a[0] | 0x02) & 0xfe; // locally administered, unicast
    a
}

fn parse_hex(s: &str) -> Option<Vec<u8>> {
    let s: String = s.chars().filter(|c| *c != ':').collect();
    if s.is_empty() || s.len() % 2 != 0 || s.len() / 2 > proto::MAX_HOST {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn host_table() -> Vec<(String, Vec<u8>)> {
    let path = std::env::var("VIA_HOSTS").unwrap_or_else(|_| "/etc/via_hosts".into());
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?.to_string();
            let addr = parse_hex(it.next()?)?;
            Some((name, addr))
        })
        .collect()
}

fn main() {
    // Started by a library inside some application: drop whatever it let us
    // inherit, or its pipes would never see EOF while we live.
    sys::close_inherited_fds();
    let opts = parse_args();
    let (listener, sock_path, _lock) = match bind() {
        Ok(Some(x)) => x,
        // Another viad serves this user and instance: nothing to do.
        Ok(None) => std::process::exit(0),
        Err(e) => {
            eprintln!("viad: {e}");
            std::process::exit(1);
        }
    };
    // The socket listens before the parent exits, so whoever waits for us can
    // connect as soon as we return.
    if opts.daemon {
        if let Err(e) = sys::daemonize(opts.log.as_deref()) {
            eprintln!("viad: cannot daemonize: {e}");
            std::process::exit(1);
        }
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    if let Err(e) = sys::raise_nofile_limit() {
        log::warn!("cannot raise the fd limit: {e}");
    }
    sys::set_nonblocking(listener.as_raw_fd(), true).expect("nonblocking listener");
    let host = host_address();
    log::info!(
        "viad {} serving uid {} (host address {})",
        std::process::id(),
        sys::getuid(),
        host.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    );
    let broker = Broker::new(host, sys::hostname(), host_table());
    let code = Daemon {
        listener,
        broker,
        clients: HashMap::new(),
        uid: sys::getuid(),
        idle: opts.idle,
        sock_path,
    }
    .run();
    std::process::exit(code);
}

/// Takes this instance's lock and listens on its socket. `Ok(None)`: another
/// daemon holds the lock and answers.
///
/// The lock (an `flock` on `<instance>.lock` beside the socket, in the
/// private directory) is what makes the daemon unique: whoever holds it
/// owns the socket path, so a socket file found there is stale (its daemon
/// is gone) and is replaced. The lock is held until the process exits
/// (it survives `--daemon`'s fork: the child keeps the descriptor).
fn bind() -> io::Result<Option<(OwnedFd, PathBuf, std::fs::File)>> {
    use std::os::unix::fs::OpenOptionsExt;
    let instance = place::instance()?;
    let sock_path = place::user_socket_for(&instance)?;
    let lock_path = place::user_lock_for(&instance)?;
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&lock_path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", lock_path.display())))?;
    let answers = || sys::seqpacket_connect_path(&sock_path, Duration::from_millis(200)).is_ok();
    // A daemon that is exiting holds the lock a little longer: wait for it,
    // bounded.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sys::try_lock_exclusive(lock.as_raw_fd())? {
        if answers() {
            return Ok(None);
        }
        if Instant::now() >= deadline {
            return Err(io::Error::other(format!(
                "{} is locked, but nobody answers on {}",
                lock_path.display(),
                sock_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match std::fs::symlink_metadata(&sock_path) {
        Ok(_) => {
            if answers() {
                return Err(io::Error::other(format!(
                    "a daemon that does not hold {} answers on {}",
                    lock_path.display(),
                    sock_path.display()
                )));
            }
            // Stale: its daemon died without removing it.
            std::fs::remove_file(&sock_path)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = sys::seqpacket_listen_path(&sock_path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", sock_path.display())))?;
    Ok(Some((listener, sock_path, lock)))
}

struct Daemon {
    sock_path: PathBuf,
    listener: OwnedFd,
    broker: Broker,
    clients: HashMap<u64, Client>,
    uid: u32,
    idle: Duration,
}

#[derive(Clone, Copy)]
enum Source {
    Listener,
    Socket(u64),
    Pid(u64),
}

impl Daemon {
    fn run(&mut self) -> i32 {
        let mut idle_since = Some(Instant::now());
        let mut buf = vec![0u8; proto::MAX_FRAME + 1];
        loop {
            let now = Instant::now();
            let mut deadline = self.broker.next_deadline();
            if let Some(t) = idle_since {
                let exit_at = t + self.idle;
                if now >= exit_at {
                    // Last look for a client that raced with the decision.
                    if self.accept_all() == 0 {
                        log::info!("idle for {:?}: exiting", self.idle);
                        // Still holding the lock: nobody else uses the path.
                        let _ = std::fs::remove_file(&self.sock_path);
                        return 0;
                    }
                    idle_since = None;
                    continue;
                }
                deadline = Some(deadline.map_or(exit_at, |d| d.min(exit_at)));
            }
            let timeout = deadline.map_or(-1, |d| {
                d.saturating_duration_since(now).as_millis().min(60_000) as i32 + 1
            });

            let mut fds = vec![libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            let mut src = vec![Source::Listener];
            for (&s, c) in &self.clients {
                fds.push(pollfd(c.fd.as_raw_fd()));
                src.push(Source::Socket(s));
                if let Some(p) = &c.pidfd {
                    fds.push(pollfd(p.as_raw_fd()));
                    src.push(Source::Pid(s));
                }
            }
            if let Err(e) = sys::poll(&mut fds, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::error!("poll: {e}");
                    let _ = std::fs::remove_file(&self.sock_path);
                    return 1;
                }
                continue;
            }
            let mut outs = Vec::new();
            let mut dead = Vec::new();
            for (p, s) in fds.iter().zip(src) {
                if p.revents == 0 {
                    continue;
                }
                match s {
                    Source::Listener => {
                        self.accept_all();
                    }
                    Source::Pid(s) => dead.push((s, "process exited")),
                    Source::Socket(s) => {
                        let Some(c) = self.clients.get(&s) else {
                            continue;
                        };
                        match sys::recv_with_fds(c.fd.as_raw_fd(), &mut buf) {
                            Ok((0, _)) => dead.push((s, "socket closed")),
                            Ok((n, fds)) => match Request::decode(&buf[..n]) {
                                Ok((id, req)) => {
                                    log::trace!("session {s}: {req:?}");
                                    outs.extend(self.broker.on_request(
                                        s,
                                        id,
                                        req,
                                        fds,
                                        Instant::now(),
                                    ));
                                }
                                Err(e) => {
                                    log::warn!("session {s} (pid {}): {e}; disconnecting", c.pid);
                                    dead.push((s, "malformed request"));
                                }
                            },
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                            Err(e) => {
                                log::debug!("session {s}: {e}");
                                dead.push((s, "socket error"));
                            }
                        }
                    }
                }
            }
            outs.extend(self.broker.on_tick(Instant::now()));
            for (s, why) in dead {
                outs.extend(self.kill(s, why));
            }
            self.deliver(outs);
            idle_since = match (self.clients.is_empty(), idle_since) {
                (true, None) => Some(Instant::now()),
                (true, t) => t,
                (false, _) => None,
            };
        }
    }

    /// Accepts every pending connection; returns how many.
    fn accept_all(&mut self) -> usize {
        let mut n = 0;
        loop {
            match sys::accept(self.listener.as_raw_fd()) {
                Ok(fd) => {
                    n += 1;
                    self.admit(fd);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("accept: {e}");
                    return n;
                }
            }
        }
    }

    fn admit(&mut self, fd: OwnedFd) {
        let cred = match sys::peer_cred(fd.as_raw_fd()) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("SO_PEERCRED: {e}");
                return;
            }
        };
        if cred.uid != self.uid {
            log::warn!(
                "refusing pid {} of uid {} (this daemon serves uid {})",
                cred.pid,
                cred.uid,
                self.uid
            );
            return;
        }
        if let Err(e) = sys::set_nonblocking(fd.as_raw_fd(), true) {
            log::warn!("nonblocking: {e}");
            return;
        }
        let pidfd = sys::pidfd_open(cred.pid).ok();
        let s = self.broker.open_session();
        log::debug!("session {s}: pid {}", cred.pid);
        self.clients.insert(
            s,
            Client {
                fd,
                pid: cred.pid,
                pidfd,
            },
        );
    }

    fn kill(&mut self, s: u64, why: &str) -> Vec<Out> {
        if let Some(c) = self.clients.remove(&s) {
            log::info!("session {s} (pid {}) ended: {why}", c.pid);
        }
        self.broker.on_death(s)
    }

    fn deliver(&mut self, mut outs: Vec<Out>) {
        while !outs.is_empty() {
            let mut more = Vec::new();
            for o in outs {
                let (to, bytes, fd): (u64, Vec<u8>, Option<RawFd>) = match o {
                    Out::Send { to, id, reply } => (to, reply.encode(id), None),
                    Out::SendFd { to, id, owner, key } => match self.broker.object(owner, &key) {
                        Some(fd) => (to, Reply::Fd.encode(id), Some(fd.as_raw_fd())),
                        None => (to, Reply::Refused(proto::Refusal::Gone).encode(id), None),
                    },
                    Out::Close { session, why } => {
                        log::warn!("session {session}: {why}; disconnecting");
                        more.extend(self.kill(session, why));
                        continue;
                    }
                };
                let Some(c) = self.clients.get(&to) else {
                    continue;
                };
                let fds: Vec<RawFd> = fd.into_iter().collect();
                if let Err(e) = sys::send_with_fds(c.fd.as_raw_fd(), &bytes, &fds) {
                    // A client that does not read (full buffer) or is gone
                    // is dropped rather than allowed to stall the daemon.
                    log::warn!("session {to}: send failed ({e}); disconnecting");
                    more.extend(self.kill(to, "send failed"));
                }
            }
            outs = more;
        }
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}
