//! viad under pressure: a client that goes beyond a limit is refused (or,
//! for one that does not read, cut off), and a well-behaved client keeps
//! its service meanwhile. Service is measured as the round trips of a
//! name-service request to viad during the abuse: the bound (p99 under
//! 100 ms) is on service, not a micro-benchmark.
//!
//! Each scenario runs in a child process of this test binary with a viad
//! of its own (private `VIA_INSTANCE`, limits set through its
//! environment); scenarios run one at a time.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use via::Reliability;
use via::proto::{ObjKey, ObjKind, Reply, Request};
use via_tests::raw::{self, Client, Probe};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
/// Set only in the child process (to the scenario).
const CHILD: &str = "VIA_TESTS_PRESSURE_CHILD";
/// The service bound during every abuse.
const P99: Duration = Duration::from_millis(100);

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs scenario `name` (the test `<name>_child`) in a child process with
/// a private viad configured by `env`; prints its measurements.
fn scenario(name: &str, env: &[(&str, &str)]) {
    let _g = one_at_a_time();
    let inst = format!("via-pressure-{name}-{}", std::process::id());
    let mut all = vec![("VIA_INSTANCE", inst.as_str()), (CHILD, name)];
    all.extend_from_slice(env);
    let out = run_child_test(&format!("{name}_child"), &all, Duration::from_secs(300));
    for l in out
        .lines()
        .filter_map(|l| l.find("MEASURED").map(|i| &l[i..]))
    {
        eprintln!("{name}: {l}");
    }
}

/// Whether this process is the child for `name`.
fn child(name: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|v| v == name)
}

fn measured(what: &str, probe: (usize, Duration, Duration, Duration)) {
    let (n, med, p99, max) = probe;
    println!("MEASURED {what}: {n} round trips to viad, median {med:?}, p99 {p99:?}, max {max:?}");
    std::io::stdout().flush().unwrap();
    assert!(
        p99 < P99,
        "{what}: p99 round trip {p99:?} (bound {P99:?}; median {med:?}, max {max:?})"
    );
}

/// The viad of this instance, started by opening a NIC.
fn start_viad() -> (via::Nic, i32) {
    let nic = open_nic();
    let pid = listener_pid(&viad_socket()).expect("viad's pid");
    (nic, pid)
}

fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// CPU time (user + system) of `pid` so far.
fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    // Fields 14 and 15 (utime, stime), counted from after the name.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// A real library connection and message through the (abused) daemon.
fn library_still_works(tag: &str) {
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str(tag));
    assert_eq!(p.cmd("recv 0 4096:64"), "OK");
    s.fill(4096, 64, 3);
    post_send(&s, 0, 4096, 64);
    assert_eq!(
        s.vi.send_wait(WAIT).unwrap().status & via::descriptor::status::ERROR_MASK,
        0
    );
    assert_eq!(p.cmd("check 0 4096 64 3"), "SAME");
    p.exit();
}

#[test]
fn fd_flood() {
    scenario("fd_flood", &[("VIA_VIAD_MAX_FDS", "2000")]);
}

/// One session publishes 5000 fds: 2000 are stored, the rest refused with
/// `Limit`; its session lives on, viad's fds stay bounded, and everyone
/// else is served.
#[test]
fn fd_flood_child() {
    if !child("fd_flood") {
        return;
    }
    let (_nic, viad) = start_viad();
    let probe = Probe::start();
    let mut a = Peer::spawn(PEER, &["abuse", "fds", "5000"]);
    assert_eq!(a.expect("ABUSED"), "2000 3000");
    measured("5000 fds published by one client", probe.stop());
    let fds = fd_count(viad);
    assert!(fds < 2200, "viad holds {fds} fds");
    library_still_works("fd-flood");
    a.exit();
}

#[test]
fn connection_flood() {
    scenario("connection_flood", &[("VIA_VIAD_TIMEOUT_MS", "2000")]);
}

/// One process opens 3000 connections and never says Hello: beyond 64
/// they are refused at once, and the 64 are closed at the Hello deadline.
#[test]
fn connection_flood_child() {
    if !child("connection_flood") {
        return;
    }
    let (_nic, viad) = start_viad();
    let before = fd_count(viad);
    let probe = Probe::start();
    let mut a = Peer::spawn(PEER, &["abuse", "conns", "3000"]);
    a.expect("ABUSED");
    // The Hello deadline closes what was admitted (the abuser still holds
    // its ends).
    let mut now = 0;
    let back = wait_until(Duration::from_secs(30), || {
        now = fd_count(viad);
        now <= before + 4
    });
    measured("3000 connections without Hello", probe.stop());
    assert!(
        back,
        "viad had {before} fds before, {now} after the deadline"
    );
    library_still_works("conn-flood");
    a.exit();
}

#[test]
fn fd_exhaustion() {
    scenario(
        "fd_exhaustion",
        &[
            ("VIA_VIAD_MAX_CONNECTIONS", "100000"),
            ("VIA_VIAD_TIMEOUT_MS", "10000"),
            ("RUST_LOG", "info"),
        ],
    );
}

/// viad out of descriptors (a low fd limit, many sessions): no busy loop
/// on `accept`, the error logged once per period with a count, and the
/// sessions it has are served.
#[test]
fn fd_exhaustion_child() {
    if !child("fd_exhaustion") {
        return;
    }
    let log = std::env::temp_dir().join(format!("via-pressure-viad-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    // SAFETY: setrlimit on this process with a valid rlimit; viad, started
    // below by this process, inherits the limit.
    let r = unsafe {
        libc::setrlimit(
            libc::RLIMIT_NOFILE,
            &libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            },
        )
    };
    assert_eq!(r, 0);
    // SAFETY: single test thread of a child process; nothing else reads
    // the environment concurrently.
    unsafe { std::env::set_var("VIA_VIAD_LOG", &log) };
    let (_nic, viad) = start_viad();
    let probe = Probe::start();
    let cpu0 = cpu_time(viad);
    let t0 = Instant::now();
    let mut a = Peer::spawn(PEER, &["abuse", "sessions", "200"]);
    let got = a.expect("ABUSED");
    let wall = t0.elapsed();
    let cpu = cpu_time(viad) - cpu0;
    measured("viad out of descriptors", probe.stop());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lines = text
        .lines()
        .filter(|l| l.contains("out of file descriptors"))
        .count();
    println!(
        "MEASURED out of fds: sessions admitted/refused {got}; viad CPU {cpu:?} in {wall:?}; {lines} log lines about it"
    );
    let v: Vec<usize> = got.split(' ').map(|x| x.parse().unwrap()).collect();
    assert!(v[1] > 0, "viad never ran out of descriptors ({got})");
    assert!(
        lines >= 1 && lines <= 2 + (wall.as_secs() as usize) / 5,
        "{lines} log lines in {wall:?}:\n{text}"
    );
    assert!(
        cpu < wall / 2 + Duration::from_millis(500),
        "viad used {cpu:?} of CPU in {wall:?}"
    );
    a.exit();
    let _ = std::fs::remove_file(&log);
}

#[test]
fn mass_death() {
    scenario("mass_death", &[("VIA_VIAD_MAX_CONNECTIONS", "100000")]);
}

/// 3000 sessions die at once: nobody who did not depend on them hears of
/// it, and the daemon keeps serving.
#[test]
fn mass_death_child() {
    if !child("mass_death") {
        return;
    }
    let (_nic, _viad) = start_viad();
    let mut a = Peer::spawn(PEER, &["abuse", "sessions", "3000"]);
    assert_eq!(a.expect("ABUSED"), "3000 0");
    let mut bystander = Client::open().unwrap();
    let probe = Probe::start();
    a.say("exit");
    a.finish();
    // The deaths are being processed: measure through them, then a bit.
    let t0 = Instant::now();
    let mut rtts = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        bystander.round_trip().unwrap();
        rtts += 1;
    }
    measured("3000 sessions dying at once", probe.stop());
    assert!(rtts > 0);
    assert_eq!(bystander.events, 0, "a bystander was told of deaths");
    library_still_works("mass-death");
}

#[test]
fn stopped_reader() {
    scenario("stopped_reader", &[("VIA_VIAD_MAX_CONNECTIONS", "100000")]);
}

/// A client that maps the memory of 1000 sessions and stops reading while
/// they all die is not cut off: its 1000 events wait in viad's queue for
/// it (its socket holds a few hundred), and it still has its session.
#[test]
fn stopped_reader_child() {
    if !child("stopped_reader") {
        return;
    }
    let (_nic, viad) = start_viad();
    let n = 1000;
    let mut y = Client::open().unwrap();
    let base = fd_count(viad);
    let mut a = Peer::spawn(PEER, &["abuse", "publishers", &n.to_string()]);
    let ids: Vec<u64> = a
        .expect("SESSIONS")
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), n);
    let mut x = Client::open().unwrap();
    let key = ObjKey {
        kind: ObjKind::Arena,
        nic: 0,
        id: 1,
        generation: 0,
    };
    for &s in &ids {
        match x.call(&Request::Fetch { session: s, key }, None).unwrap() {
            (Reply::Fd, fds) => assert_eq!(fds.len(), 1),
            other => panic!("fetch: {other:?}"),
        }
    }
    let probe = Probe::start();
    // x reads nothing from here on; all its peers die.
    a.say("exit");
    a.finish();
    // viad has dropped every dead session (their fds are closed) ...
    let mut now = 0;
    assert!(
        wait_until(Duration::from_secs(60), || {
            now = fd_count(viad);
            now <= base + 8
        }),
        "viad still has {now} fds (had {base})"
    );
    // ... and, once it answers a request sent after that, it has also sent
    // (or queued) every death to x, which has not read since.
    y.round_trip().unwrap();
    let mut died = 0;
    let t0 = Instant::now();
    while died < n {
        match raw::recv(x.fd.as_raw_fd()) {
            Ok((0, Reply::PeerDied { .. }, _)) => died += 1,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => panic!("cut off after {died} deaths: {e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(60));
    }
    x.round_trip()
        .expect("the slow reader still has its session");
    measured(
        "1000 deaths queued for a client that does not read",
        probe.stop(),
    );
}

#[test]
fn listen_flood() {
    scenario("listen_flood", &[]);
}

/// One session asks for 5096 listens: 4096 wait, 1000 are refused, the
/// session and everyone else are served.
#[test]
fn listen_flood_child() {
    if !child("listen_flood") {
        return;
    }
    let (_nic, _viad) = start_viad();
    let probe = Probe::start();
    let mut a = Peer::spawn_env(
        PEER,
        &["abuse", "listens", "5096"],
        &[("ABUSE_EXPECT_REFUSED", "1000")],
    );
    assert_eq!(a.expect("ABUSED"), "1000");
    measured("5096 listens from one session", probe.stop());
    library_still_works("listen-flood");
    a.exit();
}

#[test]
fn library_over_limit() {
    scenario("library_over_limit", &[("VIA_VIAD_MAX_FDS", "8")]);
}

/// Through the library: a process whose registrations go beyond viad's fd
/// limit for it gets `Resource` from the registration (viad's
/// `Refused(Limit)`), and its session keeps working.
#[test]
fn library_over_limit_child() {
    if !child("library_over_limit") {
        return;
    }
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mut regions = Vec::new();
    let refused = loop {
        match via::Region::new(&nic, 8192, ptag, false, false) {
            Ok(r) => regions.push(r),
            Err(e) => break e,
        }
        assert!(regions.len() < 64, "never refused");
    };
    println!(
        "MEASURED registration refused after {} regions: {refused:?}",
        regions.len()
    );
    assert_eq!(refused, via::Error::Resource);
    // The NIC segment is one of the 8 objects.
    assert_eq!(regions.len(), 7);
    // The session still works: viad answers a connect request.
    let vi = nic
        .create_vi(
            &via::ViAttributes::new(Reliability::ReliableDelivery, ptag),
            None,
            None,
        )
        .unwrap();
    let r = vi.connect(
        &nic.address(b"c"),
        &nic.address(&disc("nobody")),
        Some(Duration::from_millis(200)),
    );
    assert_eq!(r.err(), Some(via::Error::NoMatch));
    drop(vi);
    drop(regions);
    let _ = nic.close();
}
