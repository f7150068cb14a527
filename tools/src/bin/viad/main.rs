//! viad: the via-rs helper daemon.
//!
//! Two modes (`viad --help` explains them):
//!
//! * **Per-user** (the default): one per user and host, started by the
//!   library when none is listening (`viad --daemon`), exiting after it has
//!   had no client for a while. It serves processes of its own uid only,
//!   on a socket in the user's private directory (`via_wire::place`).
//! * **System** (`viad --system`, root, e.g. from the systemd unit
//!   `pkg/systemd/via-rs-viad.service`): serves every user of the host on
//!   `/run/via-rs/system.sock`, never exits when idle, keeps users apart
//!   (objects are fetched and connections made within one uid only), and
//!   locks registered memory in RAM within the pinning quotas of its
//!   configuration file (`/etc/via-rs/viad.toml`, example in
//!   `pkg/viad.toml`). The library uses it when it runs and answers as
//!   root, and falls back to the per-user daemon otherwise.
//!
//! In both modes it stores the shared-memory fds of its clients for their
//! peers, brokers connections, answers the name service, and reports the
//! death of a client process to those that depended on it. An `flock` on a
//! lock file beside the socket keeps it unique; each connection is checked
//! with `SO_PEERCRED` and watched with a pidfd.

mod broker;
mod config;
mod tcp;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use broker::{Broker, Cred, Limits, Out};
use clap::Parser;
use via_sys as sys;
use via_wire::place;
use via_wire::proto::{self, Reply, Request};

const ABOUT: &str = "The via-rs helper daemon: stores the shared memory of VIA processes for \
their peers, brokers their connections, and reports deaths.";

const LONG_ABOUT: &str = "\
The via-rs helper daemon: stores the shared memory (NIC segments, CQ rings,
registered memory) of VIA processes for their peers, brokers their
connections, answers the name service, and tells processes when a peer dies.

Per-user mode (the default): the library starts one per user when none
listens (`viad --daemon`); it serves that user's processes only, on
$XDG_RUNTIME_DIR/via-rs/<VIA_INSTANCE>.sock or /tmp/via-rs-<uid>/, and exits
after --idle-ms without clients. Nothing is locked in memory. Running it by
hand is only useful for debugging.

System mode (--system, as root, e.g. from the systemd unit
via-rs-viad.service): one daemon serves every user of the host on
/run/via-rs/system.sock (--dir moves it) and never exits when idle. The
library uses it whenever it runs and answers as root, and falls back to the
per-user daemon otherwise. Users are kept apart: a process fetches shared
memory of processes of its own user only, and connection requests match
listeners of the same user only (another user's discriminator gives
VIP_NO_MATCH). Registered memory stays resident: the daemon locks every
published arena (mlock) within the per-process, per-user and total pinning
quotas of its configuration file (--config, default /etc/via-rs/viad.toml;
see pkg/viad.toml); a registration beyond them fails with
VIP_ERROR_RESOURCE, and quota comes back on deregistration and on death.
Killing or restarting it breaks every connected VI of its clients with
VIP_ERROR_CONN_LOST (new requests fail with VIP_ERROR_RESOURCE until the
process closes its NICs and opens again); the locks die with it.

Environment: RUST_LOG (log filter, default info), VIA_HOST_ADDRESS (this
host's VIA address, hex), VIA_HOSTS (name-service file for clients that
ask the daemon). Per-user mode only: VIA_INSTANCE (socket instance name),
VIA_VIAD_TIMEOUT_MS (Hello deadline), VIA_VIAD_MAX_FDS,
VIA_VIAD_MAX_PENDING, VIA_VIAD_MAX_CONNECTIONS, VIA_VIAD_MAX_QUEUE
(per-client limits; in system mode they come from the [limits] table of
the configuration file), VIA_VIAD_LOG (as --log).";

#[derive(Parser, Debug)]
#[command(name = "viad", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Cli {
    /// Serve every user of the host (needs root): listen on
    /// <DIR>/system.sock, never exit when idle, keep users apart, lock
    /// registered memory within the configured quotas.
    #[arg(long)]
    system: bool,

    /// System mode: the configuration file (pinning quotas, limits,
    /// cross-user grants). Default /etc/via-rs/viad.toml, whose absence
    /// means the built-in defaults; a file named here must exist.
    #[arg(long, value_name = "PATH", requires = "system")]
    config: Option<PathBuf>,

    /// System mode: the directory of the socket and lock file (created
    /// root-owned, mode 0755, if missing; refused if anyone but root can
    /// write it). Default /run/via-rs; clients find another one through
    /// VIA_SYSTEM_DIR (for tests and unusual deployments).
    #[arg(long, value_name = "DIR", requires = "system")]
    dir: Option<PathBuf>,

    /// System mode: read and check the configuration, print what is in
    /// effect, and exit (0 if usable, 2 if not).
    #[arg(long, requires = "system")]
    check_config: bool,

    /// Detach once listening: the foreground process exits when the
    /// socket accepts connections (how the library starts the per-user
    /// daemon). Without --log, a detached daemon logs nowhere.
    #[arg(long)]
    daemon: bool,

    /// Per-user mode: exit after this many milliseconds without clients.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 5000,
        conflicts_with = "system"
    )]
    idle_ms: u64,

    /// Append the log to FILE once detached (default: $VIA_VIAD_LOG).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
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
    via_wire::hosts::parse_hex(s)
}

/// viad's own table, for clients that still ask it (the library resolves
/// in each process from that process's own environment).
fn host_table() -> Vec<(String, Vec<u8>)> {
    via_wire::hosts::host_table()
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("viad: {e}");
    std::process::exit(1)
}

fn main() {
    // Started by a library inside some application: drop whatever it let us
    // inherit, or its pipes would never see EOF while we live.
    sys::close_inherited_fds();
    let cli = Cli::parse();
    let log_file = cli
        .log
        .clone()
        .or_else(|| std::env::var_os("VIA_VIAD_LOG").map(Into::into));
    let system = if cli.system {
        let (path, required) = match &cli.config {
            Some(p) => (p.clone(), true),
            None => (PathBuf::from(config::DEFAULT_PATH), false),
        };
        let c = match config::Config::load(&path, required) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("viad: {e}");
                std::process::exit(2)
            }
        };
        if cli.check_config {
            print!("# {}\n{c}", path.display());
            std::process::exit(0);
        }
        if sys::getuid() != 0 {
            fail("--system serves every user and locks their memory: it must run as root");
        }
        Some((c, path))
    } else {
        None
    };
    let bound = match &system {
        Some(_) => bind_system(cli.dir.as_deref().unwrap_or(Path::new(place::SYSTEM_DIR))),
        None => bind_user(),
    };
    let (listener, sock_path, _lock) = match bound {
        Ok(Some(x)) => x,
        // Another viad serves this place: nothing to do.
        Ok(None) => std::process::exit(0),
        Err(e) => fail(e),
    };
    // The socket listens before the parent exits, so whoever waits for us can
    // connect as soon as we return.
    if cli.daemon {
        if let Err(e) = sys::daemonize(log_file.as_deref()) {
            fail(format_args!("cannot daemonize: {e}"));
        }
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    // SIGTERM (systemd's stop), SIGINT and SIGHUP end the loop cleanly:
    // the socket is removed and the exit logged (the locks and stored fds
    // go with the process either way).
    let signals = sys::termination_signals()
        .map_err(|e| log::warn!("no clean exit on SIGTERM: {e}"))
        .ok();
    let nofile = sys::raise_nofile_limit()
        .or_else(|e| {
            log::warn!("cannot raise the fd limit: {e}");
            sys::nofile_limit()
        })
        .unwrap_or(1024) as usize;
    // A quarter of the descriptors (at least 64) stays for connections and
    // pidfds; no session may hold more than half of the rest, nor (system
    // mode) the sessions of one user.
    let for_conns = (nofile / 4).max(64);
    let objects_total = nofile.saturating_sub(for_conns + 32).max(16);
    let over = system.as_ref().map(|(c, _)| c.limits).unwrap_or_default();
    let user_mode = system.is_none();
    // Per-user mode reads its limits from the environment of the program
    // that started it; system mode from its configuration file.
    let env_or = |name: &str, file: Option<usize>, default: usize| {
        if user_mode {
            env_num(name, default)
        } else {
            file.unwrap_or(default)
        }
    };
    let limits = Limits {
        objects_per_session: env_or("VIA_VIAD_MAX_FDS", over.max_fds_per_session, 1 << 17)
            .min(objects_total / 2),
        objects_total,
        pending_per_session: env_or("VIA_VIAD_MAX_PENDING", over.max_pending, 4096),
        objects_per_user: if user_mode {
            objects_total
        } else {
            over.max_fds_per_user
                .unwrap_or(objects_total / 2)
                .min(objects_total)
        },
    };
    let io_limits = IoLimits {
        conns_per_pid: env_or("VIA_VIAD_MAX_CONNECTIONS", over.max_connections, 64),
        prehello_total: 1024,
        hello_timeout: over.hello_timeout.unwrap_or_else(via_wire::timeout),
        queue_bytes: env_or("VIA_VIAD_MAX_QUEUE", over.max_queue, 1 << 20),
        queue_fds: 1024,
    };
    log::info!("limits (fd limit {nofile}): {limits:?}, {io_limits:?}");
    sys::set_nonblocking(listener.as_raw_fd(), true).expect("nonblocking listener");
    let host = host_address();
    let mut broker = Broker::new(host.clone(), sys::hostname(), host_table());
    broker.set_limits(limits);
    let shown_host = host
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let idle = match system {
        Some((c, path)) => {
            let p = &c.policy;
            log::info!(
                "viad {} in system mode on {}, serving every user (host address {shown_host}); configuration {}: pinning per process {}, per user {}, all users {}, {} per-user quotas, {} cross-user grants (over sockets NICs)",
                std::process::id(),
                sock_path.display(),
                path.display(),
                config::show(p.quota.per_process),
                config::show(p.quota.per_user),
                config::show(p.total),
                p.users.len(),
                p.grants.len()
            );
            broker.set_system(c.policy);
            None
        }
        None => {
            log::info!(
                "viad {} serving uid {} (host address {shown_host})",
                std::process::id(),
                sys::getuid(),
            );
            Some(Duration::from_millis(cli.idle_ms))
        }
    };
    let code = Daemon {
        listener,
        broker,
        clients: HashMap::new(),
        per_pid: HashMap::new(),
        prehello: 0,
        hello_timers: VecDeque::new(),
        uid: if user_mode { Some(sys::getuid()) } else { None },
        signals,
        idle,
        limits: io_limits,
        paused_until: None,
        reserve: open_reserve(),
        out_of_fds: Repeated::new("out of file descriptors"),
        refused: Repeated::new("connections refused"),
        tcp: tcp::Tcp::default(),
        sock_path,
    }
    .run();
    std::process::exit(code);
}

/// What [`bind_user`] and [`bind_system`] return: the listener, its path,
/// and the lock that makes the daemon unique (held until exit).
type Bound = (OwnedFd, PathBuf, std::fs::File);

/// Per-user mode: takes this instance's lock and listens on its socket in
/// the user's private directory. `Ok(None)`: another daemon holds the lock
/// and answers.
fn bind_user() -> io::Result<Option<Bound>> {
    let instance = place::instance()?;
    let sock_path = place::user_socket_for(&instance)?;
    let lock_path = place::user_lock_for(&instance)?;
    bind(&sock_path, &lock_path, false)
}

/// System mode: creates `dir` (root's, mode 0755) if needed, checks that
/// nobody but root can write it, takes its lock and listens on
/// `system.sock`, connectable by every user. `Ok(None)`: another system
/// daemon holds the lock and answers.
fn bind_system(dir: &Path) -> io::Result<Option<Bound>> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--dir {}: not an absolute path", dir.display()),
        ));
    }
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    }
    place::check_system_dir(dir)?;
    bind(
        &dir.join(place::SYSTEM_SOCKET_NAME),
        &dir.join(place::SYSTEM_LOCK_NAME),
        true,
    )
}

/// Takes the lock at `lock_path` and listens on `sock_path` (`public`:
/// connectable by every user). `Ok(None)`: another daemon holds the lock
/// and answers.
///
/// The lock (an `flock` on the lock file beside the socket, in a directory
/// only the daemon's user can write) is what makes the daemon unique:
/// whoever holds it owns the socket path, so a socket file found there is
/// stale (its daemon is gone) and is replaced. The lock is held until the
/// process exits (it survives `--daemon`'s fork: the child keeps the
/// descriptor).
fn bind(sock_path: &Path, lock_path: &Path, public: bool) -> io::Result<Option<Bound>> {
    use std::os::unix::fs::OpenOptionsExt;
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(lock_path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", lock_path.display())))?;
    let answers = || sys::seqpacket_connect_path(sock_path, Duration::from_millis(200)).is_ok();
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
    match std::fs::symlink_metadata(sock_path) {
        Ok(_) => {
            if answers() {
                return Err(io::Error::other(format!(
                    "a daemon that does not hold {} answers on {}",
                    lock_path.display(),
                    sock_path.display()
                )));
            }
            // Stale: its daemon died without removing it.
            std::fs::remove_file(sock_path)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let err = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", sock_path.display()));
    // Public: every user must be able to connect (write permission on the
    // socket file), set before it listens.
    let listener = if public {
        sys::seqpacket_listen_path_mode(sock_path, 0o666)
    } else {
        sys::seqpacket_listen_path(sock_path)
    }
    .map_err(err)?;
    Ok(Some((listener, sock_path.to_path_buf(), lock)))
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
    uid: u32,
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
    /// Per-user mode: the one uid served (`None`: system mode, every uid).
    uid: Option<u32>,
    /// Per-user mode: exit after this long without clients.
    idle: Option<Duration>,
    /// Readable when a termination signal arrived.
    signals: Option<OwnedFd>,
    limits: IoLimits,
    /// The listener is not polled until then (out of descriptors).
    paused_until: Option<Instant>,
    /// A descriptor kept free for refusing a connection when out of them.
    reserve: Option<std::fs::File>,
    out_of_fds: Repeated,
    refused: Repeated,
    /// Listeners and connection requests of other hosts (sockets NICs).
    tcp: tcp::Tcp,
}

#[derive(Clone, Copy)]
enum Source {
    Listener,
    Signal,
    Socket(u64),
    Pid(u64),
    Tcp(tcp::Watch),
}

fn open_reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

impl Daemon {
    fn run(&mut self) -> i32 {
        let mut idle_since = self.idle.map(|_| Instant::now());
        let mut buf = vec![0u8; proto::MAX_FRAME + 1];
        loop {
            let now = Instant::now();
            if self.paused_until.is_some_and(|t| now >= t) {
                self.paused_until = None;
            }
            let mut deadline = self.broker.next_deadline();
            let mut at = |t: Instant| deadline = Some(deadline.map_or(t, |d| d.min(t)));
            if let (Some(t), Some(idle)) = (idle_since, self.idle) {
                let exit_at = t + idle;
                if now >= exit_at {
                    // Last look for a client that raced with the decision.
                    if self.accept_all() == 0 {
                        log::info!("idle for {idle:?}: exiting");
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
            if let Some(t) = self.tcp.next_deadline() {
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
            if let Some(sig) = &self.signals {
                fds.push(pollfd(sig.as_raw_fd(), libc::POLLIN));
                src.push(Source::Signal);
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
            let mut tcp_fds = Vec::new();
            self.tcp.fds(&mut tcp_fds);
            for (fd, w) in tcp_fds {
                fds.push(pollfd(fd, libc::POLLIN));
                src.push(Source::Tcp(w));
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
                    Source::Signal => {
                        let sig = self.signals.as_ref().and_then(sys::read_signal);
                        log::info!(
                            "signal {}: exiting ({} clients lose their session)",
                            sig.unwrap_or(0),
                            self.clients.len()
                        );
                        let _ = std::fs::remove_file(&self.sock_path);
                        return 0;
                    }
                    Source::Pid(s) => dead.push((s, "process exited")),
                    Source::Tcp(tcp::Watch::Listener(i)) => self.tcp.accept(i),
                    Source::Tcp(tcp::Watch::Unread(k)) => {
                        self.tcp.read(k, &mut self.broker, self.uid, &mut outs);
                    }
                    Source::Tcp(tcp::Watch::Session(s)) => {
                        if self.tcp.readable(s) {
                            dead.push((s, "the requester on the network gave up"));
                        }
                    }
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
            for s in self.tcp.expire(now) {
                dead.push((s, "accepted, but nobody took the connection"));
            }
            outs.extend(self.broker.on_tick(now));
            for (s, why) in dead {
                outs.extend(self.kill(s, why));
            }
            self.deliver(outs);
            idle_since = match (self.clients.is_empty() && self.idle.is_some(), idle_since) {
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
        if let Some(uid) = self.uid.filter(|&u| u != cred.uid) {
            log::warn!(
                "refusing pid {} of uid {} (this daemon serves uid {uid})",
                cred.pid,
                cred.uid,
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
        let s = self.broker.open_session(Cred {
            uid: cred.uid,
            pid: cred.pid,
        });
        log::debug!("session {s}: pid {} uid {}", cred.pid, cred.uid);
        *self.per_pid.entry(cred.pid).or_default() += 1;
        self.prehello += 1;
        self.hello_timers
            .push_back((Instant::now() + self.limits.hello_timeout, s));
        self.clients.insert(
            s,
            Client {
                fd,
                pid: cred.pid,
                uid: cred.uid,
                pidfd,
                out: VecDeque::new(),
                out_bytes: 0,
                out_fds: 0,
                prehello: true,
            },
        );
    }

    fn kill(&mut self, s: u64, why: &str) -> Vec<Out> {
        self.tcp.end(s);
        if let Some(c) = self.clients.remove(&s) {
            log::info!("session {s} (pid {}, uid {}) ended: {why}", c.pid, c.uid);
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
                    Out::Send { to, reply, .. } if self.tcp.is_session(to) => {
                        if self.tcp.reply(to, &reply) {
                            more.extend(self.kill(to, "answered"));
                        }
                        continue;
                    }
                    Out::OpenTcp { to, id, host } => {
                        let reply = match self.tcp.open(&host) {
                            Ok(()) => {
                                self.broker.add_tcp_host(host);
                                Reply::Ok
                            }
                            Err(e) => {
                                log::warn!(
                                    "cannot listen for other hosts on {host:?} port {}: {e}",
                                    via_wire::tcp::port()
                                );
                                Reply::Refused(proto::Refusal::Invalid)
                            }
                        };
                        (to, self.enqueue(to, reply.encode(id), None, Vec::new))
                    }
                    Out::Send { to, id, reply } => {
                        (to, self.enqueue(to, reply.encode(id), None, Vec::new))
                    }
                    Out::SendFd { to, id, owner, key }
                        if self.tcp.is_answered(owner) || key.kind == proto::ObjKind::Stream =>
                    {
                        // A remote session's connection: handed over once.
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
                        if fd.is_some() && self.tcp.fetched(owner) {
                            more.extend(self.kill(owner, "connection handed over"));
                        }
                        (to, r)
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
