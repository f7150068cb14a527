//! The system daemon (`viad --system`): one daemon for every user, users
//! kept apart, registered memory locked within quotas, restarts.
//!
//! Each test starts its own system daemon as root on a private directory
//! (`--dir`, which the clients find through `VIA_SYSTEM_DIR`) with its own
//! configuration file, and runs clients (`via-peer`) as root or as two
//! unused uids (A and B, set with `setuid` when the child starts, as
//! `viad_identity.rs` does). Without root every test prints
//! `SKIPPED (needs root): ...` and passes.
//!
//! What the daemon holds locked is read from `/proc/<pid>/status`
//! (`VmLck`). An increase is checked at once (a `Publish` is answered only
//! once its arena is locked); a decrease is a `Retire` or a death, which
//! the daemon handles after the client has moved on, so the test waits
//! (bounded) for the exact expected value.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");

/// Bound for the daemon's handling of a retirement or a death.
const SETTLE: Duration = Duration::from_secs(20);

/// The two users of the tests (unused uids, fixed for the run).
fn users() -> (u32, u32) {
    let a = unused_uid(63000, &[]);
    (a, unused_uid(63000, &[a]))
}

/// A system daemon on a private directory, stopped (SIGKILL) and its
/// directory removed on drop.
struct System {
    dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    pid: i32,
    /// The network namespace it runs in (`None`: the test's).
    netns: Option<String>,
}

fn tmp(tag: &str) -> PathBuf {
    PathBuf::from(format!("/tmp/via-sys-{}-{tag}", std::process::id()))
}

impl System {
    /// Writes `config` and starts `viad --system` on a new directory.
    fn start(tag: &str, config: &str) -> System {
        Self::start_in(None, tag, config)
    }

    /// As `start`, inside network namespace `netns`.
    fn start_in(netns: Option<&str>, tag: &str, config: &str) -> System {
        let dir = tmp(tag);
        let _ = std::fs::remove_dir_all(&dir);
        let config_path = PathBuf::from(format!("{}.toml", dir.display()));
        std::fs::write(&config_path, config).unwrap();
        let mut s = System {
            log: PathBuf::from(format!("{}.log", dir.display())),
            dir,
            config: config_path,
            pid: 0,
            netns: netns.map(str::to_string),
        };
        let _ = std::fs::remove_file(&s.log);
        s.launch();
        s
    }

    /// Starts a daemon on the directory; returns once it listens (`--daemon`
    /// exits then).
    fn launch(&mut self) {
        let (_, viad) = runnable_by_all(PEER);
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(viad);
                c
            }
            None => Command::new(viad),
        };
        let st = cmd
            .args(["--system", "--daemon", "--dir"])
            .arg(&self.dir)
            .arg("--config")
            .arg(&self.config)
            .arg("--log")
            .arg(&self.log)
            .env("RUST_LOG", "info")
            .status()
            .expect("run viad --system");
        assert!(st.success(), "viad --system: {st}\n{}", self.log_text());
        self.pid = match &self.netns {
            // The socket table is per namespace; the daemon is the only
            // process in this one when it starts.
            Some(ns) => {
                let out = Command::new("ip")
                    .args(["netns", "pids", ns])
                    .output()
                    .unwrap();
                let pids: Vec<i32> = String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect();
                assert_eq!(pids.len(), 1, "processes in {ns}: {pids:?}");
                pids[0]
            }
            None => listener_pid(&self.socket()).expect("the system daemon's pid"),
        };
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("system.sock")
    }

    /// What the daemon holds locked, in KiB.
    fn locked(&self) -> u64 {
        locked_kib(self.pid).expect("the system daemon is gone")
    }

    /// Waits (bounded) until the daemon holds exactly `kib` locked.
    fn settle(&self, kib: u64, what: &str) {
        let ok = wait_until(SETTLE, || locked_kib(self.pid) == Some(kib));
        assert!(
            ok,
            "{what}: VmLck {:?} KiB, not {kib}",
            locked_kib(self.pid)
        );
    }

    /// Sends `sig` to the daemon and waits for it to be gone.
    fn stop(&mut self, sig: i32) {
        let pidfd = via::sys::pidfd_open(self.pid).expect("pidfd of the daemon");
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(self.pid, sig) }, 0);
        let mut p = [libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            events: libc::POLLIN,
            revents: 0,
        }];
        let n = via::sys::poll(&mut p, SETTLE.as_millis() as i32).unwrap();
        assert_eq!(n, 1, "the daemon did not exit on signal {sig}");
        self.pid = 0;
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A client `via-peer <args>` as `uid` (root if `None`) with this
    /// daemon's directory, a private per-user instance and extra `env`.
    fn client(&self, uid: Option<u32>, args: &[&str], env: &[(&str, &str)]) -> Peer {
        match &self.netns {
            None => client(&self.dir, uid, args, env),
            Some(ns) => {
                // Into the namespace as root, then the user (setpriv).
                let (peer, _) = runnable_by_all(PEER);
                let mut wrapped = vec!["netns", "exec", ns.as_str()];
                let ids;
                if let Some(u) = uid {
                    ids = [format!("--reuid={u}"), format!("--regid={u}")];
                    wrapped.extend(["setpriv", &ids[0], &ids[1], "--clear-groups"]);
                }
                wrapped.push(peer.to_str().unwrap());
                wrapped.extend(args);
                let mut cmd = Command::new("ip");
                cmd.args(&wrapped);
                client_with(&self.dir, None, cmd, env)
            }
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        if self.pid <= 0 {
            // A test that failed between a launch and learning its pid.
            self.pid = listener_pid(&self.socket()).unwrap_or(0);
        }
        if self.pid > 0 {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.config);
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// `via-peer <args>` as `uid` with `VIA_SYSTEM_DIR=<dir>`.
fn client(dir: &Path, uid: Option<u32>, args: &[&str], env: &[(&str, &str)]) -> Peer {
    let (peer, _) = runnable_by_all(PEER);
    let mut cmd = Command::new(peer);
    cmd.args(args);
    client_with(dir, uid, cmd, env)
}

/// `cmd` (which runs via-peer) as a client of the daemon at `dir`.
fn client_with(dir: &Path, uid: Option<u32>, mut cmd: Command, env: &[(&str, &str)]) -> Peer {
    let (_, viad) = runnable_by_all(PEER);
    cmd.env("VIA_SYSTEM_DIR", dir)
        .env(
            "VIA_INSTANCE",
            format!(
                "via-sys-{}-{}",
                std::process::id(),
                dir.file_name().unwrap().to_string_lossy()
            ),
        )
        .env("VIA_VIAD", viad)
        .env("RUST_LOG", "via=info")
        .env_remove("XDG_RUNTIME_DIR")
        .current_dir("/");
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(u) = uid {
        cmd.uid(u).gid(u);
    }
    Peer::from_command(cmd)
}

/// `DAEMON` of a peer: (mode, pin per process, pin per user, session).
fn daemon(p: &mut Peer) -> (String, u64, u64, u64) {
    let d = p.cmd_expect("daemon", "DAEMON");
    let f: Vec<&str> = d.split_whitespace().collect();
    (
        f[0].to_string(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[4].parse().unwrap(),
    )
}

/// The arena ids a process has mapped (`via-arena:<pid>:<id>` memfds).
fn arenas_of(pid: i32) -> Vec<u32> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut ids: Vec<u32> = maps
        .lines()
        .filter_map(|l| l.split(&format!("via-arena:{pid}:")).nth(1))
        .filter_map(|r| r.split([' ', ':']).next()?.parse().ok())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Users are kept apart: B cannot fetch A's NIC segment or arenas (A's
/// own other process can), B's requests never reach A's listeners and
/// A's never reach B's (refused as `NoMatch`/`Timeout`), peer requests
/// across users never match, and A's memory is unchanged by all of it;
/// meanwhile two processes of A connect and move data (send and RDMA
/// write) through the system daemon exactly as through their own.
#[test]
fn two_users_are_kept_apart() {
    if !have_root("two_users_are_kept_apart") {
        return;
    }
    let (ua, ub) = users();
    let sys = System::start("apart", "");
    let mut a1 = sys.client(Some(ua), &["serve"], &[]);
    let mem = RemoteMem::parse(&a1.cmd_expect("open rd 65536 1 1", "MEM"));
    let (mode, _, _, session) = daemon(&mut a1);
    assert_eq!(mode, "system");
    // Region 0: descriptors below 4096, a receive buffer and RDMA target
    // at 4096, and 56 KiB that nothing may change.
    assert_eq!(a1.cmd("fill 0 8192 57344 7"), "OK");
    assert_eq!(a1.cmd("recv 0 4096:64"), "OK");

    // Fetches: B gets none of A's objects; A's other process gets all.
    let arenas = arenas_of(a1.pid());
    assert!(!arenas.is_empty(), "no arena in A's maps");
    let mut keys = vec!["1:1:0".to_string()];
    keys.extend(arenas.iter().map(|id| format!("2:0:{id}")));
    let sock = sys.socket();
    let fetch = |uid: u32| {
        let mut args = vec![
            "rawfetch".to_string(),
            sock.display().to_string(),
            session.to_string(),
        ];
        args.extend(keys.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut p = sys.client(Some(uid), &args, &[]);
        let got: Vec<String> = keys.iter().map(|_| p.expect("FETCH")).collect();
        p.expect("DONE");
        p.finish();
        got
    };
    for (k, r) in keys.iter().zip(fetch(ub)) {
        assert_eq!(r, format!("{k} Gone"), "user B fetched {k} of user A");
    }
    for (k, r) in keys.iter().zip(fetch(ua)) {
        assert_eq!(
            r,
            format!("{k} FD"),
            "user A could not fetch {k} of its own"
        );
    }

    // Connections: A listens on dA; B's request for dA finds nobody.
    let da = disc_str("dA");
    a1.say(&format!("listen {da} accept 30000"));
    a1.expect("LISTENING");
    let mut b1 = sys.client(Some(ub), &["serve"], &[]);
    b1.cmd_expect("open rd 65536 1 1", "MEM");
    assert_eq!(daemon(&mut b1).0, "system");
    let t0 = Instant::now();
    assert_eq!(b1.cmd(&format!("connect {da} 1000")), "CONNECT NoMatch");
    eprintln!(
        "B's connect to A's discriminator: NoMatch after {:?}",
        t0.elapsed()
    );
    // A's listener was not taken: A's other process connects to it.
    let mut a2 = sys.client(Some(ua), &["serve"], &[]);
    a2.cmd_expect("open rd 65536 1 1", "MEM");
    assert_eq!(a2.cmd(&format!("connect {da} 20000")), "CONNECT ok");
    assert_eq!(a1.expect("ACCEPT"), "ok");
    // Same user: the fast path (A2's engine maps A1's memory).
    assert_eq!(a2.cmd("fill 0 4096 64 9"), "OK");
    assert_eq!(a2.cmd("send 64 4096:64"), "OK");
    assert!(a2.cmd("wait_send").starts_with("SEND 0x1 "));
    assert!(a1.cmd("wait_recv").starts_with("RECV 0x"));
    assert_eq!(a1.cmd("check 0 4096 64 9"), "SAME");
    assert_eq!(a2.cmd("fill 0 4096 32 11"), "OK");
    assert_eq!(
        a2.cmd(&format!(
            "write 128 {:#x} {} 4096:32",
            mem.addr + 4160,
            mem.handle
        )),
        "OK"
    );
    assert!(a2.cmd("wait_send").starts_with("SEND 0x20001 "));
    assert_eq!(a1.cmd("check 0 4160 32 11"), "SAME");

    // B listens on dB; A's request for it finds nobody, and B's listen
    // ends at its own timeout without a request.
    let db = disc_str("dB");
    b1.say(&format!("listen {db} accept 1500"));
    b1.expect("LISTENING");
    let mut a3 = sys.client(Some(ua), &["serve"], &[]);
    a3.cmd_expect("open rd 65536 1 1", "MEM");
    assert_eq!(a3.cmd(&format!("connect {db} 500")), "CONNECT NoMatch");
    assert_eq!(b1.expect("ACCEPT"), "Timeout");
    // Peer to peer across users never matches.
    let (pa, pb) = (disc_str("pa"), disc_str("pb"));
    a3.say(&format!("peer {pa} {pb} 1000"));
    b1.say(&format!("peer {pb} {pa} 1000"));
    assert_eq!(a3.line(), "PEER Timeout");
    assert_eq!(b1.line(), "PEER Timeout");

    // Nothing of A changed but what A's own peer wrote.
    assert_eq!(a1.cmd("check 0 8192 57344 7"), "SAME");
    assert_eq!(a1.cmd("errors"), "ERRORS none");
    let log = sys.log_text();
    assert!(
        log.contains(&format!("(uid {ub}) asked for")),
        "the daemon did not log the refused fetches:\n{log}"
    );
    for p in [a1, a2, a3, b1] {
        p.exit();
    }
}

/// Which daemon the library uses: the system daemon when it runs and
/// answers as root; else the per-user one (no system directory, a stale
/// socket, a directory others can write, a socket of another owner, or a
/// root-owned socket whose listener is not root, which gets a connection
/// but not one byte or descriptor).
#[test]
fn library_prefers_the_system_daemon_and_falls_back() {
    if !have_root("library_prefers_the_system_daemon_and_falls_back") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let (ua, _) = users();
    let mode_of = |dir: &Path, uid: Option<u32>| {
        let mut p = client(dir, uid, &["serve"], &[]);
        p.cmd_expect("open u 4096 0 0", "MEM");
        let m = daemon(&mut p).0;
        p.exit();
        m
    };
    // No directory.
    let none = tmp("none");
    let _ = std::fs::remove_dir_all(&none);
    assert_eq!(mode_of(&none, Some(ua)), "user");
    // The system daemon; then the same directory after it died (a stale
    // socket file is left by SIGKILL).
    let mut sys = System::start("prefer", "");
    assert_eq!(mode_of(&sys.dir, Some(ua)), "system");
    assert_eq!(mode_of(&sys.dir, None), "system");
    sys.stop(libc::SIGKILL);
    assert!(sys.socket().exists(), "SIGKILL left no socket file");
    assert_eq!(mode_of(&sys.dir, Some(ua)), "user");
    // A live daemon in a directory others can write: not trusted.
    sys.launch();
    std::fs::set_permissions(&sys.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(mode_of(&sys.dir, Some(ua)), "user");
    std::fs::set_permissions(&sys.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(mode_of(&sys.dir, Some(ua)), "system");
    drop(sys);

    // An impostor: a listener of user A on the system socket. Socket owned
    // by A: the library does not even connect. Owned by root (chowned):
    // it connects, sees uid A, and sends nothing.
    let imp = tmp("impostor");
    let _ = std::fs::remove_dir_all(&imp);
    std::fs::create_dir(&imp).unwrap();
    std::fs::set_permissions(&imp, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sock = imp.join("system.sock");
    for chown in [false, true] {
        let _ = std::fs::remove_file(&sock);
        let mut i = client(&imp, Some(ua), &["impostor", sock.to_str().unwrap()], &[]);
        i.expect("READY");
        std::fs::set_permissions(&imp, std::fs::Permissions::from_mode(0o755)).unwrap();
        if chown {
            std::os::unix::fs::lchown(&sock, Some(0), Some(0)).unwrap();
        }
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(mode_of(&imp, Some(ua)), "user", "chown {chown}");
        let got = i.cmd_expect("report", "GOT");
        i.finish();
        let want = if chown { "1 0 0" } else { "0 0 0" };
        assert_eq!(got, want, "the impostor got (connections, bytes, fds)");
        std::fs::set_permissions(&imp, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let _ = std::fs::remove_dir_all(&imp);
}

/// Pinning quota: arenas are locked in the daemon (its `VmLck` grows by
/// each registration) up to the per-process and per-user quotas;
/// beyond, `VIP_ERROR_RESOURCE` and nothing more locked; the quota comes
/// back on deregistration (exactly, with the registration cache off) and
/// when a client is killed, down to what the daemon held before. With
/// the cache on, a registration refused for quota drops the cached ones
/// and succeeds. `VipQueryNic` reports the quota; clients lock nothing.
#[test]
fn pinning_quota() {
    if !have_root("pinning_quota") {
        return;
    }
    let (ua, ub) = users();
    let sys = System::start(
        "quota",
        "[pinning]\nper_process = \"1 MiB\"\nper_user = \"1536 KiB\"\n",
    );
    let base = sys.locked();
    assert_eq!(base, 0, "a new daemon holds memory locked");
    let nocache = [("VIA_REGCACHE", "off")];
    let mut a1 = sys.client(Some(ua), &["serve"], &nocache);
    a1.cmd_expect("open rd 65536 0 0", "MEM");
    let (mode, pin_process, pin_user, _) = daemon(&mut a1);
    assert_eq!(
        (mode.as_str(), pin_process, pin_user),
        ("system", 1 << 20, 1536 << 10)
    );
    let attrs = a1.cmd_expect("attrs", "ATTRS");
    let attrs: Vec<u64> = attrs
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(
        &attrs[..2],
        &[1 << 20, 1 << 20],
        "VipQueryNic's register limits"
    );
    assert_eq!(sys.locked(), base + 64);
    for i in 1..=3 {
        a1.cmd_expect("try_region 262144", &format!("REGION {i} "));
        assert_eq!(sys.locked(), base + 64 + 256 * i);
    }
    // 832 KiB + 256 KiB > 1 MiB: refused, nothing more locked.
    assert_eq!(a1.cmd("try_region 262144"), "REGERR Resource");
    assert_eq!(sys.locked(), base + 832);
    // Another process of the user: its own 1 MiB, but 1.5 MiB for both.
    let mut a2 = sys.client(Some(ua), &["serve"], &nocache);
    a2.cmd_expect("open rd 65536 0 0", "MEM");
    a2.cmd_expect("try_region 524288", "REGION 1 ");
    assert_eq!(sys.locked(), base + 832 + 576);
    assert_eq!(a2.cmd("try_region 262144"), "REGERR Resource");
    assert_eq!(sys.locked(), base + 1408);
    // Another user has its own quota.
    let mut b1 = sys.client(Some(ub), &["serve"], &nocache);
    b1.cmd_expect("open rd 65536 0 0", "MEM");
    b1.cmd_expect("try_region 786432", "REGION 1 ");
    assert_eq!(sys.locked(), base + 1408 + 832);
    b1.exit();
    sys.settle(base + 1408, "after B exited");
    // Deregistration gives quota back.
    assert_eq!(a1.cmd("dereg 2"), "OK");
    sys.settle(base + 1152, "after a deregistration");
    a1.cmd_expect("try_region 262144", "REGION 4 ");
    assert_eq!(sys.locked(), base + 1408);
    // Clients lock nothing themselves.
    assert_eq!(locked_kib(a1.pid()), Some(0));
    // Death gives everything back.
    a1.child.kill().unwrap();
    a1.child.wait().unwrap();
    sys.settle(base + 576, "after A1 was killed");
    a2.exit();
    sys.settle(base, "after every client is gone");

    // The registration cache keeps deregistered regions (and their quota)
    // while their memory stays mapped; a registration refused for quota
    // drops them and is tried again.
    if regcache_off() {
        eprintln!("SKIPPED (VIA_REGCACHE=off): the cached regions' quota");
        return;
    }
    let mut a3 = sys.client(Some(ua), &["serve"], &[]);
    a3.cmd_expect("open rd 65536 0 0", "MEM");
    assert_eq!(a3.cmd("memory 786432"), "MEMORY 0");
    a3.cmd_expect("try_region_in 0", "REGION 1 ");
    assert_eq!(sys.locked(), base + 832);
    assert_eq!(a3.cmd("dereg 1"), "OK");
    assert_eq!(a3.cmd("memory 786432"), "MEMORY 1");
    // 832 KiB (the cached region included) + 768 KiB > 1 MiB: refused
    // once (the daemon logs it before it answers), the cache flushed (its
    // Retire goes before the second Publish), and registered.
    let refusals = || sys.log_text().matches("refused: pinning quota").count();
    let before = refusals();
    a3.cmd_expect("try_region_in 1", "REGION 2 ");
    assert_eq!(sys.locked(), base + 832);
    assert_eq!(refusals(), before + 1, "{}", sys.log_text());
    a3.exit();
    sys.settle(base, "after the last client");
}

/// Restarts: killing the daemon (SIGKILL) or stopping it (SIGTERM, as
/// systemd does) under connected clients breaks their VIs with CONN_LOST
/// and makes new requests fail with VIP_ERROR_RESOURCE, without a hang;
/// a new instance starts with nothing locked and serves new clients and
/// old ones that closed their NICs and opened again.
#[test]
fn restart_under_clients() {
    if !have_root("restart_under_clients") {
        return;
    }
    let (ua, _) = users();
    let mut sys = System::start("restart", "");
    let connected_pair = |sys: &System, tag: &str| {
        let mut srv = sys.client(Some(ua), &["serve"], &[]);
        srv.cmd_expect("open rd 262144 0 0", "MEM");
        assert_eq!(daemon(&mut srv).0, "system");
        assert_eq!(srv.cmd("recv 0 4096:64"), "OK");
        let d = disc_str(tag);
        srv.say(&format!("listen {d} accept 20000"));
        srv.expect("LISTENING");
        let mut cli = sys.client(Some(ua), &["serve"], &[]);
        cli.cmd_expect("open rd 262144 0 0", "MEM");
        assert_eq!(cli.cmd(&format!("connect {d} 20000")), "CONNECT ok");
        assert_eq!(srv.expect("ACCEPT"), "ok");
        assert_eq!(cli.cmd("fill 0 4096 64 3"), "OK");
        assert_eq!(cli.cmd("send 64 4096:64"), "OK");
        assert!(cli.cmd("wait_send").starts_with("SEND 0x1 "));
        assert!(srv.cmd("wait_recv").starts_with("RECV 0x"));
        assert_eq!(srv.cmd("check 0 4096 64 3"), "SAME");
        (srv, cli)
    };
    let broken = |p: &mut Peer| {
        assert!(p.cmd("wait_error ConnLost").starts_with("ERROR ConnLost"));
        assert_eq!(p.cmd("state"), "STATE Error");
        let t0 = Instant::now();
        assert_eq!(p.cmd("try_region 4096"), "REGERR Resource");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    };
    for (sig, name) in [(libc::SIGKILL, "killed"), (libc::SIGTERM, "stopped")] {
        let (mut srv, mut cli) = connected_pair(&sys, name);
        assert!(sys.locked() >= 512, "VmLck {} KiB", sys.locked());
        sys.stop(sig);
        broken(&mut srv);
        broken(&mut cli);
        if sig == libc::SIGTERM {
            assert!(!sys.socket().exists(), "SIGTERM left the socket");
            let log = sys.log_text();
            assert!(log.contains("signal 15: exiting"), "{log}");
        }
        sys.launch();
        assert_eq!(sys.locked(), 0, "a new instance starts with memory locked");
        // An old client, once it has closed its NIC, gets the new instance.
        assert_eq!(srv.cmd("close"), "OK");
        srv.cmd_expect("open rd 65536 0 0", "MEM");
        assert_eq!(daemon(&mut srv).0, "system");
        assert_eq!(sys.locked(), 64);
        // New clients connect and move data through it.
        let (s2, c2) = connected_pair(&sys, &format!("{name}-again"));
        for p in [srv, cli, s2, c2] {
            p.exit();
        }
        sys.settle(0, "after the clients of the new instance exited");
    }
}

/// On the shared-memory NIC a cross-user connection the configuration
/// grants is refused at once (`VIP_REJECT`: it would map one user's memory
/// into the other's process) with a log line saying why and what to use
/// instead, and the listener of the other user is left for its own user.
#[test]
fn granted_cross_user_connection_is_refused_on_shared_memory() {
    if !have_root("granted_cross_user_connection_is_refused_on_shared_memory") {
        return;
    }
    let (ua, ub) = users();
    let sys = System::start(
        "grant",
        &format!(
            "[[grant]]\nclient_uid = {ub}\nserver_uid = {ua}\ndiscriminator_prefix = \"svc-\"\n"
        ),
    );
    let d = format!("svc-{}", disc_str("g"));
    let mut a1 = sys.client(Some(ua), &["serve"], &[]);
    a1.cmd_expect("open rd 65536 1 1", "MEM");
    a1.say(&format!("listen {d} accept 30000"));
    a1.expect("LISTENING");
    let mut b1 = sys.client(Some(ub), &["serve"], &[]);
    b1.cmd_expect("open rd 65536 1 1", "MEM");
    let t0 = Instant::now();
    assert_eq!(b1.cmd(&format!("connect {d} 20000")), "CONNECT Reject");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the refusal waited for the timeout ({:?})",
        t0.elapsed()
    );
    let log = sys.log_text();
    assert!(
        log.contains("granted by the configuration, but not on the shared-memory NIC")
            && log.contains("open a sockets NIC (via_<ifname>) for cross-user connections"),
        "{log}"
    );
    let mut a2 = sys.client(Some(ua), &["serve"], &[]);
    a2.cmd_expect("open rd 65536 1 1", "MEM");
    assert_eq!(a2.cmd(&format!("connect {d} 20000")), "CONNECT ok");
    assert_eq!(a1.expect("ACCEPT"), "ok");
    for p in [a1, a2, b1] {
        p.exit();
    }
}

/// Over the sockets NIC the system daemon mediates between users: it
/// serves a TCP request as the user whose socket it came from (the
/// kernel's socket table), passes a granted one to the other user's
/// listener and nothing else of the requester, and each process checks
/// every access to its own memory. Here, in a network namespace with the
/// daemon and two users' processes: a request the configuration does not
/// grant never reaches A's listener (`NoMatch`, and A's own user
/// still connects to it); a granted one connects and moves data both
/// ways (send/receive, RDMA write, RDMA read); a write with a wrong
/// memory handle is refused by A's process with A's memory unchanged;
/// neither process maps any memory of the other.
#[test]
fn granted_cross_user_connection_over_the_sockets_nic() {
    use via::descriptor::status::*;
    let Some(h) = via_tests::netns::Hosts::new("xuser") else {
        return;
    };
    let side = via_tests::netns::Side::A;
    let (ua, ub) = users();
    let sys = System::start_in(
        Some(h.namespace(side)),
        "xuser",
        &format!(
            "[[grant]]\nclient_uid = {ub}\nserver_uid = {ua}\ndiscriminator_prefix = \"svc-\"\n"
        ),
    );
    let dev = h.device(side);
    let env = [("VIA_PEER_DEVICE", dev.as_str())];
    let (granted, private) = (
        format!("svc-{}", disc_str("xg")),
        format!("own-{}", disc_str("xp")),
    );
    let mut a = sys.client(Some(ua), &["serve"], &env);
    let m = RemoteMem::parse(&a.cmd_expect("open rd 1048576 1 1", "MEM"));
    let mut a_private = sys.client(Some(ua), &["serve"], &env);
    a_private.cmd_expect("open rd 65536 1 1", "MEM");
    a_private.say(&format!("listen {private} accept 30000"));
    a_private.expect("LISTENING");
    let mut b = sys.client(Some(ub), &["serve"], &env);
    b.cmd_expect("open rd 1048576 1 1", "MEM");
    // Not granted: B's request never reaches A's listener.
    assert_eq!(b.cmd(&format!("connect {private} 1500")), "CONNECT NoMatch");
    // A's own user still reaches it.
    let mut a2 = sys.client(Some(ua), &["serve"], &env);
    a2.cmd_expect("open rd 65536 1 1", "MEM");
    assert_eq!(a2.cmd(&format!("connect {private} 20000")), "CONNECT ok");
    assert_eq!(a_private.line(), "ACCEPT ok");
    // Granted: B connects to A.
    a.say(&format!("listen {granted} accept 30000"));
    a.expect("LISTENING");
    assert_eq!(b.cmd(&format!("connect {granted} 20000")), "CONNECT ok");
    assert_eq!(a.line(), "ACCEPT ok");
    let log = sys.log_text();
    assert!(log.contains("granted by the configuration"), "{log}");
    // Send and receive, both ways.
    let st =
        |p: &mut Peer, what: &str| nums(&p.cmd_expect(what, &what[5..9].to_uppercase()))[0] as u32;
    assert_eq!(b.cmd("fill 0 65536 5000 1"), "OK");
    assert_eq!(a.cmd("recv 0 100000:5000"), "OK");
    assert_eq!(b.cmd("send 64 65536:5000"), "OK");
    assert_eq!(st(&mut b, "wait_send"), DONE | OP_SEND, "B's send");
    assert_eq!(st(&mut a, "wait_recv"), DONE | OP_RECEIVE, "A's receive");
    assert!(unhex(&a.cmd_expect("peek 0 100000 5000", "DATA")) == pattern(5000, 1));
    assert_eq!(a.cmd("fill 0 200000 3000 2"), "OK");
    assert_eq!(b.cmd("recv 128 300000:3000"), "OK");
    assert_eq!(a.cmd("send 192 200000:3000"), "OK");
    assert_eq!(st(&mut a, "wait_send"), DONE | OP_SEND, "A's send");
    assert_eq!(st(&mut b, "wait_recv"), DONE | OP_RECEIVE, "B's receive");
    assert!(unhex(&b.cmd_expect("peek 0 300000 3000", "DATA")) == pattern(3000, 2));
    // RDMA write and read of A's region by B.
    assert_eq!(b.cmd("fill 0 400000 8192 3"), "OK");
    let w = format!("write 256 {:#x} {} 400000:8192", m.addr + 500000, m.handle);
    assert_eq!(b.cmd(&w), "OK");
    assert_eq!(
        st(&mut b, "wait_send"),
        DONE | OP_RDMA_WRITE,
        "B's RDMA write"
    );
    assert_eq!(a.cmd("check 0 500000 8192 3"), "SAME");
    assert_eq!(a.cmd("fill 0 600000 4096 4"), "OK");
    let r = format!("read 320 {:#x} {} 700000:4096", m.addr + 600000, m.handle);
    assert_eq!(b.cmd(&r), "OK");
    assert_eq!(
        st(&mut b, "wait_send"),
        DONE | OP_RDMA_READ,
        "B's RDMA read"
    );
    assert_eq!(b.cmd("check 0 700000 4096 4"), "SAME");
    // A wrong memory handle: refused by A's process, A's memory unchanged.
    assert_eq!(a.cmd("fill 0 800000 8192 5"), "OK");
    let w = format!(
        "write 384 {:#x} {} 400000:8192",
        m.addr + 800000,
        m.handle ^ 0x5a5a_0000
    );
    assert_eq!(b.cmd(&w), "OK");
    let s = st(&mut b, "wait_send");
    assert_eq!(s, DONE | OP_RDMA_WRITE | RDMA_PROT_ERROR, "status {s:#x}");
    assert_eq!(a.cmd("check 0 800000 8192 5"), "SAME");
    // Neither maps the other's memory.
    let maps = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let (pa, pb) = (peer_pid(&a), peer_pid(&b));
    assert!(
        !maps(pb).contains(&format!("via-arena:{pa}:")),
        "B maps A's memory"
    );
    assert!(
        !maps(pa).contains(&format!("via-arena:{pb}:")),
        "A maps B's memory"
    );
    for p in [a, a2, a_private, b] {
        p.exit();
    }
}

/// The pid of the via-peer process a client runs (under `ip netns exec`
/// and `setpriv`, which exec it: the same pid).
fn peer_pid(p: &Peer) -> i32 {
    p.pid()
}

/// The command line: `--help` explains both modes and every option; a
/// configuration with a mistake stops the daemon with a message naming it
/// (exit 2); `--system` refuses to run without root.
#[test]
fn command_line_and_configuration_errors() {
    let (_, viad) = runnable_by_all(PEER);
    let out = Command::new(viad).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "Per-user mode",
        "System mode",
        "--system",
        "--config",
        "--dir",
        "--check-config",
        "--daemon",
        "--idle-ms",
        "--log",
        "VIA_SYSTEM_DIR",
        "/run/via-rs/system.sock",
        "/etc/via-rs/viad.toml",
    ] {
        assert!(
            help.contains(word),
            "--help does not mention {word}:\n{help}"
        );
    }
    let bad = std::env::temp_dir().join(format!("via-sys-bad-{}.toml", std::process::id()));
    std::fs::write(&bad, "[pinning]\nper_proces = \"1 MiB\"\n").unwrap();
    let out = Command::new(viad)
        .args(["--system", "--check-config", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("per_proces"), "{err}");
    std::fs::write(&bad, "[pinning]\nper_process = \"3 MiB\"\n").unwrap();
    let out = Command::new(viad)
        .args(["--system", "--check-config", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("per_process = \"3 MiB\""));
    let _ = std::fs::remove_file(&bad);
    if !have_root("viad --system refuses to run without root") {
        return;
    }
    let (ua, _) = users();
    let dir = tmp("notroot");
    let out = Command::new(viad)
        .args(["--system", "--dir"])
        .arg(&dir)
        .uid(ua)
        .gid(ua)
        .current_dir("/")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("must run as root"), "{err}");
    assert!(!dir.exists());
}
