//! viad: started by the library when none runs (and gone again when
//! idle), and unharmed by clients that send garbage. Both run against a
//! private instance (`VIA_INSTANCE`), so that other tests' clients do not
//! disturb what is measured (fd counts, idle exit).

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use via::descriptor::status::*;
use via::proto::{self, Endpoint, NetAddr, ObjKey, ObjKind, Request};
use via::{Reliability, ViState};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
/// Set (to the instance) only in the child process.
const CHILD: &str = "VIA_TESTS_VIAD_CHILD";

fn instance(tag: &str) -> String {
    format!("via-tests-{tag}-{}", std::process::id())
}

fn socket_of(inst: &str) -> std::path::PathBuf {
    via::agent::place::user_socket_for(inst).unwrap()
}

/// Waits up to `t` for process `pid` to exit (pidfd readiness); returns
/// when it did, `None` if it did not.
fn wait_exit(pid: i32, t: Duration) -> Option<Instant> {
    let fd = match via::sys::pidfd_open(pid) {
        Ok(fd) => fd,
        Err(_) => return Some(Instant::now()),
    };
    let deadline = Instant::now() + t;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = [libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let n = via::sys::poll(&mut p, left.as_millis() as i32).unwrap_or(0);
        if n > 0 {
            return Some(Instant::now());
        }
        if Instant::now() >= deadline {
            return None;
        }
    }
}

#[test]
fn viad_started_on_demand_and_exits_when_idle() {
    let inst = instance("auto");
    let name = socket_of(&inst);
    assert!(
        listener_pid(&name).is_none(),
        "a viad already serves {inst}"
    );
    let mut p = Peer::spawn_env(PEER, &["autostart"], &[("VIA_INSTANCE", &inst)]);
    assert_eq!(
        p.expect("BEFORE"),
        "none",
        "something listened before the library started viad"
    );
    p.expect("VIAD");
    let pid = listener_pid(&name).expect("a viad listens on the private instance");
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "viad");
    // Detached: not a child of the program that started it.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let ppid: i32 = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(ppid, p.pid(), "viad is still the client's child");
    p.expect("CLOSED");
    p.finish();
    let gone_client = Instant::now();
    // The default idle time is 5 s; allow a loaded machine plenty.
    let exited = wait_exit(pid, Duration::from_secs(60)).expect("viad did not exit when idle");
    let idle = exited - gone_client;
    eprintln!("viad exited {idle:?} after its last client");
    assert!(
        idle >= Duration::from_millis(4500),
        "viad exited after only {idle:?} idle"
    );
    assert!(idle < Duration::from_secs(30), "viad idled {idle:?}");
    assert!(listener_pid(&name).is_none());
    assert!(
        via::sys::seqpacket_connect_path(&name, Duration::from_secs(1)).is_err(),
        "the socket still accepts"
    );
}

#[test]
fn garbage_clients_do_not_hurt_viad() {
    let inst = instance("garbage");
    run_child_test(
        "garbage_child",
        &[("VIA_INSTANCE", &inst), (CHILD, &inst)],
        Duration::from_secs(240),
    );
}

/// Connects a raw client.
fn raw() -> OwnedFd {
    let s = via::sys::seqpacket_connect_path(&viad_socket(), Duration::from_secs(10))
        .expect("connect to viad");
    via::sys::set_recv_timeout(s.as_raw_fd(), Duration::from_secs(10)).unwrap();
    s
}

/// Sends `frames` (ignoring send errors: viad may have closed already),
/// then reads until viad closes the connection. Returns the frames read.
fn until_closed(s: &OwnedFd, frames: &[Vec<u8>], what: &str) -> Vec<Vec<u8>> {
    for f in frames {
        let _ = via::sys::send_with_fds(s.as_raw_fd(), f, &[]);
    }
    let mut got = Vec::new();
    let mut buf = vec![0u8; proto::MAX_FRAME + 1];
    loop {
        match via::sys::recv_with_fds(s.as_raw_fd(), &mut buf) {
            Ok((0, _)) => return got,
            Ok((n, _)) => got.push(buf[..n].to_vec()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("{what}: viad did not close the connection ({e})"),
        }
    }
}

fn hello() -> Vec<u8> {
    Request::Hello {
        version: proto::VERSION,
    }
    .encode(1)
}

/// The number of open fds of `pid`.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A frame header with `magic`, `kind`, `id` and a length field of `len`,
/// followed by `body`.
fn header(magic: u16, kind: u16, len: u32, body: &[u8]) -> Vec<u8> {
    let mut v = magic.to_le_bytes().to_vec();
    v.extend(kind.to_le_bytes());
    v.extend(7u32.to_le_bytes());
    v.extend(len.to_le_bytes());
    v.extend(body);
    v
}

#[test]
fn garbage_child() {
    let Ok(inst) = std::env::var(CHILD) else {
        return;
    };
    assert_eq!(viad_socket(), socket_of(&inst));
    // A working connection before the garbage.
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let errs = ErrorLog::install(&s.nic);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str("g1"));
    let viad = listener_pid(&viad_socket()).expect("viad of the instance");
    let fds_before = fd_count(viad);

    let addr = |d: &str| NetAddr {
        host: vec![],
        discriminator: d.as_bytes().to_vec(),
    };
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut junk = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect()
    };
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("one byte", vec![vec![0xff]]),
        ("short header", vec![junk(11)]),
        ("random 100", vec![junk(100)]),
        ("random, too long", vec![junk(proto::MAX_FRAME + 500)]),
        ("bad magic", vec![header(0x1234, 1, 4, &1u32.to_le_bytes())]),
        ("unknown kind", vec![header(proto::MAGIC, 0xffff, 0, &[])]),
        (
            "length beyond the frame",
            vec![header(proto::MAGIC, 1, 1000, &1u32.to_le_bytes())],
        ),
        (
            "trailing bytes",
            vec![header(proto::MAGIC, 1, 8, &[1, 0, 0, 0, 9, 9, 9, 9])],
        ),
        (
            "request before Hello",
            vec![Request::ResolveName { name: "x".into() }.encode(2)],
        ),
        (
            "wrong version",
            vec![Request::Hello { version: 999 }.encode(1)],
        ),
        ("two Hellos", vec![hello(), hello()]),
        ("Hello then junk", vec![hello(), junk(64)]),
        (
            "Publish without an fd",
            vec![
                hello(),
                Request::Publish {
                    key: ObjKey {
                        kind: ObjKind::Arena,
                        nic: 0,
                        id: 1,
                        generation: 0,
                    },
                }
                .encode(2),
            ],
        ),
        (
            "endpoint of another session",
            vec![
                hello(),
                Request::Connect {
                    me: Endpoint {
                        session: 1 << 40,
                        ..Endpoint::default()
                    },
                    local: addr("x"),
                    remote: addr("y"),
                    timeout_ms: 10,
                }
                .encode(2),
            ],
        ),
    ];
    for (what, frames) in &cases {
        let c = raw();
        let got = until_closed(&c, frames, what);
        assert!(got.len() <= 1, "{what}: {} answers", got.len());
    }
    // Junk carrying descriptors: closed, and the descriptors not kept.
    for n in 1..=via::sys::MAX_FDS {
        let c = raw();
        let files: Vec<OwnedFd> = (0..n)
            .map(|_| via::sys::memfd_create("via-tests-junk").unwrap())
            .collect();
        let raw_fds: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
        let _ = via::sys::send_with_fds(c.as_raw_fd(), &junk(40), &raw_fds);
        until_closed(&c, &[], "junk with fds");
        let c = raw();
        let _ = via::sys::send_with_fds(c.as_raw_fd(), &hello(), &raw_fds);
        until_closed(&c, &[], "Hello with fds");
    }
    // A client that floods requests and never reads its answers is dropped
    // rather than allowed to stall the daemon.
    let c = raw();
    via::sys::set_nonblocking(c.as_raw_fd(), true).unwrap();
    let q = Request::ResolveName {
        name: "localhost".into(),
    }
    .encode(3);
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_secs(20) {
        match via::sys::send_with_fds(c.as_raw_fd(), &q, &[]) {
            Ok(_) => sent += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // viad is behind or we are full: look whether it hung up.
                let mut p = [libc::pollfd {
                    fd: c.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                }];
                let _ = via::sys::poll(&mut p, 100);
                if p[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    assert!(sent > 0);
    drop(c);

    // A well-formed client cannot break a connection it is not part of:
    // Disconnect naming our VI (every generation a young slot may have).
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let eng = maps
        .lines()
        .filter_map(|l| {
            l.split_once("/memfd:via-engine:")
                .map(|x| x.1.trim_end_matches(" (deleted)"))
        })
        .next_back()
        .expect("our engine doorbell")
        .to_string();
    let f: Vec<u64> = eng.split(':').map(|x| x.parse().unwrap()).collect();
    let c = raw();
    via::sys::send_with_fds(c.as_raw_fd(), &hello(), &[]).unwrap();
    let mut buf = vec![0u8; proto::MAX_FRAME + 1];
    let (n, _) = via::sys::recv_with_fds(c.as_raw_fd(), &mut buf).unwrap();
    let Ok((1, proto::Reply::Welcome { session: mine, .. })) = proto::Reply::decode(&buf[..n])
    else {
        panic!("no Welcome")
    };
    for g in 0..4u32 {
        let victim = Endpoint {
            session: f[0],
            nic: f[1] as u32,
            vi: s.vi.slot(),
            vi_gen: g,
            ..Endpoint::default()
        };
        let me = Endpoint {
            session: mine,
            ..Endpoint::default()
        };
        let _ = via::sys::send_with_fds(
            c.as_raw_fd(),
            &Request::Disconnect {
                peer: victim,
                me,
                reason: 4,
            }
            .encode(10 + g),
            &[],
        );
    }
    drop(c);

    // viad is the same process, and still serves: the old connection moves
    // data, a new one can be made.
    assert_eq!(
        listener_pid(&viad_socket()),
        Some(viad),
        "viad restarted or died"
    );
    assert_eq!(p.cmd("recv 0 4096:100"), "OK");
    s.fill(4096, 100, 1);
    post_send(&s, 0, 4096, 100);
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    assert_eq!(p.cmd("check 0 4096 100 1"), "SAME");
    assert_eq!(s.vi.state(), ViState::Connected);
    assert!(
        errs.all().is_empty(),
        "garbage clients disturbed a connection: {:?}",
        errs.all()
    );
    let mut closed = 0;
    let back = wait_until(Duration::from_secs(10), || {
        closed = fd_count(viad);
        closed <= fds_before
    });
    assert!(
        back,
        "viad had {fds_before} fds before the garbage, {closed} after"
    );
    let s2 = Setup::new(Reliability::Unreliable, 65536, false, false);
    let mut p2 = Peer::serve(PEER);
    p2.cmd_expect("open u 65536 0 0", "MEM");
    s2.connect_to(&mut p2, &disc_str("g2"));
    assert_eq!(p2.cmd("recv 0 4096:10"), "OK");
    post_send(&s2, 0, 4096, 10);
    assert_eq!(
        p2.cmd_expect("wait_recv", "RECV").split(' ').next(),
        Some("0x10001")
    );
    p2.exit();
    p.exit();
}

/// Set (to the instance) only in the child of `viad_loss_breaks_connections`.
const LOSS_CHILD: &str = "VIA_TESTS_VIAD_LOSS_CHILD";

#[test]
fn viad_loss_breaks_connections() {
    let inst = instance("loss");
    run_child_test(
        "viad_loss_child",
        &[("VIA_INSTANCE", &inst), (LOSS_CHILD, &inst)],
        Duration::from_secs(240),
    );
}

/// viad is killed while two processes are connected: without it a peer's
/// death would go unnoticed, so both sides break at once (CONN_LOST through
/// the error callback, VI in ERROR, outstanding receives flushed); requests
/// that need viad fail with `Resource`; once every NIC is closed, the next
/// open gets a new daemon and works.
#[test]
fn viad_loss_child() {
    if std::env::var(LOSS_CHILD).is_err() {
        return;
    }
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let errs = ErrorLog::install(&s.nic);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str("loss"));
    post_recv(&s, 0, 4096, 100);
    let viad = listener_pid(&viad_socket()).expect("viad of the instance");
    // SAFETY: plain signal to a process id we just looked up.
    assert_eq!(unsafe { libc::kill(viad, libc::SIGKILL) }, 0);
    let e = errs.expect(via::ErrorCode::ConnLost, Duration::from_secs(20));
    assert_eq!(e.vi.map(|v| v.0), Some(s.vi.slot()));
    assert_eq!(s.vi.state(), ViState::Error);
    let c = s.vi.recv_wait(WAIT).expect("the receive completes");
    assert_eq!(c.status & DESC_FLUSHED_ERROR, DESC_FLUSHED_ERROR);
    assert!(p.cmd("wait_error ConnLost").starts_with("ERROR ConnLost"));
    // Requests that need viad fail cleanly.
    let at = via::ViAttributes::new(Reliability::ReliableDelivery, s.ptag);
    let vi2 = s.nic.create_vi(&at, None, None).unwrap();
    let r = vi2.connect(
        &s.nic.address(b"c"),
        &s.nic.address(&disc("nobody")),
        Some(Duration::from_millis(100)),
    );
    assert_eq!(r.err(), Some(via::Error::Resource));
    // A second NIC while the lost one is open: refused.
    assert_eq!(via::Nic::open(None).err(), Some(via::Error::Resource));
    drop(vi2);
    drop(s);
    p.exit();
    // Everything closed: a fresh session with a new daemon.
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str("after-loss"));
    let again = listener_pid(&viad_socket()).expect("a new viad");
    assert_ne!(again, viad);
    p.exit();
}
