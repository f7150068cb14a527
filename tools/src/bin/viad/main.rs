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

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use broker::{Broker, Limits, Out};
use via::agent::place;
use via::proto::{self, Reply, Request};
use via::sys;

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
         VIA_HOSTS (name-service file: 'name hexaddr' per line), RUST_LOG,\n\
         VIA_VIAD_TIMEOUT_MS (Hello deadline), VIA_VIAD_MAX_FDS, VIA_VIAD_MAX_PENDING,\n\
         VIA_VIAD_MAX_CONNECTIONS, VIA_VIAD_MAX_QUEUE (per-client limits)."
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

/// A number from the environment, or `default`.
fn env_num(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| {
            log::warn!("ignoring {name}={v:?}: not a number");
            default
        }),
        Err(_) => default,
    }
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
    via::ns::parse_hex(s)
}

/// viad's own table, for clients that still ask it (the library resolves
/// in each process from that process's own environment).
fn host_table() -> Vec<(String, Vec<u8>)> {
    via::ns::host_table()
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
    let nofile = sys::raise_nofile_limit()
        .or_else(|e| {
            log::warn!("cannot raise the fd limit: {e}");
            sys::nofile_limit()
        })
        .unwrap_or(1024) as usize;
    // A quarter of the descriptors (at least 64) stays for connections and
    // pidfds; no session may hold more than half of the rest.
    let for_conns = (nofile / 4).max(64);
    let objects_total = nofile.saturating_sub(for_conns + 32).max(16);
    let limits = Limits {
        objects_per_session: env_num("VIA_VIAD_MAX_FDS", 1 << 17).min(objects_total / 2),
        objects_total,
        pending_per_session: env_num("VIA_VIAD_MAX_PENDING", 4096),
    };
    let io_limits = IoLimits {
        conns_per_pid: env_num("VIA_VIAD_MAX_CONNECTIONS", 64),
        prehello_total: 1024,
        hello_timeout: via::agent::timeout(),
        queue_bytes: env_num("VIA_VIAD_MAX_QUEUE", 1 << 20),
        queue_fds: 1024,
    };
    log::info!("limits (fd limit {nofile}): {limits:?}, {io_limits:?}");
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
    let mut broker = Broker::new(host, sys::hostname(), host_table());
    broker.set_limits(limits);
    let code = Daemon {
        listener,
        broker,
        clients: HashMap::new(),
        per_pid: HashMap::new(),
        prehello: 0,
        hello_timers: VecDeque::new(),
        uid: sys::getuid(),
        idle: opts.idle,
        limits: io_limits,
        paused_until: None,
        reserve: open_reserve(),
        out_of_fds: Repeated::new("out of file descriptors"),
        refused: Repeated::new("connections refused"),
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

/// Limits of the I/O loop (the broker enforces the others).
#[derive(Clone, Copy, Debug)]
struct IoLimits {
    /// Connections one process (pid) may have open.
    conns_per_pid: usize,
    /// Connections that have not said Hello yet, all together.
    prehello_total: usize,
    /// How long a new connection may take to say Hello.
    hello_timeout: Duration,
    /// Bytes of replies and events queued for one client that does not read.
    queue_bytes: usize,
    /// Descriptors queued for one client that does not read.
    queue_fds: usize,
}

/// An error that may repeat many times a second: logged the first time,
/// then at most every 5 s with the number of repeats.
struct Repeated {
    what: &'static str,
    count: u64,
    last: Option<Instant>,
}

impl Repeated {
    const fn new(what: &'static str) -> Repeated {
        Repeated {
            what,
            count: 0,
            last: None,
        }
    }

    fn hit(&mut self, detail: &dyn std::fmt::Display) {
        let now = Instant::now();
        self.count += 1;
        if self
            .last
            .is_none_or(|l| now.duration_since(l) >= Duration::from_secs(5))
        {
            if self.count > 1 {
                log::error!(
                    "{}: {detail} ({} times since the last report)",
                    self.what,
                    self.count
                );
            } else {
                log::error!("{}: {detail}", self.what);
            }
            self.last = Some(now);
            self.count = 0;
        }
    }
}

struct Client {
    fd: OwnedFd,
    pid: i32,
    pidfd: Option<OwnedFd>,
    /// Frames the socket did not take yet (with a duplicate of the fd they
    /// carry), oldest first.
    out: VecDeque<(Vec<u8>, Option<OwnedFd>)>,
    out_bytes: usize,
    out_fds: usize,
    /// Has not said Hello yet.
    prehello: bool,
}

struct Daemon {
    sock_path: PathBuf,
    listener: OwnedFd,
    broker: Broker,
    clients: HashMap<u64, Client>,
    per_pid: HashMap<i32, usize>,
    prehello: usize,
    /// Hello deadlines, in admission order (so in time order).
    hello_timers: VecDeque<(Instant, u64)>,
    uid: u32,
    idle: Duration,
    limits: IoLimits,
    /// The listener is not polled until then (out of descriptors).
    paused_until: Option<Instant>,
    /// A descriptor kept free for refusing a connection when out of them.
    reserve: Option<std::fs::File>,
    out_of_fds: Repeated,
    refused: Repeated,
}

#[derive(Clone, Copy)]
enum Source {
    Listener,
    Socket(u64),
    Pid(u64),
}

fn open_reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

impl Daemon {
    fn run(&mut self) -> i32 {
        let mut idle_since = Some(Instant::now());
        let mut buf = vec![0u8; proto::MAX_FRAME + 1];
        loop {
            let now = Instant::now();
            if self.paused_until.is_some_and(|t| now >= t) {
                self.paused_until = None;
            }
            let mut deadline = self.broker.next_deadline();
            let mut at = |t: Instant| deadline = Some(deadline.map_or(t, |d| d.min(t)));
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
                at(exit_at);
            }
            if let Some(&(t, _)) = self.hello_timers.front() {
                at(t);
            }
            if let Some(t) = self.paused_until {
                at(t);
            }
            let timeout = deadline.map_or(-1, |d| {
                d.saturating_duration_since(now).as_millis().min(60_000) as i32 + 1
            });

            let mut fds = Vec::with_capacity(2 * self.clients.len() + 1);
            let mut src = Vec::with_capacity(2 * self.clients.len() + 1);
            if self.paused_until.is_none() {
                fds.push(pollfd(self.listener.as_raw_fd(), libc::POLLIN));
                src.push(Source::Listener);
            }
            for (&s, c) in &self.clients {
                let ev = if c.out.is_empty() {
                    libc::POLLIN
                } else {
                    libc::POLLIN | libc::POLLOUT
                };
                fds.push(pollfd(c.fd.as_raw_fd(), ev));
                src.push(Source::Socket(s));
                if let Some(p) = &c.pidfd {
                    fds.push(pollfd(p.as_raw_fd(), libc::POLLIN));
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
                        if p.revents & libc::POLLOUT != 0 {
                            if let Err(why) = self.flush(s) {
                                dead.push((s, why));
                                continue;
                            }
                        }
                        if p.revents & !libc::POLLOUT != 0 {
                            if let Some(why) = self.read_one(s, &mut buf, &mut outs) {
                                dead.push((s, why));
                            }
                        }
                    }
                }
            }
            let now = Instant::now();
            while let Some(&(t, s)) = self.hello_timers.front() {
                if t > now {
                    break;
                }
                self.hello_timers.pop_front();
                if self.clients.get(&s).is_some_and(|c| c.prehello) {
                    dead.push((s, "no Hello in time"));
                }
            }
            outs.extend(self.broker.on_tick(now));
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

    /// Reads and handles one message of session `s`; returns why the
    /// session must end, if it must.
    fn read_one(&mut self, s: u64, buf: &mut [u8], outs: &mut Vec<Out>) -> Option<&'static str> {
        let c = self.clients.get(&s)?;
        let r = match sys::recv_msg(c.fd.as_raw_fd(), buf) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) => {
                log::debug!("session {s}: {e}");
                return Some("socket error");
            }
        };
        if r.len == 0 {
            return Some("socket closed");
        }
        let (id, req) = match Request::decode(&buf[..r.len]) {
            Ok(x) => x,
            Err(e) => {
                log::warn!("session {s} (pid {}): {e}; disconnecting", c.pid);
                return Some("malformed request");
            }
        };
        log::trace!("session {s}: {req:?}");
        if r.fds_lost {
            // We are out of descriptors: the fd the client sent is gone.
            // Refuse the request; the client keeps its session.
            if !matches!(req, Request::Publish { .. }) {
                return Some("unexpected fd");
            }
            self.out_of_fds.hit(&format_args!(
                "session {s}: the descriptor of a Publish was lost; refused"
            ));
            outs.push(Out::Send {
                to: s,
                id,
                reply: Reply::Refused(proto::Refusal::Limit),
            });
            return None;
        }
        outs.extend(self.broker.on_request(s, id, req, r.fds, Instant::now()));
        let c = self.clients.get_mut(&s)?;
        if c.prehello && self.broker.said_hello(s) {
            c.prehello = false;
            self.prehello -= 1;
        }
        None
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
                Err(e) if out_of_fds(&e) => {
                    self.out_of_fds.hit(&format_args!(
                        "accept: {e}; refusing new connections for a while"
                    ));
                    // Free the reserve to take one connection and tell it
                    // no, instead of leaving it to its deadline; then stop
                    // polling the listener for a while (no busy loop).
                    if self.reserve.take().is_some() {
                        if let Ok(c) = sys::accept(self.listener.as_raw_fd()) {
                            refuse_conn(&c);
                        }
                        self.reserve = open_reserve();
                    }
                    self.paused_until = Some(Instant::now() + Duration::from_millis(100));
                    return n;
                }
                Err(e) => {
                    self.refused.hit(&format_args!("accept: {e}"));
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
        let conns = self.per_pid.get(&cred.pid).copied().unwrap_or(0);
        if conns >= self.limits.conns_per_pid || self.prehello >= self.limits.prehello_total {
            self.refused.hit(&format_args!(
                "refusing a connection of pid {}: it has {conns} (limit {}), {} connections wait for their Hello (limit {})",
                cred.pid, self.limits.conns_per_pid, self.prehello, self.limits.prehello_total
            ));
            refuse_conn(&fd);
            return;
        }
        if let Err(e) = sys::set_nonblocking(fd.as_raw_fd(), true) {
            log::warn!("nonblocking: {e}");
            return;
        }
        let pidfd = sys::pidfd_open(cred.pid).ok();
        let s = self.broker.open_session();
        log::debug!("session {s}: pid {}", cred.pid);
        *self.per_pid.entry(cred.pid).or_default() += 1;
        self.prehello += 1;
        self.hello_timers
            .push_back((Instant::now() + self.limits.hello_timeout, s));
        self.clients.insert(
            s,
            Client {
                fd,
                pid: cred.pid,
                pidfd,
                out: VecDeque::new(),
                out_bytes: 0,
                out_fds: 0,
                prehello: true,
            },
        );
    }

    fn kill(&mut self, s: u64, why: &str) -> Vec<Out> {
        if let Some(c) = self.clients.remove(&s) {
            log::info!("session {s} (pid {}) ended: {why}", c.pid);
            if let Some(n) = self.per_pid.get_mut(&c.pid) {
                *n -= 1;
                if *n == 0 {
                    self.per_pid.remove(&c.pid);
                }
            }
            if c.prehello {
                self.prehello -= 1;
            }
        }
        self.broker.on_death(s)
    }

    /// Sends what is queued for `s` until the socket is full.
    fn flush(&mut self, s: u64) -> Result<(), &'static str> {
        let Some(c) = self.clients.get_mut(&s) else {
            return Ok(());
        };
        while let Some((bytes, fd)) = c.out.front() {
            let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
            match sys::send_with_fds(c.fd.as_raw_fd(), bytes, &fds) {
                Ok(_) => {
                    let (bytes, fd) = c.out.pop_front().unwrap();
                    c.out_bytes -= bytes.len();
                    c.out_fds -= fd.is_some() as usize;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::debug!("session {s}: send: {e}");
                    return Err("send failed");
                }
            }
        }
        Ok(())
    }

    /// Sends `bytes` (with `fd`) to `to` now, or queues it if the socket is
    /// full. `Err`: the client must be cut off.
    fn enqueue(
        &mut self,
        to: u64,
        bytes: Vec<u8>,
        fd: Option<RawFd>,
        instead: impl FnOnce() -> Vec<u8>,
    ) -> Result<(), &'static str> {
        let limits = self.limits;
        let Some(c) = self.clients.get_mut(&to) else {
            return Ok(());
        };
        if c.out.is_empty() {
            let fds: Vec<RawFd> = fd.into_iter().collect();
            match sys::send_with_fds(c.fd.as_raw_fd(), &bytes, &fds) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    log::debug!("session {to}: send: {e}");
                    return Err("send failed");
                }
            }
        }
        // Keep our own duplicate: the object may be retired meanwhile.
        let (bytes, dup) = match fd.map(sys::dup) {
            None => (bytes, None),
            Some(Ok(d)) => (bytes, Some(d)),
            Some(Err(e)) => {
                self.out_of_fds.hit(&format_args!(
                    "session {to}: cannot keep a descriptor for a reply ({e}); refused"
                ));
                (instead(), None)
            }
        };
        c.out_bytes += bytes.len();
        c.out_fds += dup.is_some() as usize;
        c.out.push_back((bytes, dup));
        if c.out_bytes > limits.queue_bytes || c.out_fds > limits.queue_fds {
            log::warn!(
                "session {to} (pid {}) does not read: {} bytes and {} descriptors queued (limits {} and {}); cutting it off",
                c.pid,
                c.out_bytes,
                c.out_fds,
                limits.queue_bytes,
                limits.queue_fds
            );
            return Err("does not read its replies and events");
        }
        Ok(())
    }

    fn deliver(&mut self, mut outs: Vec<Out>) {
        while !outs.is_empty() {
            let mut more = Vec::new();
            for o in outs {
                let (to, r) = match o {
                    Out::Send { to, id, reply } => {
                        (to, self.enqueue(to, reply.encode(id), None, Vec::new))
                    }
                    Out::SendFd { to, id, owner, key } => {
                        let fd = self.broker.object(owner, &key).map(|f| f.as_raw_fd());
                        let r = match fd {
                            Some(fd) => self.enqueue(to, Reply::Fd.encode(id), Some(fd), || {
                                Reply::Refused(proto::Refusal::Limit).encode(id)
                            }),
                            None => self.enqueue(
                                to,
                                Reply::Refused(proto::Refusal::Gone).encode(id),
                                None,
                                Vec::new,
                            ),
                        };
                        (to, r)
                    }
                    Out::Close { session, why } => {
                        log::warn!("session {session}: {why}; disconnecting");
                        more.extend(self.kill(session, why));
                        continue;
                    }
                };
                if let Err(why) = r {
                    more.extend(self.kill(to, why));
                }
            }
            outs = more;
        }
    }
}

/// Tells a connection that is not admitted why (as the answer to its
/// Hello), then drops it.
fn refuse_conn(fd: &OwnedFd) {
    let _ = sys::set_nonblocking(fd.as_raw_fd(), true);
    let _ = sys::send_with_fds(
        fd.as_raw_fd(),
        &Reply::Refused(proto::Refusal::Limit).encode(1),
        &[],
    );
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}
