//! Who the library talks to: an impostor of another user, or a daemon of
//! the right place that does not answer, never gets anything from a
//! process that opens a NIC, and never makes it hang.
//!
//! The tests with a second user need root (they run children under unused
//! uids); without root they print `SKIPPED (needs root): ...` and pass.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");

/// Every `Nic::open` here must end within this (the children use a viad
/// deadline of 1 s).
const BOUND: Duration = Duration::from_secs(15);

fn instance(tag: &str) -> String {
    format!("via-id-{tag}-{}", std::process::id())
}

/// `(via-peer, viad)` runnable by every user.
fn runnable_by_all() -> &'static (PathBuf, PathBuf) {
    via_tests::runnable_by_all(PEER)
}

/// `via-peer args` as `uid` (and gid), with a private instance and a short
/// viad deadline, without `XDG_RUNTIME_DIR`.
fn as_user(uid: Option<u32>, inst: &str, args: &[&str]) -> Peer {
    let (peer, viad) = runnable_by_all();
    let mut cmd = Command::new(peer);
    cmd.args(args)
        .env("VIA_INSTANCE", inst)
        .env("VIA_VIAD", viad)
        .env("VIA_VIAD_TIMEOUT_MS", "1000")
        .env("RUST_LOG", "via=info")
        .env_remove("XDG_RUNTIME_DIR")
        .current_dir("/");
    if let Some(u) = uid {
        cmd.uid(u).gid(u);
    }
    Peer::from_command(cmd)
}

/// Reads `OPEN <result> <ms>` from an `open_timed` peer.
fn open_result(p: &mut Peer) -> (String, Duration) {
    let l = p.expect("OPEN");
    let mut it = l.split_whitespace();
    let r = it.next().unwrap().to_string();
    let ms: u64 = it.next().unwrap().parse().unwrap();
    (r, Duration::from_millis(ms))
}

fn remove(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// Kills the viad listening at `sock`, if any (a daemon a victim started).
fn stop_viad(sock: &Path) {
    if let Some(pid) = listener_pid(sock) {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
}

#[test]
fn impostor_of_another_user_gets_nothing() {
    if !have_root("impostor_of_another_user_gets_nothing") {
        return;
    }
    let squatter = unused_uid(61000, &[]);
    let victim = unused_uid(61000, &[squatter]);
    let victim_dir = PathBuf::from(format!("/tmp/via-rs-{victim}"));
    let squat_dir = PathBuf::from(format!("/tmp/via-squat-{squatter}-{victim}"));
    for mode in ["dir", "link", "abstract"] {
        let inst = instance(mode);
        remove(&victim_dir);
        remove(&squat_dir);
        let vs = victim.to_string();
        let mut sq = as_user(Some(squatter), &inst, &["squat", mode, &vs, &inst]);
        sq.expect("READY");
        let mut v = as_user(Some(victim), &inst, &["open_timed"]);
        let (r, took) = open_result(&mut v);
        v.finish();
        eprintln!("{mode}: victim's Nic::open: {r} after {took:?}");
        assert!(took < BOUND, "{mode}: Nic::open took {took:?}");
        if mode == "abstract" {
            // Its own place is free: it gets its own daemon.
            assert_eq!(r, "ok", "{mode}: the victim could not open a NIC");
        } else {
            // Its place is taken: a clean refusal.
            assert_eq!(r, "Resource", "{mode}");
        }
        assert_eq!(
            sq.cmd_expect("report", "GOT"),
            "0 0 0",
            "{mode}: the impostor received something (connections, bytes, fds)"
        );
        sq.finish();
        stop_viad(&victim_dir.join(format!("{inst}.p{}.sock", via::proto::VERSION)));
        remove(&victim_dir);
        remove(&squat_dir);
    }
}

/// Accepts every connection on `l` and counts what arrives on it, until
/// the listener is shut down by the test ending.
fn record(l: OwnedFd) -> Arc<[AtomicUsize; 3]> {
    let counts: Arc<[AtomicUsize; 3]> = Arc::default();
    let c2 = counts.clone();
    std::thread::spawn(move || {
        while let Ok(c) = via::sys::accept(l.as_raw_fd()) {
            c2[0].fetch_add(1, Relaxed);
            let c3 = c2.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while let Ok(r) = via::sys::recv_msg(c.as_raw_fd(), &mut buf) {
                    if r.len == 0 && r.fds.is_empty() {
                        break;
                    }
                    c3[1].fetch_add(r.len, Relaxed);
                    c3[2].fetch_add(r.fds.len() + r.fds_lost as usize, Relaxed);
                }
            });
        }
    });
    counts
}

/// A socket of another uid in the victim's own, correct directory (only
/// root can put one there) is not the victim's daemon: `SO_PEERCRED`
/// shows it, and the victim sends nothing.
#[test]
fn daemon_of_another_uid_is_refused() {
    if !have_root("daemon_of_another_uid_is_refused") {
        return;
    }
    let victim = unused_uid(62000, &[]);
    let inst = instance("cred");
    let dir = PathBuf::from(format!("/tmp/via-rs-{victim}"));
    remove(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(victim), Some(victim)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sock = dir.join(format!("{inst}.p{}.sock", via::proto::VERSION));
    let l = via::sys::seqpacket_listen_path(&sock).unwrap();
    // Writable by all, so that the victim does connect and only its
    // SO_PEERCRED check stands between it and this socket.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let counts = record(l);
    let mut v = as_user(Some(victim), &inst, &["open_timed"]);
    let (r, took) = open_result(&mut v);
    v.finish();
    eprintln!("victim's Nic::open: {r} after {took:?}");
    assert_eq!(r, "Resource");
    assert!(took < BOUND, "Nic::open took {took:?}");
    assert!(
        wait_until(BOUND, || counts[0].load(Relaxed) == 1),
        "the victim did not connect"
    );
    assert_eq!(
        (counts[1].load(Relaxed), counts[2].load(Relaxed)),
        (0, 0),
        "root's socket received bytes or fds"
    );
    remove(&dir);
}

/// A daemon place of the caller's own uid whose listener accepts and never
/// answers, or never accepts at all (full backlog): `Nic::open` fails
/// cleanly within the deadline instead of hanging.
#[test]
fn own_daemon_that_never_answers_is_bounded() {
    for variant in ["accept", "backlog"] {
        let inst = instance(variant);
        let path = via::agent::place::user_socket_for(&inst).unwrap();
        remove(&path);
        let l = via::sys::seqpacket_listen_path(&path).unwrap();
        let mut held = Vec::new();
        let counts = if variant == "accept" {
            Some(record(l))
        } else {
            // Fill the backlog: connect until the kernel refuses more.
            loop {
                match via::sys::seqpacket_connect_path(&path, Duration::ZERO) {
                    Ok(s) => held.push(s),
                    Err(e) => {
                        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
                        break;
                    }
                }
                assert!(held.len() < 100_000);
            }
            held.push(l);
            None
        };
        let mut v = as_user(None, &inst, &["open_timed"]);
        let (r, took) = open_result(&mut v);
        v.finish();
        eprintln!("{variant}: Nic::open: {r} after {took:?}");
        assert_eq!(r, "Resource", "{variant}");
        assert!(took < BOUND, "{variant}: Nic::open took {took:?}");
        assert!(
            took >= Duration::from_millis(900),
            "{variant}: gave up before the deadline ({took:?})"
        );
        if let Some(c) = counts {
            assert!(
                wait_until(BOUND, || c[0].load(Relaxed) >= 1),
                "the victim never connected"
            );
        }
        drop(held);
        remove(&path);
    }
}
